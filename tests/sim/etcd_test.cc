// rendezvous.backend = "etcd" through the whole simulator: the coordinator's host lost for good,
// cut off from etcd, etcd without a quorum, and the swarm on bench/swarm-etcd.toml.
#include <fstream>
#include <set>
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

// 3 nodes x 2 workers and a spare; the role and the state in a 3-member etcd; no random faults.
// With this seed node 0's agent wins the first campaign (FirstHolder checks it).
std::string EtcdJob() {
  return R"(version = 1
[job]
name = "e"
command = ["python", "train.py"]
[cluster]
nodes = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
spares = ["10.0.0.4"]
nproc_per_node = 2
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 3
[rendezvous]
backend = "etcd"
endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"]
lease = "5s"
[restart]
max_restarts = 3
backoff = "10s"
[timeouts]
rendezvous = "5m"
heartbeat = "2s"
replace = "1m"
[simulate]
seed = 2
train_time = "20m"
checkpoint_every = "5m"
worker_startup = "20s"
)";
}

constexpr char kNode0Leads[] =
    "coordinator: this agent holds the coordinator role now (etcd key /ddprun/e/coordinator, "
    "rendezvous.lease = 5s); it plays node rank 0, and 10.0.0.1 is every round's MASTER_ADDR\n";

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(EtcdTest, TheFirstCoordinatorsHostDiesForGoodAndAnotherAgentFinishesTheJob) {
  const SimRun run = Simulate(EtcdJob(), {"node-crash@5m:node=0"});
  ASSERT_FALSE(run.result.violation) << *run.result.violation << "\n" << run.output;
  ASSERT_THAT(run.output, HasSubstr(kNode0Leads));
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  // Node 0 held the role first; its lease ends and another agent takes the job over with the
  // round numbers and the budget where node 0 left them: the lost round costs one restart,
  // counted once.
  EXPECT_THAT(run.output, HasSubstr("coordinator: taking over the job from node 0 (10.0.0.1): round 1 next, "
                                    "0 of 3 restarts used"));
  EXPECT_THAT(run.output, HasSubstr("coordinator: round 0 failed: the coordinator (node 0 (10.0.0.1)) was "
                                    "lost while round 0 ran; restart 1 of 3"));
  EXPECT_EQ(run.result.stats.restarts_used, 1);
  EXPECT_EQ(run.result.stats.rounds_started, 2);
  EXPECT_THAT(run.output, HasSubstr("rounds:            2 started, 1 interrupted; restarts used: 1 of 3"));
  // The new holder plays node rank 0: rank 0's store and MASTER_ADDR are on its host, and the
  // other ranks' store clients reach it there (they could not reach node 0's dead host).
  ASSERT_EQ(run.result.replacements.size(), 1u) << run.output;
  const std::string& replaced = run.result.replacements.front();
  EXPECT_THAT(replaced, HasSubstr("replaces node 0 (10.0.0.1) as node rank 0"));
  const size_t host_at = replaced.find("(10.0.0.");
  ASSERT_NE(host_at, std::string::npos);
  const std::string new_host = replaced.substr(host_at + 1, 8);
  EXPECT_NE(new_host, "10.0.0.1");
  EXPECT_THAT(run.output,
              HasSubstr("it plays node rank 0, and " + new_host + " is every round's MASTER_ADDR"));
  EXPECT_GT(run.result.stats.store_clients, 5u);
  EXPECT_EQ(run.result.nodes[0].state, sim::NodeOutcome::State::kDown);
  for (size_t i = 1; i < run.result.nodes.size(); ++i) {
    EXPECT_EQ(run.result.nodes[i].state, sim::NodeOutcome::State::kExited);
    EXPECT_EQ(run.result.nodes[i].exit_code, 0);
  }
  // One verdict, said once by each agent.
  EXPECT_EQ(CountOf(run.output, "summary:\n"), 1) << run.output;
}

