// End-to-end tests of `ddprun job.toml`: real agents as separate processes on 127.0.0.1.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

struct JobOptions {
  std::string name = "e2e";
  int nnodes = 2;
  int nproc = 2;
  std::string script = "true";
  std::string command;  // the TOML array, when not `sh -c script`
  int max_restarts = 0;
  std::string rendezvous = "10s";
  std::string extra;  // appended TOML
};

std::string ShellQuoteToml(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string JobToml(const JobOptions& o, uint16_t port) {
  std::ostringstream t;
  t << "version = 1\n[job]\nname = \"" << o.name << "\"\ncommand = "
    << (o.command.empty() ? "[\"sh\", \"-c\", " + ShellQuoteToml(o.script) + "]" : o.command) << "\n"
    << "[cluster]\nnnodes = " << o.nnodes << "\nmaster_addr = \"127.0.0.1\"\nmaster_port = " << port
    << "\n[trainer]\naccelerator = \"cpu\"\ndevices = " << o.nproc << "\nnum_nodes = " << o.nnodes
    << "\n[restart]\nmax_restarts = " << o.max_restarts << "\nbackoff = \"0s\"\n"
    << "[timeouts]\nrendezvous = \"" << o.rendezvous << "\"\nheartbeat = \"250ms\"\nstop_grace = \"2s\"\n"
    << o.extra;
  return t.str();
}

class RunnerTest : public ::testing::Test {
 protected:
  void WriteJob(const JobOptions& options, const std::string& file = "job.toml") {
    port_ = port_ ? port_ : FreePort();
    job_path_ = dir_.Write(file, JobToml(options, port_));
  }
  AgentProcess& Start(int node_rank, const std::string& job = "job.toml",
                      const std::map<std::string, std::string>& env = {}) {
    const std::string out = dir_.path() + "/agent-" + std::to_string(agents_.size()) + ".out";
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{dir_.path() + "/" + job, "--node-rank", std::to_string(node_rank)},
        out, env));
    return *agents_.back();
  }
  std::string Describe() const { return DescribeAgents(agents_); }
  /// Waits for a pid file to be written completely (a worker writes it while we poll).
  pid_t ReadPid(const std::string& name) const {
    std::string text;
    WaitFor([&] {
      text = dir_.Read(name);
      return !text.empty() && text.back() == '\n';
    }, std::chrono::seconds(5));
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
  JobOptions o;
  o.nnodes = nnodes;
  o.nproc = nproc;
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
    EXPECT_THAT(env["TORCHELASTIC_ERROR_FILE"],
                AllOf(HasSubstr(dir_.path() + "/logs/e2e/attempt-0/"),
                      HasSubstr("rank-" + std::to_string(rank) + ".error.json")));
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
                         ::testing::Values(std::make_pair(1, 3), std::make_pair(2, 2),
                                           std::make_pair(4, 2)),
                         [](const auto& param_info) {
                           return std::to_string(param_info.param.first) + "x" + std::to_string(param_info.param.second);
                         });

TEST_F(RunnerTest, WithAStorePortEveryRankUsesItAndNoRelayIsInvolved) {
  const uint16_t store_port = FreePort();
  JobOptions o;
  o.script = "env > env-$RANK.txt";
  port_ = FreePort();
  WriteJob(o);
  // store_port belongs in [cluster]; append it under the master_port line.
  std::string text = dir_.Read("job.toml");
  const std::string master_line = "master_port = " + std::to_string(port_) + "\n";
  text.replace(text.find(master_line), master_line.size(),
               master_line + "store_port = " + std::to_string(store_port) + "\n");
  dir_.Write("job.toml", text);
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
  JobOptions o;
  o.max_restarts = 1;
  o.script = std::string("echo start > start-$RANK-$TORCHELASTIC_RESTART_COUNT; "
                         "if [ \"$RANK\" = 3 ]; then sleep 0.5; echo 'rank 3 fails here' >&2; exit 1; fi; ") +
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
  EXPECT_THAT(dir_.Read("logs/e2e/attempt-0/rank-3.log"), HasSubstr("rank 3 fails here"));
  EXPECT_THAT(dir_.Read("logs/e2e/attempt-1/rank-3.log"), HasSubstr("rank 3 fails here"));
}

