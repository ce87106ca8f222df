// Nodes that do not come back, without a spare to take their place: with cluster.min_nodes the
// next rounds run with the nodes left (each agent hears its place and the round's size) and
// grow back at a later restart; [quarantine] keeps a host whose rounds keep failing out for a
// doubling cooldown, remembered across launches through node 0's state file.

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
using test::FindLog;
using test::Sent;
using test::SpecFromToml;
using Effects = std::vector<CoordinatorEffect>;

// Three nodes, two workers each; rounds may run with two. Lightning's num_nodes follows.
constexpr std::string_view kShrinkJob = R"(version = 1
[job]
name = "demo"
command = ["python", "train.py"]
[cluster]
nodes = ["gpu-01", "gpu-02", "gpu-03"]
master_port = 50000
min_nodes = 2
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 3
[restart]
max_restarts = 5
backoff = "10s"
[timeouts]
rendezvous = "15m"
heartbeat = "2s"
stop_grace = "30s"
replace = "5s"
)";

class ShrinkTest : public ::testing::Test, public test::CoordinatorDriver {
 protected:
  void SetUp() override { Use(std::string(kShrinkJob)); }
  /// Every agent joins at 0 s and round 0 starts on all of them.
  void StartAll(int agents) {
    for (int a = 0; a < agents; ++a) Join(0s, a);
    ASSERT_EQ(Sent<wire::StartRound>(Feed(0s, StorePortReady{0, 41000})).size(),
              static_cast<size_t>(spec_->cluster.nnodes));
  }
};

TEST_F(ShrinkTest, ALostNodeIsLeftOutAfterReplaceAndItsLeaseAndTheOthersCloseRanks) {
  StartAll(3);
  BeatUntil(0s, 10s, {{0, 0}, {1, 0}, {2, 0}});
  Feed(10s, PeerClosed{Conn(1), "connection reset"});
  Send(11s, 0, wire::RoundStopped{0, 2});
  Send(11s, 2, wire::RoundStopped{0, 2});
  ASSERT_EQ(coordinator_->phase(), Coordinator::Phase::kBackoff);
  // Away for more than replace at 21 s, but its workers may run until its lease ends at 58 s.
  const Effects wait = BeatUntil(11s, 57s, {{0, 0}, {2, 0}});
  EXPECT_TRUE(All<ReserveStorePort>(wait).empty()) << test::Describe(wait);
  // Nobody took its rank: the smaller round goes on without it, after its lease.
  EXPECT_EQ(FindLog(wait, "waiting"),
            "round 1: all 2 nodes joined; waiting 37s before starting it: node 1 (gpu-02) was lost "
            "while its workers ran and the round goes on without it, so the old workers may still "
            "run until their agent's lease ends (loss bound + stop_grace + SIGKILL)");
  const Effects gate = BeatUntil(57s, 58s, {{0, 0}, {2, 0}});
  ASSERT_EQ(All<ReserveStorePort>(gate).size(), 1u) << test::Describe(gate);
  const Effects start = Feed(58s, StorePortReady{1, 41001});
  const auto starts = Sent<wire::StartRound>(start);
  ASSERT_EQ(starts.size(), 2u) << test::Describe(start);
  EXPECT_EQ(starts[0], (std::pair<ConnId, wire::StartRound>{Conn(0), {1, 41001, 0, 0, 2}}));
  EXPECT_EQ(starts[1], (std::pair<ConnId, wire::StartRound>{Conn(2), {1, 41001, 0, 1, 2}}));
  EXPECT_NE(FindLog(start,
                    "round 1: starting 4 workers on 2 of the job's 3 nodes (cluster.min_nodes "
                    "= 2): without node 1 (gpu-02): away for 48s (more than timeouts.replace "
                    "= 5s); node 2 (gpu-03) plays node rank 1"),
            "")
      << test::Describe(start);
  EXPECT_EQ(coordinator_->Metrics().round_nodes, 2);
  // A failure on node 2 names its global rank in the smaller world.
  const auto stops = Sent<wire::StopRound>(Send(60s, 2, wire::WorkerFailed{1, 3, 1, 1, 0, "boom\n", ""}));
  ASSERT_EQ(stops.size(), 2u);
  EXPECT_EQ(stops[0].second.cause.rfind("rank 3 (node 2 (gpu-03), local rank 1) exited with code 1", 0), 0u)
      << stops[0].second.cause;
}

