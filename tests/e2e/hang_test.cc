// Hung ranks and stragglers with real agents on 127.0.0.1 and real PyTorch (gloo on CPU): a rank
// that blocks before an all_reduce, the learnt ("auto") timeout, a slow rank, and jobs that send
// no beacons at all.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
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
using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC, as Python's time.monotonic()
using Seconds = std::chrono::duration<double>;

#define SKIP_WITHOUT_TORCH() DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing)

std::string TomlArray(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + TomlString(items[i]);
  return out + "]";
}

std::string Source(const std::string& path) { return std::string(DDPRUN_SOURCE_DIR) + "/" + path; }

// 2 nodes x 2 workers running `command` (a TOML array), with `timeouts` added to [timeouts].
TestJob Job(uint16_t port, const std::string& command, int max_restarts, const std::string& timeouts) {
  TestJob job;
  job.name = "hang";
  job.command = command;
  job.master_port = port;
  job.max_restarts = max_restarts;
  job.backoff = "0s";
  job.rendezvous = "60s";
  job.heartbeat = "1s";  // four Python processes importing torch on two cores starve agents
  job.stop_grace = "5s";
  job.extra = timeouts;
  return job;
}

// The console time of the first line of `output` that holds `text` ("[ddprun 15:38:19.453 n0]
// ..."), as seconds since midnight.
std::optional<double> ConsoleTime(const std::string& output, const std::string& text) {
  const size_t at = output.find(text);
  if (at == std::string::npos) return std::nullopt;
  const size_t line = output.rfind('\n', at) == std::string::npos ? 0 : output.rfind('\n', at) + 1;
  std::smatch m;
  const std::string head = output.substr(line, at - line);
  if (!std::regex_search(head, m, std::regex(R"(^\[ddprun (\d\d):(\d\d):(\d\d\.\d\d\d) )"))) {
    return std::nullopt;
  }
  return std::stoi(m[1]) * 3600.0 + std::stoi(m[2]) * 60.0 + std::stod(m[3]);
}

// The lines of `output` that contain `text`.
std::vector<std::string> LinesWith(const std::string& output, const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(text) != std::string::npos) lines.push_back(line);
  }
  return lines;
}

class HangTest : public ::testing::Test {
 protected:
  AgentProcess& Start(int node_rank) {
    const std::string out = dir_.path() + "/node" + std::to_string(node_rank) + ".out";
    // gloo finds its peers on loopback, whatever the host name resolves to.
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{dir_.path() + "/job.toml", "--node-rank", std::to_string(node_rank)}, out,
        std::map<std::string, std::string>{{"GLOO_SOCKET_IFNAME", "lo"}}));
    return *agents_.back();
  }
  /// Starts node 1, then node 0 (the coordinator), as TorchTest does.
  void StartBoth(const TestJob& job) {
    dir_.Write("job.toml", job.Toml());
    Start(1);
    Start(0);
  }
  AgentProcess& node(int rank) { return *agents_[rank == 1 ? 0 : 1]; }
  /// When each of `texts` first appeared in any agent's output, polled every 20 ms until all
  /// have or `limit` passed; nullopt for those that never did.
  std::vector<std::optional<Clock::time_point>> Watch(const std::vector<std::string>& texts,
                                                      std::chrono::milliseconds limit) {
    std::vector<std::optional<Clock::time_point>> seen(texts.size());
    WaitFor(
        [&] {
          const Clock::time_point now = Clock::now();
          std::string all;
          for (const auto& agent : agents_) all += agent->Output();
          bool every = true;
          for (size_t i = 0; i < texts.size(); ++i) {
            if (!seen[i] && all.find(texts[i]) != std::string::npos) seen[i] = now;
            every = every && seen[i].has_value();
          }
          return every;
        },
        limit);
    return seen;
  }
  std::string Describe() const { return DescribeAgents(agents_); }

  ScratchDir dir_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

