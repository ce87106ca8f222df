// The /proc process tree: descendants through setsid, and KillTrees leaving nothing behind.

#include "runner/io/process_tree.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include <gtest/gtest.h>

namespace ddprun::io {
namespace {

bool Has(const std::vector<ProcessEntry>& entries, pid_t pid) {
  return std::any_of(entries.begin(), entries.end(), [&](const ProcessEntry& e) { return e.pid == pid; });
}

TEST(ProcessTree, ReadsThisProcess) {
  ProcessEntry self;
  ASSERT_TRUE(ReadProcessEntry(::getpid(), self));
  EXPECT_EQ(self.ppid, ::getppid());
  EXPECT_EQ(self.pgid, ::getpgrp());
  EXPECT_GT(self.start_time, 0u);
  EXPECT_FALSE(self.exiting());
  EXPECT_FALSE(self.kernel_thread());
  // Field 51: where this process's environment ends, as its memory map places the stack.
  EXPECT_NE(self.env_end, 0u);
  if (::environ[0] != nullptr) {
    EXPECT_LT(reinterpret_cast<uint64_t>(::environ[0]), self.env_end);
  }
  EXPECT_FALSE(ReadProcessEntry(-1, self));
}

TEST(ProcessTree, FindsAndKillsAGrandchildInASessionOfItsOwn) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::setsid();
      const int32_t me = ::getpid();
      [[maybe_unused]] ssize_t n = ::write(ready[1], &me, sizeof me);
      ::pause();
      ::_exit(0);
    }
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  int32_t grandchild = 0;
  ASSERT_EQ(::read(ready[0], &grandchild, sizeof grandchild), static_cast<ssize_t>(sizeof grandchild));
  ::close(ready[0]);

  const auto below = DescendantsOf(ReadProcessTable(), {::getpid()});
  EXPECT_TRUE(Has(below, child));
  EXPECT_TRUE(Has(below, grandchild));
  EXPECT_FALSE(Has(DescendantsOf(ReadProcessTable(), {::getpid()}, child), grandchild))
      << "an excluded process takes its descendants with it";

  EXPECT_EQ(KillTrees([&](const ProcessEntry& e) { return e.pid == child; }), 2u);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // The grandchild was reparented away from us; it is gone or a zombie of its new parent.
  ProcessEntry entry;
  for (int i = 0; i < 500 && ReadProcessEntry(grandchild, entry) && entry.state != 'Z'; ++i) ::usleep(10'000);
  EXPECT_TRUE(!ReadProcessEntry(grandchild, entry) || entry.state == 'Z');
}

}  // namespace
}  // namespace ddprun::io
