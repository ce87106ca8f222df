// A real PyTorch DDP job (gloo on CPU) under ddprun: 2 nodes x 2 processes on 127.0.0.1,
// through the store relay, with a forced failure and a restart.

#include <cstdlib>
#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/harness.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(TorchTest, DdpTrainsThroughTheRelayAndAgainAfterAForcedRestart) {
  DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing);
  ScratchDir dir;
  const uint16_t port = FreePort();
  dir.Write("results/.keep", "");
  // The job runs the example script from the repository, as users would.
  const std::string job = dir.Write("job.toml", R"(version = 1
[job]
name = "torch-e2e"
command = ["/usr/bin/python3", ")" + std::string(DDPRUN_SOURCE_DIR) + R"(/examples/ddp_train.py",
           "--steps", "6", "--fail-rank", "3", "--fail-attempt", "0", "--result-dir", "results"]
env = { GLOO_SOCKET_IFNAME = "lo" }
[cluster]
nnodes = 2
master_addr = "127.0.0.1"
master_port = )" + std::to_string(port) + R"(
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 2
[restart]
max_restarts = 1
backoff = "0s"
[timeouts]
rendezvous = "60s"
heartbeat = "1s"
stop_grace = "10s"
)");
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/node1.out");
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/node0.out");
  const auto code0 = node0.Wait(240s);
  const auto code1 = node1.Wait(30s);
  const std::string outputs = node0.Output() + "\n---- node 1 ----\n" + node1.Output();
  ASSERT_EQ(code0, 0) << outputs;
  ASSERT_EQ(code1, 0) << outputs;

  // Round 0 failed on rank 3 with a Python exception; every node quoted it from the error file.
  for (const std::string& out : {node0.Output(), node1.Output()}) {
    EXPECT_THAT(out, HasSubstr("round 0 failed: rank 3 (node 1"));
    EXPECT_THAT(out, HasSubstr("RuntimeError: rank 3 fails on purpose in attempt 0"));
    EXPECT_THAT(out, HasSubstr("succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)"));
  }
  // Round 1 trained on every rank: the all_reduce is right and DDP kept the replicas equal.
  nlohmann::json reference;
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::string name = "results/rank-" + std::to_string(rank) + "-attempt-1.json";
    ASSERT_TRUE(dir.Exists(name)) << outputs;
    const auto result = nlohmann::json::parse(dir.Read(name));
    EXPECT_EQ(result["world"], 4);
    EXPECT_EQ(result["attempt"], 1);
    EXPECT_EQ(result["all_reduce"], 10.0);
    if (rank == 0) {
      reference = result["weights"];
      EXPECT_NE(result["master_port"], std::to_string(port)) << "rank 0 hosts the store itself";
    } else {
      EXPECT_EQ(result["weights"], reference) << "DDP replicas diverged";
      EXPECT_EQ(result["master_port"], std::to_string(port)) << "others go through the relay";
    }
  }
  EXPECT_FALSE(dir.Exists("results/rank-0-attempt-0.json")) << "round 0 was stopped before training ended";
}

}  // namespace
}  // namespace ddprun::e2e
