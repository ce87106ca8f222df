// The agent's process set-up (runner/io/process_hygiene.h): descriptors kept for workers and
// the socket budget with its warning word for word, the descriptor limit, descriptors the agent
// was started with, and stdio reopened when started closed.
#include "runner/io/process_hygiene.h"

#include <climits>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace ddprun::io {
namespace {

JobSpec Workers(int nproc_per_node, uint16_t metrics_port = 0) {
  JobSpec spec;
  spec.cluster.nproc_per_node = nproc_per_node;
  spec.metrics.port = metrics_port;
  return spec;
}

TEST(DescriptorReserveTest, EightPerWorkerOnTopOfTheAgentsOwnAndTheMetricsEndpoints) {
  EXPECT_EQ(DescriptorReserve(Workers(8)), 64u + 8 * 8);
  EXPECT_EQ(DescriptorReserve(Workers(0)), 64u + 8);  // at least one worker's worth
  EXPECT_EQ(DescriptorReserve(Workers(8, 9400)),
            64u + 8 * 8 + 16 + 2);  // MetricsServer::Limits::max_connections
}

TEST(BudgetSocketsTest, AGenerousLimitLeavesTheRestToConnectionsQuietly) {
  const SocketBudget budget = BudgetSockets(Workers(8), 65536, 0);
  EXPECT_EQ(budget.max_sockets, 65536u - 128);
  EXPECT_EQ(budget.warning, "");
  EXPECT_EQ(BudgetSockets(Workers(8), RLIM_INFINITY, 0).max_sockets, (size_t{1} << 20) - 128);
}

TEST(BudgetSocketsTest, ATightLimitIsSaid) {
  const SocketBudget budget = BudgetSockets(Workers(8), 150, 0);
  EXPECT_EQ(budget.max_sockets, 22u);
  EXPECT_EQ(
      budget.warning,
      "RLIMIT_NOFILE is 150 (hard limit too): 128 descriptors are kept for workers and logs, so at most 22 "
      "connections are accepted at once; raise it (ulimit -n) for a job under load");
}

TEST(BudgetSocketsTest, InheritedDescriptorsCountAndSixteenSocketsAlwaysRemain) {
  const SocketBudget budget = BudgetSockets(Workers(8), 100, 3);
  EXPECT_EQ(budget.max_sockets, 16u);
  EXPECT_EQ(
      budget.warning,
      "RLIMIT_NOFILE is 100 (hard limit too): 128 descriptors are kept for workers and logs and 3 were open "
      "at start, so at most 16 connections are accepted at once; raise it (ulimit -n) for a job under load");
}

TEST(RaiseNoFileLimitTest, TheSoftLimitGoesUpToTheHardOne) {
  const NoFileLimits limits = RaiseNoFileLimit();
  rlimit now{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(limits.soft_now, now.rlim_cur);
  EXPECT_EQ(now.rlim_cur, now.rlim_max);
  EXPECT_LE(limits.original.rlim_cur, limits.soft_now);
  EXPECT_EQ(limits.original.rlim_max, now.rlim_max);
}

TEST(InheritedDescriptorsTest, CountsWhatIsOpenAboveStderr) {
  const size_t before = InheritedDescriptors();
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(InheritedDescriptors(), before + 1);
  ::close(fd);
  EXPECT_EQ(InheritedDescriptors(), before);
}

// In a child: the test's own stdout stays open.
TEST(OpenClosedStdioTest, AClosedStdoutBecomesDevNull) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(1);
    OpenClosedStdio();
    char target[PATH_MAX] = {};
    const ssize_t n = ::readlink("/proc/self/fd/1", target, sizeof target - 1);
    const bool devnull = n > 0 && std::string(target, static_cast<size_t>(n)) == "/dev/null";
    const bool writable = (::fcntl(1, F_GETFL) & O_ACCMODE) == O_WRONLY;
    ::_exit(devnull && writable ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace ddprun::io
