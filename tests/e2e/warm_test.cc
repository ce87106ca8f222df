// Warm starts (job.preload) with real agents and real Python: a forked worker sees what a cold
// one sees, a DDP job trains to the same weights warm and cold and restarts warm, a hung warm
// rank is named with its stack, a killed or unanswering template is replaced while rounds start
// cold, and templates that are not safe to fork (a thread, an open file, a failed import) or
// commands that are not Python start cold and say why.

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/harness.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;
using namespace std::chrono_literals;

#define SKIP_WITHOUT_TORCH() DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing)

std::string Source(const std::string& path) { return std::string(DDPRUN_SOURCE_DIR) + "/" + path; }

std::string TomlArray(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + TomlString(items[i]);
  return out + "]";
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The run folder an agent's output names ("logs of this run: DIR/ (also ...").
std::string RunFolder(const std::string& output) {
  std::smatch m;
  return std::regex_search(output, m, std::regex("logs of this run: (\\S+)/ \\(also")) ? m[1].str() : "";
}

// The "workers-started" records of a node's event log, by round.
std::map<int, Json> StartRecords(const std::string& run_folder, int node) {
  std::map<int, Json> records;
  std::istringstream in(ReadFile(run_folder + "/events-node" + std::to_string(node) + ".jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    const Json record = Json::parse(line, nullptr, false);
    if (!record.is_discarded() && record.value("event", "") == "workers-started") {
      records[record["round"].get<int>()] = record;
    }
  }
  return records;
}

class WarmTest : public ::testing::Test {
 protected:
  AgentProcess& Start(const std::string& job_file, int node_rank) {
    const std::string out = dir_.path() + "/" + job_file + "-node" + std::to_string(node_rank) + ".out";
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{dir_.path() + "/" + job_file, "--node-rank", std::to_string(node_rank)}, out,
        std::map<std::string, std::string>{{"GLOO_SOCKET_IFNAME", "lo"}}));
    return *agents_.back();
  }
  std::string Describe() const { return DescribeAgents(agents_); }

  ScratchDir dir_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

TestJob ProbeJob(const std::string& name, const std::string& job_extra) {
  TestJob job;
  job.name = name;
  job.nnodes = 1;
  job.devices = 2;
  job.master_port = FreePort();
  job.command = TomlArray({"/usr/bin/python3", "-u", Source("tests/e2e/warm_probe.py"), "probes-" + name});
  job.job_extra = job_extra;
  job.max_restarts = 1;
  job.backoff = "0s";
  job.rendezvous = "60s";
  job.heartbeat = "1s";
  return job;
}

// What must be equal between a cold and a warm worker of the same rank: everything the probe
// saw but the seeds, the parent's pid, and the variables that name this run (its log folder,
// its beacon socket, its store port).
Json Comparable(Json probe, const std::string& run_folder) {
  for (const char* key : {"random", "torch_seed", "ppid"}) probe.erase(key);
  // The stacks file (in the run's folder) and the beacon socket `import ddprun` opened.
  for (auto& [fd, target] : probe["fds"].items()) {
    std::string text = target.get<std::string>();
    if (const size_t at = text.find(run_folder); at != std::string::npos)
      text.replace(at, run_folder.size(), "<run>");
    if (text.starts_with("socket:")) text = "socket";
    target = text;
  }
  Json& env = probe["env"];
  for (const char* key : {"DDPRUN_PROGRESS_ADDR", "DDPRUN_PROGRESS_TOKEN", "MASTER_PORT"}) env.erase(key);
  for (auto& [name, value] : env.items()) {
    std::string text = value.get<std::string>();
    if (const size_t at = text.find(run_folder); at != std::string::npos)
      text.replace(at, run_folder.size(), "<run>");
    value = text;
  }
  return probe;
}

TEST_F(WarmTest, ForkedWorkersSeeWhatColdWorkersSee) {
  SKIP_WITHOUT_TORCH();
  dir_.Write("probes-cold/.keep", "");
  dir_.Write("probes-warm/.keep", "");
  dir_.Write("cold.toml", ProbeJob("cold", "").Toml());
  dir_.Write("warm.toml", ProbeJob("warm", "preload = [\"torch\"]\n").Toml());
  // The same job name would share one log tree; the names differ, so does TORCHELASTIC_RUN_ID.
  AgentProcess& cold = Start("cold.toml", 0);
  ASSERT_EQ(cold.Wait(120s), 0) << Describe();
  AgentProcess& warm = Start("warm.toml", 0);
  ASSERT_EQ(warm.Wait(120s), 0) << Describe();

  EXPECT_THAT(warm.Output(),
              ContainsRegex("workers start warm: a template \\(pid [0-9]+\\) imported torch in "))
      << Describe();
  EXPECT_THAT(cold.Output(), Not(HasSubstr("workers start warm"))) << Describe();
  const std::string cold_run = RunFolder(cold.Output()), warm_run = RunFolder(warm.Output());
  ASSERT_FALSE(cold_run.empty() || warm_run.empty()) << Describe();

  std::map<std::string, double> seeds;
  for (int attempt : {0, 1}) {
    for (int rank : {0, 1}) {
      SCOPED_TRACE(fmt::format("rank {} attempt {}", rank, attempt));
      const std::string name = fmt::format("probe-{}-{}.json", rank, attempt);
      ASSERT_TRUE(dir_.Exists("probes-cold/" + name) && dir_.Exists("probes-warm/" + name))
          << name << Describe();
      const Json cold_probe = Json::parse(dir_.Read("probes-cold/" + name));
      const Json warm_probe = Json::parse(dir_.Read("probes-warm/" + name));
      EXPECT_EQ(cold_probe["ppid"], cold.pid());
      EXPECT_EQ(warm_probe["ppid"], warm.pid());  // reparented to the agent, which waits for it
      EXPECT_TRUE(warm_probe["own_group"].get<bool>());
      EXPECT_TRUE(warm_probe["stack_dump_registered"].get<bool>());
      EXPECT_FALSE(warm_probe["ddprun_before_import"].get<bool>());
      EXPECT_EQ(warm_probe["threads"], 1);
      // Every field, the environment whole, compared with the run's own names taken out.
      Json cold_view = Comparable(cold_probe, cold_run), warm_view = Comparable(warm_probe, warm_run);
      cold_view["env"].erase("TORCHELASTIC_RUN_ID");
      warm_view["env"].erase("TORCHELASTIC_RUN_ID");
      for (Json* view : {&cold_view, &warm_view}) {
        for (auto& item : (*view)["argv"])
          item = std::regex_replace(item.get<std::string>(), std::regex("probes-(cold|warm)"), "probes");
        for (auto& item : (*view)["orig_argv"])
          item = std::regex_replace(item.get<std::string>(), std::regex("probes-(cold|warm)"), "probes");
      }
      EXPECT_EQ(cold_view.dump(1), warm_view.dump(1));
      seeds[fmt::format("warm {} {}", rank, attempt)] = warm_probe["torch_seed"].get<double>();
      seeds[fmt::format("random {} {}", rank, attempt)] = warm_probe["random"].get<double>();
    }
  }
  // Fresh seeds in every forked worker: no two ranks or rounds draw the same.
  EXPECT_NE(seeds["warm 0 0"], seeds["warm 1 0"]);
  EXPECT_NE(seeds["warm 0 0"], seeds["warm 0 1"]);
  EXPECT_NE(seeds["random 0 0"], seeds["random 1 0"]);
  EXPECT_NE(seeds["random 0 1"], seeds["random 1 1"]);

  // The failing rank's log (its traceback, as the interpreter prints it) and the summary's
  // quote of its error file are the same, warm or cold.
  const std::string cold_log = ReadFile(cold_run + "/attempt-0/rank-1.log");
  const std::string warm_log = ReadFile(warm_run + "/attempt-0/rank-1.log");
  EXPECT_THAT(warm_log, HasSubstr("ValueError: warm probe fails on purpose"));
  EXPECT_EQ(std::regex_replace(cold_log, std::regex("probes-cold"), "probes"),
            std::regex_replace(warm_log, std::regex("probes-warm"), "probes"));
  for (AgentProcess* agent : {&cold, &warm}) {
    EXPECT_THAT(agent->Output(), HasSubstr("ValueError: warm probe fails on purpose")) << Describe();
    EXPECT_THAT(agent->Output(), ContainsRegex("warm_probe\\.py\", line [0-9]+, in main")) << Describe();
  }
  // The event log and the summary say how each round started.
  const auto records = StartRecords(warm_run, 0);
  ASSERT_EQ(records.size(), 2u) << Describe();
  for (const auto& [round, record] : records) {
    EXPECT_EQ(record["warm"], 2) << record.dump();
    EXPECT_EQ(record["cold"], 0) << record.dump();
    EXPECT_GE(record["start_us"].get<int64_t>(), 0) << record.dump();
  }
  EXPECT_EQ(StartRecords(cold_run, 0).at(1)["cold"], 2);
  EXPECT_THAT(
      warm.Output(),
      ContainsRegex("worker starts on this node: round 0: 2 warm in [0-9.]+ ms.*; round 1: 2 warm in"))
      << Describe();
}

// examples/ddp_train.py on 2 nodes x 2, rank 3 failing in round 0: cold and warm runs restart
// once and end with the same weights; the warm run forks both rounds' workers.
TEST_F(WarmTest, DdpJobRestartsWarmAndEndsWithTheWeightsOfAColdRun) {
  SKIP_WITHOUT_TORCH();
  std::map<std::string, std::vector<double>> weights;
  for (const std::string mode : {"cold", "warm"}) {
    SCOPED_TRACE(mode);
    TestJob job;
    job.name = "ddp-" + mode;
    job.master_port = FreePort();
    job.devices = 2;
    job.command = TomlArray({"/usr/bin/python3", Source("examples/ddp_train.py"), "--steps", "6",
                             "--fail-rank", "3", "--fail-attempt", "0", "--result-dir", "results-" + mode});
    if (mode == "warm")
      job.job_extra = "preload = [\"torch\", \"torch.distributed\", \"torch.nn.parallel\"]\n";
    job.max_restarts = 1;
    job.backoff = "0s";
    job.rendezvous = "60s";
    job.heartbeat = "1s";
    job.stop_grace = "10s";
    dir_.Write("results-" + mode + "/.keep", "");
    dir_.Write(mode + ".toml", job.Toml());
    AgentProcess& node1 = Start(mode + ".toml", 1);
    AgentProcess& node0 = Start(mode + ".toml", 0);
    ASSERT_EQ(node0.Wait(240s), 0) << Describe();
    ASSERT_EQ(node1.Wait(30s), 0) << Describe();
    EXPECT_THAT(node0.Output(), HasSubstr("rank 3 fails on purpose in attempt 0")) << Describe();
    for (int rank = 0; rank < 4; ++rank) {
      const Json result =
          Json::parse(dir_.Read(fmt::format("results-{}/rank-{}-attempt-1.json", mode, rank)));
      weights[fmt::format("{} {}", mode, rank)] = result["weights"].get<std::vector<double>>();
    }
    if (mode == "warm") {
      for (int n : {0, 1}) {
        AgentProcess& agent = n == 0 ? node0 : node1;
        const auto records = StartRecords(RunFolder(agent.Output()), n);
        ASSERT_EQ(records.size(), 2u) << Describe();
        EXPECT_EQ(records.at(0)["warm"], 2) << records.at(0).dump();
        EXPECT_EQ(records.at(1)["warm"], 2) << records.at(1).dump();  // the restart forks too
      }
    }
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_FALSE(weights[fmt::format("cold {}", rank)].empty());
    EXPECT_EQ(weights[fmt::format("cold {}", rank)], weights[fmt::format("warm {}", rank)])
        << "rank " << rank;
  }
}

// What a worker kept from its imports about the environment, as the stand-ins of
// tests/e2e/warm_standins keep it (Lightning's and torchmetrics' rank_zero_only.rank, a variable
// an import set, one it removed, the names an import walked), with its whole environment.
constexpr const char* kStatePython = R"(import json, os, sys
import lightning.fabric.utilities.rank_zero, torchmetrics.utilities.prints, reads_rank, sets_var, walks_names
# After the imports: a warm worker's were done before its first line, a cold one's just now.
state = {"env": {k: v for k, v in os.environ.items() if k not in (
             "DDPRUN_PROGRESS_ADDR", "DDPRUN_PROGRESS_TOKEN", "DDPRUN_STACKS_FILE", "MASTER_PORT",
             "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")}}
for name in ("lightning.fabric.utilities.rank_zero", "torchmetrics.utilities.prints"):
    state[name] = sys.modules[name].rank_zero_only.rank
state["reads_rank"] = reads_rank.RANK_AT_IMPORT
state["walks_names"] = walks_names.NAMES
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(sys.argv[1], "state-%s-%s.json" % (rank, attempt)), "w") as f:
    json.dump(state, f, sort_keys=True)
