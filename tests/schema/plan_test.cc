// The plan: rank table, devices, per-node environment, torchrun and ddprun commands, JSON.
#include <gtest/gtest.h>

#include "schema/json_schema.h"
#include "schema/plan.h"
#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

JobSpec Load(std::string_view text) {
  auto r = testing::Parse(text);
  EXPECT_TRUE(r.spec) << testing::Diags(r);
  return r.spec.value_or(JobSpec{});
}

constexpr std::string_view kGpuJob = R"(version = 1
[job]
name = "resnet50"
command = ["python", "train.py", "--epochs", "90"]
env = { NCCL_DEBUG = "WARN" }
[cluster]
nodes = ["10.10.10.16", "10.10.10.17"]
master_port = 50000
[trainer]
accelerator = "gpu"
devices = [4, 5]
num_nodes = 2
precision = "bf16-mixed"
[restart]
max_restarts = 3
)";

TEST(Plan, RanksHostsAndDevices) {
  const JobSpec spec = Load(kGpuJob);
  const Plan plan = MakePlan(spec, std::nullopt);
  ASSERT_EQ(plan.nodes.size(), 2u);
  const RankPlan& r3 = plan.nodes[1].ranks[1];
  EXPECT_EQ(r3.global_rank, 3);
  EXPECT_EQ(r3.node_rank, 1);
  EXPECT_EQ(r3.local_rank, 1);
  EXPECT_EQ(r3.host, "10.10.10.17");
  EXPECT_EQ(r3.device, 5);
  const Plan one = MakePlan(spec, 1);
  ASSERT_EQ(one.nodes.size(), 1u);
  EXPECT_EQ(one.nodes[0].node_rank, 1);
}

TEST(Plan, EnvUsesMasterPortOrStorePortAndErrorFileUnderLogs) {
  JobSpec spec = Load(kGpuJob);
  auto env_of = [](const RankPlan& r, const std::string& name) {
    for (const auto& [k, v] : r.env) {
      if (k == name) return v;
    }
    return std::string("(missing)");
  };
  const Plan plan = MakePlan(spec, std::nullopt);
  EXPECT_EQ(env_of(plan.nodes[1].ranks[0], "MASTER_PORT"), "50000");
  EXPECT_EQ(env_of(plan.nodes[1].ranks[0], "TORCHELASTIC_ERROR_FILE"),
            "logs/resnet50/<run>/attempt-0/rank-2.error.json");
  EXPECT_EQ(env_of(plan.nodes[1].ranks[0], "TORCHELASTIC_RESTART_COUNT"), "0");
  spec.cluster.store_port = 50001;
  EXPECT_EQ(env_of(MakePlan(spec, 0).nodes[0].ranks[0], "MASTER_PORT"), "50001");
}

TEST(Plan, TorchrunCommandForms) {
  JobSpec spec = Load(kGpuJob);
  const std::string run_id = RunId(spec);
  EXPECT_EQ(MakePlan(spec, 1).nodes[0].torchrun_command,
            "NCCL_DEBUG=WARN PL_TRAINER_ACCELERATOR=gpu PL_TRAINER_DEVICES='[4, 5]' "
            "PL_TRAINER_NUM_NODES=2 PL_TRAINER_PRECISION=bf16-mixed torchrun --nnodes=2 "
            "--nproc_per_node=2 --node_rank=1 --master_addr=10.10.10.16 --master_port=50000 "
            "--max_restarts=3 --rdzv_id=" +
                run_id + " train.py --epochs 90");
  spec.trainer.settings.clear();
  spec.job.env.clear();
  spec.job.command = {"python", "-m", "pkg.train", "--lr", "0.1"};
  EXPECT_TRUE(MakePlan(spec, 0).nodes[0].torchrun_command.ends_with("--rdzv_id=" + RunId(spec) +
                                                                    " -m pkg.train --lr 0.1"));
  spec.job.command = {"./train.sh", "it's"};
  EXPECT_TRUE(MakePlan(spec, 0).nodes[0].torchrun_command.ends_with("--rdzv_id=" + RunId(spec) +
                                                                    " --no_python ./train.sh 'it'\\''s'"));
  spec.job.workdir = "my dir";
  EXPECT_TRUE(MakePlan(spec, 0).nodes[0].torchrun_command.starts_with("cd 'my dir' && torchrun "));
}

