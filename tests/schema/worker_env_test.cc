// Worker environment against torchrun 1.13's (2 nodes x 2, static rendezvous), owned names,
// run id, PL_TRAINER_* spellings and log paths.
#include <gtest/gtest.h>

#include <map>

#include "schema/worker_env.h"
#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

// What torchrun 1.13 added to each worker's environment, 2 nodes x 2 procs,
// --master_addr 127.0.0.1 --master_port 29820 (recorded in the torchrun reference run).
struct TorchrunRank {
  int group_rank, local_rank, rank;
};
constexpr TorchrunRank kTorchrunRanks[] = {{0, 0, 0}, {0, 1, 1}, {1, 0, 2}, {1, 1, 3}};

std::map<std::string, std::string> TorchrunEnv(const TorchrunRank& r) {
  return {
      {"GROUP_RANK", std::to_string(r.group_rank)},
      {"GROUP_WORLD_SIZE", "2"},
      {"LOCAL_RANK", std::to_string(r.local_rank)},
      {"LOCAL_WORLD_SIZE", "2"},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "29820"},
      {"NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"OMP_NUM_THREADS", "1"},
      {"RANK", std::to_string(r.rank)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(r.rank)},
      {"ROLE_WORLD_SIZE", "4"},
      {"TORCHELASTIC_ERROR_FILE", "<per rank>"},
      {"TORCHELASTIC_MAX_RESTARTS", "0"},
      {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_RUN_ID", "<run id>"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"WORLD_SIZE", "4"},
  };
}

JobSpec TwoByTwo() {
  auto r = testing::Parse(R"(version = 1
[job]
name = "envjob"
command = ["python", "train.py"]
[cluster]
nnodes = 2
master_addr = "127.0.0.1"
master_port = 29820
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 2
)");
  EXPECT_TRUE(r.spec) << testing::Diags(r);
  return r.spec.value_or(JobSpec{});
}

TEST(WorkerEnv, MatchesTorchrun113ForEveryRank) {
  const JobSpec spec = TwoByTwo();
  for (const TorchrunRank& expected : kTorchrunRanks) {
    WorkerPosition pos;
    pos.node_rank = expected.group_rank;
    pos.local_rank = expected.local_rank;
    pos.master_port = 29820;
    pos.error_file = "logs/" + RunLogFolder(spec, "run") + "/" + RankErrorFilePath(spec, 0, expected.rank);
    const EnvList env = WorkerEnvironment(spec, pos, {});
    std::map<std::string, std::string> ours(env.begin(), env.end());
    for (const auto& [name, value] : TorchrunEnv(expected)) {
      SCOPED_TRACE(name + " on rank " + std::to_string(expected.rank));
      ASSERT_EQ(ours.count(name), 1u);
      if (name == "TORCHELASTIC_ERROR_FILE") {
        EXPECT_EQ(ours[name],
                  "logs/envjob/run/attempt-0/rank-" + std::to_string(expected.rank) + ".error.json");
      } else if (name == "TORCHELASTIC_RUN_ID") {
        EXPECT_EQ(ours[name], RunId(spec));
      } else if (name == "TORCHELASTIC_USE_AGENT_STORE") {
        EXPECT_EQ(ours[name], "False");  // ddprun hosts no store (DESIGN.md section 5)
      } else {
        EXPECT_EQ(ours[name], value);
      }
      ours.erase(name);
    }
    // What ddprun adds beyond torchrun 1.13: the 2.x name of the NCCL variable, NODE_RANK and
    // the Lightning defaults.
    EXPECT_EQ(ours, (std::map<std::string, std::string>{
                        {"NODE_RANK", std::to_string(expected.group_rank)},
                        {"PL_TRAINER_ACCELERATOR", "cpu"},
                        {"PL_TRAINER_DEVICES", "2"},
                        {"PL_TRAINER_NUM_NODES", "2"},
                        {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
                    }));
  }
}

TEST(WorkerEnv, SortedByName) {
  const EnvList env = WorkerEnvironment(TwoByTwo(), {}, {});
  EXPECT_TRUE(std::is_sorted(env.begin(), env.end()));
}

// The agent builds local rank 0's environment and derives its siblings' from it: each must be
// exactly what WorkerEnvironment gives that rank, whatever the job and the node set.
TEST(WorkerEnv, ASiblingsEnvironmentIsItsOwn) {
  JobSpec spec = TwoByTwo();
  spec.cluster.nproc_per_node = 8;
  spec.job.env["PYTHONPATH"] = "/opt/lib";
  spec.job.env["HF_HOME"] = "/data/hf";
  for (const bool beacons : {false, true}) {
    for (const bool relay : {false, true}) {
      for (const int node_rank : {0, 1}) {
        std::vector<WorkerPosition> positions(8);
        for (int local = 0; local < 8; ++local) {
          WorkerPosition& p = positions[static_cast<size_t>(local)];
          p.node_rank = node_rank;
          p.local_rank = local;
          p.restart_count = 3;
          p.master_addr = "10.0.0.7";
          // Under the relay, rank 0 alone gets the round's store port.
          p.master_port = relay && node_rank * 8 + local == 0 ? 41234 : 29820;
          p.error_file = "/logs/attempt-3/rank-" + std::to_string(node_rank * 8 + local) + ".error.json";
          p.run_id = "envjob-0123abcd";
          p.python_dir = "/usr/lib/ddprun/python";
          p.socket_ifname = "ens3";
          if (beacons) {
            p.progress_addr = "127.0.0.1:40404";
            p.progress_token = "t0ken";
            p.stacks_file = "/logs/attempt-3/rank-" + std::to_string(node_rank * 8 + local) + ".stacks";
          }
        }
        const EnvList first = WorkerEnvironment(spec, positions[0], {{"PATH", "/usr/bin"}});
        for (int local = 1; local < 8; ++local) {
          const WorkerPosition& p = positions[static_cast<size_t>(local)];
          EXPECT_EQ(SiblingWorkerEnvironment(first, spec, p),
                    WorkerEnvironment(spec, p, {{"PATH", "/usr/bin"}}))
              << "local rank " << local << " of node " << node_rank << (beacons ? ", beacons" : "")
              << (relay ? ", relay" : "");
        }
      }
    }
  }
}

TEST(WorkerEnv, UnlessSetVariablesYieldToTheAgentEnvironment) {
  const EnvList env =
      WorkerEnvironment(TwoByTwo(), {}, {{"OMP_NUM_THREADS", "8"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}});
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(m.count("NCCL_ASYNC_ERROR_HANDLING"), 0u);
  EXPECT_EQ(m.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
}

TEST(WorkerEnv, SocketInterfaceNamesGlooNcclAndTensorPipeUnlessTheUserSetThem) {
  WorkerPosition position;
  EnvList env = WorkerEnvironment(TwoByTwo(), position, {});
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m.count("GLOO_SOCKET_IFNAME"), 0u) << "no interface given, none set";

  position.socket_ifname = "ens3";
  env = WorkerEnvironment(TwoByTwo(), position, {});
  m = {env.begin(), env.end()};
  EXPECT_EQ(m.at("GLOO_SOCKET_IFNAME"), "ens3");
  EXPECT_EQ(m.at("NCCL_SOCKET_IFNAME"), "=ens3") << "exact, not a prefix of ens30";
  EXPECT_EQ(m.at("TP_SOCKET_IFNAME"), "ens3");

  // Each one the user set (the agent's environment or job.env) is theirs; the others are set.
  JobSpec spec = TwoByTwo();
  spec.job.env["NCCL_SOCKET_IFNAME"] = "ib0";
  env = WorkerEnvironment(spec, position, {{"GLOO_SOCKET_IFNAME", "eth9"}});
  m = {env.begin(), env.end()};
  EXPECT_EQ(m.count("GLOO_SOCKET_IFNAME"), 0u) << "inherited from the agent, not repeated";
  EXPECT_EQ(m.at("NCCL_SOCKET_IFNAME"), "ib0");
  EXPECT_EQ(m.at("TP_SOCKET_IFNAME"), "ens3");
}

TEST(WorkerEnv, OneProcessPerNodeGetsNoOmpNumThreads) {
  JobSpec spec = TwoByTwo();
  spec.cluster.nproc_per_node = 1;
  const EnvList env = WorkerEnvironment(spec, {}, {});
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m.count("OMP_NUM_THREADS"), 0u);
}

TEST(WorkerEnv, OwnedNames) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                           "TORCHELASTIC_RUN_ID", "PL_TRAINER_DEVICES"}) {
    EXPECT_TRUE(IsOwnedEnvName(name)) << name;
  }
  for (const char* name : {"NCCL_DEBUG", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PATH"}) {
    EXPECT_FALSE(IsOwnedEnvName(name)) << name;
  }
}