TEST_F(ShrinkTest, TheNodeThatComesBackSitsOutTheRunningRoundAndTakesPartInTheNext) {
  StartAll(3);
  Feed(10s, PeerClosed{Conn(1), "connection reset"});
  Send(11s, 0, wire::RoundStopped{0, 2});
  Send(11s, 2, wire::RoundStopped{0, 2});
  BeatUntil(11s, 58s, {{0, 0}, {2, 0}});
  Feed(58s, StorePortReady{1, 41001});
  ASSERT_EQ(coordinator_->phase(), Coordinator::Phase::kRunning);
  BeatUntil(58s, 69s, {{0, 0}, {2, 0}});
  // Its host rebooted: a new agent for node 1 joins while the smaller round runs.
  const Effects back = Join(70s, 1, 1);
  EXPECT_NE(FindLog(back,
                    "node 1 (gpu-02) joined from 10.0.0.2 (3/3); round 1 runs without it, it "
                    "takes part from the next round"),
            "")
      << test::Describe(back);
  EXPECT_TRUE(Sent<wire::StartRound>(back).empty());
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kRunning);
  // It ran nothing: a failure it reports is not the round's, and losing it stops nothing.
  EXPECT_TRUE(Sent<wire::StopRound>(Send(71s, 1, wire::WorkerFailed{1, 2, 0, 1, 0, "", ""}, 1)).empty());
  // The next failure restarts the job: every node is back, so the round has all three.
  Send(80s, 2, wire::WorkerFailed{1, 3, 1, 1, 0, "boom\n", ""});
  Send(81s, 0, wire::RoundStopped{1, 2});
  Send(81s, 2, wire::RoundStopped{1, 2});
  const Effects next = BeatUntil(81s, 91s, {{0, 0}, {1, 1}, {2, 0}});
  ASSERT_EQ(All<ReserveStorePort>(next).size(), 1u) << test::Describe(next);
  const auto starts = Sent<wire::StartRound>(Feed(91s, StorePortReady{2, 41002}));
  ASSERT_EQ(starts.size(), 3u);
  EXPECT_EQ(starts[1], (std::pair<ConnId, wire::StartRound>{Conn(1, 1), {2, 41002, 0, 1, 0}}));
  EXPECT_EQ(starts[2], (std::pair<ConnId, wire::StartRound>{Conn(2), {2, 41002, 0, 2, 0}}));
  EXPECT_EQ(coordinator_->Metrics().round_nodes, 3);
}

TEST_F(ShrinkTest, ASmallerRoundThatSucceedsSaysSoAndTheEndDoesNotWaitForTheAbsentNode) {
  StartAll(3);
  Feed(10s, PeerClosed{Conn(1), "connection reset"});
  Send(11s, 0, wire::RoundStopped{0, 2});
  Send(11s, 2, wire::RoundStopped{0, 2});
  BeatUntil(11s, 58s, {{0, 0}, {2, 0}});
  Feed(58s, StorePortReady{1, 41001});
  Send(60s, 0, wire::NodeDone{1});
  const Effects done = Send(60s, 2, wire::NodeDone{1});
  const auto ends = Sent<wire::JobEnd>(done);
  ASSERT_EQ(ends.size(), 2u) << test::Describe(done);
  EXPECT_EQ(ends[0].second.exit_code, 0);
  EXPECT_NE(ends[0].second.summary.find("all 4 ranks on 2 nodes exited 0 in round 1"), std::string::npos)
      << ends[0].second.summary;
  EXPECT_NE(ends[0].second.summary.find("the round ran with 2 of the job's 3 nodes (cluster.min_nodes = 2)"),
            std::string::npos)
      << ends[0].second.summary;
  Send(61s, 0, wire::JobEndAck{});
  const Effects acked = Send(61s, 2, wire::JobEndAck{});
  EXPECT_EQ(All<CoordinatorDone>(acked).size(), 1u) << test::Describe(acked);
}

