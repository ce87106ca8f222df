// cluster.hosts_from = "slurm": the allocation's hosts as the loader is given them, each rule
// with its exact message.
#include <gtest/gtest.h>

#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

using testing::Diags;

constexpr std::string_view kSlurmJob = R"(version = 1
[job]
name = "t"
command = ["python", "train.py"]
[cluster]
hosts_from = "slurm"
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 3
)";

LoadContext Allocation(std::vector<std::string> hosts) {
  LoadContext context;
  context.slurm_hosts = [hosts] { return Result<std::vector<std::string>>(hosts); };
  return context;
}

TEST(HostsFrom, TakesTheAllocationsHostsInItsOrder) {
  auto r = ParseJobText(kSlurmJob, "job.toml", Allocation({"gpu-07", "gpu-03", "gpu-11"}));
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(Diags(r), "");
  EXPECT_TRUE(r.spec->cluster.hosts_from_slurm);
  EXPECT_EQ(r.spec->cluster.nodes, (std::vector<std::string>{"gpu-07", "gpu-03", "gpu-11"}));
  EXPECT_EQ(r.spec->cluster.nnodes, 3);
  EXPECT_EQ(r.spec->cluster.master_addr, "gpu-07");
}

TEST(HostsFrom, OutsideAnAllocationWarnsAndKeepsTheCount) {
  auto r = ParseJobText(kSlurmJob, "job.toml", {});
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(Diags(r),
            "6:14: warning: not in a SLURM allocation (SLURM_JOB_NODELIST is not set): the hosts are known "
            "only under srun or sbatch; shown here as 3 nodes without names\n"
            "  hint: run `ddprun check` inside the allocation (salloc) to see its hosts\n");
  EXPECT_TRUE(r.spec->cluster.nodes.empty());
  EXPECT_EQ(r.spec->cluster.nnodes, 3);
}

TEST(HostsFrom, AnAllocationOfAnotherSizeThanNnodesIsAnError) {
  std::string text(kSlurmJob);
  text.replace(text.find("hosts_from"), 0, "nnodes = 4\n");
  auto r = ParseJobText(text, "job.toml", Allocation({"a", "b", "c"}));
  EXPECT_FALSE(r.spec);
  EXPECT_EQ(Diags(r),
            "6:10: error: cluster.nnodes = 4 but the SLURM allocation has 3 hosts (a, b, c)\n"
            "  hint: ask SLURM for that many nodes (sbatch -N), or remove cluster.nnodes\n");
}

TEST(HostsFrom, WithNodesIsAnError) {
  std::string text(kSlurmJob);
  text.replace(text.find("hosts_from"), 0, "nodes = [\"a\"]\n");
  auto r = ParseJobText(text, "job.toml", Allocation({"a"}));
  EXPECT_FALSE(r.spec);
  EXPECT_EQ(Diags(r),
            "6:9: error: cluster.nodes and cluster.hosts_from both give the hosts\n"
            "  hint: keep one: the listed hosts, or hosts_from = \"slurm\" for the allocation's\n");
}

TEST(HostsFrom, UnknownSourceAndUnreadableAllocationAreErrors) {
  std::string text(kSlurmJob);
  text.replace(text.find("\"slurm\""), 7, "\"pbs\"");
  auto unknown = ParseJobText(text, "job.toml", Allocation({"a"}));
  EXPECT_FALSE(unknown.spec);
  EXPECT_NE(Diags(unknown).find("cluster.hosts_from = \"pbs\" is not a source of hosts ddprun knows"),
            std::string::npos)
      << Diags(unknown);

  LoadContext failing;
  failing.slurm_hosts = [] {
    return Result<std::vector<std::string>>(Fail("`scontrol show hostnames gpu-[01-03]` could not run"));
  };
  auto unreadable = ParseJobText(kSlurmJob, "job.toml", failing);
  EXPECT_FALSE(unreadable.spec);
  EXPECT_EQ(
      Diags(unreadable),
      "6:14: error: cannot read the SLURM allocation's hosts: `scontrol show hostnames gpu-[01-03]` could "
      "not run\n");
}

}  // namespace
}  // namespace ddprun