TEST(WorkerEnv, RunIdIsNameAndFingerprintPrefix) {
  const JobSpec spec = TwoByTwo();
  const std::string id = RunId(spec);
  EXPECT_EQ(id.substr(0, 7), "envjob-");
  EXPECT_EQ(id.size(), 7u + 8u);
}

TEST(WorkerEnv, TrainerValuesInLiteralEvalSpelling) {
  EXPECT_EQ(TrainerEnvValue({true}), "True");
  EXPECT_EQ(TrainerEnvValue({false}), "False");
  EXPECT_EQ(TrainerEnvValue({int64_t{8}}), "8");
  EXPECT_EQ(TrainerEnvValue({0.5}), "0.5");
  EXPECT_EQ(TrainerEnvValue({std::string("bf16-mixed")}), "bf16-mixed");
  EXPECT_EQ(TrainerEnvValue({std::vector<int64_t>{0, 1}}), "[0, 1]");
  // A float stays a float: Lightning reads an int 1 as "one batch", 1.0 as "all of them".
  EXPECT_EQ(TrainerEnvValue({1.0}), "1.0");
  EXPECT_EQ(TrainerEnvValue({1e-3}), "0.001");
  EXPECT_EQ(TrainerEnvValue({1e16}), "1e+16");
  // Strings that literal_eval would turn into something else are quoted.
  EXPECT_EQ(TrainerEnvValue({std::string("16-mixed")}), "16-mixed");
  EXPECT_EQ(TrainerEnvValue({std::string("32")}), "'32'");
  EXPECT_EQ(TrainerEnvValue({std::string("True")}), "'True'");
  EXPECT_EQ(TrainerEnvValue({std::string("")}), "''");
  EXPECT_EQ(TrainerEnvValue({std::string("it's a\n")}), "'it\\'s a\\n'");
  EXPECT_EQ(TrainerPythonLiteral({std::string("ddp")}, /*top_level=*/false), "'ddp'");
  EXPECT_EQ(TrainerEnvValue({TrainerLiteral{"{'days': 1}", "{\"days\" = 1}"}}), "{'days': 1}");
}

