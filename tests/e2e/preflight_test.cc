// End-to-end tests of `ddprun preflight`: two real agents on 127.0.0.1, no GPU on this machine.

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

class PreflightTest : public ::testing::Test {
 protected:
  /// `nodes`: cluster.nodes (empty: only nnodes is given).
  void WriteJob(const std::string& accelerator, const std::vector<std::string>& nodes = {}) {
    port_ = FreePort();
    TestJob job;
    job.name = "pf";
    job.command = "[\"false\"]";
    job.master_port = port_;
    job.accelerator = accelerator;
    job.nodes = nodes;
    dir_.Write("job.toml", job.Toml());
  }
  AgentProcess& Start(int node_rank, const std::map<std::string, std::string>& env = {}) {
    const std::string out = dir_.path() + "/agent-" + std::to_string(node_rank) + ".out";
    agents_.push_back(
        std::make_unique<AgentProcess>(std::vector<std::string>{"preflight", dir_.path() + "/job.toml",
                                                                "--node-rank", std::to_string(node_rank)},
                                       out, env));
    return *agents_.back();
  }
  std::string Describe() const { return DescribeAgents(agents_); }
  static bool MachineHasGpu() { return ::access("/dev/nvidia0", F_OK) == 0; }

  ScratchDir dir_;
  uint16_t port_ = 0;  // cluster.master_port
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

TEST_F(PreflightTest, CpuJobOnTwoNodesIsOk) {
  if (MachineHasGpu()) GTEST_SKIP() << "this machine has a GPU: the no-GPU report would differ";
  WriteJob("cpu");
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_EQ(node0.Wait(60s), 0) << Describe();
  ASSERT_EQ(node1.Wait(60s), 0) << Describe();
  const std::string out = node0.Output();
  EXPECT_THAT(out, HasSubstr("ddprun preflight: job \"pf\", 2 nodes x 2 ranks (world 4), accelerator cpu"));
  EXPECT_THAT(out, HasSubstr("no GPU on node 0 ("));
  EXPECT_THAT(out, HasSubstr("no GPU on node 1 ("));
  // The job's Python (job.command[0] is not one here, so python3) and its libraries, per node.
  EXPECT_THAT(out, HasSubstr("        Python 3."));
  EXPECT_THAT(out, HasSubstr("  versions agree across nodes\n"));
  EXPECT_THAT(out, HasSubstr("  n0       -            reachable   \n"));
  EXPECT_THAT(out, HasSubstr("  n1       reachable    -           \n"));
  EXPECT_THAT(out, HasSubstr("NCCL all-reduce: skipped (no GPU on nodes 0, 1)"));
  EXPECT_THAT(out, HasSubstr("\npreflight: OK\n"));
  // Only rank 0 speaks on the console, unprefixed; every rank still has its log file.
  EXPECT_THAT(out, Not(HasSubstr("[n0 r")));
  EXPECT_THAT(node1.Output(), Not(HasSubstr("preflight: OK")));
  // Each node writes its own run folder (logs/<job>/<time>-n<node>-<id>).
  std::vector<std::string> logs;
  std::string rank0_log;
  for (const auto& run : std::filesystem::directory_iterator(dir_.path() + "/logs/pf-preflight")) {
    if (run.is_symlink() || !run.is_directory()) continue;
    const std::string name = run.path().filename().string();
    if (name.find("-n0-") != std::string::npos)
      rank0_log = "logs/pf-preflight/" + name + "/attempt-0/rank-0.log";
    for (const auto& file : std::filesystem::directory_iterator(run.path() / "attempt-0")) {
      if (file.path().extension() == ".log") logs.push_back(file.path().filename().string());
    }
  }
  std::sort(logs.begin(), logs.end());
  EXPECT_EQ(logs, (std::vector<std::string>{"rank-0.log", "rank-1.log", "rank-2.log", "rank-3.log"}));
  EXPECT_THAT(dir_.Read(rank0_log), HasSubstr("preflight: OK"));
}

TEST_F(PreflightTest, GpuJobWithoutGpusFailsNamingTheNodes) {
  if (MachineHasGpu()) GTEST_SKIP() << "this machine has a GPU";
  WriteJob("gpu");
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_EQ(node0.Wait(60s), 1) << Describe();
  ASSERT_EQ(node1.Wait(60s), 1) << Describe();
  const std::string out = node0.Output();
  EXPECT_THAT(out, HasSubstr("preflight: 2 problems\n  - no GPU on node 0 ("));
  EXPECT_THAT(out, HasSubstr("  - no GPU on node 1 ("));
  EXPECT_THAT(out, HasSubstr("trainer.accelerator = \"gpu\" needs 2 GPUs there"));
  // The root-cause summary quotes rank 0's stderr on both nodes; node 0's console shows the
  // list once from rank 0 (not also in the report on stdout).
  EXPECT_THAT(node1.Output(), HasSubstr("| preflight: 2 problems\n"));
  // The verdict is the preflight's, not a training job's failure (issue 12).
  EXPECT_THAT(node1.Output(), HasSubstr("preflight FAILED: rank 0 ("));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("-preflight\" FAILED")));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("other running rank")));
  EXPECT_THAT(node1.Output(), HasSubstr("|   - no GPU on node 1"));
  EXPECT_THAT(out, HasSubstr("joining on 127.0.0.1:" + std::to_string(port_) + "...\n"));
}

TEST_F(PreflightTest, UnreachableTestPortIsReported) {
  if (MachineHasGpu()) GTEST_SKIP() << "this machine has a GPU";
  // cluster.nodes lists node 1 at the loopback broadcast address: both agents still meet on
  // 127.0.0.1 (master_addr), but node 0 probes node 1's test port there, and Linux answers a
  // TCP connect to a broadcast address with ENETUNREACH at once, on any machine, no root needed.
  // On one machine every local address reaches a wildcard listener, so "refused" cannot be
  // staged without a firewall (tests/e2e/netns_test.cc has those, as root).
  WriteJob("cpu", {"127.0.0.1", "127.255.255.255"});
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_EQ(node0.Wait(60s), 1) << Describe();
  node1.Wait(60s);
  const std::string out = node0.Output();
  EXPECT_THAT(out, HasSubstr("  n0       -            unreachable \n"));
  EXPECT_THAT(out, HasSubstr("  n1       reachable    -           \n"));
  EXPECT_THAT(out, HasSubstr("preflight: 1 problem\n  - node 0 (127.0.0.1) cannot reach node 1 "
                             "(127.255.255.255) over TCP (unreachable: 127.255.255.255:"));
  EXPECT_THAT(out, HasSubstr("fix: open TCP ports on node 1 for node 0: NCCL's socket transport "
                             "connects between all nodes"));
}

}  // namespace
}  // namespace ddprun::e2e
