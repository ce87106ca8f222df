// End-to-end tests of `ddprun job.toml`: real agents as separate processes on 127.0.0.1.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

/// The runner tests' job: two nodes of two workers running `sh -c true`, no restart and no
/// backoff, a 10 s rendezvous.
TestJob Job() {
  TestJob job;
  job.max_restarts = 0;
  job.backoff = "0s";
  job.rendezvous = "10s";
  return job;
}

class RunnerTest : public ::testing::Test {
 protected:
  /// Writes `job` with this test's master port (one per test, taken on the first call).
  void WriteJob(TestJob job, const std::string& file = "job.toml") {
    port_ = port_ ? port_ : FreePort();
    job.master_port = port_;
    job_path_ = dir_.Write(file, job.Toml());
  }
  AgentProcess& Start(int node_rank, const std::string& job = "job.toml",
                      const std::map<std::string, std::string>& env = {}, bool own_process_group = false) {
    const std::string out = dir_.path() + "/agent-" + std::to_string(agents_.size()) + ".out";
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{dir_.path() + "/" + job, "--node-rank", std::to_string(node_rank)}, out, env,
        std::vector<std::string>{}, own_process_group));
    return *agents_.back();
  }
  /// Processes the test's workers started; any still alive at the end (the bug under test)
  /// are killed by pid so they do not outlive the test.
  void TearDown() override {
    for (pid_t pid : strays_) {
      if (pid > 0 && ProcessAlive(pid)) ::kill(pid, SIGKILL);
    }
  }
  std::vector<pid_t> strays_;
  /// This run's log folder of node `node`, relative to the scratch dir: each agent makes its
  /// own, "logs/<job>/<UTC time>-n<node>-<id>" (the agents of a test share one logs.dir).
  std::string RunFolder(int node) const {
    const std::vector<std::string> folders = RunFolders(node);
    EXPECT_EQ(folders.size(), 1u) << "run folders of node " << node;
    return folders.empty() ? "" : folders.back();
  }
  std::vector<std::string> RunFolders(int node) const {
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.path() + "/logs/e2e", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.find("-n" + std::to_string(node) + "-") != std::string::npos && !entry.is_symlink()) {
        found.push_back("logs/e2e/" + name);
      }
    }
    std::sort(found.begin(), found.end());
    return found;
  }
  std::string Describe() const { return DescribeAgents(agents_); }
  /// Waits for a pid file to be written completely (a worker writes it while we poll).
  pid_t ReadPid(const std::string& name) const {
    std::string text;
    WaitFor(
        [&] {
          text = dir_.Read(name);
          return !text.empty() && text.back() == '\n';
        },
        std::chrono::seconds(5));
    return text.empty() ? -1 : std::stoi(text);
  }

  ScratchDir dir_;
  uint16_t port_ = 0;
  std::string job_path_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

// Every worker gets torchrun's variables with the values torchrun would give it.
class EnvironmentTest : public RunnerTest, public ::testing::WithParamInterface<std::pair<int, int>> {};

TEST_P(EnvironmentTest, EveryWorkerSeesTheTorchrunEnvironment) {
  const auto [nnodes, nproc] = GetParam();
  TestJob o = Job();
  o.nnodes = nnodes;
  o.devices = nproc;
  o.script = "env > env-$RANK.txt";
  WriteJob(o);
  for (int n = 0; n < nnodes; ++n) Start(n, "job.toml", {{"DDPRUN_TEST_INHERITED", "kept"}});
  for (auto& agent : agents_) ASSERT_EQ(agent->Wait(30s), 0) << Describe();

  const int world = nnodes * nproc;
  std::string run_id;
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    auto env = ParseEnvDump(dir_.Read("env-" + std::to_string(rank) + ".txt"));
    const int node = rank / nproc, local = rank % nproc;
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(env["WORLD_SIZE"], std::to_string(world));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], std::to_string(nproc));
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(node));
    EXPECT_EQ(env["NODE_RANK"], std::to_string(node));
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], std::to_string(nnodes));
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(env["ROLE_WORLD_SIZE"], std::to_string(world));
    EXPECT_EQ(env["ROLE_NAME"], "default");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "1");
    EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
    EXPECT_EQ(env["PL_TRAINER_DEVICES"], std::to_string(nproc));
    EXPECT_EQ(env["PL_TRAINER_NUM_NODES"], std::to_string(nnodes));
    EXPECT_EQ(env["PL_TRAINER_ACCELERATOR"], "cpu");
    EXPECT_EQ(env["DDPRUN_TEST_INHERITED"], "kept");
    if (nproc > 1) {
      EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
    }
    EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], dir_.path() + "/" + RunFolder(node) + "/attempt-0/rank-" +
                                                  std::to_string(rank) + ".error.json");
    EXPECT_THAT(env["TORCHELASTIC_RUN_ID"], ::testing::StartsWith("e2e-"));
    if (rank == 0) {
      run_id = env["TORCHELASTIC_RUN_ID"];
      // Rank 0 hosts the store on a port node 0 picked for this round; every other rank
      // reaches it through the relay on master_port.
      EXPECT_GT(std::stoi(env["MASTER_PORT"]), 0);
      EXPECT_NE(env["MASTER_PORT"], std::to_string(port_));
    } else {
      EXPECT_EQ(env["MASTER_PORT"], std::to_string(port_));
    }
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], run_id) << "the run id must agree on every node";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, EnvironmentTest,
                         ::testing::Values(std::make_pair(1, 3), std::make_pair(2, 2), std::make_pair(4, 2)),
                         [](const auto& param_info) {
                           return std::to_string(param_info.param.first) + "x" +
                                  std::to_string(param_info.param.second);
                         });