if rank == "3" and attempt == "0":
    # The others must have written theirs before this failure stops them.
    import time
    while not all(os.path.exists(os.path.join(sys.argv[1], "state-%d-0.json" % r)) for r in range(3)):
        time.sleep(0.02)
    raise ValueError("rank 3 fails on purpose")
)";

// For every rank and round of a 2 x 2 job whose rank 3 fails once, a warm worker keeps from the
// preloaded imports what a cold one keeps from its own: Lightning's rank (set again in each
// worker), the variables the imports set and removed, the names they walked. A module whose
// rank-specific state cannot be set again (reads_rank) makes those ranks start cold, said once,
// so that they too are what a cold start gives. No torch needed.
TEST_F(WarmTest, ModuleStateFromTheEnvironmentIsAColdWorkersInEveryRankAndRound) {
  dir_.Write("state.py", kStatePython);
  for (const std::string mode : {"cold", "warm", "refused"}) {
    SCOPED_TRACE(mode);
    dir_.Write("states-" + mode + "/.keep", "");
    TestJob job;
    job.name = "state-" + mode;
    job.master_port = FreePort();
    job.devices = 2;
    job.command = TomlArray({"/usr/bin/python3", "state.py", "states-" + mode});
    if (mode == "warm") {
      job.job_extra =
          "preload = [\"lightning.fabric.utilities.rank_zero\", \"torchmetrics.utilities.prints\", "
          "\"sets_var\", \"walks_names\"]\n";
    } else if (mode == "refused") {
      job.job_extra = "preload = [\"lightning.fabric.utilities.rank_zero\", \"reads_rank\"]\n";
    }
    job.extra = "[job.env]\nPYTHONPATH = " + TomlString(Source("tests/e2e/warm_standins")) +
                "\nSTANDIN_REMOVED = \"x\"\nSTANDIN_KEPT = \"y\"\n";
    job.max_restarts = 1;
    job.backoff = "0s";
    job.rendezvous = "60s";
    job.heartbeat = "1s";
    dir_.Write(mode + ".toml", job.Toml());
    AgentProcess& node1 = Start(mode + ".toml", 1);
    AgentProcess& node0 = Start(mode + ".toml", 0);
    ASSERT_EQ(node0.Wait(120s), 0) << Describe();
    ASSERT_EQ(node1.Wait(30s), 0) << Describe();
    for (int n : {0, 1}) {
      AgentProcess& agent = n == 0 ? node0 : node1;
      const auto records = StartRecords(RunFolder(agent.Output()), n);
      ASSERT_EQ(records.size(), 2u) << Describe();
      for (const auto& [round, record] : records) {
        if (mode == "warm") {
          EXPECT_EQ(record["warm"], 2) << record.dump();
        } else if (mode == "refused") {
          // Each node's template imported with its local rank 0's variables: that rank forks,
          // the other would keep its RANK.
          EXPECT_EQ(record["warm"], 1) << record.dump();
          EXPECT_EQ(record["cold"], 1) << record.dump();
          EXPECT_THAT(record["cold_reason"].get<std::string>(),
                      HasSubstr("reads_rank read RANK when the template imported it"));
        }
      }
    }
    if (mode == "refused") {
      EXPECT_THAT(node0.Output(),
                  ContainsRegex("warning: warm starts: rank 1 starts cold: a fork would differ from a "
                                "cold start: reads_rank read RANK when the template imported it, "
                                "and this worker's RANK differs \\('1', the template's '0'\\)"))
          << Describe();
    }
  }
  for (int attempt : {0, 1}) {
    for (int rank = 0; rank < 4; ++rank) {
      SCOPED_TRACE(fmt::format("rank {} attempt {}", rank, attempt));
      const std::string name = fmt::format("state-{}-{}.json", rank, attempt);
      for (const std::string mode : {"cold", "warm", "refused"}) {
        ASSERT_TRUE(dir_.Exists("states-" + mode + "/" + name)) << mode << Describe();
      }
      const Json cold = Json::parse(dir_.Read("states-cold/" + name));
      EXPECT_EQ(cold["lightning.fabric.utilities.rank_zero"], rank);
      EXPECT_EQ(cold["torchmetrics.utilities.prints"], rank % 2);
      EXPECT_EQ(cold["reads_rank"], std::to_string(rank));
      for (const std::string mode : {"warm", "refused"}) {
        const Json other = Json::parse(dir_.Read("states-" + mode + "/" + name));
        EXPECT_EQ(cold.dump(1), other.dump(1)) << mode;
      }
    }
  }
  const Json warm = Json::parse(dir_.Read("states-warm/state-2-1.json"));
  EXPECT_EQ(warm["env"]["STANDIN_SET"], "1");
  EXPECT_FALSE(warm["env"].contains("STANDIN_REMOVED"));
  EXPECT_EQ(warm["walks_names"], Json::parse(R"(["STANDIN_KEPT", "STANDIN_SET"])"));
}

