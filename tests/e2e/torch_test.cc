// A real PyTorch DDP job (gloo on CPU) under ddprun: 2 nodes x 2 processes on 127.0.0.1,
// through the store relay, with a forced failure and a restart; what the consoles show of it.

#include <cstdlib>
#include <memory>
#include <regex>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/harness.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(TorchTest, DdpTrainsThroughTheRelayAndAgainAfterAForcedRestart) {
  DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing);
  ScratchDir dir;
  const uint16_t port = FreePort();
  dir.Write("results/.keep", "");
  // The job runs the example script from the repository, as users would.
  const std::string job = dir.Write("job.toml", R"(version = 1
[job]
name = "torch-e2e"
command = ["/usr/bin/python3", ")" + std::string(DDPRUN_SOURCE_DIR) +
                                                    R"(/examples/ddp_train.py",
           "--steps", "6", "--fail-rank", "3", "--fail-attempt", "0", "--result-dir", "results"]
env = { GLOO_SOCKET_IFNAME = "lo" }
[cluster]
nnodes = 2
master_addr = "127.0.0.1"
master_port = )" + std::to_string(port) + R"(
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 2
[restart]
max_restarts = 1
backoff = "0s"
[timeouts]
rendezvous = "60s"
heartbeat = "1s"
stop_grace = "10s"
)");
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/node1.out");
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/node0.out");
  const auto code0 = node0.Wait(240s);
  const auto code1 = node1.Wait(30s);
  const std::string outputs = node0.Output() + "\n---- node 1 ----\n" + node1.Output();
  ASSERT_EQ(code0, 0) << outputs;
  ASSERT_EQ(code1, 0) << outputs;

  // Round 0 failed on rank 3 with a Python exception; every node quoted it from the error file.
  for (const std::string& out : {node0.Output(), node1.Output()}) {
    EXPECT_THAT(out, HasSubstr("round 0 failed: rank 3 (node 1"));
    EXPECT_THAT(out, HasSubstr("RuntimeError: rank 3 fails on purpose in attempt 0"));
    EXPECT_THAT(out, HasSubstr("succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)"));
  }
  // Round 1 trained on every rank: the all_reduce is right and DDP kept the replicas equal.
  nlohmann::json reference;
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::string name = "results/rank-" + std::to_string(rank) + "-attempt-1.json";
    ASSERT_TRUE(dir.Exists(name)) << outputs;
    const auto result = nlohmann::json::parse(dir.Read(name));
    EXPECT_EQ(result["world"], 4);
    EXPECT_EQ(result["attempt"], 1);
    EXPECT_EQ(result["all_reduce"], 10.0);
    if (rank == 0) {
      reference = result["weights"];
      EXPECT_NE(result["master_port"], std::to_string(port)) << "rank 0 hosts the store itself";
    } else {
      EXPECT_EQ(result["weights"], reference) << "DDP replicas diverged";
      EXPECT_EQ(result["master_port"], std::to_string(port)) << "others go through the relay";
    }
  }
  EXPECT_FALSE(dir.Exists("results/rank-0-attempt-0.json")) << "round 0 was stopped before training ended";
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

size_t CountStartingWith(const std::vector<std::string>& lines, const std::string& prefix) {
  return static_cast<size_t>(std::count_if(
      lines.begin(), lines.end(), [&](const std::string& line) { return line.rfind(prefix, 0) == 0; }));
}