TEST(Plan, DdprunCommandNamesTheRankOnlyWhenNodesAreUnnamed) {
  JobSpec spec = Load(kGpuJob);
  EXPECT_EQ(MakePlan(spec, 1).nodes[0].ddprun_command, "ddprun job.toml");
  spec.cluster.nodes.clear();
  EXPECT_EQ(MakePlan(spec, 1).nodes[0].ddprun_command, "ddprun job.toml --node-rank 1");
  EXPECT_EQ(MakePlan(spec, 1).nodes[0].host, "node1");
}

TEST(Plan, TextShowsCommonEnvOncePerNodeAndPerRankColumns) {
  const JobSpec spec = Load(kGpuJob);
  const std::string text = RenderPlanText(spec, MakePlan(spec, 1));
  EXPECT_NE(text.find("job resnet50: 2 nodes x 2 processes = world size 4\n"), std::string::npos);
  EXPECT_NE(text.find("      3     1  10.10.10.17      1  cuda:5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("node 1 (10.10.10.17):\n  environment of every worker:\n"
                      "    GLOO_SOCKET_IFNAME=<interface found by this node's agent>\n    GROUP_RANK=1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("    RANK LOCAL_RANK ROLE_RANK TORCHELASTIC_ERROR_FILE\n"
                      "    2    0          2         logs/resnet50/<run>/attempt-0/rank-2.error.json\n"),
            std::string::npos)
      << text;
  // Per-rank variables are not repeated in the common block.
  EXPECT_EQ(text.find("    RANK=2"), std::string::npos);
  EXPECT_NE(text.find("  torchrun: NCCL_DEBUG=WARN"), std::string::npos);
}

TEST(Plan, SocketInterfacesAreFoundPerNodeAtRunTimeAndSaidSo) {
  JobSpec spec = Load(kGpuJob);
  auto env_of = [](const RankPlan& r, const std::string& name) {
    for (const auto& [k, v] : r.env) {
      if (k == name) return v;
    }
    return std::string("(missing)");
  };
  const Plan plan = MakePlan(spec, std::nullopt);
  for (const char* name : {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"}) {
    EXPECT_EQ(env_of(plan.nodes[1].ranks[0], name), kSocketIfnamePlaceholder) << name;
  }
  const std::string text = RenderPlanText(spec, plan);
  EXPECT_NE(text.find("worker sockets: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME name, on "
                      "each node, the interface that holds its cluster.nodes address, or else the one it "
                      "reaches master_addr through (NCCL's as \"=name\"), found by its agent when it "
                      "starts; a variable set in job.env or in the agent's environment is kept\n"),
            std::string::npos)
      << text;
  // One the job file sets is the job file's; a job of one node gets none.
  spec.job.env["NCCL_SOCKET_IFNAME"] = "ib";
  EXPECT_EQ(env_of(MakePlan(spec, 0).nodes[0].ranks[0], "NCCL_SOCKET_IFNAME"), "ib");
  EXPECT_NE(RenderPlanText(spec, MakePlan(spec, 0)).find(" (NCCL_SOCKET_IFNAME from job.env)"),
            std::string::npos);
  spec.cluster.nnodes = 1;
  spec.cluster.nodes = {"10.10.10.16"};
  EXPECT_EQ(env_of(MakePlan(spec, 0).nodes[0].ranks[0], "GLOO_SOCKET_IFNAME"), "(missing)");
}

TEST(Plan, JsonHasEveryRank) {
  const JobSpec spec = Load(kGpuJob);
  const std::string json = RenderPlanJson(spec, MakePlan(spec, std::nullopt));
  EXPECT_NE(json.find("\"world_size\": 4"), std::string::npos);
  EXPECT_NE(json.find("\"global_rank\": 3"), std::string::npos);
  EXPECT_NE(json.find("\"RANK\": \"3\""), std::string::npos);
}

TEST(Plan, SchemaIsDraft2020AndClosed) {
  const std::string schema = JobFileJsonSchema();
  EXPECT_NE(schema.find("\"$schema\": \"https://json-schema.org/draft/2020-12/schema\""), std::string::npos);
  EXPECT_NE(schema.find("\"additionalProperties\": false"), std::string::npos);
  for (const char* key : {"master_port", "nproc_per_node", "store_port", "max_restarts", "stop_grace",
                          "console", "reboot_after", "worker_mtbf"}) {
    EXPECT_NE(schema.find(std::string("\"") + key + "\""), std::string::npos) << key;
  }
}

}  // namespace
}  // namespace ddprun
