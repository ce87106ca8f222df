// The state machines' metrics snapshots (runner/core/metrics.h): what Agent::Metrics and
// Coordinator::Metrics say at each stage of a round, and that taking one changes nothing.

#include "runner/core/metrics.h"

#include <gtest/gtest.h>

#include <csignal>

#include <memory>
#include <string>

#include <fmt/format.h>

#include "runner/core/agent.h"
#include "runner/core/coordinator.h"
#include "schema/canonical.h"
#include "tests/core/core_test_util.h"
#include "tests/core/drivers.h"

namespace ddprun::core {
namespace {

using namespace std::chrono_literals;
using test::At;
using test::Edit;
using test::kTwoNodeJob;
using test::Sent;
using test::SpecFromToml;

// heartbeat 2 s and a 16 s straggler window: a progress report every 2 s, 8 per window.
constexpr std::string_view kWindow = "stop_grace = \"30s\"\n[stragglers]\nwindow = \"16s\"\n";

class AgentMetricsTest : public ::testing::Test, public test::AgentDriver {
 protected:
  AgentMetricsTest() {
    Agent::Config config;
    config.node_rank = 1;
    config.host = "gpu-02";
    config.ddprun_version = "0.1.0";
    config.progress_addr = "127.0.0.1:39999";
    config.progress_token = "tok";
    Use(Edit(kTwoNodeJob, "stop_grace = \"30s\"\n", kWindow), std::move(config));
  }
  void Beat(Duration at, int local, int64_t step, int64_t busy_us, BeaconKind kind = BeaconKind::kStep) {
    Feed(at, BeaconReceived{Beacon{0, local, kind, step, busy_us, 0}});
  }
};

TEST_F(AgentMetricsTest, BeforeTheFirstRoundTheNodeHasNoRanks) {
  Start(0s);
  AgentMetrics expected;
  expected.node_rank = 1;
  expected.host = "gpu-02";
  expected.version = "0.1.0";
  expected.phase = "connecting";
  expected.round = -1;
  EXPECT_EQ(agent_->Metrics(At(1s)), expected);
  Feed(1s, MasterConnected{});
  Feed(1s, MasterMessage{wire::JoinAck{2}});
  expected.phase = "waiting";
  EXPECT_EQ(agent_->Metrics(At(1s)), expected);
}

TEST_F(AgentMetricsTest, RanksShowTheirLastStepSilenceAndWindowedTimes) {
  Start(0s);
  Feed(0s, MasterConnected{});
  Feed(0s, MasterMessage{wire::JoinAck{2}});
  Feed(0s, MasterMessage{wire::StartRound{0, 41000}});
  AgentMetrics started = agent_->Metrics(At(0s));
  EXPECT_EQ(started.phase, "running");
  EXPECT_EQ(started.round, 0);
  EXPECT_EQ(started.plays, 1);
  EXPECT_EQ(started.workers_running, 2);
  EXPECT_EQ(started.ranks, (std::vector<RankMetrics>{{2, -1, std::nullopt, std::nullopt, std::nullopt},
                                                     {3, -1, std::nullopt, std::nullopt, std::nullopt}}));
  // A step a second; rank 2 says its own work took 250 ms, rank 3 says nothing of it.
  for (int64_t step = 1; step <= 40; ++step) {
    const Duration t = Duration(std::chrono::seconds(step));
    Feed(t, MasterMessage{wire::Heartbeat{}});
    Beat(t, 0, step, 250'000);
    Beat(t, 1, step, -1);
    Feed(t + 500ms, Tick{});
  }
  const AgentMetrics m = agent_->Metrics(At(40s + 700ms));
  EXPECT_EQ(m.ranks, (std::vector<RankMetrics>{{2, 40, 700ms, 1s, 250ms}, {3, 40, 700ms, 1s, std::nullopt}}));
  // Taking a snapshot changes nothing.
  EXPECT_EQ(agent_->Metrics(At(40s + 700ms)), m);
  // A phase beacon is a beacon; an exited rank is no longer listed.
  Beat(41s, 1, 40, -1, BeaconKind::kPhase);
  Feed(41s, WorkerExited{0, 0, 0, 0, "", ""});
  const AgentMetrics after = agent_->Metrics(At(42s));
  EXPECT_EQ(after.workers_running, 1);
  ASSERT_EQ(after.ranks.size(), 1u);
  EXPECT_EQ(after.ranks[0].global_rank, 3);
  EXPECT_EQ(after.ranks[0].since_beacon, std::optional<Duration>(1s));
}

class CoordinatorMetricsTest : public ::testing::Test, public test::CoordinatorDriver {
 protected:
  CoordinatorMetricsTest() { UseJob(Edit(kTwoNodeJob, "stop_grace = \"30s\"\n", kWindow)); }
  void UseJob(const std::string& text) { Use(text); }
};

TEST_F(CoordinatorMetricsTest, FromRendezvousThroughAFailureToTheRestart) {
  CoordinatorMetrics expected;
  expected.phase = "rendezvous";
  expected.restarts_allowed = 1;
  expected.nodes = 2;
  EXPECT_EQ(coordinator_->Metrics(), expected);

  Join(0s, 0);
  Join(0s, 1);
  ASSERT_EQ(Sent<wire::StartRound>(Feed(0s, StorePortReady{0, 41000})).size(), 2u);
  expected.phase = "running";
  expected.nodes_joined = 2;
  expected.round_nodes = 2;
  EXPECT_EQ(coordinator_->Metrics(), expected);

  // Progress reports: rank 3 works twice as long as the others and becomes a straggler.
  for (Duration t = 2s; t <= 20s; t += 2s) {
    Send(t, 0, wire::Heartbeat{});
    Send(t, 1, wire::Heartbeat{});
    Send(t, 0, wire::RankProgress{0, {{0, 10, 200'000, 1'000'000, 0}, {1, 10, 210'000, 1'000'000, 0}}});
    Send(t, 1, wire::RankProgress{0, {{2, 10, 190'000, 1'000'000, 0}, {3, 9, 420'000, 1'000'000, 0}}});
    Feed(t + 1s, Tick{});
  }
  const CoordinatorMetrics running = coordinator_->Metrics();
  EXPECT_EQ(running.stragglers, 1);
  EXPECT_EQ(running.ranks_reported, 4u);
  EXPECT_EQ(running.ranks, (std::vector<ReportedRankMetrics>{{0, 0, 10, 1s, 200ms, false},
                                                             {1, 0, 10, 1s, 210ms, false},
                                                             {2, 1, 10, 1s, 190ms, false},
                                                             {3, 1, 9, 1s, 420ms, true}}));
  EXPECT_EQ(coordinator_->last_failure_round(), std::nullopt);

  // Rank 3 fails: the round stops, and with one restart left the job backs off into round 1.
  Send(22s, 1, wire::WorkerFailed{0, 3, 1, 1, 0, "boom", ""});
  EXPECT_EQ(coordinator_->Metrics().phase, "stopping");
  EXPECT_EQ(coordinator_->last_failure_round(), std::optional<int>(0));
  Send(22s, 0, wire::RoundStopped{0, 2});
  Send(22s, 1, wire::RoundStopped{0, 1});
  const CoordinatorMetrics backoff = coordinator_->Metrics();
  EXPECT_EQ(backoff.phase, "backoff");
  EXPECT_EQ(backoff.round, 1);
  EXPECT_EQ(backoff.restarts_used, 1);
  EXPECT_EQ(backoff.last_failure_round, std::optional<int>(0));
  EXPECT_EQ(backoff.last_failure_kind, "exit:1");
  EXPECT_EQ(backoff.rounds_failed, 1);
  EXPECT_EQ(backoff.exit_code, std::nullopt);
}

// The job's end is a phase a dashboard can read: succeeded, failed or interrupted.
TEST_F(CoordinatorMetricsTest, TheEndIsTheOutcomeWithItsExitCodeAndTheFailuresCounted) {
  Join(0s, 0);
  Join(0s, 1);
  Feed(0s, StorePortReady{0, 41000});
  Send(1s, 1, wire::WorkerFailed{0, 3, 1, 1, 0, "boom", ""});
  EXPECT_EQ(coordinator_->Metrics().rounds_failed, 1);
  Send(1s, 0, wire::RoundStopped{0, 2});
  Send(1s, 1, wire::RoundStopped{0, 1});
  for (Duration t = 2s; t <= 12s; t += 1s) {
    Send(t, 0, wire::Heartbeat{});
    Send(t, 1, wire::Heartbeat{});
    Feed(t, Tick{});
  }
  Feed(12s, StorePortReady{1, 41001});
  ASSERT_EQ(coordinator_->Metrics().phase, "running");
  // Round 1 fails too, with no restart left: the job failed.
  Send(13s, 1, wire::WorkerFailed{1, 2, 0, 1, 0, "boom", ""});
  Send(13s, 0, wire::RoundStopped{1, 2});
  Send(13s, 1, wire::RoundStopped{1, 1});
  const CoordinatorMetrics failed = coordinator_->Metrics();
  EXPECT_EQ(failed.phase, "failed");
  EXPECT_EQ(failed.exit_code, std::optional<int>(1));
  EXPECT_EQ(failed.restarts_used, 1);
  EXPECT_EQ(failed.rounds_failed, 2);

  UseJob(std::string(kTwoNodeJob));
  Join(0s, 0);
  Join(0s, 1);
  Feed(0s, StorePortReady{0, 41000});
  Send(1s, 0, wire::NodeDone{0});
  Send(1s, 1, wire::NodeDone{0});
  const CoordinatorMetrics succeeded = coordinator_->Metrics();
  EXPECT_EQ(succeeded.phase, "succeeded");
  EXPECT_EQ(succeeded.exit_code, std::optional<int>(0));
  EXPECT_EQ(succeeded.rounds_failed, 0);

  UseJob(std::string(kTwoNodeJob));
  Join(0s, 0);
  Join(0s, 1);
  Feed(0s, StorePortReady{0, 41000});
  Send(1s, 0, wire::Interrupted{SIGINT});
  EXPECT_EQ(coordinator_->Metrics().phase, "interrupted");
  EXPECT_EQ(coordinator_->Metrics().exit_code, std::optional<int>(130));
}

TEST_F(CoordinatorMetricsTest, ANodeThatLeftIsAwayAndAJoinedSpareWaits) {
  UseJob(Edit(Edit(kTwoNodeJob, "stop_grace = \"30s\"\n", kWindow), "nproc_per_node = 2",
              "nproc_per_node = 2\nspares = [\"gpu-03\"]"));
  Join(0s, 0);
  Join(0s, 1);
  Join(0s, 2);
  Feed(0s, StorePortReady{0, 41000});
  Feed(1s, PeerClosed{ConnId(101), "reset"});
  const CoordinatorMetrics m = coordinator_->Metrics();
  EXPECT_EQ(m.nodes, 2);
  EXPECT_EQ(m.spares, 1);
  EXPECT_EQ(m.nodes_joined, 2);
  EXPECT_EQ(m.nodes_away, 1);
  EXPECT_EQ(m.spares_waiting, 1);
}

TEST_F(CoordinatorMetricsTest, OfAVeryLargeJobTheStragglersAndTheLowestRanksAreListed) {
  // 2 x 600 ranks; rank 1199, the last, is the one straggler.
  UseJob(Edit(Edit(kTwoNodeJob, "stop_grace = \"30s\"\n", kWindow), "nproc_per_node = 2",
              "nproc_per_node = 600"));
  Join(0s, 0);
  Join(0s, 1);
  Feed(0s, StorePortReady{0, 41000});
  for (Duration t = 2s; t <= 4s; t += 2s) {
    for (int node : {0, 1}) {
      wire::RankProgress report{0, {}};
      for (int local = 0; local < 600; ++local) {
        const int rank = node * 600 + local;
        report.ranks.push_back({rank, 10, rank == 1199 ? 420'000 : 200'000, 1'000'000, 0});
      }
      Send(t, node, wire::Heartbeat{});
      Send(t, node, std::move(report));
    }
    Feed(t + 1s, Tick{});
  }
  const CoordinatorMetrics m = coordinator_->Metrics();
  EXPECT_EQ(m.ranks_reported, 1200u);
  EXPECT_EQ(m.stragglers, 1);
  ASSERT_EQ(m.ranks.size(), kMaxReportedRanks);
  EXPECT_EQ(m.ranks.front().global_rank, 0);
  EXPECT_EQ(m.ranks[kMaxReportedRanks - 2].global_rank, static_cast<int>(kMaxReportedRanks) - 2);
  EXPECT_EQ(m.ranks.back().global_rank, 1199);
  EXPECT_TRUE(m.ranks.back().straggling);
}

}  // namespace
}  // namespace ddprun::core