// A warm rank that deadlocks is found by its silence and named with its faulthandler stack,
// registered in the forked worker by its own `import ddprun`.
TEST_F(WarmTest, HungWarmRankIsNamedWithItsStack) {
  SKIP_WITHOUT_TORCH();
  TestJob job;
  job.name = "hang-warm";
  job.master_port = FreePort();
  job.devices = 2;
  job.command = TomlArray({"/usr/bin/python3", Source("examples/ddp_train.py"), "--steps", "4", "--step-time",
                           "0.3", "--hang-rank", "3", "--hang-attempt", "0", "--hang-step", "2"});
  job.job_extra = "preload = [\"torch\"]\n";
  job.max_restarts = 0;
  job.rendezvous = "60s";
  job.heartbeat = "1s";
  job.stop_grace = "5s";
  job.extra = "progress = \"5s\"\n";
  dir_.Write("job.toml", job.Toml());
  AgentProcess& node1 = Start("job.toml", 1);
  AgentProcess& node0 = Start("job.toml", 0);
  EXPECT_EQ(node0.Wait(180s), 1) << Describe();
  EXPECT_EQ(node1.Wait(30s), 1) << Describe();
  for (AgentProcess* agent : {&node0, &node1}) {
    const std::string out = agent->Output();
    EXPECT_THAT(out, HasSubstr("workers start warm")) << Describe();
    EXPECT_THAT(out, ContainsRegex(R"(round 0 failed: rank 3 \(node 1 \([^)]*\), local rank 1\) hung: )"))
        << Describe();
    EXPECT_THAT(out, ContainsRegex("\n"
                                   R"(      File "[^"]*/examples/ddp_train\.py", line [0-9]+ in wait_forever)"
                                   "\n"))
        << Describe();
  }
  const auto records = StartRecords(RunFolder(node1.Output()), 1);
  ASSERT_EQ(records.count(0), 1u) << Describe();
  EXPECT_EQ(records.at(0)["warm"], 2);
}

