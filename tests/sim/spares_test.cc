// Hot spares in the simulator: spare agents join and wait, take the node rank of a node that
// never returns, and the output says which host replaced which; faults can take hosts away for
// good (node-crash without reboot_after, simulate.node_never_returns_percent) and land on spares.
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schema/loader.h"
#include "sim/swarm.h"
#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// SmallJob (2 nodes x 2 workers, rendezvous 5m) with `spares` spares in [cluster] and `timeouts`
// lines added to [timeouts].
std::string SpareJob(int spares, std::string_view extra = "", std::string_view timeouts = "") {
  std::string job = SmallJob(extra);
  if (spares > 0) {
    const std::string nproc = "nproc_per_node = 2\n";
    job.replace(job.find(nproc), nproc.size(), nproc + "spares = " + std::to_string(spares) + "\n");
  }
  if (!timeouts.empty()) {
    const std::string section = "[timeouts]\n";
    job.replace(job.find(section), section.size(), section + std::string(timeouts) + "\n");
  }
  return job;
}

TEST(SparesTest, ASpareJoinsWaitsAndExitsWithTheJob) {
  const SimRun run = Simulate(SpareJob(1), {}, std::nullopt, /*record=*/true);
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output,
              HasSubstr("spare 0: spare 0 joined; it waits to take the node rank of a node that is lost"));
  EXPECT_THAT(run.output, HasSubstr("simulation summary: job \"t\", 2 nodes x 2 workers, 1 spare, seed 3"));
  EXPECT_THAT(run.output, HasSubstr("nodes 0-1: exit 0"));
  EXPECT_THAT(run.output, HasSubstr("spare 0 (node-0002): exit 0, never needed"));
  EXPECT_THAT(run.output, Not(HasSubstr("replaced:")));
  ASSERT_EQ(run.result.nodes.size(), 3u);
  EXPECT_TRUE(run.result.nodes[2].spare);
  EXPECT_EQ(run.result.nodes[2].node_rank, 2);  // its agent's --node-rank: nnodes + 0
  EXPECT_EQ(run.result.nodes[2].plays, -1);
  // Its own timeline row, labelled as a spare, waiting in the rendezvous until the end.
  ASSERT_EQ(run.timeline.labels.size(), 3u);
  EXPECT_EQ(run.timeline.labels[2], "spare 0 (node-0002)");
  EXPECT_EQ(run.result.stats.useful_ns, Minutes(20).count());
}

TEST(SparesTest, ASpareTakesTheRankOfANodeThatNeverReturns) {
  const SimRun run = Simulate(SpareJob(1), {"node-crash@5m:node=1"}, std::nullopt, /*record=*/true);
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation) << *run.result.violation;
  EXPECT_THAT(run.output, HasSubstr("node 1: crashed (fault node-crash); stays down"));
  // The coordinator's decision, once timeouts.replace (1m) has passed ...
  EXPECT_THAT(run.output, HasSubstr("coordinator: spare 0 (node-0002) takes node rank 1 in place of node 1 "
                                    "(node-0001), away for 1m"));
  // ... the agent's, and the simulator's line naming both hosts.
  EXPECT_THAT(run.output, HasSubstr("this agent (spare 0) takes node rank 1 from now on"));
  EXPECT_THAT(run.output,
              HasSubstr("spare 0: spare 0 (node-0002) replaces node 1 (node-0001) as node rank 1"));
  // The spare's workers are node 1's ranks 2 and 3.
  EXPECT_THAT(run.output,
              HasSubstr("succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)"));
  EXPECT_THAT(run.output, HasSubstr("spare 0 (node-0002): exit 0, played node rank 1"));
  EXPECT_THAT(run.output, HasSubstr("node 1: down (crashed)"));
  ASSERT_EQ(run.result.replacements.size(), 1u);
  EXPECT_THAT(run.result.replacements[0],
              HasSubstr("spare 0 (node-0002) replaces node 1 (node-0001) as node rank 1"));
  EXPECT_THAT(run.output, HasSubstr("  replaced:          at "));
  EXPECT_EQ(run.result.nodes[2].plays, 1);
  EXPECT_EQ(run.result.stats.useful_ns, Minutes(20).count());
  // A mark on both rows: the spare's and the lost node's.
  int on_spare = 0;
  int on_lost = 0;
  for (const sim::Mark& mark : run.timeline.marks) {
    if (mark.text.find("replaces node 1") == std::string::npos) continue;
    on_spare += mark.node == 2 ? 1 : 0;
    on_lost += mark.node == 1 ? 1 : 0;
  }
  EXPECT_EQ(on_spare, 1);
  EXPECT_EQ(on_lost, 1);
}