TEST_F(RunnerTest, WithAStorePortEveryRankUsesItAndNoRelayIsInvolved) {
  const uint16_t store_port = FreePort();
  TestJob o = Job();
  o.script = "env > env-$RANK.txt";
  o.store_port = store_port;
  WriteJob(o);
  Start(0);
  Start(1);
  for (auto& agent : agents_) ASSERT_EQ(agent->Wait(30s), 0) << Describe();
  for (int rank = 0; rank < 4; ++rank) {
    auto env = ParseEnvDump(dir_.Read("env-" + std::to_string(rank) + ".txt"));
    EXPECT_EQ(env["MASTER_PORT"], std::to_string(store_port)) << "rank " << rank;
  }
}

constexpr const char* kSleeper =
    "trap 'echo stopped > stopped-$RANK-$TORCHELASTIC_RESTART_COUNT; exit 143' TERM; "
    "echo $$ > pid-$RANK-$TORCHELASTIC_RESTART_COUNT; sleep 30 & wait";

TEST_F(RunnerTest, AFailureStopsEveryWorkerRestartsAndThenFailsTheJobEverywhere) {
  TestJob o = Job();
  o.max_restarts = 1;
  // Rank 3 fails only once ranks 0-2 have set their TERM trap (they write the pid file after
  // it), so that each of them is stopped by the trap, not killed by the default action; it
  // gives up waiting after 10 s.
  o.script = std::string(
                 "echo start > start-$RANK-$TORCHELASTIC_RESTART_COUNT; "
                 "if [ \"$RANK\" = 3 ]; then r=$TORCHELASTIC_RESTART_COUNT; i=0; "
                 "while [ $i -lt 500 ] && ! { [ -e pid-0-$r ] && [ -e pid-1-$r ] && [ -e pid-2-$r ]; }; "
                 "do sleep 0.02; i=$((i + 1)); done; "
                 "echo 'rank 3 fails here' >&2; exit 1; fi; ") +
             kSleeper;
  WriteJob(o);
  Start(0);
  Start(1);
  for (auto& agent : agents_) ASSERT_EQ(agent->Wait(40s), 1) << Describe();

  for (int round = 0; round <= 1; ++round) {
    for (int rank = 0; rank < 4; ++rank) {
      const std::string suffix = std::to_string(rank) + "-" + std::to_string(round);
      EXPECT_TRUE(dir_.Exists("start-" + suffix)) << suffix;
      if (rank != 3) {
        EXPECT_TRUE(dir_.Exists("stopped-" + suffix)) << "not stopped by SIGTERM: " << suffix;
      }
    }
  }
  EXPECT_FALSE(dir_.Exists("start-0-2")) << "no third round with max_restarts = 1";
  for (const auto& agent : agents_) {
    const std::string out = agent->Output();
    EXPECT_THAT(out, HasSubstr("job \"e2e\" FAILED in round 1 after using all 1 restart"));
    EXPECT_THAT(out, HasSubstr("root cause (first failure anywhere in the job): rank 3 (node 1"));
    EXPECT_THAT(out, HasSubstr("local rank 1) exited with code 1"));
    EXPECT_THAT(out, HasSubstr("rank 3 fails here"));
    EXPECT_THAT(out, HasSubstr("ddprun then stopped 3 other running ranks"));
  }
  // The per-rank, per-attempt log holds the failing rank's output.
  EXPECT_THAT(dir_.Read(RunFolder(1) + "/attempt-0/rank-3.log"), HasSubstr("rank 3 fails here"));
  EXPECT_THAT(dir_.Read(RunFolder(1) + "/attempt-1/rank-3.log"), HasSubstr("rank 3 fails here"));
}

