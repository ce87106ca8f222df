// Shrinking in the simulator: the same coordinator and agents run a smaller round when a node
// is gone for good and cluster.min_nodes allows it; the worker model trains with the round's
// world, and the invariants check every rank of it.

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;

// SmallJob with 3 nodes of 2 workers; rounds may run with `min_nodes`.
std::string ShrinkJob(int min_nodes) {
  std::string job = SmallJob("", 3, 2, 2);
  const std::string cluster = "[cluster]\n";
  job.insert(job.find(cluster) + cluster.size(), "min_nodes = " + std::to_string(min_nodes) + "\n");
  return job;
}

TEST(ShrinkSimTest, ANodeGoneForGoodLeavesASmallerRoundThatFinishesTheJob) {
  const SimRun run = Simulate(ShrinkJob(2), {"node-crash@6m:node=1"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("round 1: starting 4 workers on 2 of the job's 3 nodes (cluster.min_nodes = 2): "
                        "without node 1 (node-0001)"));
  EXPECT_THAT(run.output, HasSubstr("node 2 (node-0002) plays node rank 1"));
  EXPECT_THAT(run.output, HasSubstr("training: round 1: all 4 ranks up; training from 5m00s of 20m00s"));
  // Two thirds of the ranks do the last 15 minutes of work in 22m30s: 5m40s + 22m30s.
  EXPECT_THAT(run.output, HasSubstr("20m00s of 20m00s kept (28m10s spent training)"));
  EXPECT_THAT(run.output, HasSubstr("the round ran with 2 of the job's 3 nodes"));
}

TEST(ShrinkSimTest, WithoutMinNodesTheSameCrashEndsTheJobAtTheRendezvousTimeout) {
  const SimRun run = Simulate(SmallJob("", 3, 2, 2), {"node-crash@6m:node=1"});
  EXPECT_EQ(run.result.exit_code, 3) << run.output;
  EXPECT_FALSE(run.result.violation) << run.output;
}

TEST(ShrinkSimTest, ANodeThatRebootsLateTakesPartAgainAtTheNextRestart) {
  // Node 1 is back 4 minutes later, while the smaller round trains; a worker exit at 15m
  // restarts the job, and round 2 has all three nodes again.
  const SimRun run =
      Simulate(ShrinkJob(2), {"node-crash@6m:node=1,reboot_after=4m", "worker-exit@15m:node=0,local_rank=1"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation) << run.output;
  EXPECT_THAT(run.output, HasSubstr("on 2 of the job's 3 nodes"));
  EXPECT_THAT(run.output, HasSubstr("round 1 runs without it, it takes part from the next round"));
  EXPECT_THAT(run.output, HasSubstr("training: round 2: all 6 ranks up"));
}

TEST(ShrinkSimTest, AHostWhoseRoundsKeepFailingIsQuarantinedAndTheJobRunsWithoutIt) {
  std::string job = ShrinkJob(2) + "[quarantine]\nfailures = 2\ncooldown = \"2h\"\n";
  job.replace(job.find("max_restarts = 2"), 16, "max_restarts = 4");
  const SimRun run =
      Simulate(job, {"worker-exit@3m:node=2,local_rank=0", "worker-exit@8m:node=2,local_rank=1"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("quarantine: host node-0002 (node 2 (node-0002)) sits out for 2h00m: 2 rounds "
                        "failed because of it"));
  EXPECT_THAT(run.output,
              HasSubstr("round 2: starting 4 workers on 2 of the job's 3 nodes (cluster.min_nodes = 2): "
                        "without node 2 (node-0002): its host is quarantined"));
  EXPECT_THAT(run.output, HasSubstr("quarantined: node-0002 for "));
}

}  // namespace
}  // namespace ddprun::testing