// The deadlock examples/ddp_train.py makes for tests: rank 3 blocks in wait_forever() before the all_reduce
// of step 2 in attempt 0, and the other ranks wait for it in backward. The agents must notice the silence at
// timeouts.progress, the summary must name rank 3 with its stack and group the others, every worker of round
// 0 must be gone before round 1 starts, and round 1 must train to the end.
TEST_F(HangTest, RankBlockedBeforeAnAllReduceIsNamedWithItsStackAndTheJobRestarts) {
  SKIP_WITHOUT_TORCH();
  constexpr auto kProgress = 5s;    // timeouts.progress
  constexpr auto kStepTime = 0.3s;  // --step-time: rank 3's last beacon is this long before it blocks
  // Each worker records its pid (the shell execs Python, so the pid is the worker's).
  const std::string command =
      TomlArray({"sh", "-c", "echo $$ > pid-$RANK-$TORCHELASTIC_RESTART_COUNT; exec /usr/bin/python3 \"$@\"",
                 "sh", Source("examples/ddp_train.py"), "--steps", "3", "--step-time", "0.3", "--hang-rank",
                 "3", "--hang-attempt", "0", "--hang-step", "2"});
  StartBoth(Job(FreePort(), command, /*max_restarts=*/1, "progress = \"5s\"\n"));

  const auto seen = Watch({"rank 3 blocks before the all_reduce of step 2", "sent no progress beacon for ",
                           ") hung: no progress for ", "round 1: all 2 nodes joined; starting 4 workers"},
                          120s);
  ASSERT_TRUE(seen[0] && seen[1] && seen[2] && seen[3]) << Describe();
  // Round 1 starts only once every node has stopped its workers: none of round 0's may be left.
  for (int rank = 0; rank < 4; ++rank) {
    const std::string name = "pid-" + std::to_string(rank) + "-0";
    ASSERT_TRUE(dir_.Exists(name)) << name << Describe();
    const pid_t pid = std::stoi(dir_.Read(name));
    EXPECT_FALSE(ProcessAlive(pid)) << "rank " << rank << "'s round 0 worker " << pid
                                    << " still runs in round 1" << Describe();
  }
  const auto code0 = node(0).Wait(120s);
  const auto code1 = node(1).Wait(30s);
  ASSERT_EQ(code0, 0) << Describe();
  ASSERT_EQ(code1, 0) << Describe();

  // Detection: some rank's last beacon (all ranks beacon right after the all_reduce of step 1)
  // came at least --step-time before rank 3 said it blocks, and the first agent reports the
  // silence kProgress after it. Slack: 0.5 s for the agent's timer and our 20 ms polling on a
  // loaded machine; below, 1 s more for rank 3 reaching its print (randn, a busy CPU).
  const double detected = Seconds(*seen[1] - *seen[0]).count();
  const double silence = Seconds(kProgress - kStepTime).count();
  EXPECT_LE(detected, silence + 0.5) << Describe();
  EXPECT_GE(detected, silence - 1.0) << Describe();
  // The verdict: the agents wait up to a second for the faulthandler dumps, then answer.
  const double verdict = Seconds(*seen[2] - *seen[0]).count();
  EXPECT_LE(verdict, silence + 1.0 + 0.5) << Describe();
  EXPECT_GE(verdict, detected) << Describe();

  for (int n : {0, 1}) {
    SCOPED_TRACE("node " + std::to_string(n));
    const std::string out = node(n).Output();
    EXPECT_THAT(out, ContainsRegex(R"(round 0 failed: rank 3 \(node 1 \([^)]*\), local rank 1\) hung: )"
                                   R"(no progress for [0-9.]+s after step 2 \(timeouts\.progress = 5s\))"))
        << Describe();
    EXPECT_THAT(out, HasSubstr("  why rank 3: the only rank not waiting for the others\n")) << Describe();
    EXPECT_THAT(out, ContainsRegex(
                         R"(all threads: rank 3's in logs/hang/latest-n1/attempt-0/rank-3\.stacks on node 1 )"
                         R"(\([^)]+\), in its job file's folder, every rank's in )"
                         R"(latest-n<node>/attempt-0/rank-<r>\.stacks on its node\):)"
                         "\n"))
        << Describe();
    EXPECT_THAT(out,
                ContainsRegex("\n"
                              R"(    rank 3, last step 2, silent [0-9.]+s: in wait at ddp_train\.py:[0-9]+)"
                              "\n"))
        << Describe();
    EXPECT_THAT(out, ContainsRegex("\n"
                                   R"(      File "[^"]*/examples/ddp_train\.py", line [0-9]+ in wait_forever)"
                                   "\n"))
        << Describe();
    EXPECT_THAT(out, HasSubstr("\n    3 ranks 0-2, last step 2: in ")) << Describe();
    EXPECT_THAT(out, HasSubstr("succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)"))
        << Describe();
  }
  EXPECT_THAT(node(0).Output(), HasSubstr("done: 4 ranks, all_reduce ok")) << Describe();

  // Rank 3's faulthandler dump, in node 1's run folder.
  std::smatch folder;
  const std::string out1 = node(1).Output();
  ASSERT_TRUE(std::regex_search(out1, folder, std::regex("logs of this run: (\\S+/) \\(also"))) << out1;
  std::ifstream file(folder[1].str() + "attempt-0/rank-3.stacks");
  std::stringstream stacks;
  stacks << file.rdbuf();
  EXPECT_THAT(stacks.str(), ContainsRegex("thread 0x[0-9a-f]+ \\(most recent call first\\):\n")) << folder[1];
  EXPECT_THAT(stacks.str(), ContainsRegex("ddp_train\\.py\", line [0-9]+ in wait_forever\n")) << stacks.str();
}