TEST_F(RunnerTest, ASigkilledAgentLeavesNoOrphansAndTheOthersNotice) {
  TestJob o = Job();
  o.script = "sleep 60 & echo $! > child-$RANK; echo $$ > pid-$RANK; wait";
  WriteJob(o);
  Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_TRUE(
      WaitFor([&] { return dir_.Exists("child-3") && dir_.Exists("pid-3") && dir_.Exists("child-0"); }, 20s))
      << Describe();
  std::vector<pid_t> node1_pids = {ReadPid("pid-2"), ReadPid("pid-3"), ReadPid("child-2"),
                                   ReadPid("child-3")};
  node1.Signal(SIGKILL);
  EXPECT_EQ(node1.Wait(5s), 128 + SIGKILL);
  for (pid_t pid : node1_pids) {
    EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(pid); }, 5s)) << "orphan " << pid << " survived";
  }
  // Node 0 notices within the heartbeat bound, stops its workers and ends the job.
  EXPECT_EQ(agents_[0]->Wait(15s), 1) << Describe();
  EXPECT_THAT(agents_[0]->Output(),
              ::testing::ContainsRegex(
                  "root cause \\(first failure anywhere in the job\\): node 1 \\([^)]*\\) was lost"));
  for (const char* name : {"pid-0", "pid-1", "child-0", "child-1"}) {
    EXPECT_FALSE(ProcessAlive(ReadPid(name))) << name;
  }
}

TEST_F(RunnerTest, WhenTheMastersAgentDiesTheOthersStopAndExit3) {
  TestJob o = Job();
  o.script = "echo $$ > pid-$RANK; sleep 60 & wait";
  o.rendezvous = "2s";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  Start(1);
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("pid-2") && dir_.Exists("pid-3"); }, 20s)) << Describe();
  ASSERT_GT(ReadPid("pid-3"), 0);
  node0.Signal(SIGKILL);
  EXPECT_EQ(agents_[1]->Wait(20s), 3) << Describe();
  const std::string out = agents_[1]->Output();
  EXPECT_THAT(out, HasSubstr("lost the coordinator at 127.0.0.1:" + std::to_string(port_)));
  EXPECT_THAT(out, HasSubstr("could not rejoin within timeouts.rendezvous = 2s"));
  EXPECT_FALSE(ProcessAlive(ReadPid("pid-2")));
  EXPECT_FALSE(ProcessAlive(ReadPid("pid-3")));
}

TEST_F(RunnerTest, ANodeWithADifferentJobFileIsRefusedWithTheDifference) {
  TestJob o = Job();
  o.rendezvous = "3s";
  WriteJob(o);
  TestJob other = o;
  other.devices = 3;
  WriteJob(other, "other.toml");
  Start(0);
  AgentProcess& node1 = Start(1, "other.toml");
  EXPECT_EQ(node1.Wait(20s), 3) << Describe();
  EXPECT_THAT(node1.Output(), AllOf(HasSubstr("runs a different job file than node 0"),
                                    HasSubstr("cluster.nproc_per_node: node 1 has 3, node 0 has 2")));
  EXPECT_EQ(agents_[0]->Wait(20s), 3) << Describe();
  EXPECT_THAT(agents_[0]->Output(), HasSubstr("cluster.nproc_per_node: node 1 has 3, node 0 has 2"));
}

TEST_F(RunnerTest, ADuplicateNodeRankIsRefusedAndTheJobGoesOn) {
  TestJob o = Job();
  // The workers run until the impostor has been refused (the test writes `go`; 30 s at most),
  // so that node 1 still holds its rank when the impostor claims it.
  o.script =
      "touch started-$RANK; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done";
  WriteJob(o);
  Start(0);
  Start(1);
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("started-3"); }, 20s)) << Describe();
  AgentProcess& impostor = Start(1);
  EXPECT_EQ(impostor.Wait(20s), 3) << Describe();
  EXPECT_THAT(impostor.Output(), HasSubstr("node rank 1 is claimed twice"));
  dir_.Write("go", "");
  EXPECT_EQ(agents_[0]->Wait(20s), 0) << Describe();
  EXPECT_EQ(agents_[1]->Wait(20s), 0) << Describe();
}