TEST_F(ShrinkTest, FewerNodesThanMinNodesWaitAndTheRendezvousFailureSaysWhy) {
  Join(0s, 0);
  const Effects e = BeatUntil(0s, 15min, {{0, 0}});
  EXPECT_TRUE(All<ReserveStorePort>(e).empty());
  const auto ends = Sent<wire::JobEnd>(e);
  ASSERT_EQ(ends.size(), 1u) << test::Describe(e);
  EXPECT_EQ(ends[0].second.exit_code, 3);
  EXPECT_NE(ends[0].second.summary.find("1/3 nodes joined"), std::string::npos) << ends[0].second.summary;
  EXPECT_NE(ends[0].second.summary.find("cluster.min_nodes = 2 needs at least that many"), std::string::npos)
      << ends[0].second.summary;
}

TEST_F(ShrinkTest, ANodeThatNeverCameIsLeftOutOfTheFirstRoundAfterReplace) {
  Join(0s, 0);
  Join(0s, 2);
  EXPECT_TRUE(All<ReserveStorePort>(BeatUntil(0s, 4s, {{0, 0}, {2, 0}})).empty());
  const Effects e = BeatUntil(4s, 5s, {{0, 0}, {2, 0}});
  ASSERT_EQ(All<ReserveStorePort>(e).size(), 1u) << test::Describe(e);
  const auto starts = Sent<wire::StartRound>(Feed(5s, StorePortReady{0, 41000}));
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[1].second.nnodes, 2);
}

TEST_F(ShrinkTest, WithoutMinNodesTheRoundWaitsForEveryNodeAsBefore) {
  Use(test::Edit(kShrinkJob, "min_nodes = 2\n", ""));
  Join(0s, 0);
  Join(0s, 2);
  const Effects e = BeatUntil(0s, 60s, {{0, 0}, {2, 0}});
  EXPECT_TRUE(All<ReserveStorePort>(e).empty());
}

// The agent of a smaller round: its place, the round's world size, and Lightning's num_nodes.
TEST(ShrinkAgentTest, TheWorkersOfASmallerRoundGetItsWorldSizeAndNumNodes) {
  Agent::Config config;
  config.node_rank = 2;
  config.host = "gpu-03";
  config.logs_dir = "/logs";
  test::AgentDriver agent;
  agent.Use(kShrinkJob, config);
  agent.Start(0s);
  agent.Feed(0s, MasterConnected{});
  agent.Msg(0s, wire::JoinAck{3, true});
  const std::vector<AgentEffect> out = agent.Msg(1s, wire::StartRound{1, 41001, 0, 1, 2});
  const auto spawns = All<SpawnWorkers>(out);
  ASSERT_EQ(spawns.size(), 1u) << test::Describe(out);
  ASSERT_EQ(spawns[0].workers.size(), 2u);
  auto env = [&](const WorkerLaunch& w, const std::string& name) {
    for (const auto& [k, v] : w.env) {
      if (k == name) return v;
    }
    return std::string("(unset)");
  };
  const WorkerLaunch& w = spawns[0].workers[1];
  EXPECT_EQ(w.global_rank, 3);
  EXPECT_EQ(env(w, "RANK"), "3");
  EXPECT_EQ(env(w, "NODE_RANK"), "1");
  EXPECT_EQ(env(w, "GROUP_WORLD_SIZE"), "2");
  EXPECT_EQ(env(w, "WORLD_SIZE"), "4");
  EXPECT_EQ(env(w, "ROLE_WORLD_SIZE"), "4");
  EXPECT_EQ(env(w, "PL_TRAINER_NUM_NODES"), "2");
  EXPECT_NE(FindLog(out, "round 1: starting 2 workers (ranks 2..3 of 4)"), "") << test::Describe(out);
  // A round smaller than min_nodes (or larger than the job) is refused.
  test::AgentDriver other;
  other.Use(kShrinkJob, config);
  other.Start(0s);
  other.Feed(0s, MasterConnected{});
  other.Msg(0s, wire::JoinAck{3, true});
  const std::vector<AgentEffect> o = other.Msg(1s, wire::StartRound{0, 41000, 0, 0, 1});
  EXPECT_TRUE(All<SpawnWorkers>(o).empty());
  EXPECT_NE(FindLog(o, "but the job has 3 nodes (at least 2 per round); ignoring"), "") << test::Describe(o);
}