// Rank 3 raises; its peers lose it in a collective and print gloo tracebacks of their own. Each
// console shows rank 3's traceback whole and the peers' errors as one line per node; the log
// files keep every line; the final summary, after the restart, still names round 0's cause.
TEST(TorchTest, ThePeersErrorsCollapseToOneLinePerNodeAndTheLogsKeepEveryLine) {
  DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing);
  ScratchDir dir;
  TestJob job;
  job.name = "torch-console";
  job.command = "[\"/usr/bin/python3\", " +
                TomlString(std::string(DDPRUN_SOURCE_DIR) + "/examples/ddp_train.py") +
                ", \"--steps\", \"3\", \"--fail-rank\", \"3\", \"--fail-attempt\", \"0\"]";
  job.master_port = FreePort();
  job.max_restarts = 1;
  job.backoff = "0s";
  job.rendezvous = "60s";
  job.heartbeat = "1s";
  job.stop_grace = "10s";
  job.extra = "[job.env]\nGLOO_SOCKET_IFNAME = \"lo\"\n";
  const std::string file = dir.Write("job.toml", job.Toml());
  AgentProcess node1({file, "--node-rank", "1"}, dir.path() + "/node1.out");
  AgentProcess node0({file, "--node-rank", "0"}, dir.path() + "/node0.out");
  const auto code0 = node0.Wait(240s);
  const auto code1 = node1.Wait(30s);
  const std::string outputs = node0.Output() + "\n---- node 1 ----\n" + node1.Output();
  ASSERT_EQ(code0, 0) << outputs;
  ASSERT_EQ(code1, 0) << outputs;

  const std::regex digest_pattern(
      R"(round 0: after rank 3 failed, (.*); (\d+) lines? of (its|their) stderr (is|are) not shown here \(every byte is in .*/attempt-0/rank-<r>\.log\))");
  size_t digests = 0;
  for (int node = 0; node < 2; ++node) {
    SCOPED_TRACE("node " + std::to_string(node));
    const std::string console = node == 0 ? node0.Output() : node1.Output();
    const std::vector<std::string> lines = SplitLines(console);
    const std::string logs = "logs/torch-console/latest-n" + std::to_string(node) + "/";
    // One digest line at most per node, and the number it gives is what the console lacks.
    size_t collapsed = 0;
    std::smatch match;
    for (const std::string& line : lines) {
      if (!std::regex_search(line, match, digest_pattern)) continue;
      ++digests;
      collapsed += std::stoul(match[2].str());
      EXPECT_THAT(match[1].str(), HasSubstr("lost a peer, as expected")) << line;
    }
    size_t logged = 0;
    size_t shown = 0;
    for (int local = 0; local < 2; ++local) {
      const int rank = node * 2 + local;
      const std::string prefix = "[n" + std::to_string(node) + " r" + std::to_string(rank) + "] ";
      shown += CountStartingWith(lines, prefix);
      for (int attempt = 0; attempt < 2; ++attempt) {
        const std::string log =
            dir.Read(logs + "attempt-" + std::to_string(attempt) + "/rank-" + std::to_string(rank) + ".log");
        logged += SplitLines(log).size();
        if (attempt != 0) continue;
        if (rank == 3) {
          // The root cause's traceback, every line of it, live on its node's console.
          const auto traceback = SplitLines(log.substr(log.find("Traceback (most recent call last):")));
          ASSERT_GE(traceback.size(), 3u) << log;
          for (const std::string& line : traceback) EXPECT_THAT(console, HasSubstr(prefix + line + "\n"));
          EXPECT_THAT(traceback.back(), HasSubstr("RuntimeError: rank 3 fails on purpose in attempt 0"));
        } else if (log.find("Connection closed by peer") != std::string::npos) {
          // A consequence: its whole traceback is in its log, none of it on the console.
          EXPECT_THAT(log, HasSubstr("Traceback (most recent call last):"));
          EXPECT_EQ(console.find(prefix + "Traceback"), std::string::npos) << console;
          EXPECT_EQ(console.find(prefix + "RuntimeError"), std::string::npos) << console;
        }
      }
    }
    EXPECT_EQ(shown + collapsed, logged) << console;
    // The final summary, after the restart, still names round 0's root cause.
    EXPECT_THAT(console, HasSubstr("succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)\n"
                                   "earlier rounds' root causes:\n"
                                   "  round 0: rank 3 (node 1 ("));
    EXPECT_THAT(console, HasSubstr("local rank 1) exited with code 1 (RuntimeError)\n"));
  }
  // Rank 2 shares node 1 with rank 3: it always loses it in the first collective.
  EXPECT_GE(digests, 1u) << outputs;
  EXPECT_LE(digests, 2u) << outputs;
}

}  // namespace
}  // namespace ddprun::e2e