TEST_F(RunnerTest, ANodeThatNeverComesIsNamedAndTheJobExits3) {
  TestJob o = Job();
  o.rendezvous = "1500ms";
  o.nnodes = 3;
  WriteJob(o);
  Start(0);
  Start(2);
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(20s), 3) << Describe();
  for (auto& agent : agents_) {
    EXPECT_THAT(agent->Output(), HasSubstr("rendezvous failed: 2/3 nodes joined within "
                                           "timeouts.rendezvous = 1s500ms; never joined: node 1"));
  }
}

TEST_F(RunnerTest, ATakenMasterPortIsExplainedWithItsOwner) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  WriteJob(Job());
  AgentProcess& node0 = Start(0);
  EXPECT_EQ(node0.Wait(20s), 3) << Describe();
  EXPECT_THAT(node0.Output(),
              AllOf(HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(port_) +
                              ": the port is already in use by pid " + std::to_string(::getpid())),
                    HasSubstr("pick another cluster.master_port")));
  ::close(fd);
}

TEST_F(RunnerTest, SigintOnAnyAgentStopsTheJobOnEveryNode) {
  TestJob o = Job();
  o.script = kSleeper;
  WriteJob(o);
  Start(0);
  AgentProcess& node1 = Start(1);
  // Every worker must have set its trap before the signal: wait for all four.
  ASSERT_TRUE(WaitFor(
      [&] {
        return dir_.Exists("pid-0-0") && dir_.Exists("pid-1-0") && dir_.Exists("pid-2-0") &&
               dir_.Exists("pid-3-0");
      },
      20s))
      << Describe();
  node1.Signal(SIGINT);
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(20s), 130) << Describe();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(dir_.Exists("stopped-" + std::to_string(rank) + "-0")) << rank;
  }
  EXPECT_THAT(agents_[0]->Output(),
              ::testing::ContainsRegex("interrupted: node 1 \\([^)]*\\) received SIGINT"));
}

TEST_F(RunnerTest, SigtermExits143) {
  TestJob o = Job();
  o.nnodes = 1;
  o.script = kSleeper;
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  // Both ranks must have set their TERM trap (they write the pid file after it) before the
  // signal, or a slow-starting rank 0 dies of the default action and writes nothing.
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("pid-0-0") && dir_.Exists("pid-1-0"); }, 20s)) << Describe();
  node0.Signal(SIGTERM);
  EXPECT_EQ(node0.Wait(20s), 143) << Describe();
  EXPECT_TRUE(dir_.Exists("stopped-0-0"));
  EXPECT_TRUE(dir_.Exists("stopped-1-0"));
}

TEST_F(RunnerTest, NoByteOfOutputIsLostAtExit) {
  TestJob o = Job();
  o.nnodes = 1;
  o.script = "seq 1 100000; printf 'no newline at the end'";
  o.extra = "[logs]\nconsole = \"none\"\n";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  ASSERT_EQ(node0.Wait(30s), 0) << Describe();
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = dir_.Read("logs/e2e/latest/attempt-0/rank-" + std::to_string(rank) + ".log");
    std::string expected;
    for (int i = 1; i <= 100000; ++i) expected += std::to_string(i) + "\n";
    expected += "no newline at the end";
    EXPECT_EQ(log.size(), expected.size());
    EXPECT_TRUE(log == expected) << "rank " << rank << " log differs";
  }
  EXPECT_THAT(node0.Output(), ::testing::Not(HasSubstr("[n0 r0] 5000")))
      << "logs.console = none shows nothing live";
}

TEST_F(RunnerTest, TheConsoleShowsPrefixedLinesOfTheSelectedRanks) {
  TestJob o = Job();
  o.nnodes = 1;
  o.devices = 3;
  o.script = "echo hello from $RANK";
  o.extra = "[logs]\nconsole = [1]\n";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  ASSERT_EQ(node0.Wait(30s), 0) << Describe();
  EXPECT_THAT(node0.Output(), HasSubstr("[n0 r1] hello from 1\n"));
  EXPECT_THAT(node0.Output(), ::testing::Not(HasSubstr("hello from 0")));
  EXPECT_THAT(node0.Output(), ::testing::Not(HasSubstr("hello from 2")));
}

