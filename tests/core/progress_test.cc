// Hung ranks and stragglers: the beacon datagram and faulthandler parsing, the choice of the
// hung rank, the agent's timeouts (fixed, "auto", start-up and phases) and its stack round
// trip, and the coordinator's probe, root cause and straggler reports.

#include "runner/core/progress.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runner/core/agent.h"
#include "runner/core/coordinator.h"
#include "schema/canonical.h"
#include "tests/core/core_test_util.h"
#include "tests/core/drivers.h"

namespace ddprun::core {
namespace {

using namespace std::chrono_literals;
using test::All;
using test::At;
using test::Edit;
using test::FindLog;
using test::kTwoNodeJob;
using test::Sent;
using test::SpecFromToml;

constexpr Duration kNs = Duration(1);

// ---- The datagram ---------------------------------------------------------------------

TEST(BeaconTest, AWellFormedBeaconIsParsed) {
  const auto b = ParseBeacon("ddprun1 tok 2 3 step 4711 2500 12", "tok");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->round, 2);
  EXPECT_EQ(b->local_rank, 3);
  EXPECT_EQ(b->kind, BeaconKind::kStep);
  EXPECT_EQ(b->step, 4711);
  EXPECT_EQ(b->busy_us, 2500);
  EXPECT_EQ(b->stack_signal, 12);
  EXPECT_EQ(ParseBeacon("ddprun1 tok 0 0 hello 0 -1 0\n", "tok")->kind, BeaconKind::kHello);
  EXPECT_EQ(ParseBeacon("ddprun1 tok 0 0 phase 7 -1 12", "tok")->kind, BeaconKind::kPhase);
}

TEST(BeaconTest, FormatAndParseAgree) {
  const Beacon b{5, 7, BeaconKind::kPhase, 99, -1, 12};
  const auto back = ParseBeacon(FormatBeacon(b, "abc"), "abc");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->round, 5);
  EXPECT_EQ(back->local_rank, 7);
  EXPECT_EQ(back->kind, BeaconKind::kPhase);
  EXPECT_EQ(back->step, 99);
}

TEST(BeaconTest, AnythingElseIsDropped) {
  for (const char* bad : {
           "ddprun1 other 0 0 step 1 -1 0",                   // another agent's (or an attacker's) token
           "ddprun2 tok 0 0 step 1 -1 0",                     // another version
           "ddprun1 tok 0 0 step 1 -1",                       // a field missing
           "ddprun1 tok 0 0 step 1 -1 0 9",                   // a field too many
           "ddprun1 tok 0 0 jump 1 -1 0",                     // an unknown kind
           "ddprun1 tok -1 0 step 1 -1 0",                    // a negative round
           "ddprun1 tok 0 0 step -5 -1 0",                    // a negative step
           "ddprun1 tok 0 0 step 1 -2 0",                     // busy below -1
           "ddprun1 tok 0 0 step 1 -1 65",                    // not a signal
           "ddprun1 tok 0 0 step 1x -1 0",                    // not a number
           "ddprun1 tok 0 0 step 99999999999999999999 -1 0",  // overflow
           "",
       }) {
    EXPECT_FALSE(ParseBeacon(bad, "tok")) << bad;
  }
  EXPECT_FALSE(ParseBeacon("ddprun1 tok 0 0 step 1 -1 0", ""));  // no token configured
  EXPECT_FALSE(ParseBeacon(std::string(kMaxBeaconSize + 1, ' '), "tok"));
}

// ---- faulthandler ------------------------------------------------------------------------

// What Python 3.11's faulthandler.dump_traceback(all_threads=True) writes, two threads.
constexpr std::string_view kDump =
    "Thread 0x00007f3a5d7fe640 (most recent call first):\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap\n"
    "\n"
    "Current thread 0x00007f3a6c1b7000 (most recent call first):\n"
    "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 2501 in "
    "all_reduce\n"
    "  File \"/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py\", line 83 in wrapper\n"
    "  File \"/home/me/train.py\", line 95 in train_step\n"
    "  File \"/home/me/train.py\", line 120 in <module>\n";

TEST(StackTest, TheMainThreadIsTheOneRunningTheModule) {
  const auto frames = MainThreadStack(kDump);
  ASSERT_EQ(frames.size(), 4u);
  EXPECT_EQ(frames[0], (Frame{"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 2501,
                              "all_reduce"}));
  EXPECT_EQ(frames[3], (Frame{"/home/me/train.py", 120, "<module>"}));
  EXPECT_EQ(DescribeStack(frames), "in all_reduce at train.py:95");
  EXPECT_TRUE(WaitsForOtherRanks(frames));
  EXPECT_EQ(ParseFrames(FormatFrames(frames)), frames);
}

