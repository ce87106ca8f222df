// Fault scenarios through the real agents and coordinator: what the user reads, and the outcome.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ScenarioTest, CleanJobFinishesWithExitZero) {
  const SimRun run = Simulate(SmallJob());
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output, HasSubstr("coordinator: round 0: all 2 nodes joined; starting 4 workers"));
  EXPECT_THAT(run.output, HasSubstr("job \"t\" succeeded: all 4 ranks on 2 nodes exited 0 in round 0"));
  EXPECT_THAT(run.output, HasSubstr("nodes 0-1: exit 0"));
  EXPECT_EQ(run.result.stats.rounds_started, 1);
  EXPECT_EQ(run.result.stats.restarts_used, 0);
  EXPECT_EQ(run.result.stats.lost_ns, 0);
  // Training starts once every worker is up (worker_startup = 20s +-10%).
  ASSERT_TRUE(run.result.stats.first_training_ns);
  EXPECT_GE(*run.result.stats.first_training_ns, Seconds(18).count());
  EXPECT_LE(*run.result.stats.first_training_ns, Seconds(23).count());
  EXPECT_EQ(run.result.stats.useful_ns, Minutes(20).count());
}

TEST(ScenarioTest, WorkerExitWithRestartsLeftRestartsAndFinishes) {
  const SimRun run = Simulate(SmallJob(), {"worker-exit@7m:node=1,local_rank=1,exit_code=3"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("node 1: rank 3 (local rank 1, pid"));
  EXPECT_THAT(run.output, HasSubstr("coordinator: round 0 failed: rank 3 (node 1 (node-0001), local "
                                    "rank 1) exited with code 3; stopping every worker on every node"));
  EXPECT_THAT(run.output, HasSubstr("restart 1 of 2 in 10s"));
  EXPECT_THAT(run.output,
              HasSubstr("succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)"));
  EXPECT_EQ(run.result.stats.rounds_started, 2);
  EXPECT_EQ(run.result.stats.restarts_used, 1);
  // 6m40s of training at the failure: the checkpoint at 5m survives, 1m40s is lost (+-startup).
  EXPECT_GT(run.result.stats.lost_ns, Minutes(1).count());
  EXPECT_LT(run.result.stats.lost_ns, Minutes(2).count());
}

// Issue 37 (the simulator's optimism): Lightning's SIGTERM handler only sets a flag, which its
// loop reads after a step that waits on the failed rank: its workers stay until SIGKILL at
// stop_grace. A plain script takes SIGTERM's default action and is gone at once (a bare Python
// process is reaped about 1 ms after it here).
TEST(ScenarioTest, LightningWorkersStayUntilSigkillAndPlainOnesLeaveOnSigterm) {
  const auto stop_time = [](const SimRun& run) {
    const std::string failed = "coordinator: round 0 failed";
    const std::string stopped = "coordinator: all workers stopped";
    const size_t a = run.output.find(failed);
    const size_t b = run.output.find(stopped);
    EXPECT_NE(a, std::string::npos) << run.output;
    EXPECT_NE(b, std::string::npos) << run.output;
    const auto at = [&](size_t pos) {
      const size_t open = run.output.rfind('[', pos);
      const std::string stamp = run.output.substr(open + 1, run.output.find(']', open) - open - 1);
      const size_t m = stamp.find('m');
      return std::stod(stamp.substr(0, m)) * 60 + std::stod(stamp.substr(m + 1));
    };
    return at(b) - at(a);
  };
  const std::vector<std::string> fault = {"worker-exit@7m:node=1,local_rank=1,exit_code=3"};
  const SimRun lightning = Simulate(SmallJob(), fault);  // [trainer]: simulate.sigterm = "auto"
  EXPECT_EQ(lightning.result.exit_code, 0) << lightning.output;
  EXPECT_THAT(lightning.output,
              HasSubstr("node 0: 2 workers still running 30s after SIGTERM; sending SIGKILL"));
  EXPECT_THAT(lightning.output,
              HasSubstr("node 1: 1 worker still running 30s after SIGTERM; sending SIGKILL"));
  EXPECT_GE(stop_time(lightning), 30.0);
  EXPECT_LT(stop_time(lightning), 31.0);
  const SimRun plain = Simulate(SmallJob("sigterm = \"exits\""), fault);
  EXPECT_EQ(plain.result.exit_code, 0) << plain.output;
  EXPECT_THAT(plain.output, Not(HasSubstr("after SIGTERM; sending SIGKILL")));
  EXPECT_LT(stop_time(plain), 0.6);
  EXPECT_FALSE(lightning.result.violation);
  EXPECT_FALSE(plain.result.violation);
}

TEST(ScenarioTest, BudgetExhaustedExitsOneNamingTheRank) {
  const SimRun run =
      Simulate(SmallJob("", 2, 2, /*max_restarts=*/0), {"worker-exit@7m:node=1,local_rank=0,exit_code=3"});
  EXPECT_EQ(run.result.exit_code, 1) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output, HasSubstr("job \"t\" FAILED in round 0 (restart.max_restarts = 0)"));
  EXPECT_THAT(run.output, HasSubstr("root cause (first failure anywhere in the job): rank 2 (node 1 "
                                    "(node-0001), local rank 0) exited with code 3"));
  EXPECT_THAT(run.output, HasSubstr("simulated failure (fault worker-exit, exit code 3)"));
  EXPECT_THAT(run.output, HasSubstr("nodes 0-1: exit 1"));
}