TEST_F(RunnerTest, TheErrorFileTracebackLeadsTheSummaryWithAnNcclHint) {
  TestJob o = Job();
  o.nnodes = 1;
  o.script =
      "if [ \"$RANK\" = 1 ]; then printf '%s' '{\"message\": {\"message\": \"RuntimeError: NCCL "
      "error: unhandled system error\", \"extraInfo\": {\"py_callstack\": \"Traceback (most recent "
      "call last):\\n  File \\\"train.py\\\", line 7\\nRuntimeError: NCCL error: unhandled system "
      "error\", \"timestamp\": \"1\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 1; fi; sleep 30";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  ASSERT_EQ(node0.Wait(30s), 1) << Describe();
  const std::string out = node0.Output();
  EXPECT_THAT(out, HasSubstr("error (from TORCHELASTIC_ERROR_FILE):"));
  EXPECT_THAT(out, HasSubstr("    | Traceback (most recent call last):"));
  EXPECT_THAT(out, HasSubstr("    | RuntimeError: NCCL error: unhandled system error"));
  EXPECT_THAT(out, HasSubstr("hint: the error mentions NCCL; rerun with NCCL_DEBUG=INFO"));
}

TEST_F(RunnerTest, ACommandThatDoesNotExistIsReportedAsTheRootCause) {
  TestJob o = Job();
  o.nnodes = 1;
  o.command = "[\"ddprun-no-such-command\", \"--flag\"]";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  ASSERT_EQ(node0.Wait(30s), 1) << Describe();
  EXPECT_THAT(node0.Output(), HasSubstr("command not found: \"ddprun-no-such-command\""));
}

// Issue 11 item 4 (a): a worker's `setsid cmd &` leaves its process group and session; the agent
// (a child subreaper) still finds it below itself and kills it when no worker runs any more.
TEST_F(RunnerTest, AProcessAWorkerStartedInItsOwnSessionEndsWithTheJob) {
  TestJob o = Job();
  o.nnodes = 1;
  o.devices = 1;
  // The child writes its pid once it is in its own session; the worker exits only then (else
  // the worker's end could take the child with its group before it left).
  o.script = "setsid sh -c 'echo $$ > escapee; exec sleep 300' & while [ ! -s escapee ]; do sleep 0.01; done";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  ASSERT_EQ(node0.Wait(30s), 0) << Describe();
  const pid_t escapee = ReadPid("escapee");
  strays_.push_back(escapee);
  ASSERT_GT(escapee, 0);
  EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(escapee); }, 5s))
      << "the worker's setsid child " << escapee << " outlived the job";
}

/// Workers that start a child in their group and one in a session of its own, then wait.
constexpr const char* kParent =
    "sleep 300 & echo $! > child-$RANK; setsid sh -c 'echo $$ > session-$RANK; exec sleep 300' & "
    "echo $$ > pid-$RANK; wait";

// Issue 11 item 4 (b): `kill -9 %1` in bash SIGKILLs the agent's whole process group. The
// guardian lives in its own session, so it survives that and kills every worker and
// everything they started, in their group or not.
TEST_F(RunnerTest, KillingTheAgentsWholeProcessGroupLeavesNoProcessBehind) {
  TestJob o = Job();
  o.nnodes = 1;
  o.script = kParent;
  WriteJob(o);
  AgentProcess& node0 = Start(0, "job.toml", {}, /*own_process_group=*/true);
  std::vector<pid_t> pids;
  for (const char* name : {"pid-0", "pid-1", "child-0", "child-1", "session-0", "session-1"}) {
    pids.push_back(ReadPid(name));
    strays_.push_back(pids.back());
    ASSERT_GT(pids.back(), 0) << name << "\n" << Describe();
  }
  ASSERT_EQ(::kill(-node0.pid(), SIGKILL), 0);
  EXPECT_EQ(node0.Wait(5s), 128 + SIGKILL);
  for (pid_t pid : pids) {
    EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(pid); }, 10s)) << "process " << pid << " survived";
  }
}