TEST(StackTest, OfTwoDumpsInOneFileTheLastCounts) {
  const std::string second =
      "Current thread 0x00007f3a6c1b7000 (most recent call first):\n"
      "  File \"/home/me/train.py\", line 57 in load_batch\n"
      "  File \"/home/me/train.py\", line 120 in <module>\n";
  const auto frames = MainThreadStack(std::string(kDump) + second);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].function, "load_batch");
  EXPECT_EQ(DescribeStack(frames), "in load_batch at train.py:57");
  EXPECT_FALSE(WaitsForOtherRanks(frames));
}

TEST(StackTest, DeepStacksAreCutAndGarbageYieldsNothing) {
  std::string deep = "Current thread 0x1 (most recent call first):\n";
  for (int i = 0; i < 100; ++i) deep += fmt::format("  File \"/x/f.py\", line {} in g{}\n", i + 1, i);
  EXPECT_EQ(MainThreadStack(deep).size(), kMaxFrames);
  EXPECT_TRUE(MainThreadStack("").empty());
  EXPECT_TRUE(MainThreadStack("Fatal Python error: Segmentation fault\n\x01\x02").empty());
  EXPECT_TRUE(MainThreadStack("  File \"/x.py\", line 1 in f\n").empty());  // no thread header
}

TEST(StackTest, OnlyTheCallsBelowTheUsersCodeSayWhereItWaits) {
  // A rank blocked in its own code, inside torchelastic's @record wrapper.
  const std::vector<Frame> own = {
      {"/usr/lib/python3.11/threading.py", 320, "wait"},
      {"/home/me/train.py", 28, "wait_forever"},
      {"/usr/lib/python3/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", 346,
       "wrapper"},
      {"/home/me/train.py", 120, "<module>"}};
  EXPECT_FALSE(WaitsForOtherRanks(own));
  EXPECT_EQ(DescribeStack(own), "in wait at train.py:28");
}

TEST(StackTest, ABackwardPassUnderDdpWaitsForTheOthers) {
  const std::vector<Frame> backward = {
      {"/usr/lib/python3/dist-packages/torch/autograd/__init__.py", 266, "backward"},
      {"/usr/lib/python3/dist-packages/torch/_tensor.py", 522, "backward"},
      {"/home/me/train.py", 96, "train_step"}};
  EXPECT_TRUE(WaitsForOtherRanks(backward));
  EXPECT_EQ(DescribeStack(backward), "in backward at train.py:96");
  const std::vector<Frame> library_only = {{"/usr/lib/python3.11/time.py", 1, "sleep"}};
  EXPECT_EQ(DescribeStack(library_only), "in sleep (time.py:1)");
}

// ---- Which rank hung ---------------------------------------------------------------------

const std::vector<Frame> kAllReduce = MainThreadStack(kDump);
const std::vector<Frame> kLoader = {{"/home/me/train.py", 57, "load_batch"},
                                    {"/home/me/train.py", 120, "<module>"}};