TEST_F(RunnerTest, ASigkilledAgentLeavesNoOrphansAndTheOthersNotice) {
  JobOptions o;
  o.script = "sleep 60 & echo $! > child-$RANK; echo $$ > pid-$RANK; wait";
  WriteJob(o);
  Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("child-3") && dir_.Exists("pid-3") && dir_.Exists("child-0"); }, 20s))
      << Describe();
  std::vector<pid_t> node1_pids = {ReadPid("pid-2"), ReadPid("pid-3"), ReadPid("child-2"), ReadPid("child-3")};
  node1.Signal(SIGKILL);
  EXPECT_EQ(node1.Wait(5s), 128 + SIGKILL);
  for (pid_t pid : node1_pids) {
    EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(pid); }, 5s)) << "orphan " << pid << " survived";
  }
  // Node 0 notices within the heartbeat bound, stops its workers and ends the job.
  EXPECT_EQ(agents_[0]->Wait(15s), 1) << Describe();
  EXPECT_THAT(agents_[0]->Output(), ::testing::ContainsRegex("root cause \\(first failure anywhere in the job\\): node 1 \\([^)]*\\) was lost"));
  for (const char* name : {"pid-0", "pid-1", "child-0", "child-1"}) {
    EXPECT_FALSE(ProcessAlive(ReadPid(name))) << name;
  }
}

TEST_F(RunnerTest, WhenTheMastersAgentDiesTheOthersStopAndExit3) {
  JobOptions o;
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
  JobOptions o;
  o.rendezvous = "3s";
  WriteJob(o);
  JobOptions other = o;
  other.nproc = 3;
  dir_.Write("other.toml", JobToml(other, port_));
  Start(0);
  AgentProcess& node1 = Start(1, "other.toml");
  EXPECT_EQ(node1.Wait(20s), 3) << Describe();
  EXPECT_THAT(node1.Output(), AllOf(HasSubstr("runs a different job file than node 0"),
                                    HasSubstr("cluster.nproc_per_node: node 1 has 3, node 0 has 2")));
  EXPECT_EQ(agents_[0]->Wait(20s), 3) << Describe();
  EXPECT_THAT(agents_[0]->Output(), HasSubstr("cluster.nproc_per_node: node 1 has 3, node 0 has 2"));
}

TEST_F(RunnerTest, ADuplicateNodeRankIsRefusedAndTheJobGoesOn) {
  JobOptions o;
  o.script = "touch started-$RANK; sleep 2";
  WriteJob(o);
  Start(0);
  Start(1);
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("started-3"); }, 20s)) << Describe();
  AgentProcess& impostor = Start(1);
  EXPECT_EQ(impostor.Wait(20s), 3) << Describe();
  EXPECT_THAT(impostor.Output(), HasSubstr("node rank 1 is claimed twice"));
  EXPECT_EQ(agents_[0]->Wait(20s), 0) << Describe();
  EXPECT_EQ(agents_[1]->Wait(20s), 0) << Describe();
}

TEST_F(RunnerTest, ANodeThatNeverComesIsNamedAndTheJobExits3) {
  JobOptions o;
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
  WriteJob(JobOptions{});
  AgentProcess& node0 = Start(0);
  EXPECT_EQ(node0.Wait(20s), 3) << Describe();
  EXPECT_THAT(node0.Output(),
              AllOf(HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(port_) +
                              ": the port is already in use by pid " + std::to_string(::getpid())),
                    HasSubstr("pick another cluster.master_port")));
  ::close(fd);
}

TEST_F(RunnerTest, SigintOnAnyAgentStopsTheJobOnEveryNode) {
  JobOptions o;
  o.script = kSleeper;
  WriteJob(o);
  Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("pid-0-0") && dir_.Exists("pid-3-0"); }, 20s)) << Describe();
  node1.Signal(SIGINT);
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(20s), 130) << Describe();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(dir_.Exists("stopped-" + std::to_string(rank) + "-0")) << rank;
  }
  EXPECT_THAT(agents_[0]->Output(), ::testing::ContainsRegex("interrupted: node 1 \\([^)]*\\) received SIGINT"));
}

TEST_F(RunnerTest, SigtermExits143) {
  JobOptions o;
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
  JobOptions o;
  o.nnodes = 1;
  o.script = "seq 1 100000; printf 'no newline at the end'";
  o.extra = "[logs]\nconsole = \"none\"\n";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  ASSERT_EQ(node0.Wait(30s), 0) << Describe();
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = dir_.Read("logs/e2e/attempt-0/rank-" + std::to_string(rank) + ".log");
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
  JobOptions o;
  o.nnodes = 1;
  o.nproc = 3;
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
  JobOptions o;
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
  JobOptions o;
  o.nnodes = 1;
  o.command = "[\"ddprun-no-such-command\", \"--flag\"]";
  WriteJob(o);
  AgentProcess& node0 = Start(0);
  ASSERT_EQ(node0.Wait(30s), 1) << Describe();
  EXPECT_THAT(node0.Output(), HasSubstr("command not found: \"ddprun-no-such-command\""));
}

}  // namespace
}  // namespace ddprun::e2e