// The template is SIGKILLed while round 0 runs; round 1 (after a failure) starts cold, said
// with the reason, while the replacement imports (slowly, on purpose); the job still succeeds.
TEST_F(WarmTest, KilledTemplateIsReplacedAndTheRoundMeanwhileStartsCold) {
  SKIP_WITHOUT_TORCH();
  // Rank 1 of round 0 fails once the file `fail` appears; everything else just finishes.
  const std::string script =
      "import os, sys, time\n"
      "import torch\n"
      "if os.environ['RANK'] == '1' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
      "    while not os.path.exists('fail'):\n"
      "        time.sleep(0.05)\n"
      "    sys.exit(3)\n"
      "print('trained in round', os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\n";
  dir_.Write("worker.py", script);
  TestJob job;
  job.name = "replace";
  job.nnodes = 1;
  job.devices = 2;
  job.master_port = FreePort();
  job.command = TomlArray({"/usr/bin/python3", "worker.py"});
  job.job_extra = "preload = [\"torch\", \"slow_when_marked\"]\n";
  job.max_restarts = 1;
  job.backoff = "0s";
  job.rendezvous = "60s";
  job.heartbeat = "1s";
  job.extra = "[job.env]\nPYTHONPATH = " + TomlString(Source("tests/e2e/warm_modules")) + "\n";
  // [job.env] after [timeouts] is a new table: fine in TOML.
  dir_.Write("job.toml", job.Toml());
  AgentProcess& agent = Start("job.toml", 0);
  std::smatch m;
  std::string out;
  ASSERT_TRUE(WaitFor(
      [&] {
        out = agent.Output();
        return std::regex_search(out, m, std::regex("workers start warm: a template \\(pid ([0-9]+)\\)")) &&
               out.find("starting 2 workers") != std::string::npos;
      },
      90s))
      << Describe();
  const pid_t template_pid = std::stoi(m[1]);
  ASSERT_TRUE(
      WaitFor([&] { return agent.Output().find("[n0 r0] trained in round 0") != std::string::npos; }, 60s))
      << Describe();
  dir_.Write("slow-imports", "");  // the replacement takes 30 s to import
  ASSERT_EQ(::kill(template_pid, SIGKILL), 0);
  ASSERT_TRUE(
      WaitFor([&] { return agent.Output().find("a new template is starting") != std::string::npos; }, 30s))
      << Describe();
  dir_.Write("fail", "");
  ASSERT_EQ(agent.Wait(120s), 0) << Describe();
  out = agent.Output();
  EXPECT_THAT(out,
              ContainsRegex(
                  "warm starts: the template exited \\(killed by signal 9 \\(Killed\\)\\); a new template is "
                  "starting, and workers start cold until it is ready"))
      << Describe();
  EXPECT_THAT(out, HasSubstr("[n0 r1] trained in round 1")) << Describe();
  const auto records = StartRecords(RunFolder(out), 0);
  ASSERT_EQ(records.size(), 2u) << Describe();
  EXPECT_EQ(records.at(0)["warm"], 2) << records.at(0).dump();
  EXPECT_EQ(records.at(1)["cold"], 2) << records.at(1).dump();
  EXPECT_THAT(records.at(1)["cold_reason"].get<std::string>(), HasSubstr("still importing"))
      << records.at(1).dump();
  EXPECT_FALSE(ProcessAlive(template_pid));
}