// Issue 11 item 4 (c): killing the guardian alone is noticed; the agent says so and starts a
// new one, which then does the guardian's job when the agent's group is killed.
TEST_F(RunnerTest, AKilledGuardianIsReplacedAndTheReplacementCleansUp) {
  TestJob o = Job();
  o.nnodes = 1;
  o.script = kParent;
  WriteJob(o);
  AgentProcess& node0 = Start(0, "job.toml", {}, /*own_process_group=*/true);
  std::vector<pid_t> pids;
  for (const char* name : {"pid-0", "pid-1", "child-0", "child-1", "session-0", "session-1"}) {
    pids.push_back(ReadPid(name));
    strays_.push_back(pids.back());
    ASSERT_GT(pids.back(), 0) << name << "\n" << Describe();
  }
  const std::vector<pid_t> guardians = ChildrenNamed(node0.pid(), "ddprun-guardian");
  ASSERT_EQ(guardians.size(), 1u) << Describe();
  ASSERT_EQ(::kill(guardians[0], SIGKILL), 0);
  const std::string said = "the guardian process (pid " + std::to_string(guardians[0]) +
                           ") killed by SIGKILL; started a new one (pid ";
  ASSERT_TRUE(WaitFor([&] { return node0.Output().find(said) != std::string::npos; }, 10s)) << Describe();
  const std::string out = node0.Output();
  const pid_t replacement = std::atoi(out.c_str() + out.find(said) + said.size());
  EXPECT_THAT(out, HasSubstr(said + std::to_string(replacement) +
                             "), so processes the workers started still cannot outlive this agent"));
  // The new guardian names itself a moment after the fork.
  ASSERT_TRUE(WaitFor(
      [&] { return ChildrenNamed(node0.pid(), "ddprun-guardian") == std::vector<pid_t>{replacement}; }, 10s))
      << Describe();
  ASSERT_EQ(::kill(-node0.pid(), SIGKILL), 0);
  EXPECT_EQ(node0.Wait(5s), 128 + SIGKILL);
  for (pid_t pid : pids) {
    EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(pid); }, 10s)) << "process " << pid << " survived";
  }
  EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(replacement); }, 10s)) << "the guardian stays";
}

// Issue 12 item 3: a second run of the same job writes a new folder; the first run's files
// stay as they were, and `latest` names the second.
TEST_F(RunnerTest, EachRunKeepsItsOwnLogsAndLatestNamesTheNewest) {
  TestJob o = Job();
  o.nnodes = 1;
  o.devices = 1;
  o.script = "echo run $(cat count 2>/dev/null || echo 1); echo 2 > count";
  WriteJob(o);
  ASSERT_EQ(Start(0).Wait(30s), 0) << Describe();
  const std::string first = RunFolder(0);
  ASSERT_FALSE(first.empty()) << Describe();
  EXPECT_EQ(dir_.Read(first + "/attempt-0/rank-0.log"), "run 1\n");
  EXPECT_EQ(std::filesystem::read_symlink(dir_.path() + "/logs/e2e/latest").string(),
            first.substr(first.rfind('/') + 1));
  ASSERT_EQ(Start(0).Wait(30s), 0) << Describe();
  const std::vector<std::string> folders = RunFolders(0);
  ASSERT_EQ(folders.size(), 2u) << Describe();
  const std::string second = folders[0] == first ? folders[1] : folders[0];
  EXPECT_EQ(dir_.Read(first + "/attempt-0/rank-0.log"), "run 1\n") << "the first run's log was touched";
  EXPECT_EQ(dir_.Read(second + "/attempt-0/rank-0.log"), "run 2\n");
  EXPECT_EQ(dir_.Read("logs/e2e/latest/attempt-0/rank-0.log"), "run 2\n");
  EXPECT_EQ(dir_.Read("logs/e2e/latest-n0/attempt-0/rank-0.log"), "run 2\n");
  EXPECT_THAT(agents_[1]->Output(),
              HasSubstr("logs of this run: " + dir_.path() + "/" + second + "/ (also logs/e2e/latest-n0)"));
}

// Issue 11 item 5: a link planted where ddprun makes the job's log folder is not followed; the
// file it points into is untouched and the job fails saying why.
TEST_F(RunnerTest, APlantedLinkInTheLogFolderIsNotFollowed) {
  TestJob o = Job();
  o.nnodes = 1;
  o.devices = 2;
  o.script = "echo overwritten";
  WriteJob(o);
  dir_.Write("victim/attempt-0/rank-1.log", "precious\n");
  std::filesystem::create_directories(dir_.path() + "/logs");
  std::filesystem::create_directory_symlink(dir_.path() + "/victim", dir_.path() + "/logs/e2e");
  AgentProcess& node0 = Start(0);
  ASSERT_EQ(node0.Wait(30s), 1) << Describe();
  EXPECT_EQ(dir_.Read("victim/attempt-0/rank-1.log"), "precious\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_.path() + "/victim"),
                          std::filesystem::directory_iterator()),
            1)
      << "nothing was created in the link's target";
  EXPECT_THAT(node0.Output(), HasSubstr("ddprun could not start the worker: " + dir_.path() +
                                        "/logs/e2e is a symbolic link; ddprun follows no link below logs.dir "
                                        "(someone may have planted it to make ddprun write elsewhere)"));
}