TEST(FindHungRanksTest, TheOnlyRankNotWaitingForTheOthersHung) {
  std::vector<RankAtHang> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back({r, r / 2, r % 2, 41, 30'000, r == 3 ? kLoader : kAllReduce});
  const auto verdict = FindHungRanks(ranks, /*first_silent=*/0);
  EXPECT_EQ(verdict.culprits, std::vector<int>{3});
  EXPECT_EQ(verdict.reason, "the only rank not waiting for the others");
}

TEST(FindHungRanksTest, ARankBehindTheOthersHungEvenWithoutStacks) {
  std::vector<RankAtHang> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back({r, r / 4, r % 4, r == 5 ? 40 : 41, 30'000, {}});
  const auto verdict = FindHungRanks(ranks, 0);
  EXPECT_EQ(verdict.culprits, std::vector<int>{5});
  EXPECT_EQ(verdict.reason, "its last step is behind every other rank's");
}

TEST(FindHungRanksTest, AStackUnlikeTheMajoritysHung) {
  // Everyone is inside torch.distributed, but rank 2 in another call.
  const std::vector<Frame> barrier = {
      {"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 3700, "barrier"},
      {"/home/me/train.py", 140, "<module>"}};
  std::vector<RankAtHang> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back({r, 0, r, 41, 30'000, r == 2 ? barrier : kAllReduce});
  const auto verdict = FindHungRanks(ranks, 0);
  EXPECT_EQ(verdict.culprits, std::vector<int>{2});
  EXPECT_EQ(verdict.reason, "stuck elsewhere than the other ranks");
}

TEST(FindHungRanksTest, ARankWithoutAStackIsWhatTheOthersWaitFor) {
  // Rank 1 hung before the module said hello: no stack; every other rank waits in all_reduce.
  std::vector<RankAtHang> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.push_back({r, 0, r, 41, 30'000, r == 1 ? std::vector<Frame>{} : kAllReduce});
  const auto verdict = FindHungRanks(ranks, /*first_silent=*/3);
  EXPECT_EQ(verdict.culprits, std::vector<int>{1});
  EXPECT_EQ(verdict.reason, "every other rank waits in a collective; it has no stack");
}

TEST(FindHungRanksTest, WithNothingToTellThemApartTheFirstSilentRankIsNamed) {
  std::vector<RankAtHang> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back({r, 0, r, 41, 30'000, {}});
  const auto verdict = FindHungRanks(ranks, 2);
  EXPECT_EQ(verdict.culprits, std::vector<int>{2});
  EXPECT_EQ(verdict.reason, "the first rank found silent; the stacks do not tell the others apart");
}

TEST(FindHungRanksTest, RankRangesAreCompact) {
  EXPECT_EQ(RankRanges({7, 0, 1, 2, 5, 9, 8}), "0-2, 5, 7-9");
  EXPECT_EQ(RankRanges({}), "");
  EXPECT_EQ(RankRanges({3, 3}), "3");
}

// ---- The agent -------------------------------------------------------------------------

using AgentEffects = std::vector<AgentEffect>;

class AgentProgressTest : public ::testing::Test, public test::AgentDriver {
 protected:
  void UseJob(std::string_view timeouts) {
    Agent::Config config;
    config.node_rank = 1;
    config.host = "gpu-02";
    config.instance = 4242;
    config.logs_dir = "/var/log/ddprun/demo/run";
    config.progress_addr = "127.0.0.1:39999";
    config.progress_token = "tok";
    config.python_dir = "/opt/ddprun/share/ddprun/python";
    Use(Edit(kTwoNodeJob, "stop_grace = \"30s\"\n",
             std::string("stop_grace = \"30s\"\n") + std::string(timeouts)),
        std::move(config));
  }
  AgentEffects Beat(Duration at, int local, int64_t step, int64_t busy_us = -1,
                    BeaconKind kind = BeaconKind::kStep, int round = 0) {
    return Feed(at, BeaconReceived{Beacon{round, local, kind, step, busy_us, 12}});
  }
  /// Joined at 0 and running round 0 (ranks 2 and 3); the master beats every second so
  /// that it is never lost, up to `until`.
  SpawnWorkers Running() {
    Start(0s);
    Feed(0s, MasterConnected{});
    Msg(0s, wire::JoinAck{2});
    const auto spawns = All<SpawnWorkers>(Msg(0s, wire::StartRound{0, 41000}));
    EXPECT_EQ(spawns.size(), 1u);
    return spawns.empty() ? SpawnWorkers{} : spawns[0];
  }
  /// Every second in (from, to]: a master heartbeat and, with `beats`, a step from both ranks.
  AgentEffects Until(Duration from, Duration to, bool beats, int64_t* step = nullptr) {
    AgentEffects all;
    for (Duration t = from + 1s; t <= to; t += 1s) {
      auto e = Msg(t, wire::Heartbeat{});
      all.insert(all.end(), e.begin(), e.end());
      if (beats) {
        ++*step;
        for (int local : {0, 1}) {
          auto b = Beat(t, local, *step, 800'000);
          all.insert(all.end(), b.begin(), b.end());
        }
      }
    }
    return all;
  }
};

std::string EnvOf(const WorkerLaunch& launch, const std::string& name) {
  for (const auto& [key, value] : launch.env) {
    if (key == name) return value;
  }
  return "(unset)";
}

TEST_F(AgentProgressTest, WorkersGetTheBeaconContractAndTheModuleOnTheirPath) {
  UseJob("");
  const SpawnWorkers spawn = Running();
  ASSERT_EQ(spawn.workers.size(), 2u);
  const WorkerLaunch& w = spawn.workers[1];
  EXPECT_EQ(EnvOf(w, "DDPRUN_PROGRESS_ADDR"), "127.0.0.1:39999");
  EXPECT_EQ(EnvOf(w, "DDPRUN_PROGRESS_TOKEN"), "tok");
  EXPECT_EQ(EnvOf(w, "DDPRUN_STACKS_FILE"), "/var/log/ddprun/demo/run/attempt-0/rank-3.stacks");
  EXPECT_EQ(EnvOf(w, "PYTHONPATH"), "/opt/ddprun/share/ddprun/python");
}

TEST_F(AgentProgressTest, WithoutTimeoutsProgressASilentRankIsNeverReported) {
  UseJob("");
  Running();
  int64_t step = 0;
  Until(0s, 5s, true, &step);
  const AgentEffects e = Until(5s, 300s, false);
  EXPECT_TRUE(Sent<wire::RankHung>(e).empty()) << test::Describe(e);
}

TEST_F(AgentProgressTest, ARankSilentPastTimeoutsProgressIsReportedAtThatInstant) {
  UseJob("progress = \"30s\"\nprogress_start = \"60s\"\n");
  Running();
  int64_t step = 0;
  Until(0s, 10s, true, &step);  // last beacons at 10 s, step 10
  // Rank 2 keeps beating, rank 3 stops.
  for (Duration t = 11s; t <= 40s; t += 1s) {
    Msg(t, wire::Heartbeat{});
    Beat(t, 0, ++step);
  }
  EXPECT_TRUE(Sent<wire::RankHung>(Feed(40s, Tick{})).empty());
  const AgentEffects e = Feed(40s + kNs, Tick{});
  const auto hung = Sent<wire::RankHung>(e);
  ASSERT_EQ(hung.size(), 1u) << test::Describe(e);
  EXPECT_EQ(hung[0], (wire::RankHung{0, 3, 1, 10, 30'000, 30'000, false}));
  EXPECT_NE(FindLog(e,
                    "rank 3 (local rank 1) sent no progress beacon for 30s after step 10 "
                    "(timeouts.progress = 30s)"),
            "")
      << test::Describe(e);
  // Once said, not again (the coordinator now asks for stacks).
  EXPECT_TRUE(Sent<wire::RankHung>(Feed(90s, Tick{})).empty());
}

TEST_F(AgentProgressTest, TheAgentsOwnStallIsNotTheWorkersSilence) {
  UseJob("progress = \"4s\"\nprogress_start = \"60s\"\n");
  Running();
  int64_t step = 0;
  Until(0s, 10s, true, &step);
  // The agent does not run from 10 s to 15 s (a VM pause, shorter than the loss bound of 6 s);
  // the beacons of that time wait in its socket and come after the first input it handles.
  const AgentEffects resumed = Msg(15s, wire::Heartbeat{});
  EXPECT_TRUE(Sent<wire::RankHung>(resumed).empty()) << test::Describe(resumed);
  Beat(15s, 0, 11);
  Beat(15s, 1, 11);
  // Then rank 3 really is silent: reported 4 s after its last beacon.
  for (Duration t = 16s; t <= 19s; t += 1s) {
    Msg(t, wire::Heartbeat{});
    EXPECT_TRUE(Sent<wire::RankHung>(Beat(t, 0, t / 1s)).empty());
  }
  const AgentEffects e = Feed(19s + kNs, Tick{});
  const auto hung = Sent<wire::RankHung>(e);
  ASSERT_EQ(hung.size(), 1u) << test::Describe(e);
  EXPECT_EQ(hung[0].global_rank, 3);
}

TEST_F(AgentProgressTest, TheFirstBeaconAndOneAfterAPhaseGetTheStartTimeout) {
  UseJob("progress = \"30s\"\nprogress_start = \"2m\"\n");
  Running();
  // No beacon at all: start-up gets progress_start.
  for (Duration t = 1s; t <= 110s; t += 1s) Msg(t, wire::Heartbeat{});
  Beat(110s, 0, 1);
  Beat(110s, 1, 1, -1, BeaconKind::kPhase);  // rank 3 loads a checkpoint
  for (Duration t = 111s; t <= 229s; t += 1s) {
    Msg(t, wire::Heartbeat{});
    Beat(t, 0, t / 1s);
  }
  EXPECT_TRUE(Sent<wire::RankHung>(Feed(230s, Tick{})).empty());
  const AgentEffects e = Feed(230s + kNs, Tick{});
  const auto hung = Sent<wire::RankHung>(e);
  ASSERT_EQ(hung.size(), 1u) << test::Describe(e);
  EXPECT_EQ(hung[0].global_rank, 3);
  EXPECT_TRUE(hung[0].first_beat);
  EXPECT_EQ(hung[0].timeout_ms, 120'000);
  EXPECT_NE(FindLog(e, "since its last phase (timeouts.progress_start = 2m)"), "") << test::Describe(e);
}

TEST_F(AgentProgressTest, AutoLearnsFiveTimesTheLongestIntervalAtLeastTenSeconds) {
  UseJob("progress = \"auto\"\nprogress_start = \"5m\"\n");
  Running();
  // Steps every 3 s: after 10 intervals the timeout is 5 x 3 s = 15 s.
  int64_t step = 0;
  Duration t = 0s;
  for (int i = 0; i < 12; ++i) {
    t += 3s;
    Msg(t, wire::Heartbeat{});
    ++step;
    Beat(t, 0, step);
    Beat(t, 1, step);
  }
  for (Duration u = t + 1s; u <= t + 15s; u += 1s) {
    EXPECT_TRUE(Sent<wire::RankHung>(Msg(u, wire::Heartbeat{})).empty()) << (u - t).count();
  }
  const AgentEffects e = Feed(t + 15s + kNs, Tick{});
  const auto hung = Sent<wire::RankHung>(e);
  ASSERT_EQ(hung.size(), 1u) << test::Describe(e);
  EXPECT_EQ(hung[0].timeout_ms, 15'000);
  EXPECT_NE(FindLog(e, "(timeouts.progress = \"auto\": 15s)"), "") << test::Describe(e);
}

TEST_F(AgentProgressTest, AutoBeforeWarmUpUsesTheStartTimeout) {
  UseJob("progress = \"auto\"\nprogress_start = \"100s\"\n");
  Running();
  Beat(1s, 0, 1);
  Beat(1s, 1, 1);
  Beat(2s, 0, 2);
  Beat(2s, 1, 2);  // one interval: nothing learnt yet
  for (Duration t = 3s; t <= 102s; t += 1s) {
    EXPECT_TRUE(Sent<wire::RankHung>(Msg(t, wire::Heartbeat{})).empty()) << t.count();
  }
  const AgentEffects e = Feed(102s + kNs, Tick{});
  const auto hung = Sent<wire::RankHung>(e);
  ASSERT_EQ(hung.size(), 1u);
  // It says that the start-up timeout stood in, not that 100 s were learnt.
  EXPECT_FALSE(hung[0].learnt);
  EXPECT_FALSE(hung[0].first_beat);
  EXPECT_EQ(FindLog(e, "sent no progress beacon"),
            "rank 2 (local rank 0) sent no progress beacon for 1m40s after step 2 (timeouts.progress = "
            "\"auto\", nothing learnt yet: timeouts.progress_start = 1m40s); asking every rank where it "
            "is before the round is stopped");
}

TEST_F(AgentProgressTest, BeaconsOfAnotherRoundOrUnknownRanksAreIgnored) {
  UseJob("progress = \"30s\"\nprogress_start = \"30s\"\n");
  Running();
  for (Duration t = 1s; t <= 30s; t += 1s) {
    Msg(t, wire::Heartbeat{});
    Beat(t, 0, t / 1s, -1, BeaconKind::kStep, /*round=*/1);  // a stale process of another round
    Beat(t, 7, t / 1s);                                      // no such local rank
    Beat(t, 1, t / 1s, -1, BeaconKind::kHello);              // alive, but not progress
  }
  EXPECT_EQ(Sent<wire::RankHung>(Feed(30s + kNs, Tick{})).size(), 1u);
}

TEST_F(AgentProgressTest, StacksAreAskedOfRanksWithAHandlerAndSentWithTheirStepAndSilence) {
  UseJob("progress = \"30s\"\n");
  Running();
  Beat(1s, 0, 5);                                                       // signal 12
  Feed(1s, BeaconReceived{Beacon{0, 1, BeaconKind::kStep, 4, -1, 0}});  // no handler
  const AgentEffects ask = Msg(2s, wire::DumpStacks{0});
  const auto signals = All<SignalForStacks>(ask);
  ASSERT_EQ(signals.size(), 1u) << test::Describe(ask);
  EXPECT_EQ(signals[0].targets, (std::vector<std::pair<int, int>>{{0, 12}}));
  // A second request while the first is open changes nothing.
  EXPECT_TRUE(All<SignalForStacks>(Msg(2s + 100ms, wire::DumpStacks{0})).empty());
  EXPECT_TRUE(All<ReadStacks>(Feed(3s - kNs, Tick{})).empty());
  const AgentEffects read = Feed(3s, Tick{});
  ASSERT_EQ(All<ReadStacks>(read).size(), 1u) << test::Describe(read);
  const AgentEffects sent = Feed(3s, WorkerStacks{0, {std::string(kDump), ""}});
  const auto stacks = Sent<wire::RankStacks>(sent);
  ASSERT_EQ(stacks.size(), 1u) << test::Describe(sent);
  ASSERT_EQ(stacks[0].ranks.size(), 2u);
  EXPECT_EQ(stacks[0].ranks[0].global_rank, 2);
  EXPECT_EQ(stacks[0].ranks[0].step, 5);
  EXPECT_EQ(stacks[0].ranks[0].silent_ms, 2000);
  EXPECT_EQ(stacks[0].ranks[0].stack, FormatFrames(MainThreadStack(kDump)));
  EXPECT_EQ(stacks[0].ranks[1].stack, "");
}

TEST_F(AgentProgressTest, WithoutAnyHandlerTheRanksAreReportedAtOnce) {
  UseJob("progress = \"30s\"\n");
  Running();
  const auto stacks = Sent<wire::RankStacks>(Msg(2s, wire::DumpStacks{0}));
  ASSERT_EQ(stacks.size(), 1u);
  EXPECT_EQ(stacks[0].ranks.size(), 2u);
  EXPECT_EQ(stacks[0].ranks[1].silent_ms, 2000);
}

TEST_F(AgentProgressTest, ProgressReportsCarryWindowedStepAndWorkTimes) {
  // heartbeat 2 s, window 16 s: a report every 2 s, the window is 8 reports.
  UseJob("[stragglers]\nwindow = \"16s\"\n");
  Running();
  std::vector<wire::RankProgress> reports;
  int64_t step = 0;
  for (Duration t = 1s; t <= 40s; t += 1s) {
    auto e = Msg(t, wire::Heartbeat{});
    ++step;
    auto b0 = Beat(t, 0, step, 250'000);
    auto b1 = Beat(t, 1, step, 500'000);
    for (auto* effects : {&e, &b0, &b1}) {
      for (auto& r : Sent<wire::RankProgress>(*effects)) reports.push_back(r);
    }
    auto tick = Feed(t + 500ms, Tick{});
    for (auto& r : Sent<wire::RankProgress>(tick)) reports.push_back(r);
  }
  ASSERT_GE(reports.size(), 10u);
  const wire::RankProgress& last = reports.back();
  ASSERT_EQ(last.ranks.size(), 2u);
  EXPECT_EQ(last.ranks[0].global_rank, 2);
  EXPECT_EQ(last.ranks[0].step_us, 1'000'000);
  EXPECT_EQ(last.ranks[0].work_us, 250'000);
  EXPECT_EQ(last.ranks[1].work_us, 500'000);
  EXPECT_EQ(last.ranks[0].longest_ms, 1000);  // warmed up: 10 intervals of 1 s
  // Before the window is full, no step time.
  EXPECT_EQ(reports.front().ranks[0].step_us, -1);
}

// ---- The coordinator -------------------------------------------------------------------

using CoordEffects = std::vector<CoordinatorEffect>;

class CoordinatorProgressTest : public ::testing::Test, public test::CoordinatorDriver {
 protected:
  void UseJob(std::string_view extra) {
    Use(Edit(kTwoNodeJob, "stop_grace = \"30s\"\n",
             std::string("stop_grace = \"30s\"\n") + std::string(extra)));
  }
  void StartRound() {
    for (int node : {0, 1}) Join(0s, node);
    const auto starts = Sent<wire::StartRound>(Feed(0s, StorePortReady{0, 41000}));
    ASSERT_EQ(starts.size(), 2u);
  }
  /// Both nodes beat every second in (from, to].
  void BeatUntil(Duration from, Duration to) { CoordinatorDriver::BeatUntil(from, to, {{0, 0}, {1, 0}}); }
  static std::string Stack(const std::vector<Frame>& frames) { return FormatFrames(frames); }
};

TEST_F(CoordinatorProgressTest, AHungRankIsNamedFromEveryRanksStackAndTheRoundStopsWithIt) {
  UseJob("progress = \"30s\"\n");
  StartRound();
  BeatUntil(0s, 40s);
  // Node 0's rank 0 went silent first (it waits in all_reduce for rank 3).
  const CoordEffects ask = Send(41s, 0, wire::RankHung{0, 0, 0, 41, 30'001, 30'000, false});
  EXPECT_EQ(Sent<wire::DumpStacks>(ask).size(), 2u) << test::Describe(ask);
  EXPECT_TRUE(Sent<wire::StopRound>(ask).empty());
  EXPECT_NE(FindLog(ask, "round 0: rank 0 (node 0 (gpu-01), local rank 0) sent no progress beacon for 30s"),
            "");
  // A second report while the stacks come in changes nothing.
  EXPECT_TRUE(
      Sent<wire::DumpStacks>(Send(41s, 1, wire::RankHung{0, 2, 0, 41, 30'000, 30'000, false})).empty());
  EXPECT_TRUE(
      Sent<wire::StopRound>(
          Send(42s, 0,
               wire::RankStacks{0, {{0, 41, 31'000, Stack(kAllReduce)}, {1, 41, 31'000, Stack(kAllReduce)}}}))
          .empty());
  const CoordEffects stop = Send(
      42s, 1, wire::RankStacks{0, {{2, 41, 31'000, Stack(kAllReduce)}, {3, 41, 32'000, Stack(kLoader)}}});
  const auto stops = Sent<wire::StopRound>(stop);
  ASSERT_EQ(stops.size(), 2u) << test::Describe(stop);
  const std::string& cause = stops[0].second.cause;
  EXPECT_EQ(cause.substr(0, cause.find('\n')),
            "rank 3 (node 1 (gpu-02), local rank 1) hung: no progress for 32s after step 41 "
            "(timeouts.progress = 30s)");
  EXPECT_NE(cause.find("  why rank 3: the only rank not waiting for the others\n"), std::string::npos)
      << cause;
  EXPECT_NE(cause.find("    rank 3, last step 41, silent 32s: in load_batch at train.py:57\n"
                       "      File \"/home/me/train.py\", line 57 in load_batch\n"),
            std::string::npos)
      << cause;
  EXPECT_NE(cause.find("    3 ranks 0-2, last step 41: in all_reduce at train.py:95\n"), std::string::npos)
      << cause;
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kStopping);
}

// timeouts.progress = "auto": the cause says whether the timeout was learnt, or whether
// timeouts.progress_start stood in because nothing was learnt yet.
TEST_F(CoordinatorProgressTest, AnAutoTimeoutSaysWhetherItWasLearnt) {
  for (const bool learnt : {false, true}) {
    SCOPED_TRACE(learnt ? "learnt" : "nothing learnt");
    UseJob("progress = \"auto\"\nprogress_start = \"20s\"\n");
    StartRound();
    BeatUntil(0s, 40s);
    Send(41s, 1, wire::RankHung{0, 3, 1, 41, 20'001, 20'000, false, learnt});
    Send(41s, 0,
         wire::RankStacks{0, {{0, 41, 30'000, Stack(kAllReduce)}, {1, 41, 30'000, Stack(kAllReduce)}}});
    const auto stops = Sent<wire::StopRound>(Send(
        41s, 1, wire::RankStacks{0, {{2, 41, 30'000, Stack(kAllReduce)}, {3, 41, 20'001, Stack(kLoader)}}}));
    ASSERT_EQ(stops.size(), 2u);
    const std::string& cause = stops[0].second.cause;
    EXPECT_EQ(cause.substr(0, cause.find('\n')),
              learnt ? "rank 3 (node 1 (gpu-02), local rank 1) hung: no progress for 20s after step 41 "
                       "(timeouts.progress = \"auto\", 20s learnt from this job)"
                     : "rank 3 (node 1 (gpu-02), local rank 1) hung: no progress for 20s after step 41 "
                       "(timeouts.progress = \"auto\", nothing learnt yet: timeouts.progress_start = 20s)");
  }
}

TEST_F(CoordinatorProgressTest, ANodeThatDoesNotAnswerDoesNotHoldTheStopBack) {
  UseJob("progress = \"30s\"\n");
  StartRound();
  BeatUntil(0s, 40s);
  Send(41s, 1, wire::RankHung{0, 3, 1, 41, 30'001, 30'000, false});
  Send(41s, 1, wire::RankStacks{0, {{2, 41, 30'000, Stack(kAllReduce)}, {3, 41, 30'001, Stack(kLoader)}}});
  // Node 0 beats but never answers; the wait is max(5 s, 2 x heartbeat) = 5 s.
  Send(45s, 0, wire::Heartbeat{});
  Send(45s, 1, wire::Heartbeat{});
  EXPECT_TRUE(Sent<wire::StopRound>(Feed(46s - kNs, Tick{})).empty());
  const auto stops = Sent<wire::StopRound>(Feed(46s, Tick{}));
  ASSERT_EQ(stops.size(), 2u);
  EXPECT_NE(stops[0].second.cause.find("    node 0 did not answer in time: 2 ranks unknown\n"),
            std::string::npos)
      << stops[0].second.cause;
  EXPECT_EQ(stops[0].second.cause.rfind("rank 3 (node 1 (gpu-02), local rank 1) hung", 0), 0u);
}

TEST_F(CoordinatorProgressTest, AFailureWhileStacksAreCollectedDoesNotReplaceTheHang) {
  UseJob("progress = \"30s\"\n");
  StartRound();
  BeatUntil(0s, 40s);
  Send(41s, 1, wire::RankHung{0, 3, 1, 41, 30'001, 30'000, false});
  const CoordEffects e = Send(42s, 0, wire::WorkerFailed{0, 0, 0, 1, 0, "watchdog timeout\n", ""});
  const auto stops = Sent<wire::StopRound>(e);
  ASSERT_EQ(stops.size(), 2u) << test::Describe(e);
  const std::string& cause = stops[0].second.cause;
  EXPECT_EQ(cause.rfind("rank 3 (node 1 (gpu-02), local rank 1) hung", 0), 0u) << cause;
  EXPECT_NE(cause.find("meanwhile, while the stacks were collected: rank 0 (node 0 (gpu-01), local "
                       "rank 0) exited with code 1"),
            std::string::npos)
      << cause;
}

TEST_F(CoordinatorProgressTest, ALostNodeExplainsTheSilenceAndIsTheRootCause) {
  UseJob("progress = \"30s\"\n");
  StartRound();
  BeatUntil(0s, 40s);
  Send(41s, 0, wire::RankHung{0, 0, 0, 41, 30'001, 30'000, false});
  const CoordEffects e = Feed(41s, PeerClosed{101, "connection reset"});
  const auto stops = Sent<wire::StopRound>(e);
  ASSERT_EQ(stops.size(), 1u) << test::Describe(e);
  EXPECT_EQ(stops[0].second.cause.rfind("node 1 (gpu-02) was lost: connection reset", 0), 0u);
  EXPECT_NE(stops[0].second.cause.find("(before that, rank 0 (node 0 (gpu-01), local rank 0) had "
                                       "sent no progress beacon for 30s"),
            std::string::npos);
}

TEST_F(CoordinatorProgressTest, AStragglerIsReportedOnceAndListedInTheSummary) {
  UseJob("[stragglers]\nslower_percent = 50\nwindow = \"16s\"\n");
  StartRound();
  CoordEffects logs;
  auto keep = [&](CoordEffects e) { logs.insert(logs.end(), e.begin(), e.end()); };
  for (Duration t = 2s; t <= 20s; t += 2s) {
    keep(Send(t, 0, wire::Heartbeat{}));
    keep(Send(t, 1, wire::Heartbeat{}));
    keep(Send(t, 0, wire::RankProgress{0, {{0, 10, 200'000, 1'000'000, 0}, {1, 10, 210'000, 1'000'000, 0}}}));
    keep(Send(t, 1,
              wire::RankProgress{0, {{2, 10, 190'000, 1'000'000, 0}, {3, 10, 420'000, 1'000'000, 1'500}}}));
    keep(Feed(t + 1s, Tick{}));
  }
  const std::string line = FindLog(logs, "is a straggler");
  EXPECT_EQ(line,
            "rank 3 (node 1 (gpu-02), local rank 1) is a straggler: its own work per step is "
            "0.42s, 2x the median 0.21s of 4 ranks over the last 16s (stragglers.slower_percent = 50)");
  int said = 0;
  for (const std::string& text : test::LogTexts(logs))
    said += text.find("is a straggler") != std::string::npos;
  EXPECT_EQ(said, 1);
  // It recovers.
  Send(22s, 0, wire::Heartbeat{});
  Send(22s, 1, wire::RankProgress{0, {{3, 12, 200'000, 1'000'000, 1'500}}});
  EXPECT_NE(FindLog(Feed(25s, Tick{}), "rank 3 (node 1 (gpu-02), local rank 1) is no longer a straggler"),
            "");
  // The job's summary lists it.
  Send(26s, 0, wire::NodeDone{0});
  const auto end = Sent<wire::JobEnd>(Send(26s, 1, wire::NodeDone{0}));
  ASSERT_EQ(end.size(), 2u);
  EXPECT_NE(end[0].second.summary.find("\nstragglers (more than 50% slower than the median rank for 16s):\n"
                                       "  rank 3 (node 1 (gpu-02), local rank 1) in round 0: its own "
                                       "work per step 0.42s, 2x the median 0.21s"),
            std::string::npos)
      << end[0].second.summary;
}

TEST_F(CoordinatorProgressTest, TheLearntIntervalReachesTheNextRound) {
  UseJob("progress = \"auto\"\n");
  StartRound();
  Send(2s, 1, wire::RankProgress{0, {{3, 10, -1, -1, 4'200}}});
  Send(3s, 1, wire::WorkerFailed{0, 3, 1, 1, 0, "boom\n", ""});
  Send(3s, 0, wire::RoundStopped{0, 2});
  Send(3s, 1, wire::RoundStopped{0, 1});
  BeatUntil(3s, 12s);
  Send(13s, 0, wire::Heartbeat{});  // the backoff (10 s) is over: the next round starts
  const CoordEffects e = Feed(13s, StorePortReady{1, 41001});
  const auto starts = Sent<wire::StartRound>(e);
  ASSERT_EQ(starts.size(), 2u) << test::Describe(e);
  EXPECT_EQ(starts[0].second.longest_interval_ms, 4'200);
}

}  // namespace
}  // namespace ddprun::core