// timeouts.progress = "auto": after 10 intervals per rank the agents allow
// max(10 s, 5 x the longest interval seen). One step of 2.2 s puts the learnt timeout above the
// floor; the workers print when they beaconed, so the test knows the intervals the agents saw.
TEST_F(HangTest, AutoTimeoutIsLearntFromTheLongestIntervalAndCatchesTheHang) {
  SKIP_WITHOUT_TORCH();
  const std::string command =
      TomlArray({"/usr/bin/python3", Source("tests/e2e/beacon_worker.py"), "--steps", "14", "--step-time",
                 "0.12", "--long-step", "5", "--long-time", "2.2", "--hang-rank", "3", "--hang-step", "12"});
  StartBoth(Job(FreePort(), command, /*max_restarts=*/0, "progress = \"auto\"\n"));
  const auto seen = Watch({"rank 3 blocks at ", "sent no progress beacon for "}, 120s);
  ASSERT_TRUE(seen[0] && seen[1]) << Describe();
  EXPECT_EQ(node(0).Wait(60s), 1) << Describe();
  EXPECT_EQ(node(1).Wait(30s), 1) << Describe();

  // What each node's agent saw: its ranks' last beacon and their longest interval.
  std::map<int, std::vector<double>> beacons;  // rank -> monotonic seconds, in step order
  const std::regex beacon(R"(rank (\d) beacon (\d+) at ([0-9.]+))");
  for (int n : {0, 1}) {
    const std::string out = node(n).Output();
    for (std::sregex_iterator it(out.begin(), out.end(), beacon), end; it != end; ++it) {
      beacons[std::stoi((*it)[1])].push_back(std::stod((*it)[3]));
    }
  }
  ASSERT_EQ(beacons.size(), 4u) << Describe();
  std::optional<Clock::time_point> expected;  // when the first agent should report the silence
  double learnt_low = 1e9, learnt_high = 0;
  for (int n : {0, 1}) {
    double last = 1e18, longest = 0;
    for (int rank : {2 * n, 2 * n + 1}) {
      const std::vector<double>& t = beacons[rank];
      ASSERT_EQ(t.size(), 12u) << "rank " << rank << Describe();  // 11 intervals: past the warm-up
      for (size_t i = 1; i < t.size(); ++i) longest = std::max(longest, t[i] - t[i - 1]);
      last = std::min(last, t.back());
    }
    EXPECT_GT(5 * longest, 10.0) << "the long step must lift the timeout above the floor";
    const double learnt = std::max(10.0, 5 * longest);
    learnt_low = std::min(learnt_low, learnt);
    learnt_high = std::max(learnt_high, learnt);
    const Clock::time_point at{std::chrono::duration_cast<Clock::duration>(Seconds(last + learnt))};
    if (!expected || at < *expected) expected = at;
  }
  // The agents time intervals by arrival: a beacon delayed by 0.15 s shortens one by that, and
  // the timeout by 5 x 0.15 s. Late: the agent's timer and our polling on a loaded machine.
  const double error = Seconds(*seen[1] - *expected).count();
  EXPECT_GE(error, -0.75) << Describe();
  EXPECT_LE(error, 1.5) << Describe();

  const std::string out0 = node(0).Output();
  EXPECT_THAT(out0,
              ContainsRegex(R"(rank 3 \(node 1 \([^)]*\), local rank 1\) hung: no progress for [0-9.]+s )"
                            R"(after step 12 \(timeouts\.progress = "auto", [0-9]+s learnt from this job\))"))
      << Describe();
  EXPECT_THAT(out0, HasSubstr("job \"hang\" FAILED in round 0 (restart.max_restarts = 0)")) << Describe();
  EXPECT_THAT(out0, HasSubstr("  why rank 3: the only rank not waiting for the others\n")) << Describe();
  EXPECT_THAT(out0, HasSubstr("\n    3 ranks 0-2, last step 12: in all_reduce ")) << Describe();
  // The learnt value the cause quotes (whole seconds, rounded down).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out0, m, std::regex(R"("auto", ([0-9]+)s learnt)"))) << Describe();
  EXPECT_GE(std::stoi(m[1]), static_cast<int>(learnt_low) - 1) << Describe();
  EXPECT_LE(std::stoi(m[1]), learnt_high + 1) << Describe();
  // The agent's own line says "auto" too.
  EXPECT_THAT(Describe(), ContainsRegex(R"(sent no progress beacon for [0-9.]+s after step 12 )"
                                        R"(\(timeouts\.progress = "auto": [0-9.]+s\))"));
}