// A template that stops answering (SIGSTOP stands in for a hang) is killed after 10 s and
// replaced; that round's workers start cold, and a fork it made but never reported would find
// its `go` pipe closed. The agent's loop never waits for it: with a heartbeat of 0.3 s nothing
// is found stalled meanwhile. Needs no torch: the preload is the standard json.
TEST_F(WarmTest, TemplateThatDoesNotAnswerIsKilledAndTheRoundStartsCold) {
  dir_.Write("worker.py",
             "import os, sys, time\n"
             "if os.environ['RANK'] == '1' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
             "    while not os.path.exists('fail'):\n"
             "        time.sleep(0.05)\n"
             "    sys.exit(3)\n"
             "print('ran in round', os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\n");
  TestJob job;
  job.name = "hung-template";
  job.nnodes = 1;
  job.devices = 2;
  job.master_port = FreePort();
  job.command = TomlArray({"/usr/bin/python3", "worker.py"});
  job.job_extra = "preload = [\"json\"]\n";
  job.max_restarts = 1;
  job.backoff = "0s";
  job.heartbeat = "300ms";  // 10 s of a template that does not answer would be 33 beats
  job.rendezvous = "60s";
  dir_.Write("job.toml", job.Toml());
  AgentProcess& agent = Start("job.toml", 0);
  std::smatch m;
  std::string out;
  ASSERT_TRUE(WaitFor(
      [&] {
        out = agent.Output();
        return std::regex_search(out, m, std::regex("workers start warm: a template \\(pid ([0-9]+)\\)")) &&
               out.find("[n0 r0] ran in round 0") != std::string::npos;
      },
      60s))
      << Describe();
  const pid_t template_pid = std::stoi(m[1]);
  ASSERT_EQ(::kill(template_pid, SIGSTOP), 0) << Describe();
  dir_.Write("fail", "");
  ASSERT_EQ(agent.Wait(60s), 0) << Describe();
  out = agent.Output();
  EXPECT_THAT(
      out, HasSubstr(fmt::format("warm starts: the template (pid {}) did not answer within 10 s: taken for "
                                 "hung and killed",
                                 template_pid)))
      << Describe();
  EXPECT_THAT(out, HasSubstr("[n0 r1] ran in round 1")) << Describe();
  const auto records = StartRecords(RunFolder(out), 0);
  ASSERT_EQ(records.size(), 2u) << Describe();
  EXPECT_EQ(records.at(0)["warm"], 2) << records.at(0).dump();
  EXPECT_EQ(records.at(1)["cold"], 2) << records.at(1).dump();
  EXPECT_THAT(records.at(1)["cold_reason"].get<std::string>(), HasSubstr("did not answer within 10 s"));
  EXPECT_THAT(out, Not(HasSubstr("stalled"))) << Describe();
  EXPECT_FALSE(ProcessAlive(template_pid));
}