TEST(EtcdTest, TheCoordinatorCutOffFromEtcdStepsDownAndAnotherTakesOver) {
  const SimRun run = Simulate(EtcdJob(), {"etcd-partition@5m:node=0,duration=2m"});
  ASSERT_FALSE(run.result.violation) << *run.result.violation << "\n" << run.output;
  ASSERT_THAT(run.output, HasSubstr(kNode0Leads));
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  // It cannot renew its lease: it lets the role go before etcd can end the lease, and closes
  // its agents' connections, so every worker of the round stops (its own node's too), while it
  // still reaches the other agents.
  EXPECT_THAT(run.output, HasSubstr("node 0: etcd: this host is cut off from etcd for 2m"));
  EXPECT_THAT(run.output, HasSubstr("coordinator: this agent no longer holds the coordinator role: it could "
                                    "not renew its etcd lease (rendezvous.lease = 5s) in time; closing its "
                                    "agents' connections"));
  EXPECT_THAT(run.output, HasSubstr("node 0: lost the coordinator at 10.0.0.1:29500 (connection closed by "
                                    "the peer); stopping this node's workers"));
  EXPECT_THAT(run.output, HasSubstr("coordinator: taking over the job from node 0 (10.0.0.1): round 1 next"));
  EXPECT_EQ(run.result.stats.restarts_used, 1);
  // Node 0 cannot find the new holder while it is cut off; it rejoins after the heal.
  EXPECT_THAT(run.output, HasSubstr("node 0: cannot find the coordinator in etcd"));
  for (const sim::NodeOutcome& node : run.result.nodes) {
    EXPECT_EQ(node.state, sim::NodeOutcome::State::kExited);
    EXPECT_EQ(node.exit_code, 0);
  }
}

TEST(EtcdTest, WithoutAQuorumTheCoordinatorStepsDownAndTheJobWaitsForEtcd) {
  // Two of three members down for a minute: no request is served. The coordinator cannot renew
  // its lease and steps down (its workers stop); the agents cannot look up a holder and retry
  // for timeouts.rendezvous; once a member returns and a leader is elected, the old role key
  // lives one more lease (a new leader renews every lease) and then another agent takes over.
  const SimRun run = Simulate(
      EtcdJob(), {"etcd-member-down@5m:node=0,duration=1m", "etcd-member-down@5m:node=1,duration=2m"});
  ASSERT_FALSE(run.result.violation) << *run.result.violation << "\n" << run.output;
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("sim: etcd: no quorum; requests wait, then fail"));
  EXPECT_THAT(run.output, HasSubstr("it could not renew its etcd lease (rendezvous.lease = 5s) in time"));
  EXPECT_THAT(run.output, HasSubstr("cannot find the coordinator in etcd (http://10.0.0.1:2379, "
                                    "http://10.0.0.2:2379, http://10.0.0.3:2379): no etcd endpoint "
                                    "answered within 3s"));
  EXPECT_THAT(run.output, HasSubstr("sim: etcd: a leader is elected; requests are served again"));
  const size_t elected = run.output.find("sim: etcd: a leader is elected");
  const size_t taken = run.output.find("coordinator: taking over the job from node 0 (10.0.0.1)");
  ASSERT_NE(taken, std::string::npos) << run.output;
  EXPECT_LT(elected, taken);
  EXPECT_EQ(run.result.stats.restarts_used, 1);
}

TEST(EtcdTest, OneMemberDownOrALostLeaderChangesNothing) {
  const SimRun run = Simulate(EtcdJob(), {"etcd-member-down@5m:node=0,duration=3m", "etcd-leader-lost@10m"});
  ASSERT_FALSE(run.result.violation) << *run.result.violation << "\n" << run.output;
  EXPECT_EQ(run.result.exit_code, 0);
  EXPECT_EQ(run.result.stats.restarts_used, 0);
  EXPECT_EQ(run.result.stats.rounds_started, 1);
  EXPECT_THAT(run.output, Not(HasSubstr("no longer holds the coordinator role")));
}

TEST(EtcdTest, OneSeedGivesTheSameRunTwice) {
  const std::vector<std::string> faults = {"node-crash@5m:node=0,reboot_after=1m", "etcd-leader-lost@7m",
                                           "etcd-partition@9m:node=2,duration=30s"};
  const SimRun a = Simulate(EtcdJob(), faults, 11);
  const SimRun b = Simulate(EtcdJob(), faults, 11);
  EXPECT_EQ(a.output, b.output);
  EXPECT_FALSE(a.result.violation);
}