TEST(ScenarioTest, NodeCrashAndRebootRestartsFromTheCheckpoint) {
  const SimRun run = Simulate(SmallJob(), {"node-crash@6m:node=1,reboot_after=2m"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("node 1: crashed (fault node-crash); reboots in 2m"));
  EXPECT_THAT(run.output, HasSubstr("round 0 failed: node 1 (node-0001) was lost: silent for"));
  EXPECT_THAT(run.output, HasSubstr("node 1: rebooted; the agent starts again as node-0001"));
  EXPECT_THAT(run.output, HasSubstr("training: round 1: all 4 ranks up; training from 5m00s of 20m00s"));
  EXPECT_EQ(run.result.stats.node_crashes, 1);
  EXPECT_EQ(run.result.stats.rounds_started, 2);
}

TEST(ScenarioTest, CoordinatorNodeCrashAndRebootFinishes) {
  // Regression: the rebooted coordinator numbers rounds from 0 again; surviving agents used to
  // drop its StartRound as stale and the job hung.
  const SimRun run = Simulate(SmallJob(), {"node-crash@10m:node=0,reboot_after=41s"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output, HasSubstr("node 1: lost the coordinator at 127.0.0.1:29500"));
}

TEST(ScenarioTest, PartitionAndHeal) {
  const SimRun run = Simulate(SmallJob(), {"partition@6m:node=1,duration=40s"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("sim: network: partition: node 1 cut off from node 0 for 40s"));
  EXPECT_THAT(run.output, HasSubstr("node 1: lost the coordinator at 127.0.0.1:29500 (silent for"));
  EXPECT_THAT(run.output, HasSubstr("sim: network: partition of node 1 healed"));
  EXPECT_GE(run.result.stats.rounds_started, 2);
}

TEST(ScenarioTest, MasterPortBlockedPastTheRendezvousTimeoutExitsThree) {
  const SimRun run = Simulate(SmallJob("", 2, 2, 2, "2m"), {"master-port-blocked@0s:duration=10m"});
  EXPECT_EQ(run.result.exit_code, 3) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output, HasSubstr("connection to 127.0.0.1:29500 timed out: a firewall drops TCP port "
                                    "29500 or the host is down"));
  EXPECT_THAT(run.output, HasSubstr("rendezvous failed: 1/2 nodes joined within timeouts.rendezvous = 2m; "
                                    "never joined: node 1"));
  EXPECT_THAT(run.output, HasSubstr("nodes 0-1: exit 3"));
}

TEST(ScenarioTest, DifferentJobFileIsRefusedWithTheFieldDifference) {
  const SimRun run = Simulate(SmallJob("", 2, 2, 2, "2m"), {"job-file-differs@0s:node=1"});
  EXPECT_EQ(run.result.exit_code, 3) << run.output;
  EXPECT_THAT(run.output, HasSubstr("node 1 (host node-0001) runs a different job file than node 0:"));
  EXPECT_THAT(run.output, HasSubstr("cluster.nproc_per_node: node 1 has 1, node 0 has 2"));
  EXPECT_THAT(run.output, HasSubstr("node 1: agent exited with code 3"));
}

TEST(ScenarioTest, DuplicateNodeRankIsRefused) {
  const SimRun run = Simulate(SmallJob(), {"duplicate-node-rank@2m:node=1"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("a second agent starts on node-0002 and claims node rank 1"));
  EXPECT_THAT(run.output, HasSubstr("node rank 1 is claimed twice: by host node-0001 (already joined) and "
                                    "by host node-0002"));
  EXPECT_THAT(run.output, HasSubstr("extra agent for node 1 on node-0002: exit 3"));
}

TEST(ScenarioTest, HungWorkerIgnoresSigtermAndIsKilled) {
  const SimRun run = Simulate(SmallJob(), {"worker-hang@5m:node=1,local_rank=0"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("rank 2 (local rank 0, pid"));
  EXPECT_THAT(run.output, HasSubstr("the NCCL watchdog times out after 10m"));
  EXPECT_THAT(run.output, HasSubstr("node 1: 1 worker still running 30s after SIGTERM; sending SIGKILL"));
  EXPECT_EQ(run.result.stats.rounds_started, 2);
}

TEST(ScenarioTest, HungAgentIsDroppedAndItsWorkersDoNotOutliveTheRound) {
  const SimRun run = Simulate(SmallJob(), {"agent-hang@6m:node=1,duration=1m"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output, HasSubstr("node 1: agent hangs for 1m (its workers keep running)"));
  EXPECT_THAT(run.output, HasSubstr("round 0 failed: node 1 (node-0001) was lost: silent for"));
  EXPECT_THAT(run.output, HasSubstr("node 1: agent resumes"));
}

TEST(ScenarioTest, SlowJoinerIsWaitedFor) {
  const SimRun run = Simulate(SmallJob(), {"slow-joiner@0s:node=1,duration=1m"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("node 0: 1/2 nodes joined; waiting for node 1"));
  ASSERT_TRUE(run.result.stats.first_training_ns);
  EXPECT_GT(*run.result.stats.first_training_ns, Minutes(1).count());
}

TEST(ScenarioTest, RandomFailuresFromRatesAreInjected) {
  const SimRun run =
      Simulate(SmallJob("node_mtbf = \"40m\"\nworker_mtbf = \"40m\"\nmax_time = \"2d\"", 2, 2, 50));
  EXPECT_FALSE(run.result.violation) << run.output;
  EXPECT_GT(run.result.stats.faults_injected, 0);
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
}

TEST(ScenarioTest, StoreClientsReachTheirRoundsStoreThroughTheRelay) {
  // 2 nodes x 2: ranks 1..3 dial master_port and node 0's relay carries them to rank 0's
  // store, in each of the two rounds.
  const SimRun run = Simulate(SmallJob(), {"worker-exit@7m:node=1,local_rank=1,exit_code=3"});
  EXPECT_FALSE(run.result.violation) << run.output;
  EXPECT_EQ(run.result.stats.store_clients, 6u);
}

TEST(ScenarioTest, StoreClientsWaitOutABlockedPort) {
  // Blocked from 15s to 45s: the workers come up at about 20s and keep dialling until the
  // port opens; the agents' own connections are established and keep working.
  const SimRun run = Simulate(SmallJob(), {"master-port-blocked@15s:duration=30s"});
  EXPECT_FALSE(run.result.violation) << run.output;
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_EQ(run.result.stats.store_clients, 3u);
}

TEST(ScenarioTest, WithAStorePortThereIsNoRelay) {
  const SimRun run =
      Simulate(SmallJob().replace(SmallJob().find("nproc_per_node"), 0, "store_port = 29400\n"));
  EXPECT_FALSE(run.result.violation) << run.output;
  EXPECT_EQ(run.result.stats.store_clients, 3u);
}

TEST(ScenarioTest, SummaryGroupsIdenticalOutcomes) {
  const SimRun run = Simulate(SmallJob("", 4, 1, 2));
  EXPECT_THAT(run.output, HasSubstr("nodes 0-3: exit 0"));
  EXPECT_EQ(CountOf(run.output, "summary:\n"), 1) << "the job summary is printed once";
  EXPECT_EQ(CountOf(run.output, "printed the same summary as"), 3);
  EXPECT_THAT(run.output, Not(HasSubstr("INVARIANT")));
}

// Issue 26: every rank of the round hangs for good and the job has no timeouts.progress:
// nothing can end the round, and the simulator does not call that a liveness failure.
TEST(ScenarioTest, ARoundWhoseRanksAllHangForGoodWithoutProgressOwesNoEnd) {
  const SimRun run = Simulate(SmallJob("", 3, 1),
                              {"worker-hang@5m:node=0,local_rank=0", "worker-hang@5m:node=1,local_rank=0",
                               "worker-hang@5m:node=2,local_rank=0"});
  EXPECT_FALSE(run.result.violation) << *run.result.violation << run.output;
  EXPECT_TRUE(run.result.stuck_for_good);
  EXPECT_NE(run.output.find("outcome:           the job never ends: every rank of its round hangs for "
                            "good and nothing watches progress (set timeouts.progress)\n"),
            std::string::npos)
      << run.output;
  // One rank hangs, the others time out in their collective: an end is owed, and it comes.
  const SimRun one = Simulate(SmallJob("", 3, 1), {"worker-hang@5m:node=1,local_rank=0"});
  EXPECT_FALSE(one.result.violation) << *one.result.violation;
  EXPECT_EQ(one.result.exit_code, 0) << one.output;
}

// Issue 26: restart.never_on ends the job at once when a worker exits 2, with restarts left.
TEST(ScenarioTest, NeverOnEndsTheJobWithRestartsLeftWithoutALivenessFailure) {
  const SimRun run =
      Simulate(SmallJob("", 3, 1).replace(SmallJob("", 3, 1).find("backoff"), 0, "never_on = [\"exit:2\"]\n"),
               {"worker-exit@5m:node=1,local_rank=0,exit_code=2"});
  EXPECT_FALSE(run.result.violation) << *run.result.violation << run.output;
  EXPECT_EQ(run.result.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("restart.never_on has \"exit:2\""), std::string::npos) << run.output;
}

}  // namespace
}  // namespace ddprun::testing