// ---- Quarantine ------------------------------------------------------------------------

// Two nodes and a spare; a host is quarantined after 2 failed rounds within 10 minutes.
constexpr std::string_view kQuarantineJob = R"(version = 1
[job]
name = "demo"
command = ["python", "train.py"]
[cluster]
nodes = ["gpu-01", "gpu-02"]
spares = ["gpu-09"]
master_port = 50000
nproc_per_node = 2
[restart]
max_restarts = 9
backoff = "1s"
[timeouts]
rendezvous = "15m"
heartbeat = "2s"
stop_grace = "30s"
replace = "5s"
[quarantine]
failures = 2
window = "10m"
cooldown = "20m"
)";

class QuarantineTest : public ShrinkTest {
 protected:
  void SetUp() override { Use(std::string(kQuarantineJob)); }
  /// Rank 2 (on whichever agent plays node rank 1) fails in `round`, at `at`; all stop.
  Effects FailRound(Duration at, int round, int agent) {
    BeatUntil(last_, at - 1s, {{0, 0}, {1, 0}, {2, 0}});
    Effects all = Send(at, agent, wire::WorkerFailed{round, 2, 0, 1, 0, "RuntimeError: ECC\n", ""});
    for (int a : {0, 1, 2}) {
      Effects e = Send(at, a, wire::RoundStopped{round, 2});
      all.insert(all.end(), e.begin(), e.end());
    }
    return all;
  }
};

TEST_F(QuarantineTest, AHostWhoseRoundsKeepFailingSitsOutAndTheSpareTakesItsRankAtOnce) {
  StartAll(3);
  FailRound(10s, 0, 1);
  BeatUntil(10s, 11s, {{0, 0}, {1, 0}, {2, 0}});
  ASSERT_EQ(Sent<wire::StartRound>(Feed(11s, StorePortReady{1, 41001})).size(), 2u);
  BeatUntil(11s, 19s, {{0, 0}, {1, 0}, {2, 0}});
  const Effects second = FailRound(20s, 1, 1);
  EXPECT_NE(FindLog(second,
                    "quarantine: host gpu-02 (node 1 (gpu-02)) sits out for 20m00s: 2 rounds "
                    "failed because of it within quarantine.window = 10m, the last with rank 2 "
                    "(node 1 (gpu-02), local rank 0) exited with code 1; quarantine 1 of this host"),
            "")
      << test::Describe(second);
  const auto records = All<RecordQuarantine>(second);
  ASSERT_EQ(records.size(), 1u);
  ASSERT_EQ(records[0].hosts.size(), 1u);
  EXPECT_EQ(records[0].hosts[0], (QuarantinedHost{"gpu-02", 20min, 1}));
  // The next round: the spare plays node rank 1 without waiting for timeouts.replace.
  const Effects next = BeatUntil(20s, 21s, {{0, 0}, {1, 0}, {2, 0}});
  EXPECT_NE(FindLog(next,
                    "spare 0 (gpu-09) takes node rank 1 in place of node 1 (gpu-02), whose host "
                    "is quarantined"),
            "")
      << test::Describe(next);
  const auto starts = Sent<wire::StartRound>(Feed(21s, StorePortReady{2, 41002}));
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[1], (std::pair<ConnId, wire::StartRound>{Conn(2), {2, 41002, 0, 1, 0}}));
  EXPECT_EQ(coordinator_->Metrics().hosts_quarantined, 1);
  // It stays joined, as a spare: after the cooldown it may take a rank again.
  EXPECT_EQ(coordinator_->Metrics().spares_waiting, 1);
}