// Issue 11 item 5: a log that cannot be written (a full disk) is said on the console and in the
// summary instead of leaving a silently short file behind.
TEST_F(RunnerTest, AFullDiskIsReportedOnTheConsoleAndInTheSummary) {
  const std::string probe = dir_.path() + "/probe";
  std::filesystem::create_directories(probe);
  const std::string mount =
      "unshare -m --propagation private sh -c 'mount -t tmpfs -o size=64k tmpfs " + probe + "' 2>/dev/null";
  DDPRUN_REQUIRE_OR_SKIP(
      "testbed", std::system(mount.c_str()) == 0,
      "needs root and mount namespaces (unshare -m, mount -t tmpfs) for a small full disk");
  TestJob o = Job();
  o.nnodes = 1;
  o.devices = 1;
  o.script = "head -c 300000 /dev/zero | tr '\\0' x; echo; echo end";
  o.extra = "[logs]\nconsole = \"none\"\n";
  WriteJob(o);
  std::filesystem::create_directories(dir_.path() + "/logs");
  const std::string out = dir_.path() + "/agent.out";
  agents_.push_back(std::make_unique<AgentProcess>(
      std::vector<std::string>{job_path_, "--node-rank", "0"}, out, std::map<std::string, std::string>{},
      std::vector<std::string>{"unshare", "-m", "--propagation", "private", "sh", "-c",
                               "mount -t tmpfs -o size=64k tmpfs \"$0\" && exec \"$@\"",
                               dir_.path() + "/logs"}));
  ASSERT_EQ(agents_.back()->Wait(30s), 0) << Describe();
  const std::string output = agents_.back()->Output();
  const std::string problem = "log file incomplete: rank 0: cannot write ";
  EXPECT_THAT(output, ::testing::ContainsRegex("error: " + problem +
                                               ".*/attempt-0/rank-0.log: No space "
                                               "left on device; the file stops after [0-9]+ bytes\n"));
  const auto summary = output.find("job \"e2e\" succeeded");
  ASSERT_NE(summary, std::string::npos) << output;
  EXPECT_THAT(output.substr(summary), HasSubstr(problem));
}

// Issue 12 item 6: a progress bar ('\r' without '\n') shows on the console while the worker
// runs; the log file keeps the bytes as written.
TEST_F(RunnerTest, ProgressBarsShowLiveAndTheLogKeepsTheBytes) {
  TestJob o = Job();
  o.nnodes = 1;
  o.devices = 1;
  o.script = "printf '\\rprogress 1'; while [ ! -e go ]; do sleep 0.05; done; printf '\\rprogress 2\\n'";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  EXPECT_TRUE(WaitFor([&] { return node0.Output().find("[n0 r0] progress 1\n") != std::string::npos; }, 10s))
      << Describe();
  dir_.Write("go", "");
  ASSERT_EQ(node0.Wait(30s), 0) << Describe();
  EXPECT_THAT(node0.Output(), HasSubstr("[n0 r0] progress 2\n"));
  EXPECT_EQ(dir_.Read("logs/e2e/latest/attempt-0/rank-0.log"), "\rprogress 1\rprogress 2\n");
}

// Issue 12 item 8: a missing workdir is named as such, not as a missing program.
TEST_F(RunnerTest, AMissingWorkdirIsNamed) {
  TestJob o = Job();
  o.nnodes = 1;
  o.devices = 1;
  o.workdir = "no-such-folder";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  ASSERT_EQ(node0.Wait(30s), 1) << Describe();
  EXPECT_THAT(node0.Output(), HasSubstr("ddprun could not start the worker: the workdir " + dir_.path() +
                                        "/no-such-folder does not exist (job.workdir, relative to the "
                                        "job file)"));
}