// Rank 2 does 3 times the others' work per step; with a 3 s window it is named as a straggler
// while the job runs and in the job summary. DDP makes every rank's step equally long, so only
// the work each rank reports (busy=) tells it apart.
TEST_F(HangTest, SlowRankIsNamedAsAStragglerAndNoOtherRankIs) {
  SKIP_WITHOUT_TORCH();
  const std::string command = TomlArray({"/usr/bin/python3", Source("examples/ddp_train.py"), "--steps", "9",
                                         "--step-time", "0.15", "--slow-rank", "2", "--slow-factor", "3"});
  TestJob job = Job(FreePort(), command, /*max_restarts=*/0, "[stragglers]\nwindow = \"3s\"\n");
  job.heartbeat = "500ms";  // progress reports every max(heartbeat, window / 8)
  StartBoth(job);
  EXPECT_EQ(node(0).Wait(120s), 0) << Describe();
  EXPECT_EQ(node(1).Wait(30s), 0) << Describe();

  const std::string out0 = node(0).Output();
  EXPECT_THAT(out0, ContainsRegex(
                        R"(coordinator\] warning: rank 2 \(node 1 \([^)]*\), local rank 0\) is a straggler: )"
                        R"(its own work per step is [0-9.]+s, [0-9.]+x the median [0-9.]+s of 4 ranks )"
                        R"(over the last 3s \(stragglers\.slower_percent = 50\))"))
      << Describe();
  EXPECT_THAT(out0, ContainsRegex(
                        R"(succeeded: all 4 ranks on 2 nodes exited 0 in round 0 \(0 restarts used\))"
                        "\n"
                        R"(stragglers \(more than 50% slower than the median rank for 3s\):)"
                        "\n"
                        R"(  rank 2 \(node 1 \([^)]*\), local rank 0\) in round 0: its own work per step )"))
      << Describe();
  for (const std::string& line : LinesWith(Describe(), "straggler")) {
    EXPECT_THAT(line, Not(ContainsRegex("rank [013] \\("))) << Describe();
  }
  EXPECT_THAT(Describe(), Not(HasSubstr("no longer a straggler")));
}

