// [[simulate.faults]] and [simulate] in the job file, and the --fault command-line syntax.
#include <gtest/gtest.h>

#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

using testing::Diags;
using testing::Parse;
using testing::WithBase;

TEST(Faults, KindNamesRoundTrip) {
  for (FaultKind kind :
       {FaultKind::kNodeCrash, FaultKind::kAgentHang, FaultKind::kWorkerExit, FaultKind::kWorkerHang,
        FaultKind::kPartition, FaultKind::kMasterPortBlocked, FaultKind::kSlowJoiner,
        FaultKind::kJobFileDiffers, FaultKind::kDuplicateNodeRank, FaultKind::kWorkerSlow,
        FaultKind::kEtcdMemberDown, FaultKind::kEtcdLeaderLost, FaultKind::kEtcdPartition}) {
    EXPECT_EQ(ParseFaultKind(FaultKindName(kind)), kind);
  }
  EXPECT_EQ(FaultKindName(FaultKind::kMasterPortBlocked), "master-port-blocked");
  EXPECT_FALSE(ParseFaultKind("node_crash"));
}

TEST(Faults, FromTheJobFile) {
  auto r = Parse(WithBase(R"([simulate]
seed = 7
node_mtbf = "30d"
train_time = "2h"
[[simulate.faults]]
at = "40m"
kind = "node-crash"
node = 1
reboot_after = "5m"
[[simulate.faults]]
at = "90s"
kind = "worker-exit"
node = 1
local_rank = 1
exit_code = 3
[[simulate.faults]]
at = "1h"
kind = "partition"
node = 1
peers = [0]
duration = "30s"
)"));
  ASSERT_TRUE(r.spec) << Diags(r);
  const auto& s = r.spec->simulate;
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(s.node_mtbf, Hours(24 * 30));
  EXPECT_EQ(s.train_time, Hours(2));
  ASSERT_EQ(s.faults.size(), 3u);
  FaultSpec crash;
  crash.kind = FaultKind::kNodeCrash;
  crash.at = Minutes(40);
  crash.node = 1;
  crash.reboot_after = Minutes(5);
  EXPECT_EQ(s.faults[0], crash);
  EXPECT_EQ(s.faults[1].kind, FaultKind::kWorkerExit);
  EXPECT_EQ(s.faults[1].local_rank, 1);
  EXPECT_EQ(s.faults[1].exit_code, 3);
  EXPECT_EQ(s.faults[2].peers, (std::vector<int>{0}));
  EXPECT_EQ(s.faults[2].duration, Seconds(30));
}

TEST(Faults, JobFileErrors) {
  EXPECT_EQ(Diags(Parse(WithBase("[[simulate.faults]]\nat = \"1m\"\nkind = \"node-crash\"\n"
                                 "node = 2\nexit_code = 3\n"))),
            "15:8: error: simulate.faults[0].node = 2 is out of range (0..1)\n"
            "16:1: error: simulate.faults[0].exit_code does not apply to a fault of kind "
            "\"node-crash\"\n"
            "  hint: a node-crash fault takes: at, kind, node, reboot_after\n");
  EXPECT_EQ(Diags(Parse(WithBase("[[simulate.faults]]\nkind = \"disk-full\"\n"))),
            "12:1: error: missing required key `simulate.faults[0].at`\n"
            "  hint: e.g. at = \"40m\" (virtual time since the start)\n"
            "13:8: error: unknown fault kind \"disk-full\"\n"
            "  hint: known kinds: node-crash, agent-hang, worker-exit, worker-hang, worker-slow, "
            "partition, master-port-blocked, slow-joiner, job-file-differs, duplicate-node-rank, "
            "etcd-member-down, etcd-leader-lost, etcd-partition\n");
  EXPECT_EQ(Diags(Parse(WithBase("[[simulate.faults]]\nat = 40\nkind = \"worker-exit\"\n"
                                 "local_rank = 2\n"))),
            "13:6: error: simulate.faults[0].at must be a duration string, not an integer\n"
            "  hint: write \"40s\" (units: ms, s, m, h, d; e.g. \"250ms\", \"30s\", \"15m\")\n"
            "15:14: error: simulate.faults[0].local_rank = 2 is out of range (0..1)\n");
  EXPECT_EQ(Diags(Parse(WithBase("[simulate]\nseed = -1\nnode_mtbf = \"0s\"\n"))),
            "13:8: error: simulate.seed = -1 is out of range (0..9223372036854775807)\n"
            "14:13: error: simulate.node_mtbf must be longer than 0s\n");
  EXPECT_EQ(Diags(Parse(WithBase("[[simulate.faults]]\nat = \"1m\"\nkind = \"partition\"\n"
                                 "node = 1\npeers = [1]\n"))),
            "16:9: error: simulate.faults[0].peers contains node 1, the node it cuts off\n");
}

TEST(Faults, FlagSyntax) {
  auto crash = ParseFaultFlag("node-crash@40m:node=1");
  ASSERT_TRUE(crash) << crash.error();
  EXPECT_EQ(crash->kind, FaultKind::kNodeCrash);
  EXPECT_EQ(crash->at, Minutes(40));
  EXPECT_EQ(crash->node, 1);

  auto exit = ParseFaultFlag("worker-exit@90s:node=1,local_rank=0,exit_code=3");
  ASSERT_TRUE(exit) << exit.error();
  EXPECT_EQ(exit->at, Seconds(90));
  EXPECT_EQ(exit->local_rank, 0);
  EXPECT_EQ(exit->exit_code, 3);

  auto part = ParseFaultFlag("partition@5m:node=1,peers=0+2,duration=1m");
  ASSERT_TRUE(part) << part.error();
  EXPECT_EQ(part->peers, (std::vector<int>{0, 2}));
  EXPECT_EQ(part->duration, Minutes(1));

  auto bare = ParseFaultFlag("agent-hang@1h");
  ASSERT_TRUE(bare) << bare.error();
  EXPECT_EQ(bare->node, 0);

  auto slow = ParseFaultFlag("worker-slow@5m:node=1,local_rank=2,percent=100");
  ASSERT_TRUE(slow) << slow.error();
  EXPECT_EQ(slow->kind, FaultKind::kWorkerSlow);
  EXPECT_EQ(slow->at, Minutes(5));
  EXPECT_EQ(slow->node, 1);
  EXPECT_EQ(slow->local_rank, 2);
  EXPECT_EQ(slow->percent, 100);
  EXPECT_FALSE(slow->duration);
  auto slower = ParseFaultFlag("worker-slow@5m:node=1,percent=250,duration=10m");
  ASSERT_TRUE(slower) << slower.error();
  EXPECT_EQ(slower->percent, 250);
  EXPECT_EQ(slower->duration, Minutes(10));
  EXPECT_EQ(ParseFaultFlag("worker-slow@1m")->percent, 100) << "the table's default";
}

TEST(Faults, WorkerSlowFromTheJobFile) {
  auto r = Parse(WithBase(R"([simulate]
step_time = "2s"
worker_hang_mtbf = "30d"
[[simulate.faults]]
at = "5m"
kind = "worker-slow"
node = 1
local_rank = 1
percent = 50
duration = "20m"
)"));
  ASSERT_TRUE(r.spec) << Diags(r);
  const auto& s = r.spec->simulate;
  EXPECT_EQ(s.step_time, Seconds(2));
  EXPECT_EQ(s.worker_hang_mtbf, Hours(24 * 30));
  ASSERT_EQ(s.faults.size(), 1u);
  EXPECT_EQ(s.faults[0].kind, FaultKind::kWorkerSlow);
  EXPECT_EQ(s.faults[0].percent, 50);
  EXPECT_EQ(s.faults[0].duration, Minutes(20));
  EXPECT_EQ(Diags(Parse(WithBase("[[simulate.faults]]\nat = \"1m\"\nkind = \"worker-slow\"\n"
                                 "percent = 0\n"))),
            "15:11: error: simulate.faults[0].percent = 0 is out of range (1..10000)\n");
  EXPECT_EQ(Diags(Parse(WithBase("[[simulate.faults]]\nat = \"1m\"\nkind = \"worker-hang\"\n"
                                 "percent = 50\n"))),
            "15:1: error: simulate.faults[0].percent does not apply to a fault of kind "
            "\"worker-hang\"\n"
            "  hint: a worker-hang fault takes: at, kind, node, local_rank, duration\n");
  EXPECT_EQ(Diags(Parse(WithBase("[simulate]\nstep_time = \"0s\"\n"))),
            "13:13: error: simulate.step_time must be longer than 0s\n");
}

TEST(Faults, FlagErrors) {
  auto error_of = [](std::string_view text) -> std::string {
    auto fault = ParseFaultFlag(text);
    EXPECT_FALSE(fault) << text;
    return fault ? "" : fault.error();
  };
  EXPECT_EQ(error_of("node-crash"),
            "--fault `node-crash` has no time: write kind@time[:key=value,...], e.g. "
            "node-crash@40m:node=1");
  EXPECT_EQ(error_of("disk-full@1m"),
            "unknown fault kind `disk-full` (known: node-crash, agent-hang, worker-exit, "
            "worker-hang, worker-slow, partition, master-port-blocked, slow-joiner, "
            "job-file-differs, duplicate-node-rank, etcd-member-down, etcd-leader-lost, etcd-partition)");
  EXPECT_EQ(error_of("node-crash@40"), "`40` is not a duration (e.g. 90s, 40m, 1h30m)");
  EXPECT_EQ(error_of("node-crash@40m:nod=1"), "unknown fault key `nod`; did you mean `node`?");
  EXPECT_EQ(error_of("node-crash@40m:exit_code=1"),
            "`exit_code` does not apply to a node-crash fault (a node-crash fault takes: at, "
            "kind, node, reboot_after)");
  EXPECT_EQ(error_of("node-crash@40m:node"),
            "`node` is not key=value: write kind@time[:key=value,...], e.g. "
            "node-crash@40m:node=1");
  EXPECT_EQ(error_of("node-crash@40m:node=-1"), "node=-1 is not a valid number");
  EXPECT_EQ(error_of("node-crash@40m:node=1,node=2"), "`node` is given twice");
  EXPECT_EQ(error_of("worker-exit@1m:exit_code=256"), "exit_code = 256 is out of range (0..255)");
  EXPECT_EQ(error_of("worker-slow@1m:percent=0"), "percent = 0 is out of range (1..10000)");
  EXPECT_EQ(error_of("partition@1m:peers=a"), "peers=a is not a list of node ranks (e.g. 0+2)");
}

TEST(Faults, FitsJob) {
  auto r = Parse(testing::kBaseJob);
  ASSERT_TRUE(r.spec);
  FaultSpec f;
  f.node = 2;
  ASSERT_FALSE(FaultFitsJob(f, *r.spec));
  EXPECT_EQ(FaultFitsJob(f, *r.spec).error(),
            "node-crash fault: node 2 is out of range (the job has nodes 0..1)");
  f.node = 1;
  f.kind = FaultKind::kWorkerExit;
  f.local_rank = 2;
  ASSERT_FALSE(FaultFitsJob(f, *r.spec));
  EXPECT_EQ(FaultFitsJob(f, *r.spec).error(), "worker-exit fault: local_rank 2 is out of range (0..1)");
  f.local_rank = 1;
  EXPECT_TRUE(FaultFitsJob(f, *r.spec));
}

// A fault's node nnodes + i addresses spare i.
TEST(Faults, SparesAreAddressedAfterTheNodes) {
  std::string job(testing::kBaseJob);
  job.replace(job.find("nodes = [\"a\", \"b\"]\n"), 19, "nodes = [\"a\", \"b\"]\nspares = [\"c\", \"d\"]\n");
  auto r = Parse(job + "[[simulate.faults]]\nat = \"1m\"\nkind = \"node-crash\"\nnode = 3\n");
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(r.spec->simulate.faults[0].node, 3);
  EXPECT_NE(Diags(Parse(job + "[[simulate.faults]]\nat = \"1m\"\nkind = \"node-crash\"\nnode = 4\n"))
                .find("16:8: error: simulate.faults[0].node = 4 is out of range (0..3)\n"),
            std::string::npos);
  FaultSpec f;
  f.node = 3;
  EXPECT_TRUE(FaultFitsJob(f, *r.spec));
  f.node = 4;
  EXPECT_EQ(FaultFitsJob(f, *r.spec).error(),
            "node-crash fault: node 4 is out of range (the job has nodes 0..1 and spares 2..3)");
}

TEST(Faults, NodeNeverReturnsPercent) {
  auto r = Parse(WithBase("[simulate]\nnode_mtbf = \"30d\"\nnode_never_returns_percent = 25\n"));
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(r.spec->simulate.node_never_returns_percent, 25);
  EXPECT_EQ(Parse(testing::kBaseJob).spec->simulate.node_never_returns_percent, 0);
  EXPECT_EQ(Diags(Parse(WithBase("[simulate]\nnode_mtbf = \"30d\"\nnode_never_returns_percent = 101\n"))),
            "14:30: error: simulate.node_never_returns_percent = 101 is out of range (0..100)\n");
  EXPECT_EQ(Diags(Parse(WithBase("[simulate]\nnode_never_returns_percent = 10\n"))),
            "13:30: error: simulate.node_never_returns_percent is a share of the random node crashes, but "
            "simulate.node_mtbf is not set\n"
            "  hint: set simulate.node_mtbf, e.g. node_mtbf = \"30d\"\n");
}

TEST(Faults, SigtermFollowsTheTrainerUnlessSet) {
  // kBaseJob has a [trainer]: Lightning's handler only sets a flag, so SIGTERM is ignored.
  const auto base = Parse(testing::kBaseJob);
  ASSERT_TRUE(base.spec) << Diags(base);
  EXPECT_EQ(base.spec->simulate.sigterm, JobSpec::Simulate::Sigterm::kAuto);
  EXPECT_TRUE(base.spec->SimulatedWorkersIgnoreSigterm());
  JobSpec plain = *base.spec;
  plain.trainer.settings.clear();
  EXPECT_FALSE(plain.SimulatedWorkersIgnoreSigterm());
  const auto exits = Parse(WithBase("[simulate]\nsigterm = \"exits\"\n"));
  ASSERT_TRUE(exits.spec) << Diags(exits);
  EXPECT_FALSE(exits.spec->SimulatedWorkersIgnoreSigterm());
  plain.simulate.sigterm = JobSpec::Simulate::Sigterm::kIgnored;
  EXPECT_TRUE(plain.SimulatedWorkersIgnoreSigterm());
  EXPECT_EQ(
      Diags(Parse(WithBase("[simulate]\nsigterm = \"term\"\n"))),
      "13:11: error: simulate.sigterm = \"term\" is not \"auto\", \"exits\" or \"ignored\"\n"
      "  hint: \"exits\" for a plain PyTorch script, \"ignored\" for Lightning (its SIGTERM handler only "
      "sets a flag)\n");
}

}  // namespace
}  // namespace ddprun