// 20 workers on one node: two requests of at most 16 (warm_template.h), the second sent once the
// first is answered; every rank forked, none twice. Needs no torch.
TEST_F(WarmTest, ANodeWithMoreWorkersThanARequestHoldsForksThemAll) {
  dir_.Write("worker.py", "import os\nprint('rank', os.environ['RANK'], 'pid', os.getpid(), flush=True)\n");
  TestJob job;
  job.name = "wide";
  job.nnodes = 1;
  job.devices = 20;
  job.master_port = FreePort();
  job.command = TomlArray({"/usr/bin/python3", "worker.py"});
  job.job_extra = "preload = [\"json\"]\n";
  job.rendezvous = "60s";
  dir_.Write("job.toml", job.Toml());
  AgentProcess& agent = Start("job.toml", 0);
  ASSERT_EQ(agent.Wait(60s), 0) << Describe();
  const std::string out = agent.Output();
  std::set<std::string> pids;
  for (int rank = 0; rank < 20; ++rank) {
    std::smatch m;
    ASSERT_TRUE(
        std::regex_search(out, m, std::regex(fmt::format("\\[n0 r{}\\] rank {} pid ([0-9]+)", rank, rank))))
        << rank << Describe();
    pids.insert(m[1]);
  }
  EXPECT_EQ(pids.size(), 20u);
  const auto records = StartRecords(RunFolder(out), 0);
  ASSERT_EQ(records.size(), 1u) << Describe();
  EXPECT_EQ(records.at(0)["warm"], 20) << records.at(0).dump();
}

