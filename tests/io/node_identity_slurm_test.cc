// Node rank under srun (SLURM_NODEID against the host's own entry) and the srun variables kept
// from workers, word for word.
#include "runner/io/node_identity_slurm.h"

#include <gtest/gtest.h>

namespace ddprun::io {
namespace {

JobSpec ListedJob() {
  JobSpec spec;
  spec.cluster.nodes = {"192.0.2.50", "vm", "gpu-03"};
  spec.cluster.nnodes = 3;
  return spec;
}

TEST(RankFromSlurmNodeIdTest, AgreeingHostAndSlurmGiveTheRank) {
  auto rank =
      RankFromSlurmNodeId(ListedJob(), "1", DetectedRank{1, "this host (vm) is cluster.nodes[1]", ""});
  ASSERT_TRUE(rank);
  EXPECT_EQ(rank->rank, 1);
  EXPECT_EQ(rank->how, "SLURM_NODEID=1, and this host (vm) is cluster.nodes[1]");
  EXPECT_EQ(rank->warning, "");
}

// The report: SLURM_NODEID=0 on host vm, listed as nodes[1].
TEST(RankFromSlurmNodeIdTest, TheHostsEntryWinsAndTheWarningNamesBoth) {
  auto rank =
      RankFromSlurmNodeId(ListedJob(), "0", DetectedRank{1, "this host (vm) is cluster.nodes[1]", ""});
  ASSERT_TRUE(rank);
  EXPECT_EQ(rank->rank, 1);
  EXPECT_EQ(
      rank->warning,
      "SLURM_NODEID=0 is not used: this host (vm) is cluster.nodes[1], so this is node 1. SLURM numbers "
      "an allocation's hosts in its own order; the job file's order decides (cluster.nodes[0] is where "
      "the coordinator listens)");
}

TEST(RankFromSlurmNodeIdTest, AnUnlistedHostIsAnErrorNamingBoth) {
  auto rank = RankFromSlurmNodeId(ListedJob(), "0",
                                  Fail("this host (node7, addresses 10.0.0.7) is not in cluster.nodes"));
  ASSERT_FALSE(rank);
  EXPECT_EQ(rank.error(),
            "SLURM_NODEID=0 makes this node 0 (192.0.2.50), but this host (node7, addresses 10.0.0.7) is not "
            "in cluster.nodes\nhint: under SLURM, list the allocation's hosts (`scontrol show hostnames`) in "
            "cluster.nodes, or pass --node-rank");
}

TEST(RankFromSlurmNodeIdTest, UnlistedNodesTakeSlurmNodeIdAndBadValuesAreErrors) {
  JobSpec spec;
  spec.cluster.nnodes = 3;
  auto rank = RankFromSlurmNodeId(spec, "2", Fail("cluster.nodes is not listed"));
  ASSERT_TRUE(rank);
  EXPECT_EQ(rank->rank, 2);
  EXPECT_EQ(rank->how, "SLURM_NODEID");
  EXPECT_EQ(RankFromSlurmNodeId(spec, "x", Fail("")).error(),
            "SLURM_NODEID=\"x\" is not a node rank (a non-negative integer)");
}

TEST(RemoveSlurmTaskLayoutTest, KeepsTheAllocationDropsTheTaskLayout) {
  std::map<std::string, std::string> env = {{"SLURM_NTASKS", "3"},
                                            {"SLURM_PROCID", "0"},
                                            {"SLURM_LOCALID", "0"},
                                            {"SLURM_NODEID", "0"},
                                            {"SLURM_JOB_ID", "42"},
                                            {"SLURM_JOB_NODELIST", "gpu-[01-03]"},
                                            {"SLURM_TASKS_PER_NODE", "1(x3)"},
                                            {"PATH", "/usr/bin"}};
  RemoveSlurmTaskLayout(env);
  EXPECT_EQ(env, (std::map<std::string, std::string>{
                     {"PATH", "/usr/bin"}, {"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "gpu-[01-03]"}}));
}

}  // namespace
}  // namespace ddprun::io