// The campaign is a PutIf on an absent role key. With the model's test knob that lets every
// compare hold, the agents that start together all win the role; in a job that may shrink to
// one node (cluster.min_nodes = 1), each starts round 0 with its own agent once the others are
// away for timeouts.replace, and the invariant fires. Without the knob the same job is fine.
TEST(EtcdTest, WithoutTheCompareTwoAgentsHoldTheRoleAndTwoCoordinatorsAct) {
  std::string job = EtcdJob();
  job.replace(job.find("nproc_per_node = 2\n"), 19, "nproc_per_node = 2\nmin_nodes = 1\n");
  job.replace(job.find("replace = \"1m\"\n"), 14, "replace = \"10s\"\n");
  const SimRun fenced = Simulate(job);
  EXPECT_FALSE(fenced.result.violation) << *fenced.result.violation;
  EXPECT_EQ(fenced.result.exit_code, 0);
  const SimRun broken =
      Simulate(job, {}, std::nullopt, false, sim::SimOptions::Sabotage::kStoreIgnoresFencing);
  EXPECT_EQ(
      broken.result.violation.value_or(""),
      "two coordinators act at once: round 0 was started by the coordinator on node 0 and again by the one "
      "on node 1 (at 10s)");
  EXPECT_THAT(broken.output, HasSubstr("INVARIANT VIOLATED: two coordinators act at once"));
}

// Issue 37: the one host whose job file differs won the first campaign, refused every other
// node as "a different job file than node 0", and the whole job exited 3 on every host. Now the
// holder whose file is outnumbered gives the role up; the others elect one of theirs and run
// the job (the spare takes the odd host's rank), and only the odd host exits 3, saying why.
TEST(EtcdTest, AHolderWhoseJobFileIsTheOddOneOutGivesTheRoleUp) {
  const SimRun run = Simulate(EtcdJob(), {"job-file-differs@0s:node=0"});
  ASSERT_FALSE(run.result.violation) << *run.result.violation << "\n" << run.output;
  ASSERT_THAT(run.output, HasSubstr(kNode0Leads));
  EXPECT_THAT(run.output, HasSubstr("runs a different job file than the coordinator (host 10.0.0.1):"));
  EXPECT_THAT(run.output, Not(HasSubstr("than node 0"))) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("coordinator: this host holds the coordinator role, but 2 other nodes run "
                        "a different job file ("));
  EXPECT_THAT(run.output, HasSubstr("it gives the role up so that they can run the job"));
  ASSERT_EQ(run.result.nodes.size(), 4u);
  EXPECT_EQ(run.result.nodes[0].exit_code, 3) << run.output;
  for (size_t i = 1; i < run.result.nodes.size(); ++i)
    EXPECT_EQ(run.result.nodes[i].exit_code, 0) << i << run.output;
  EXPECT_EQ(run.result.stats.rounds_started, 1) << run.output;
  EXPECT_EQ(run.result.stats.restarts_used, 0) << run.output;
  EXPECT_EQ(CountOf(run.output, "this agent holds the coordinator role now"), 2) << run.output;
}

// The odd host is not the first holder: it is refused, for good once the holder's file has
// more nodes than its own, and the job runs without it; nobody gives the role up.
TEST(EtcdTest, AnOddJobFileThatDoesNotHoldTheRoleIsRefusedAndTheJobRuns) {
  const SimRun run = Simulate(EtcdJob(), {"job-file-differs@0s:node=2"});
  ASSERT_FALSE(run.result.violation) << *run.result.violation << "\n" << run.output;
  ASSERT_THAT(run.output, HasSubstr(kNode0Leads));
  EXPECT_THAT(run.output, Not(HasSubstr("gives the role up"))) << run.output;
  EXPECT_THAT(run.output, HasSubstr("node 2 (host 10.0.0.3) runs a different job file than the coordinator "
                                    "(host 10.0.0.1):"));
  ASSERT_EQ(run.result.nodes.size(), 4u);
  EXPECT_EQ(run.result.nodes[2].exit_code, 3) << run.output;
  for (size_t i : {0u, 1u, 3u}) EXPECT_EQ(run.result.nodes[i].exit_code, 0) << i << run.output;
  EXPECT_EQ(CountOf(run.output, "this agent holds the coordinator role now"), 1) << run.output;
}