TEST_F(QuarantineTest, FailuresOutsideTheWindowDoNotAddUpAndNodeZeroIsNeverQuarantined) {
  StartAll(3);
  FailRound(10s, 0, 1);
  BeatUntil(10s, 11s, {{0, 0}, {1, 0}, {2, 0}});
  Feed(11s, StorePortReady{1, 41001});
  // 11 minutes later: the first failure is out of the 10-minute window.
  BeatUntil(11s, 671s, {{0, 0}, {1, 0}, {2, 0}});
  EXPECT_TRUE(All<RecordQuarantine>(FailRound(671s, 1, 1)).empty());
  BeatUntil(671s, 672s, {{0, 0}, {1, 0}, {2, 0}});
  Feed(672s, StorePortReady{2, 41002});
  BeatUntil(672s, 679s, {{0, 0}, {1, 0}, {2, 0}});
  // Node 0's rank fails twice: it hosts the coordinator, it is never kept out.
  const Effects zero = Send(680s, 0, wire::WorkerFailed{2, 0, 0, 1, 0, "boom\n", ""});
  for (int a : {0, 1, 2}) Send(680s, a, wire::RoundStopped{2, 2});
  BeatUntil(680s, 681s, {{0, 0}, {1, 0}, {2, 0}});
  Feed(681s, StorePortReady{3, 41003});
  BeatUntil(681s, 689s, {{0, 0}, {1, 0}, {2, 0}});
  Send(690s, 0, wire::WorkerFailed{3, 0, 0, 1, 0, "boom\n", ""});
  Effects again;
  for (int a : {0, 1, 2}) {
    Effects e = Send(690s, a, wire::RoundStopped{3, 2});
    again.insert(again.end(), e.begin(), e.end());
  }
  EXPECT_TRUE(All<RecordQuarantine>(again).empty()) << test::Describe(again);
  EXPECT_EQ(coordinator_->Metrics().hosts_quarantined, 0);
}