// `python -m package.module` warm: runpy gives the module __main__ with its spec, the module's
// path as argv[0] and the working folder as sys.path[0], as the interpreter does. No torch needed.
TEST_F(WarmTest, ModuleCommandRunsAsPythonDashMWould) {
  dir_.Write("pkg/__init__.py", "");
  dir_.Write(
      "pkg/train.py",
      "import sys\nprint('module', __name__, __file__, sys.argv, sys.path[0], __spec__.name, flush=True)\n");
  TestJob job;
  job.name = "dash-m";
  job.nnodes = 1;
  job.devices = 1;
  job.master_port = FreePort();
  job.command = TomlArray({"/usr/bin/python3", "-m", "pkg.train", "x"});
  job.job_extra = "preload = [\"json\"]\n";
  dir_.Write("job.toml", job.Toml());
  AgentProcess& agent = Start("job.toml", 0);
  ASSERT_EQ(agent.Wait(60s), 0) << Describe();
  const std::string& d = dir_.path();
  EXPECT_THAT(agent.Output(), HasSubstr("workers start warm")) << Describe();
  EXPECT_THAT(agent.Output(),
              HasSubstr(fmt::format("[n0 r0] module __main__ {}/pkg/train.py ['{}/pkg/train.py', 'x'] {} "
                                    "pkg.train\n",
                                    d, d, d)))
      << Describe();
  EXPECT_EQ(StartRecords(RunFolder(agent.Output()), 0).at(0)["warm"], 1);
}

