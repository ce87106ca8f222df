// Hot spares with real agents on 127.0.0.1: node 1's host dies for good (its agent and workers
// SIGKILLed) and the waiting spare takes node rank 1, in a shell job and in a PyTorch DDP job
// that resumes from its checkpoint; and a spare that is never needed ends with the job.

#include <signal.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// 2 nodes x 2 workers running `script`, and one spare (agent 2) that takes the rank of a node
// away for more than 1 s. max_restarts = 2: the loss of node 1 uses one restart.
std::string SpareJob(uint16_t port, const std::string& script, const std::string& heartbeat) {
  TestJob job;
  job.name = "spares";
  job.script = script;
  job.master_port = port;
  job.max_restarts = 2;
  job.backoff = "0s";
  job.rendezvous = "60s";
  job.heartbeat = heartbeat;
  job.stop_grace = "2s";
  job.extra = "replace = \"1s\"\n";  // appended to [timeouts]
  std::string toml = job.Toml();
  const std::string cluster = "[cluster]\n";
  toml.insert(toml.find(cluster) + cluster.size(), "spares = 1\n");
  return toml;
}

class SparesTest : public ::testing::Test {
 protected:
  /// Starts the agent of node `node_rank` (2 is the spare); gloo finds its peers on loopback.
  AgentProcess& Start(int node_rank) {
    auto agent = std::make_unique<AgentProcess>(
        std::vector<std::string>{dir_.path() + "/job.toml", "--node-rank", std::to_string(node_rank)},
        dir_.path() + "/agent-" + std::to_string(node_rank) + ".out",
        std::map<std::string, std::string>{{"GLOO_SOCKET_IFNAME", "lo"}});
    agents_[node_rank] = std::move(agent);
    return *agents_[node_rank];
  }
  /// Node 0, then the spare; node 1 once the spare waits, so that round 0 finds it there.
  void StartAll(const std::string& job) {
    dir_.Write("job.toml", job);
    Start(0);
    Start(2);
    ASSERT_TRUE(OutputHas(*agents_[2], "spare 0 joined; it waits", 30s)) << Describe();
    Start(1);
  }
  AgentProcess& agent(int node_rank) { return *agents_.at(node_rank); }
  bool OutputHas(const AgentProcess& a, const std::string& text, std::chrono::milliseconds limit) {
    return WaitFor([&] { return a.Output().find(text) != std::string::npos; }, limit);
  }
  /// The pid in `name` once the worker has written it in full.
  std::optional<pid_t> PidIn(const std::string& name, std::chrono::milliseconds limit) {
    if (!WaitFor([&] { return dir_.Exists(name) && dir_.Read(name).ends_with("\n"); }, limit)) {
      return std::nullopt;
    }
    return std::stoi(dir_.Read(name));
  }
  /// Node 1's host dies: its agent, then its round-0 workers (ranks 2 and 3), SIGKILLed. The
  /// agent first, so that it cannot report its workers' deaths: the coordinator sees only a
  /// closed connection. Returns the workers' pids.
  std::vector<pid_t> KillNode1() {
    std::vector<pid_t> workers;
    for (const char* name : {"pid-2-0", "pid-3-0"}) {
      const auto pid = PidIn(name, 30s);
      EXPECT_TRUE(pid) << name << Describe();
      if (pid) workers.push_back(*pid);
    }
    agent(1).Signal(SIGKILL);
    for (pid_t pid : workers) ::kill(pid, SIGKILL);
    EXPECT_EQ(agent(1).Wait(5s), 128 + SIGKILL) << Describe();
    return workers;
  }
  /// Asserts what every hot-spare takeover shows: node 0 sees node 1 lost, gives its rank to
  /// the spare and waits for the old workers' lease; the spare plays node 1 in round 1, whose
  /// workers start only when node 1's round-0 workers are gone.
  void ExpectTakeover(const std::vector<pid_t>& old_workers) {
    ASSERT_TRUE(OutputHas(agent(0), "round 0 failed: ", 30s)) << Describe();
    ASSERT_TRUE(OutputHas(agent(2), "round 1: starting 2 workers (ranks 2..3 of 4)", 60s)) << Describe();
    for (pid_t pid : old_workers) {
      EXPECT_FALSE(ProcessAlive(pid)) << "node 1's round-0 worker " << pid << " still runs" << Describe();
    }
    // Hosts are named by this machine's host name.
    EXPECT_THAT(agent(0).Output(),
                ContainsRegex("spare 0 \\([^)]+\\) takes node rank 1 in place of node 1 \\([^)]+\\), "
                              "away for [0-9.]+s \\(more than timeouts.replace = 1s\\)"))
        << Describe();
    EXPECT_THAT(agent(0).Output(), HasSubstr("round 1: all 2 nodes joined; waiting ")) << Describe();
    EXPECT_THAT(agent(2).Output(), HasSubstr("round 1: this agent (spare 0) takes node rank 1 from now on"))
        << Describe();
  }
  std::string Describe() const {
    std::string text;
    for (const auto& [rank, a] : agents_) {
      text += "\n---- " + (rank == 2 ? std::string("spare") : "node " + std::to_string(rank)) + " ----\n" +
              a->Output();
    }
    return text;
  }