// A worker that never imports ddprun, in a job without timeouts.progress: no beacon, no word
// about progress, and the job ends as it always has.
TEST_F(HangTest, WorkerWithoutBeaconsAndNoProgressTimeoutRunsAsBefore) {
  TestJob job = Job(FreePort(), "", /*max_restarts=*/0, "");
  job.script = "sleep 1";
  StartBoth(job);
  EXPECT_EQ(node(0).Wait(30s), 0) << Describe();
  EXPECT_EQ(node(1).Wait(30s), 0) << Describe();
  EXPECT_THAT(node(0).Output(),
              HasSubstr("succeeded: all 4 ranks on 2 nodes exited 0 in round 0 (0 restarts used)"))
      << Describe();
  for (const char* word : {"progress", "beacon", "hung", "straggler", "stacks"}) {
    EXPECT_THAT(Describe(), Not(HasSubstr(word))) << Describe();
  }
}

// The same worker with timeouts.progress: it never sends a beacon, so after progress_start the
// round fails; there is no stack to show, and with no restart left the job fails with 1.
TEST_F(HangTest, WorkerWithoutBeaconsFailsAfterProgressStartWithNoStack) {
  TestJob job = Job(FreePort(), "", /*max_restarts=*/0, "progress = \"3s\"\nprogress_start = \"3s\"\n");
  job.script = "exec sleep 30";
  StartBoth(job);
  EXPECT_EQ(node(0).Wait(30s), 1) << Describe();
  EXPECT_EQ(node(1).Wait(30s), 1) << Describe();

  const std::string out0 = node(0).Output();
  EXPECT_THAT(Describe(),
              ContainsRegex(R"(error: rank [0-3] \(local rank [01]\) sent no progress beacon for )"
                            R"([0-9.]+s since it started \(timeouts\.progress_start = 3s\))"));
  EXPECT_THAT(out0,
              ContainsRegex(R"(root cause \(first failure anywhere in the job\): rank [0-3] \(node [01] \()"
                            R"([^)]*\), local rank [01]\) hung: no progress for [0-9.]+s since it started )"
                            R"(\(timeouts\.progress_start = 3s\))"
                            "\n"))
      << Describe();
  EXPECT_THAT(out0, ContainsRegex("\n"
                                  R"(    rank [0-3], no step yet, silent [0-9.]+s: no stack)"
                                  "\n"))
      << Describe();
  EXPECT_THAT(out0,
              HasSubstr(", no step yet: no stack (the worker does not `import ddprun`, or sent no hello)\n"))
      << Describe();
  EXPECT_THAT(out0, HasSubstr("job \"hang\" FAILED in round 0 (restart.max_restarts = 0)")) << Describe();
  // ~3 s after the workers started (no worker starts before the coordinator says so): the
  // agents answer at once when no rank can dump its stack.
  const auto started = ConsoleTime(out0, "round 0: all 2 nodes joined; starting 4 workers");
  const auto failed = ConsoleTime(out0, "round 0 failed: ");
  ASSERT_TRUE(started && failed) << out0;
  const double took = *failed - *started + (*failed < *started ? 86400 : 0);
  EXPECT_GE(took, 3.0) << out0;
  EXPECT_LE(took, 4.5) << out0;
}

}  // namespace
}  // namespace ddprun::e2e