TEST(SparesTest, WithoutASpareTheSameCrashEndsTheJobWithExitThree) {
  const SimRun run = Simulate(SpareJob(0), {"node-crash@5m:node=1"});
  EXPECT_EQ(run.result.exit_code, 3) << run.output;
  EXPECT_FALSE(run.result.violation) << *run.result.violation;
  EXPECT_THAT(run.output, Not(HasSubstr("replaces")));
  EXPECT_TRUE(run.result.replacements.empty());
}

TEST(SparesTest, ReplacementWaitsForTimeoutsReplace) {
  const SimRun fast = Simulate(SpareJob(1, "", "replace = \"20s\""), {"node-crash@5m:node=1"});
  const SimRun slow = Simulate(SpareJob(1, "", "replace = \"3m\""), {"node-crash@5m:node=1"});
  EXPECT_EQ(fast.result.exit_code, 0) << fast.output;
  EXPECT_EQ(slow.result.exit_code, 0) << slow.output;
  EXPECT_THAT(fast.output, HasSubstr("(more than timeouts.replace = 20s)"));
  EXPECT_THAT(slow.output, HasSubstr("(more than timeouts.replace = 3m)"));
  // The later replacement costs wall time: the job ends later.
  EXPECT_GT(slow.result.stats.end_ns, fast.result.stats.end_ns + Minutes(2).count());
}

TEST(SparesTest, DeterministicBySeed) {
  const SimRun a = Simulate(SpareJob(2, "worker_mtbf = \"2h\"\n"), {"node-crash@5m:node=1"}, 11);
  const SimRun b = Simulate(SpareJob(2, "worker_mtbf = \"2h\"\n"), {"node-crash@5m:node=1"}, 11);
  EXPECT_EQ(a.output, b.output);
  EXPECT_FALSE(a.result.violation) << *a.result.violation;
  EXPECT_THAT(a.output, HasSubstr("spare 0 (node-0002) replaces node 1 (node-0001) as node rank 1"));
}

TEST(SparesTest, AFaultOnASpareAddressesItByNodeIndex) {
  // node = nnodes + i is spare i: spare 0 crashes for good, then node 1: no spare is left.
  const SimRun run = Simulate(SpareJob(1), {"node-crash@1m:node=2", "node-crash@5m:node=1"});
  EXPECT_THAT(run.output, HasSubstr("spare 0: crashed (fault node-crash); stays down"));
  EXPECT_EQ(run.result.exit_code, 3) << run.output;
  EXPECT_FALSE(run.result.violation) << *run.result.violation;
  EXPECT_TRUE(run.result.replacements.empty());
  // With two spares the second one steps in.
  const SimRun two = Simulate(SpareJob(2), {"node-crash@1m:node=2", "node-crash@5m:node=1"});
  EXPECT_EQ(two.result.exit_code, 0) << two.output;
  EXPECT_THAT(two.output, HasSubstr("spare 1 (node-0003) replaces node 1 (node-0001) as node rank 1"));
}