// Templates that are not safe to fork are refused once, with the reason; the job runs cold.
// These need no torch: the preloads are small modules of the test's own.
struct Refusal {
  std::string preload;
  std::string command;  // "" runs python
  std::string said;
};

class WarmRefusalTest : public WarmTest, public ::testing::WithParamInterface<Refusal> {};

TEST_P(WarmRefusalTest, JobRunsColdAndSaysWhy) {
  const Refusal& refusal = GetParam();
  TestJob job;
  job.name = "refuse";
  job.nnodes = 1;
  job.devices = 2;
  job.master_port = FreePort();
  job.command = refusal.command.empty() ? TomlArray({"/usr/bin/python3", "-c", "pass"}) : refusal.command;
  if (refusal.command.empty()) {
    dir_.Write("worker.py", "import os\nprint('cold worker', os.environ['RANK'], flush=True)\n");
    job.command = TomlArray({"/usr/bin/python3", "worker.py"});
  }
  job.job_extra = "preload = [" + TomlString(refusal.preload) + "]\n";
  job.extra = "[job.env]\nPYTHONPATH = " + TomlString(Source("tests/e2e/warm_modules")) + "\n";
  dir_.Write("job.toml", job.Toml());
  AgentProcess& agent = Start("job.toml", 0);
  ASSERT_EQ(agent.Wait(60s), 0) << Describe();
  const std::string out = agent.Output();
  EXPECT_THAT(out, HasSubstr(refusal.said)) << Describe();
  EXPECT_THAT(out, Not(HasSubstr("workers start warm"))) << Describe();
  const auto records = StartRecords(RunFolder(out), 0);
  ASSERT_EQ(records.size(), 1u) << Describe();
  EXPECT_EQ(records.at(0)["cold"], 2);
  EXPECT_EQ(records.at(0)["warm"], 0);
}

INSTANTIATE_TEST_SUITE_P(
    Unsafe, WarmRefusalTest,
    ::testing::Values(
        Refusal{"starts_thread", "",
                "workers start cold: the preloaded modules left 2 threads running in the template"},
        Refusal{"opens_file", "",
                "workers start cold: the preloaded modules left files open in the template, which "
                "every worker would share: 4 -> /dev/null"},
        Refusal{"no_such_module", "",
                "workers start cold: cannot import the preloaded modules: ModuleNotFoundError"},
        Refusal{
            "opens_file", "[\"sh\", \"-c\", \"echo shell worker\"]",
            "workers start cold although job.preload is set: job.command does not run a Python interpreter"}),
    [](const ::testing::TestParamInfo<Refusal>& param) { return std::to_string(param.index); });

}  // namespace
}  // namespace ddprun::e2e