  ScratchDir dir_;
  std::map<int, std::unique_ptr<AgentProcess>> agents_;
};

// Each worker writes its pid (and in round 1, its parent's and its environment) and round 0
// sleeps; round 1 ends at once. The spare's workers must get node rank 1's ranks.
TEST_F(SparesTest, TheSpareTakesTheRankOfANodeKilledForGood) {
  const std::string script =
      "echo $$ > pid-$RANK-$TORCHELASTIC_RESTART_COUNT; "
      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exec sleep 60; fi; "
      "echo $PPID > ppid-$RANK; env > env-$RANK";
  ASSERT_NO_FATAL_FAILURE(StartAll(SpareJob(FreePort(), script, "250ms")));
  ASSERT_TRUE(OutputHas(agent(1), "round 0: starting", 30s)) << Describe();
  const std::vector<pid_t> old_workers = KillNode1();
  ASSERT_NO_FATAL_FAILURE(ExpectTakeover(old_workers));
  EXPECT_EQ(agent(0).Wait(30s), 0) << Describe();
  EXPECT_EQ(agent(2).Wait(10s), 0) << Describe();
  for (int rank : {2, 3}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto env = ParseEnvDump(dir_.Read("env-" + std::to_string(rank)));
    EXPECT_EQ(env.at("RANK"), std::to_string(rank));
    EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(rank - 2));
    EXPECT_EQ(env.at("NODE_RANK"), "1");
    EXPECT_EQ(env.at("GROUP_RANK"), "1");
    EXPECT_EQ(std::stoi(dir_.Read("ppid-" + std::to_string(rank))), agent(2).pid())
        << "not the spare's worker";
  }
  for (int rank : {0, 2}) {
    EXPECT_THAT(
        agent(rank).Output(),
        HasSubstr("job \"spares\" succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)"))
        << Describe();
  }
}

// A spare that no node needs ends with the job: it hears the verdict and exits 0.
TEST_F(SparesTest, ASpareThatIsNeverNeededEndsWithTheJob) {
  ASSERT_NO_FATAL_FAILURE(StartAll(SpareJob(FreePort(), "sleep 1", "250ms")));
  EXPECT_EQ(agent(0).Wait(30s), 0) << Describe();
  EXPECT_EQ(agent(1).Wait(10s), 0) << Describe();
  EXPECT_EQ(agent(2).Wait(10s), 0) << Describe();
  for (int rank : {0, 1, 2}) {
    EXPECT_THAT(agent(rank).Output(),
                HasSubstr("job \"spares\" succeeded: all 4 ranks on 2 nodes exited 0 in round 0"))
        << Describe();
  }
  EXPECT_THAT(agent(2).Output(), Not(HasSubstr("starting 2 workers"))) << Describe();
}

// examples/ddp_train.py with a checkpoint after every step: node 1's host dies mid-training,
// the spare takes its rank, and round 1 resumes from the last checkpoint and trains to the end.
TEST_F(SparesTest, ADdpJobResumesFromItsCheckpointOnTheSpare) {
  DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing);
  // The shell execs Python, so the pid it writes is the worker's.
  const std::string script = "echo $$ > pid-$RANK-$TORCHELASTIC_RESTART_COUNT; exec /usr/bin/python3 " +
                             std::string(DDPRUN_SOURCE_DIR) +
                             "/examples/ddp_train.py --steps 15 --step-time 0.3 --checkpoint-dir checkpoints";
  // A heartbeat of 500 ms: four Python processes importing torch on two cores starve agents.
  ASSERT_NO_FATAL_FAILURE(StartAll(SpareJob(FreePort(), script, "500ms")));
  // Rank 0 prints every fifth step: the job is mid-training, with checkpoints to resume from,
  // and nine steps (2.7 s at least) from its end.
  ASSERT_TRUE(OutputHas(agent(0), "step 5 loss", 120s)) << Describe();
  const std::vector<pid_t> old_workers = KillNode1();
  ASSERT_NO_FATAL_FAILURE(ExpectTakeover(old_workers));
  EXPECT_EQ(agent(0).Wait(120s), 0) << Describe();
  EXPECT_EQ(agent(2).Wait(10s), 0) << Describe();
  // Every rank of round 1 loaded the same checkpoint, from a step after the first.
  std::smatch resumed;
  const std::string out0 = agent(0).Output();
  ASSERT_TRUE(std::regex_search(out0, resumed, std::regex("rank 0: resumed from step ([0-9]+)")))
      << Describe();
  const std::string step = resumed[1];
  EXPECT_GT(std::stoi(step), 0) << Describe();
  EXPECT_THAT(out0, HasSubstr("rank 1: resumed from step " + step + "\n")) << Describe();
  for (const char* rank : {"2", "3"}) {
    EXPECT_THAT(agent(2).Output(),
                HasSubstr("rank " + std::string(rank) + ": resumed from step " + step + "\n"))
        << Describe();
  }
  EXPECT_THAT(agent(0).Output(), HasSubstr("done: 4 ranks, all_reduce ok")) << Describe();
  for (int rank : {0, 2}) {
    EXPECT_THAT(
        agent(rank).Output(),
        HasSubstr("job \"spares\" succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)"))
        << Describe();
  }
}

}  // namespace
}  // namespace ddprun::e2e