TEST_F(QuarantineTest,
       AQuarantineKeptFromAnEarlierLaunchHoldsFromTheFirstRoundAndTheNextOneLastsTwiceAsLong) {
  Effects restored;
  coordinator_->RestoreQuarantine({{"gpu-02", 15min, 1}, {"gpu-07", -1min, 2}}, restored);
  EXPECT_NE(FindLog(restored, "quarantine (kept from an earlier launch of this job): gpu-02 for 15m00s more"),
            "")
      << test::Describe(restored);
  Join(0s, 0);
  const Effects one = Join(0s, 1);
  EXPECT_NE(FindLog(one, "its host is quarantined for 15m00s more"), "") << test::Describe(one);
  const Effects spare = Join(0s, 2);
  EXPECT_NE(FindLog(spare,
                    "spare 0 (gpu-09) takes node rank 1 in place of node 1 (gpu-02), whose host is "
                    "quarantined"),
            "")
      << test::Describe(spare);
  ASSERT_EQ(Sent<wire::StartRound>(Feed(0s, StorePortReady{0, 41000})).size(), 2u);
  // After its cooldown it waits as a spare; when the spare host fails twice it is quarantined.
  BeatUntil(0s, 16min, {{0, 0}, {1, 0}, {2, 0}});
  FailRound(16min, 0, 2);
  BeatUntil(16min, 16min + 1s, {{0, 0}, {1, 0}, {2, 0}});
  Feed(16min + 1s, StorePortReady{1, 41001});
  BeatUntil(16min + 1s, 16min + 9s, {{0, 0}, {1, 0}, {2, 0}});
  const Effects second = FailRound(16min + 10s, 1, 2);
  const auto records = All<RecordQuarantine>(second);
  ASSERT_EQ(records.size(), 1u) << test::Describe(second);
  // gpu-07's count is kept; gpu-02's time is over; gpu-09 gets its first 20 minutes.
  ASSERT_EQ(records[0].hosts.size(), 3u);
  EXPECT_EQ(records[0].hosts[0].host, "gpu-02");
  EXPECT_LE(records[0].hosts[0].left, Duration::zero());
  EXPECT_EQ(records[0].hosts[1], (QuarantinedHost{"gpu-07", Duration::zero(), 2}));
  EXPECT_EQ(records[0].hosts[2], (QuarantinedHost{"gpu-09", 20min, 1}));
  // gpu-02, free again, takes node rank 1 back from the quarantined spare host.
  const Effects next = BeatUntil(16min + 10s, 16min + 11s, {{0, 0}, {1, 0}, {2, 0}});
  EXPECT_NE(
      FindLog(next,
              "node 1 (gpu-02) takes node rank 1 in place of spare 0 (gpu-09), whose host is quarantined"),
      "")
      << test::Describe(next);
}

TEST_F(QuarantineTest, TheSecondQuarantineOfAHostLastsTwiceAsLong) {
  Effects restored;
  coordinator_->RestoreQuarantine({{"gpu-02", -1s, 1}}, restored);
  StartAll(3);
  FailRound(10s, 0, 1);
  BeatUntil(10s, 11s, {{0, 0}, {1, 0}, {2, 0}});
  Feed(11s, StorePortReady{1, 41001});
  BeatUntil(11s, 19s, {{0, 0}, {1, 0}, {2, 0}});
  const Effects second = FailRound(20s, 1, 1);
  const auto records = All<RecordQuarantine>(second);
  ASSERT_EQ(records.size(), 1u) << test::Describe(second);
  EXPECT_EQ(records[0].hosts[0], (QuarantinedHost{"gpu-02", 40min, 2}));
  EXPECT_NE(FindLog(second, "sits out for 40m00s"), "") << test::Describe(second);
}

TEST_F(QuarantineTest, WithNothingToTakeItsPlaceAQuarantinedHostTakesPartAfterAll) {
  StartAll(2);  // the spare never came
  FailRound(10s, 0, 1);
  BeatUntil(10s, 11s, {{0, 0}, {1, 0}});
  Feed(11s, StorePortReady{1, 41001});
  BeatUntil(11s, 19s, {{0, 0}, {1, 0}});
  FailRound(20s, 1, 1);
  // The next rendezvous gives a spare timeouts.replace to come; then the host plays after all.
  const Effects wait = BeatUntil(20s, 25s, {{0, 0}, {1, 0}});
  EXPECT_TRUE(All<ReserveStorePort>(wait).empty()) << test::Describe(wait);
  const Effects next = BeatUntil(25s, 26s, {{0, 0}, {1, 0}});
  EXPECT_NE(FindLog(next,
                    "round 2: quarantined hosts take part after all: no spare waits to run "
                    "without them"),
            "")
      << test::Describe(next);
  ASSERT_EQ(Sent<wire::StartRound>(Feed(26s, StorePortReady{2, 41002})).size(), 2u);
}