TEST(EtcdTest, EtcdFaultsNeedAnEtcdJob) {
  const Status fits =
      FaultFitsJob(*ParseFaultFlag("etcd-partition@1m:node=1"), *ParseJobText(SmallJob(), "j").spec);
  EXPECT_EQ(fits.error(),
            "etcd-partition fault: the job keeps no state in etcd (rendezvous.backend = \"etcd\" "
            "models an etcd cluster)");
}

// 300 seeds of the etcd swarm job (about 2 s in an optimised build); bench/swarm-etcd.sh runs
// the long version.
TEST(EtcdSwarmTest, ThreeHundredSeedsHoldEveryInvariant) {
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/bench/swarm-etcd.toml");
  std::stringstream text;
  text << in.rdbuf();
  LoadResult loaded = ParseJobText(text.str(), "bench/swarm-etcd.toml");
  ASSERT_TRUE(loaded.spec);
  ASSERT_TRUE(loaded.spec->rendezvous.Etcd());
  sim::SimOptions options;
  options.seed = 1000;
  options.quiet = true;
  options.job_path = "bench/swarm-etcd.toml";
  std::ostringstream out;
  const sim::SwarmResult swarm = sim::RunSwarm(*loaded.spec, options, 300, out);
  EXPECT_EQ(swarm.runs, 300);
  EXPECT_EQ(swarm.failures, 0) << out.str();
  // The swarm draws etcd's faults for this job, and every draw fits it.
  int etcd_faults = 0;
  for (uint64_t seed = 1000; seed < 1300; ++seed) {
    for (const FaultSpec& fault : sim::DrawSwarmFaults(*loaded.spec, seed)) {
      const Status fits = FaultFitsJob(fault, *loaded.spec);
      EXPECT_TRUE(fits) << fits.error();
      if (fault.kind == FaultKind::kEtcdMemberDown || fault.kind == FaultKind::kEtcdLeaderLost ||
          fault.kind == FaultKind::kEtcdPartition) {
        ++etcd_faults;
      }
    }
  }
  EXPECT_GT(etcd_faults, 300);
}

// Issue 40: the shape swarm drew `etcd-member-down` with member 2 for a 2-node job, and the
// printed repro line was refused ("node 2 is out of range"): etcd has 3 members whatever the
// job's size, and a member fault names a member. Every draw for a 2-node etcd job fits it, and
// each printed fault parses and fits again.
TEST(EtcdTest, EveryDrawnEtcdFaultOfATwoNodeJobRunsFromItsReproLine) {
  std::string job = EtcdJob();
  job.replace(
      job.find("nodes = [\"10.0.0.1\", \"10.0.0.2\", \"10.0.0.3\"]\nspares = [\"10.0.0.4\"]"),
      std::string("nodes = [\"10.0.0.1\", \"10.0.0.2\", \"10.0.0.3\"]\nspares = [\"10.0.0.4\"]").size(),
      "nodes = [\"10.0.0.1\", \"10.0.0.2\"]");
  job.replace(job.find("num_nodes = 3"), 13, "num_nodes = 2");
  LoadResult loaded = ParseJobText(job, "two.toml");
  ASSERT_TRUE(loaded.spec);
  std::set<int> members;
  for (uint64_t seed = 1; seed < 400; ++seed) {
    for (const FaultSpec& fault : sim::DrawSwarmFaults(*loaded.spec, seed)) {
      const std::string flag = sim::FormatFaultFlag(fault);
      const Result<FaultSpec> parsed = ParseFaultFlag(flag);
      ASSERT_TRUE(parsed) << flag << ": " << parsed.error();
      const Status fits = FaultFitsJob(*parsed, *loaded.spec);
      EXPECT_TRUE(fits) << flag << ": " << fits.error();
      if (fault.kind == FaultKind::kEtcdMemberDown) members.insert(fault.node);
    }
  }
  EXPECT_EQ(members, (std::set<int>{0, 1, 2}));
  // A member beyond etcd's three is still refused, by its name.
  const Status beyond = FaultFitsJob(*ParseFaultFlag("etcd-member-down@1m:node=3,duration=1m"), *loaded.spec);
  EXPECT_EQ(beyond.error(),
            "etcd-member-down fault: etcd member 3 is out of range (the modelled etcd cluster has "
            "members 0..2)");
}

}  // namespace
}  // namespace ddprun::testing