TEST(SparesTest, WorkerFaultsOnASpareHitItsWorkersOnceItPlays) {
  // After the spare took node rank 1, a worker-exit on node index 2 hits the spare's rank 2.
  const SimRun run = Simulate(SpareJob(1), {"node-crash@5m:node=1", "worker-exit@10m:node=2,local_rank=0"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation) << *run.result.violation;
  EXPECT_THAT(run.output,
              ::testing::ContainsRegex("spare 0: rank 2 \\(local rank 0, pid [0-9]+\\) exits with code 1 "
                                       "\\(fault worker-exit\\)"));
  // The coordinator names the spare as the log's prefix does, with its host and the node rank it
  // plays, and so does the spare's own line.
  EXPECT_THAT(
      run.output,
      HasSubstr(
          "round 1 failed: rank 2 (spare 0 (node-0002, node rank 1), local rank 0) exited with code 1"));
  EXPECT_THAT(run.output, HasSubstr("spare 0: round 2: all 2 workers of node rank 1 exited 0"));
  EXPECT_EQ(run.result.stats.restarts_used, 2);
}

TEST(SparesTest, RandomWorkerFailuresHitTheSpareThatPlaysTheRank) {
  // simulate.worker_mtbf draws a global rank; once the spare plays node rank 1, ranks 2 and 3
  // are its workers (node 1's host is down and has none).
  const std::string job = SpareJob(1, "worker_mtbf = \"1h\"\n");
  int on_spare = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const SimRun run = Simulate(job, {"node-crash@5m:node=1"}, seed);
    EXPECT_FALSE(run.result.violation) << "seed " << seed << ": " << *run.result.violation;
    std::istringstream lines(run.output);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("] spare 0: rank ") != std::string::npos &&
          line.find("exits with code 1 (random failure (simulate.worker_mtbf))") != std::string::npos) {
        ++on_spare;
      }
    }
  }
  EXPECT_GT(on_spare, 0);
}

TEST(SparesTest, RandomCrashesCanLeaveHostsDownForGood) {
  // Every random crash is for good: hosts never return, and the spares take their ranks.
  const std::string job = SpareJob(2, "node_mtbf = \"6h\"\nnode_never_returns_percent = 100\n");
  int replaced = 0;
  int runs_with_loss = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const SimRun run = Simulate(job, {}, seed);
    EXPECT_FALSE(run.result.violation) << "seed " << seed << ": " << *run.result.violation;
    if (run.output.find("stays down") != std::string::npos) ++runs_with_loss;
    EXPECT_THAT(run.output, Not(HasSubstr("reboots in"))) << "seed " << seed;
    replaced += static_cast<int>(run.result.replacements.size());
  }
  EXPECT_GT(runs_with_loss, 0);
  EXPECT_GT(replaced, 0);
  // Without the share, random crashes reboot.
  const SimRun back = Simulate(SpareJob(2, "node_mtbf = \"6h\"\n"), {}, 1);
  EXPECT_THAT(back.output, Not(HasSubstr("stays down")));
}

TEST(SparesTest, SwarmOfASpareJobFindsNoViolation) {
  LoadResult loaded =
      ParseJobText(SpareJob(2, "node_mtbf = \"12h\"\nnode_never_returns_percent = 50\n"), "job.toml");
  ASSERT_TRUE(loaded.spec);
  sim::SimOptions options;
  options.seed = 500;
  options.quiet = true;
  std::ostringstream out;
  const sim::SwarmResult swarm = sim::RunSwarm(*loaded.spec, options, 40, out);
  EXPECT_EQ(swarm.failures, 0) << out.str();
  EXPECT_THAT(out.str(), HasSubstr("swarm goodput: mean "));
}

TEST(SparesTest, SwarmFaultsLandOnSparesToo) {
  LoadResult loaded = ParseJobText(SpareJob(2), "job.toml");
  ASSERT_TRUE(loaded.spec);
  bool on_spare = false;
  for (uint64_t seed = 1; seed <= 200 && !on_spare; ++seed) {
    for (const FaultSpec& fault : sim::DrawSwarmFaults(*loaded.spec, seed)) {
      EXPECT_LT(fault.node, 4);
      on_spare = on_spare || fault.node >= 2;
    }
  }
  EXPECT_TRUE(on_spare);
}

}  // namespace
}  // namespace ddprun::testing