TEST(WorkerEnv, LogPaths) {
  const JobSpec spec = TwoByTwo();
  EXPECT_EQ(RankLogPath(spec, 2, 3), "attempt-2/rank-3.log");
  EXPECT_EQ(RankErrorFilePath(spec, 0, 1), "attempt-0/rank-1.error.json");
  EXPECT_EQ(RunLogFolder(spec, "20261203T081500Z-n0-3fa2c1"), "envjob/20261203T081500Z-n0-3fa2c1");
}

// Run folders sort by their UTC start time and say which node wrote them.
TEST(WorkerEnv, RunFolderName) {
  EXPECT_EQ(RunFolderName(1764749700, 0, 0x3fa2c1), "20251203T081500Z-n0-3fa2c1");
  EXPECT_EQ(RunFolderName(0, 12, 0xff000001u), "19700101T000000Z-n12-000001");
}

TEST(AppendToSearchPath, AnEmptyPathBecomesTheFolder) {
  EXPECT_EQ(AppendToSearchPath("", "/opt/ddprun/share/ddprun/python"), "/opt/ddprun/share/ddprun/python");
}

TEST(AppendToSearchPath, TheFolderGoesLast) { EXPECT_EQ(AppendToSearchPath("/a:/b", "/d"), "/a:/b:/d"); }

TEST(AppendToSearchPath, AFolderAlreadyThereIsNotAddedAgain) {
  EXPECT_EQ(AppendToSearchPath("/d", "/d"), "/d");
  EXPECT_EQ(AppendToSearchPath("/d:/a", "/d"), "/d:/a");
  EXPECT_EQ(AppendToSearchPath("/a:/d:/b", "/d"), "/a:/d:/b");
  EXPECT_EQ(AppendToSearchPath("/a:/d", "/d"), "/a:/d");
}

TEST(AppendToSearchPath, APrefixOfAnEntryIsNotTheEntry) {
  EXPECT_EQ(AppendToSearchPath("/dd:/d/x", "/d"), "/dd:/d/x:/d");
}

TEST(AppendToSearchPath, AnEmptyEntryMeaningTheCurrentFolderIsKept) {
  EXPECT_EQ(AppendToSearchPath("/a:", "/d"), "/a::/d");
  EXPECT_EQ(AppendToSearchPath(":/a", "/d"), ":/a:/d");
}

TEST(AppendToSearchPath, AFolderThatCannotBeOneEntryLeavesThePathAlone) {
  EXPECT_EQ(AppendToSearchPath("/a", ""), "/a");
  EXPECT_EQ(AppendToSearchPath("/a", "/x:y"), "/a");
}

}  // namespace
}  // namespace ddprun