// Issue 25: node 0's agent stalled 7 s at start (a slow NFS read of quarantine.state) and
// round 0 ran without it ("node 1 plays node rank 0"). Rank 0 is the coordinator's own agent:
// it is never left out, however late it joins.
TEST_F(ShrinkTest, NodeRankZeroIsNeverLeftOutHoweverLateItsAgentJoins) {
  Join(0s, 1);
  Join(0s, 2);
  const Effects wait = BeatUntil(0s, 60s, {{1, 0}, {2, 0}});
  EXPECT_TRUE(All<ReserveStorePort>(wait).empty()) << test::Describe(wait);
  EXPECT_EQ(FindLog(wait, "plays node rank 0"), "") << test::Describe(wait);
  const Effects joined = Join(61s, 0);
  ASSERT_EQ(All<ReserveStorePort>(joined).size(), 1u) << test::Describe(joined);
  const auto starts = Sent<wire::StartRound>(Feed(61s, StorePortReady{0, 41000}));
  ASSERT_EQ(starts.size(), 3u);
  EXPECT_EQ(starts[0].first, Conn(0));
  EXPECT_EQ(starts[0].second.nnodes, 0) << "the whole job";
}

// Issue 25: an agent that gave up on a join we were too slow to answer connects again; its
// first connection was replaced, not lost: no "left" line, no restart, nothing to quarantine.
TEST_F(ShrinkTest, AConnectionReplacedByTheSameAgentBeforeTheRoundIsNotALoss) {
  Join(0s, 1);
  Join(0s, 2);
  // Agent 1 again, on a second connection, with the same instance as its first.
  Feed(7s, PeerAccepted{Conn(1, 1), "10.0.0.2"});
  const Effects again = Send(7s, 1,
                             wire::Join{1, spec_->cluster.HostOf(1), spec_->cluster.nproc_per_node, "0.1.0",
                                        FingerprintOfCanonical(canonical_), canonical_, 1001, "", "", ""},
                             1);
  ASSERT_EQ(All<CloseConn>(again).size(), 1u) << test::Describe(again);
  EXPECT_EQ(All<CloseConn>(again)[0].conn, Conn(1));
  EXPECT_EQ(FindLog(again, "left"), "") << test::Describe(again);
  EXPECT_EQ(Sent<wire::JoinAck>(again).size(), 1u) << test::Describe(again);
  Join(7s, 0);
  const auto starts = Sent<wire::StartRound>(Feed(7s, StorePortReady{0, 41000}));
  ASSERT_EQ(starts.size(), 3u);
  EXPECT_EQ(starts[1].first, Conn(1, 1));
  EXPECT_EQ(coordinator_->Metrics().restarts_used, 0);
}

// Issue 25: the absence clock must not count the coordinator's own stall. Node 2 never came;
// the coordinator did not run from 1 s to 8 s (past the 6 s loss bound). Without the stall
// node 2 would be given up at 5 s (timeouts.replace); with it, at 12 s.
TEST_F(ShrinkTest, TheCoordinatorsOwnStallIsNotCountedAsAnAbsence) {
  Join(0s, 0);
  Join(1s, 1);
  const Effects stalled = BeatUntil(7s, 8s, {{0, 0}, {1, 0}});
  EXPECT_NE(FindLog(stalled, "stalled for 7.0s"), "") << test::Describe(stalled);
  EXPECT_TRUE(All<ReserveStorePort>(stalled).empty()) << test::Describe(stalled);
  const Effects before = BeatUntil(8s, 11s, {{0, 0}, {1, 0}});
  EXPECT_TRUE(All<ReserveStorePort>(before).empty()) << test::Describe(before);
  const Effects at = BeatUntil(11s, 12s, {{0, 0}, {1, 0}});
  ASSERT_EQ(All<ReserveStorePort>(at).size(), 1u) << test::Describe(at);
  EXPECT_NE(FindLog(Feed(12s, StorePortReady{0, 41000}),
                    "without node 2 (gpu-03): away for 5.0s (more than timeouts.replace = 5s)"),
            "");
}

}  // namespace
}  // namespace ddprun::core