// The root cause is the rank that raised, not the peer that died first because it lost it:
// rank 3 writes its error file and takes long to exit (as Python does while it tears down a
// process group); rank 2 then dies at once of gloo's "Connection closed by peer". Every node
// must name rank 3, with its error, and node 0 says why rank 2 is not the cause. Rank 2's
// traceback stays off node 1's console although the first verdict named rank 2 (it is held
// while that verdict may be revised), and the digest names rank 3.
TEST_F(RunnerTest, APeerThatOnlyLostTheFailingRankIsNotTheRootCause) {
  TestJob job = Job();
  job.script =
      "case $RANK in "
      "3) printf '{\"message\": {\"message\": \"RuntimeError: rank 3 fails on purpose\", "
      "\"extraInfo\": {\"timestamp\": \"0\"}}}' > $TORCHELASTIC_ERROR_FILE; touch raised; sleep 30;; "
      "2) while [ ! -e raised ]; do sleep 0.05; done; "
      "printf 'Traceback (most recent call last):\\n  File \"train.py\", line 1, in main\\n"
      "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:1234\\n' >&2; exit 1;; "
      "*) sleep 30;; esac";
  WriteJob(job);
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  EXPECT_EQ(node0.Wait(40s), 1) << Describe();
  EXPECT_EQ(node1.Wait(20s), 1) << Describe();
  EXPECT_THAT(node0.Output(), HasSubstr("coordinator] warning: round 0: the root cause is rank 3 (node 1"))
      << Describe();
  for (const AgentProcess* agent : {&node0, &node1}) {
    EXPECT_THAT(agent->Output(), HasSubstr("round 0 failed: rank 3 (node 1")) << Describe();
    EXPECT_THAT(agent->Output(), HasSubstr("| RuntimeError: rank 3 fails on purpose")) << Describe();
    EXPECT_THAT(agent->Output(), HasSubstr("root cause (first failure anywhere in the job): rank 3 (node 1"))
        << Describe();
    EXPECT_THAT(agent->Output(), HasSubstr("(rank 2 failed before it, with an error that says it lost "
                                           "a peer: a consequence, not the cause)"))
        << Describe();
  }
  EXPECT_THAT(node1.Output(), Not(HasSubstr("[n1 r2] RuntimeError"))) << Describe();
  EXPECT_THAT(node1.Output(), Not(HasSubstr("[n1 r2] Traceback"))) << Describe();
  EXPECT_THAT(node1.Output(),
              HasSubstr("round 0: after rank 3 failed, rank 2 lost a peer, as expected; 3 lines "
                        "of its stderr are not shown here"))
      << Describe();
}

}  // namespace
}  // namespace ddprun::e2e

namespace ddprun::e2e {
namespace {

// restart.never_on: a script that does not even parse is not restarted; the job ends at once
// with exit 1, the SyntaxError in the summary and the budget unspent (issue 15).
TEST(RunnerPolicyTest, ASyntaxErrorEndsTheJobAtOnceWithoutARestart) {
  ScratchDir dir;
  dir.Write("broken.py", "import os\ndef main(:\n    pass\n");
  TestJob job;
  job.command = "[\"/usr/bin/python3\", \"broken.py\"]";
  job.max_restarts = 3;
  job.backoff = "5s";
  job.never_on = {"SyntaxError", "ModuleNotFoundError"};
  job.master_port = FreePort();
  const std::string path = dir.Write("job.toml", job.Toml());
  const auto started = std::chrono::steady_clock::now();
  AgentProcess node1({path, "--node-rank", "1"}, dir.path() + "/node1.out");
  AgentProcess node0({path, "--node-rank", "0"}, dir.path() + "/node0.out");
  const auto code0 = node0.Wait(60s);
  const auto code1 = node1.Wait(20s);
  const std::string outputs = node0.Output() + "\n---- node 1 ----\n" + node1.Output();
  EXPECT_EQ(code0, 1) << outputs;
  EXPECT_EQ(code1, 1) << outputs;
  // One round only: a restart would have waited the 5 s backoff first.
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s) << outputs;
  for (const std::string* out : {&outputs}) {
    EXPECT_NE(out->find("FAILED in round 0, not restarted: restart.never_on has \"SyntaxError\" "
                        "(3 of 3 restarts left)"),
              std::string::npos)
        << *out;
    EXPECT_NE(out->find("  kind: SyntaxError, exit:1"), std::string::npos) << *out;
    EXPECT_NE(out->find("SyntaxError: invalid syntax"), std::string::npos) << *out;
    EXPECT_EQ(out->find("round 1"), std::string::npos) << *out;
  }
}

}  // namespace
}  // namespace ddprun::e2e
