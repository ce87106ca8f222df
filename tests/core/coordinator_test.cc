// The coordinator state machine: admission, rounds, restarts, liveness, the root-cause summary
// and the exit barrier, driven with inputs and virtual time.

#include "runner/core/auth.h"
#include "runner/core/coordinator.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
using test::Meaningful;
using test::Sent;
using test::SpecFromToml;
using Effects = std::vector<CoordinatorEffect>;

constexpr Duration kNs = Duration(1);

ConnId ConnOf(int node) { return 100 + static_cast<ConnId>(node); }

// The shared driver (its Feed checks the next deadline), with this file's vocabulary: nodes by
// connection id, and joins whose instance a test may choose.
class CoordinatorTest : public ::testing::Test, public test::CoordinatorDriver {
 protected:
  void SetUp() override { UseJob(kTwoNodeJob); }

  void UseJob(std::string_view toml) { Use(toml); }
  Effects Tick(Duration at) { return Feed(at, core::Tick{}); }

  Effects Send(Duration at, ConnId conn, wire::Message message) {
    return Feed(at, PeerMessage{conn, std::move(message)});
  }
  Effects Connect(Duration at, ConnId conn, std::string addr) {
    return Feed(at, PeerAccepted{conn, std::move(addr)});
  }

  wire::Join JoinOf(int node, uint64_t instance = 0) const {
    return wire::Join{node,
                      fmt::format("gpu-0{}", node + 1),
                      spec_->cluster.nproc_per_node,
                      "0.1.0",
                      FingerprintOfCanonical(canonical_),
                      canonical_,
                      instance == 0 ? 1000 + static_cast<uint64_t>(node) : instance,
                      "",
                      "",
                      ""};
  }

  /// Both nodes join at `at` and the host answers the store port reservation.
  Effects StartFirstRound(Duration at, uint16_t port = 41000) {
    Join(at, 0);
    Effects reserve = Join(at, 1);
    EXPECT_EQ(All<ReserveStorePort>(reserve).size(), 1u) << test::Describe(reserve);
    return Feed(at, StorePortReady{0, port});
  }

  /// Every listed node sends a heartbeat at `at`; returns everything that happened.
  Effects Beat(Duration at, std::vector<int> nodes = {0, 1}) {
    Effects all;
    for (int node : nodes) {
      Effects e = Send(at, ConnOf(node), wire::Heartbeat{});
      all.insert(all.end(), e.begin(), e.end());
    }
    return all;
  }

  /// Heartbeats from `nodes` every second in (from, to]; returns the meaningful effects.
  Effects BeatUntil(Duration from, Duration to, std::vector<int> nodes = {0, 1}) {
    Effects all;
    for (Duration t = from + 1s; t <= to; t += 1s) {
      Effects e = Meaningful(Beat(t, nodes));
      all.insert(all.end(), e.begin(), e.end());
    }
    return all;
  }

  wire::WorkerFailed RankThreeFailed(int round, std::string stderr_tail = "RuntimeError: boom\n",
                                     std::string error_file = "") const {
    return wire::WorkerFailed{round, 3, 1, 1, 0, std::move(stderr_tail), std::move(error_file)};
  }
};

TEST_F(CoordinatorTest, JoinIsAcknowledgedAndLogged) {
  const Effects e = Join(0s, 0);
  ASSERT_EQ(Sent<wire::JoinAck>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(Sent<wire::JoinAck>(e)[0], (std::pair<ConnId, wire::JoinAck>{100, wire::JoinAck{2}}));
  EXPECT_EQ(FindLog(e, "joined"), "node 0 (gpu-01) joined from 10.0.0.1 (1/2)");
  EXPECT_TRUE(All<ReserveStorePort>(e).empty());
  EXPECT_EQ(coordinator_->joined_count(), 1);
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kRendezvous);
}

TEST_F(CoordinatorTest, StartsTheRoundOnlyWhenEveryNodeJoined) {
  EXPECT_TRUE(All<ReserveStorePort>(Join(0s, 1)).empty());
  const Effects e = Join(1s, 0);
  ASSERT_EQ(All<ReserveStorePort>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<ReserveStorePort>(e)[0].round, 0);
  EXPECT_TRUE(Sent<wire::StartRound>(e).empty());
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kStarting);

  // An answer for another round is stale.
  EXPECT_TRUE(Feed(1s, StorePortReady{3, 40000}).empty());

  const Effects started = Feed(1s, StorePortReady{0, 41234});
  const auto starts = Sent<wire::StartRound>(started);
  ASSERT_EQ(starts.size(), 2u) << test::Describe(started);
  // Each node hears the node rank it plays (its own: no spares here).
  EXPECT_EQ(starts[0], (std::pair<ConnId, wire::StartRound>{100, {0, 41234, 0, 0}}));
  EXPECT_EQ(starts[1], (std::pair<ConnId, wire::StartRound>{101, {0, 41234, 0, 1}}));
  EXPECT_EQ(FindLog(started, "round 0"), "round 0: all 2 nodes joined; starting 4 workers");
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kRunning);
}

TEST_F(CoordinatorTest, FixedStorePortNeedsNoReservation) {
  UseJob(Edit(kTwoNodeJob, "nproc_per_node = 2", "nproc_per_node = 2\nstore_port = 29400"));
  Join(0s, 0);
  const Effects e = Join(0s, 1);
  EXPECT_TRUE(All<ReserveStorePort>(e).empty());
  const auto starts = Sent<wire::StartRound>(e);
  ASSERT_EQ(starts.size(), 2u) << test::Describe(e);
  EXPECT_EQ(starts[0].second, (wire::StartRound{0, 29400, 0, 0}));
  EXPECT_EQ(starts[1].second, (wire::StartRound{0, 29400, 0, 1}));
}

TEST_F(CoordinatorTest, OutOfRangeNodeRankIsRejectedWithText) {
  Connect(0s, 7, "10.0.0.9");
  wire::Join join = JoinOf(1);
  join.node_rank = 2;
  join.host = "gpu-03";
  const Effects e = Send(0s, 7, join);
  const std::string reason =
      "node rank 2 (host gpu-03, from 10.0.0.9) is out of range: the job has 2 nodes (ranks 0..1)";
  ASSERT_EQ(Sent<wire::Reject>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(Sent<wire::Reject>(e)[0], (std::pair<ConnId, wire::Reject>{7, {reason}}));
  EXPECT_EQ(FindLog(e, "refused"), "refused a node: " + reason);
  EXPECT_EQ(All<CloseConn>(e).size(), 1u);
  EXPECT_EQ(coordinator_->joined_count(), 0);

  Connect(0s, 8, "10.0.0.8");
  join.node_rank = -1;
  EXPECT_NE(Sent<wire::Reject>(Send(0s, 8, join))[0].second.reason.find("node rank -1"),
            std::string::npos);
}

TEST_F(CoordinatorTest, FingerprintMismatchNamesTheFieldThatDiffers) {
  const JobSpec other = SpecFromToml(Edit(kTwoNodeJob, "nproc_per_node = 2", "nproc_per_node = 4"));
  wire::Join join = JoinOf(1);
  join.canonical = CanonicalForm(other);
  join.fingerprint = Fingerprint(other);
  Connect(0s, ConnOf(1), "10.0.0.2");
  const Effects e = Send(0s, ConnOf(1), join);
  const std::string reason =
      "node 1 (host gpu-02) runs a different job file than node 0:\n"
      "  cluster.nproc_per_node: node 1 has 4, node 0 has 2\n"
      "hint: use the same job file on every node (ddprun check prints its fingerprint)";
  ASSERT_EQ(Sent<wire::Reject>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(Sent<wire::Reject>(e)[0].second.reason, reason);
  EXPECT_EQ(FindLog(e, "refused"), "refused a node: " + reason);
  EXPECT_EQ(All<CloseConn>(e).size(), 1u);
  EXPECT_EQ(coordinator_->joined_count(), 0);
}

TEST_F(CoordinatorTest, DuplicateNodeRankIsRejectedWhileTheFirstIsAlive) {
  Join(0s, 1);
  Connect(1s, 9, "10.0.0.9");
  wire::Join impostor = JoinOf(1, /*instance=*/777);
  impostor.host = "gpu-99";
  const Effects e = Send(1s, 9, impostor);
  ASSERT_EQ(Sent<wire::Reject>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(Sent<wire::Reject>(e)[0].second.reason,
            "node rank 1 is claimed twice: by host gpu-02 (already joined) and by host gpu-99 "
            "from 10.0.0.9\nhint: every node needs its own rank; check --node-rank, "
            "DDPRUN_NODE_RANK or cluster.nodes");
  EXPECT_TRUE(Sent<wire::Reject>(e)[0].second.retry) << "a rebooted host looks the same: it may ask again";
  ASSERT_EQ(All<CloseConn>(e).size(), 1u);
  EXPECT_EQ(All<CloseConn>(e)[0].conn, 9u);
  EXPECT_EQ(coordinator_->joined_count(), 1);
  // The first node is still in: its heartbeat is accepted and nothing is closed.
  EXPECT_TRUE(All<CloseConn>(Beat(2s, {1})).empty());
}

TEST_F(CoordinatorTest, SameInstanceReconnectingIsAccepted) {
  Join(0s, 1);
  Connect(1s, 201, "10.0.0.2");
  const Effects e = Send(1s, 201, JoinOf(1));
  ASSERT_EQ(All<CloseConn>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<CloseConn>(e)[0].conn, ConnOf(1));
  ASSERT_EQ(Sent<wire::JoinAck>(e).size(), 1u);
  EXPECT_EQ(Sent<wire::JoinAck>(e)[0].first, 201u);
  EXPECT_EQ(coordinator_->joined_count(), 1);
}

TEST_F(CoordinatorTest, AReconnectDuringARoundEndsTheRoundAndCountsTheNodeAsStopped) {
  // The agent stopped its workers when it lost us, so the running round cannot finish; the
  // rejoined node has nothing left to stop, so only node 0 must confirm.
  StartFirstRound(0s);
  Connect(2s, 201, "10.0.0.2");
  const Effects e = Send(2s, 201, JoinOf(1));
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kStopping) << test::Describe(e);
  EXPECT_EQ(FindLog(e, "round 0 failed"),
            "round 0 failed: node 1 (gpu-02) was lost: its connection dropped and it reconnected; "
            "stopping every worker on every node");
  EXPECT_EQ(Sent<wire::JoinAck>(e).size(), 1u);
  const Effects stopped = Send(3s, ConnOf(0), wire::RoundStopped{0, 2});
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kBackoff) << test::Describe(stopped);
  EXPECT_EQ(coordinator_->restarts_used(), 1);
}

TEST_F(CoordinatorTest, MessagesBeforeJoinDropThePeer) {
  Connect(0s, 5, "10.0.0.5");
  const Effects e = Send(0s, 5, wire::NodeDone{0});
  EXPECT_EQ(FindLog(e, "dropping"), "dropping 10.0.0.5: sent node-done before joining");
  ASSERT_EQ(All<CloseConn>(e).size(), 1u);
  EXPECT_EQ(All<CloseConn>(e)[0].conn, 5u);
}

TEST_F(CoordinatorTest, ProgressEveryFiveSecondsNamesTheMissingNodes) {
  Join(0s, 0);
  EXPECT_TRUE(Sent<wire::Progress>(BeatUntil(0s, 4s, {0})).empty());
  const Effects at5 = Meaningful(Beat(5s, {0}));
  const auto progress = Sent<wire::Progress>(at5);
  ASSERT_EQ(progress.size(), 1u) << test::Describe(at5);
  EXPECT_EQ(progress[0].first, 100u);
  EXPECT_EQ(progress[0].second, (wire::Progress{1, 2, {1}, 5000, 900'000}));
  EXPECT_TRUE(Sent<wire::Progress>(Beat(9s + 999ms, {0})).empty());
  const auto next = Sent<wire::Progress>(Beat(10s, {0}));
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].second.elapsed_ms, 10'000);
}

TEST_F(CoordinatorTest, RendezvousTimesOutExactlyAtItsDeadline) {
  Join(0s, 0);
  Effects before = BeatUntil(0s, 15min - 1s, {0});
  before = Meaningful(Beat(15min - kNs, {0}));
  EXPECT_TRUE(Sent<wire::JobEnd>(before).empty()) << test::Describe(before);
  EXPECT_EQ(coordinator_->NextDeadline(), At(15min));

  const Effects e = Tick(15min);
  const auto end = Sent<wire::JobEnd>(e);
  ASSERT_EQ(end.size(), 1u) << test::Describe(e);
  EXPECT_EQ(end[0].first, 100u);
  EXPECT_EQ(end[0].second.exit_code, 3);
  EXPECT_EQ(end[0].second.summary,
            "rendezvous failed: 1/2 nodes joined within timeouts.rendezvous = 15m; never joined: "
            "node 1 (gpu-02)\nhint: start `ddprun job.toml` on the missing nodes, and check that "
            "they can reach gpu-01:50000 (the firewall must let TCP port 50000 through)");
  EXPECT_EQ(coordinator_->exit_code(), 3);
  EXPECT_TRUE(All<CoordinatorDone>(e).empty());

  const Effects acked = Send(15min + 1ms, 100, wire::JobEndAck{});
  ASSERT_EQ(All<CoordinatorDone>(acked).size(), 1u) << test::Describe(acked);
  EXPECT_EQ(All<CoordinatorDone>(acked)[0].exit_code, 3);
  // Done, the coordinator only keeps dropping connections that go silent.
  EXPECT_EQ(coordinator_->NextDeadline(), At(15min + 1ms + 6s + kNs));
  const Effects swept = Tick(15min + 1ms + 6s + kNs);
  ASSERT_EQ(All<CloseConn>(swept).size(), 1u) << test::Describe(swept);
  EXPECT_EQ(swept.size(), 1u) << test::Describe(swept);
  EXPECT_EQ(coordinator_->NextDeadline(), std::nullopt);
}

// Issue 12: after refusing a node, or losing one that had joined, the summary said "never
// joined" and hinted to start it. It says what happened; with `nnodes` the hint has the flag.
TEST_F(CoordinatorTest, RendezvousFailureSaysWhatHappenedToEachMissingNode) {
  UseJob(Edit(kTwoNodeJob, "nodes = [\"gpu-01\", \"gpu-02\"]",
              "nodes = [\"gpu-01\", \"gpu-02\", \"gpu-03\"]"));
  Join(0s, 0);
  Connect(1s, ConnOf(1), "10.0.0.2");
  wire::Join other = JoinOf(1);
  other.fingerprint = "different";
  Send(1s, ConnOf(1), other);
  Join(2s, 2);
  Feed(3s, PeerClosed{ConnOf(2), "connection reset by peer"});
  Effects e;
  for (Duration t = 4s; t < 15min; t += 1s) Beat(t, {0});
  e = Tick(15min);
  const auto end = Sent<wire::JobEnd>(e);
  ASSERT_EQ(end.size(), 1u) << test::Describe(e);
  EXPECT_EQ(end[0].second.summary,
            "rendezvous failed: 1/3 nodes joined within timeouts.rendezvous = 15m; refused: node 1 "
            "(gpu-02): it runs a different job file; joined, then left: node 2 (gpu-03): "
            "connection reset by peer\n"
            "hint: the refused nodes printed the reason too; fix it and start them again");
}

TEST_F(CoordinatorTest, WithNnodesTheHintToStartAMissingNodeNamesItsRank) {
  UseJob(Edit(kTwoNodeJob, "nodes = [\"gpu-01\", \"gpu-02\"]",
              "nnodes = 2\nmaster_addr = \"10.0.0.1\""));
  Join(0s, 0);
  for (Duration t = 1s; t < 15min; t += 1s) Beat(t, {0});
  const auto end = Sent<wire::JobEnd>(Tick(15min));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].second.summary,
            "rendezvous failed: 1/2 nodes joined within timeouts.rendezvous = 15m; never joined: "
            "node 1\nhint: start `ddprun job.toml --node-rank N` on the missing nodes, "
            "and check that they can reach 10.0.0.1:50000 (the firewall must let TCP port 50000 "
            "through)");
}

TEST_F(CoordinatorTest, RendezvousTimeoutWithNobodyJoinedEndsAtOnce) {
  const Effects e = Tick(15min);
  EXPECT_EQ(coordinator_->exit_code(), 3);
  ASSERT_EQ(All<CoordinatorDone>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<CoordinatorDone>(e)[0].exit_code, 3);
}

TEST_F(CoordinatorTest, WorkerFailureStopsTheRoundAndRestartsAfterExactlyTheBackoff) {
  StartFirstRound(0s);
  const Effects failed = Send(1s, ConnOf(1), RankThreeFailed(0));
  const std::string what = "rank 3 (node 1 (gpu-02), local rank 1) exited with code 1";
  EXPECT_EQ(FindLog(failed, "round 0 failed"),
            "round 0 failed: " + what + "; stopping every worker on every node");
  const auto stops = Sent<wire::StopRound>(failed);
  ASSERT_EQ(stops.size(), 2u) << test::Describe(failed);
  // Every node hears the root cause with the failing rank's stderr, also when a restart follows.
  const std::string cause = what + "\n  last lines of its stderr:\n    | RuntimeError: boom\n";
  // With the cause's rank, so that each node's console can collapse the other ranks' errors.
  EXPECT_EQ(stops[0], (std::pair<ConnId, wire::StopRound>{100, {0, cause, false, 3}}));
  EXPECT_EQ(stops[1], (std::pair<ConnId, wire::StopRound>{101, {0, cause, false, 3}}));
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kStopping);

  // A second failure of the same round is a consequence, not news.
  EXPECT_TRUE(Meaningful(Send(1s, ConnOf(0), wire::WorkerFailed{0, 0, 0, 1, 0, "", ""})).empty());

  EXPECT_TRUE(Meaningful(Send(2s, ConnOf(1), wire::RoundStopped{0, 1})).empty());
  const Effects stopped = Send(3s, ConnOf(0), wire::RoundStopped{0, 2});
  EXPECT_EQ(FindLog(stopped, "restart"),
            "all workers stopped (3 stopped by ddprun); restart 1 of 1 in 10s");
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kBackoff);
  EXPECT_EQ(coordinator_->restarts_used(), 1);
  EXPECT_EQ(coordinator_->round(), 1);

  BeatUntil(3s, 12s);
  EXPECT_TRUE(All<ReserveStorePort>(Beat(13s - kNs)).empty());
  const Effects restart = Tick(13s);
  ASSERT_EQ(All<ReserveStorePort>(restart).size(), 1u) << test::Describe(restart);
  EXPECT_EQ(All<ReserveStorePort>(restart)[0].round, 1);
  const auto starts = Sent<wire::StartRound>(Feed(13s, StorePortReady{1, 41001}));
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0].second, (wire::StartRound{1, 41001, 0, 0}));

  // Late messages of round 0 change nothing.
  EXPECT_TRUE(Meaningful(Send(14s, ConnOf(0), RankThreeFailed(0))).empty());
  EXPECT_TRUE(Meaningful(Send(14s, ConnOf(0), wire::NodeDone{0})).empty());
  EXPECT_TRUE(Meaningful(Send(14s, ConnOf(1), wire::RoundStopped{0, 1})).empty());
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kRunning);
  EXPECT_EQ(coordinator_->round(), 1);

  // The job's summary still names the restarted round's root cause.
  Send(15s, ConnOf(1), wire::NodeDone{1});
  const auto end = Sent<wire::JobEnd>(Send(15s, ConnOf(0), wire::NodeDone{1}));
  ASSERT_EQ(end.size(), 2u);
  EXPECT_EQ(end[0].second.summary,
            "job \"demo\" succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)\n"
            "earlier rounds' root causes:\n"
            "  round 0: rank 3 (node 1 (gpu-02), local rank 1) exited with code 1 (RuntimeError)");
}

TEST_F(CoordinatorTest, SecondConfirmationOfTheSameRoundDoesNotChangeTheCount) {
  UseJob(Edit(kTwoNodeJob, "max_restarts = 1", "max_restarts = 0"));
  StartFirstRound(0s);
  Send(1s, ConnOf(1), RankThreeFailed(0));
  Send(1s, ConnOf(1), wire::RoundStopped{0, 1});  // node 1 stopped its other worker itself
  Send(1s, ConnOf(1), wire::RoundStopped{0, 0});  // ... and answers the StopRound that crossed
  const auto end = Sent<wire::JobEnd>(Send(2s, ConnOf(0), wire::RoundStopped{0, 2}));
  ASSERT_EQ(end.size(), 2u);
  EXPECT_NE(end[0].second.summary.find("ddprun then stopped 3 other running ranks on 2 nodes."),
            std::string::npos)
      << end[0].second.summary;
}

// The first failure only lost a peer (gloo's "Connection closed by peer"); rank 3, stopped a
// moment later, had written its own error first. The root cause becomes rank 3 and every node
// hears it again. A later failure that also only lost a peer changes nothing.
TEST_F(CoordinatorTest, AFailureThatOnlyLostAPeerGivesWayToOneThatRaisedOnItsOwn) {
  StartFirstRound(0s);
  const wire::WorkerFailed lost{0, 2, 0, 1, 0, "RuntimeError: [gloo] Connection closed by peer\n", ""};
  const Effects first = Send(1s, ConnOf(1), lost);
  ASSERT_EQ(Sent<wire::StopRound>(first).size(), 2u) << test::Describe(first);
  EXPECT_EQ(Sent<wire::StopRound>(first)[0].second.cause.rfind("rank 2 (node 1 (gpu-02), local rank 0)", 0), 0u);

  const wire::WorkerFailed also_lost{0, 0, 0, 1, 0, "", "ncclRemoteError: remote process exited or there was a network error"};
  EXPECT_TRUE(Meaningful(Send(1s, ConnOf(0), also_lost)).empty());

  const Effects revised = Send(2s, ConnOf(1), RankThreeFailed(0, "", "RuntimeError: rank 3 fails on purpose\n"));
  EXPECT_EQ(FindLog(revised, "the root cause is"),
            "round 0: the root cause is rank 3 (node 1 (gpu-02), local rank 1) exited with code 1; "
            "rank 2 (node 1 (gpu-02), local rank 0) exited with code 1 failed first, but its error "
            "says only that it lost a peer");
  const auto stops = Sent<wire::StopRound>(revised);
  ASSERT_EQ(stops.size(), 2u) << test::Describe(revised);
  EXPECT_EQ(stops[0].second.cause_rank, 3);
  EXPECT_EQ(Sent<wire::StopRound>(first)[0].second.cause_rank, 2);
  EXPECT_EQ(stops[0].second.cause,
            "rank 3 (node 1 (gpu-02), local rank 1) exited with code 1\n"
            "  error (from TORCHELASTIC_ERROR_FILE):\n"
            "    | RuntimeError: rank 3 fails on purpose\n"
            "  (rank 2 failed before it, with an error that says it lost a peer: a consequence, not "
            "the cause)\n");
  // Once revised, it stays: a third failure is not news.
  EXPECT_TRUE(Meaningful(Send(2s, ConnOf(0), wire::WorkerFailed{0, 1, 1, 1, 0, "", "ValueError: x\n"})).empty());
}

// An error file written because of the stop itself (Lightning turns SIGTERM into a
// SignalException) is not a cause: the first failure stays.
TEST_F(CoordinatorTest, AnErrorThatIsTheStopItselfRevisesNothing) {
  StartFirstRound(0s);
  Send(1s, ConnOf(1), wire::WorkerFailed{0, 2, 0, 1, 0, "RuntimeError: [gloo] Connection closed by peer\n", ""});
  const Effects later = Send(2s, ConnOf(0), wire::WorkerFailed{0, 0, 0, 1, 0, "",
                                                               "lightning.fabric.utilities.exceptions."
                                                               "SignalException: Process 12 got signal: 15"});
  EXPECT_TRUE(Meaningful(later).empty()) << test::Describe(later);
}

TEST_F(CoordinatorTest, AFirstFailureOfItsOwnIsNeverRevised) {
  StartFirstRound(0s);
  Send(1s, ConnOf(1), RankThreeFailed(0));
  const Effects later = Send(1s, ConnOf(0), wire::WorkerFailed{0, 0, 0, 1, 0, "", "ValueError: x\n"});
  EXPECT_TRUE(Meaningful(later).empty()) << test::Describe(later);
}

TEST_F(CoordinatorTest, ExhaustedBudgetEndsTheJobWithTheRootCause) {
  StartFirstRound(0s);
  Send(1s, ConnOf(1), RankThreeFailed(0));
  Send(2s, ConnOf(0), wire::RoundStopped{0, 2});
  Send(2s, ConnOf(1), wire::RoundStopped{0, 1});
  BeatUntil(2s, 12s);
  Tick(12s);
  Feed(12s, StorePortReady{1, 41001});
  BeatUntil(12s, 19s);

  const Effects failed = Send(20s, ConnOf(1),
                              wire::WorkerFailed{1, 2, 0, 0, SIGSEGV, "", ""});
  EXPECT_TRUE(Sent<wire::JobEnd>(failed).empty());
  Send(21s, ConnOf(1), wire::RoundStopped{1, 1});
  const Effects ended = Send(22s, ConnOf(0), wire::RoundStopped{1, 2});
  const auto end = Sent<wire::JobEnd>(ended);
  ASSERT_EQ(end.size(), 2u) << test::Describe(ended);
  EXPECT_EQ(end[0].second, end[1].second);
  EXPECT_EQ(end[0].second.exit_code, 1);
  EXPECT_EQ(end[0].second.summary,
            "job \"demo\" FAILED in round 1 after using all 1 restart\n"
            "root cause (first failure anywhere in the job): rank 2 (node 1 (gpu-02), local rank 0) "
            "was killed by signal 11 (SIGSEGV)\n"
            "  kind: signal:SIGSEGV\n"
            "  (it wrote nothing to stderr)\n"
            "ddprun then stopped 3 other running ranks on 2 nodes.\n"
            "earlier rounds' root causes:\n"
            "  round 0: rank 3 (node 1 (gpu-02), local rank 1) exited with code 1 (RuntimeError)\n"
            "logs: logs/demo/latest-n1/attempt-1/rank-2.log on node 1 (gpu-02), in its job file's folder; each node keeps its "
            "own runs under logs/demo/latest-n<node>");
  EXPECT_EQ(coordinator_->exit_code(), 1);
}

class CoordinatorNoRestartTest : public CoordinatorTest {
 protected:
  void SetUp() override { UseJob(Edit(kTwoNodeJob, "max_restarts = 1", "max_restarts = 0")); }

  std::string SummaryAfter(wire::WorkerFailed failure) {
    StartFirstRound(0s);
    Send(1s, ConnOf(1), std::move(failure));
    Send(2s, ConnOf(0), wire::RoundStopped{0, 2});
    const auto end = Sent<wire::JobEnd>(Send(2s, ConnOf(1), wire::RoundStopped{0, 1}));
    EXPECT_EQ(end.size(), 2u);
    if (end.empty()) return {};
    EXPECT_EQ(end[0].second.exit_code, 1);
    return end[0].second.summary;
  }
};

TEST_F(CoordinatorNoRestartTest, SummaryShowsStderrTailAndTheNcclHint) {
  EXPECT_EQ(SummaryAfter(RankThreeFailed(
                0, "gpu-02:1:1 [1] NCCL WARN Net : Connection closed by remote peer\n"
                   "RuntimeError: NCCL communicator was aborted\n")),
            "job \"demo\" FAILED in round 0 (restart.max_restarts = 0)\n"
            "root cause (first failure anywhere in the job): rank 3 (node 1 (gpu-02), local rank "
            "1) exited with code 1\n"
            "  kind: RuntimeError, nccl, lost-peer, exit:1\n"
            "  last lines of its stderr:\n"
            "    | gpu-02:1:1 [1] NCCL WARN Net : Connection closed by remote peer\n"
            "    | RuntimeError: NCCL communicator was aborted\n"
            "ddprun then stopped 3 other running ranks on 2 nodes.\n"
            "hint: the error mentions NCCL; rerun with NCCL_DEBUG=INFO in job.env to see why.\n"
            "logs: logs/demo/latest-n1/attempt-0/rank-3.log on node 1 (gpu-02), in its job file's folder; each node keeps its "
            "own runs under logs/demo/latest-n<node>");
}

TEST_F(CoordinatorNoRestartTest, SummaryShowsTheErrorFileBeforeTheStderrAndNoHintWithoutNccl) {
  EXPECT_EQ(SummaryAfter(RankThreeFailed(0, "Traceback (most recent call last):\nValueError: x\n",
                                         "{\"message\": \"ValueError: x\"}")),
            "job \"demo\" FAILED in round 0 (restart.max_restarts = 0)\n"
            "root cause (first failure anywhere in the job): rank 3 (node 1 (gpu-02), local rank "
            "1) exited with code 1\n"
            "  kind: ValueError, exit:1\n"
            "  error (from TORCHELASTIC_ERROR_FILE):\n"
            "    | {\"message\": \"ValueError: x\"}\n"
            "  last lines of its stderr:\n"
            "    | Traceback (most recent call last):\n"
            "    | ValueError: x\n"
            "ddprun then stopped 3 other running ranks on 2 nodes.\n"
            "logs: logs/demo/latest-n1/attempt-0/rank-3.log on node 1 (gpu-02), in its job file's folder; each node keeps its "
            "own runs under logs/demo/latest-n<node>");
}

// Issue 12: the traceback was printed twice, from the error file and again from stderr.
TEST_F(CoordinatorNoRestartTest, TheTracebackInTheErrorFileIsNotRepeatedFromStderr) {
  const std::string traceback =
      "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
      "    main()\nValueError: bad lr\n";
  EXPECT_EQ(SummaryAfter(RankThreeFailed(0, "loading data\n" + traceback, traceback)),
            "job \"demo\" FAILED in round 0 (restart.max_restarts = 0)\n"
            "root cause (first failure anywhere in the job): rank 3 (node 1 (gpu-02), local rank "
            "1) exited with code 1\n"
            "  kind: ValueError, exit:1\n"
            "  error (from TORCHELASTIC_ERROR_FILE):\n"
            "    | Traceback (most recent call last):\n"
            "    |   File \"train.py\", line 3, in <module>\n"
            "    |     main()\n"
            "    | ValueError: bad lr\n"
            "  last lines of its stderr (without the traceback shown above):\n"
            "    | loading data\n"
            "ddprun then stopped 3 other running ranks on 2 nodes.\n"
            "logs: logs/demo/latest-n1/attempt-0/rank-3.log on node 1 (gpu-02), in its job file's folder; each node keeps its "
            "own runs under logs/demo/latest-n<node>");
  // Only the traceback on stderr: no stderr section at all.
  UseJob(Edit(kTwoNodeJob, "max_restarts = 1", "max_restarts = 0"));
  const std::string summary = SummaryAfter(RankThreeFailed(0, traceback, traceback));
  EXPECT_EQ(summary.find("last lines of its stderr"), std::string::npos) << summary;
}

// Issue 11: "stopped 2 other running ranks on 2 nodes" when only one node had ranks to stop.
TEST_F(CoordinatorNoRestartTest, TheSummaryCountsOnlyTheNodesThatHadRanksToStop) {
  StartFirstRound(0s);
  Send(1s, ConnOf(1), RankThreeFailed(0));
  Send(2s, ConnOf(1), wire::RoundStopped{0, 1});
  const auto end = Sent<wire::JobEnd>(Send(2s, ConnOf(0), wire::RoundStopped{0, 0}));
  ASSERT_EQ(end.size(), 2u);
  EXPECT_NE(end[0].second.summary.find("ddprun then stopped 1 other running rank on 1 node.\n"),
            std::string::npos)
      << end[0].second.summary;
}

// The last round's StopRound says so: the agents then log its first line only, since the job's
// summary repeats the cause with its traceback.
TEST_F(CoordinatorNoRestartTest, TheLastRoundsStopSaysNoRestartFollows) {
  StartFirstRound(0s);
  const auto stops = Sent<wire::StopRound>(Send(1s, ConnOf(1), RankThreeFailed(0)));
  ASSERT_EQ(stops.size(), 2u);
  EXPECT_TRUE(stops[0].second.last);
}

TEST_F(CoordinatorNoRestartTest, NcclInTheErrorFileAloneGivesTheHint) {
  const std::string summary = SummaryAfter(RankThreeFailed(0, "", "NCCL error: unhandled system error"));
  EXPECT_NE(summary.find("hint: the error mentions NCCL"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("last lines of its stderr"), std::string::npos) << summary;
}

TEST_F(CoordinatorNoRestartTest, AdviceThatOnlyNamesNcclGivesNoHint) {
  const std::string summary = SummaryAfter(RankThreeFailed(
      0, "fix: open TCP ports on node 1 for node 0: NCCL's socket transport connects between all nodes\n"));
  EXPECT_EQ(summary.find("hint: the error mentions NCCL"), std::string::npos) << summary;
}

TEST_F(CoordinatorTest, EveryNodeDoneEndsTheJobWithZeroAfterTheExitBarrier) {
  StartFirstRound(0s);
  EXPECT_TRUE(Meaningful(Send(5s, ConnOf(1), wire::NodeDone{0})).empty());
  const Effects e = Send(6s, ConnOf(0), wire::NodeDone{0});
  const auto end = Sent<wire::JobEnd>(e);
  ASSERT_EQ(end.size(), 2u) << test::Describe(e);
  EXPECT_EQ(end[0].second,
            (wire::JobEnd{0, "job \"demo\" succeeded: all 4 ranks on 2 nodes exited 0 in round 0 "
                             "(0 restarts used)"}));
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kEnding);
  EXPECT_TRUE(All<CoordinatorDone>(e).empty());
  EXPECT_TRUE(All<CoordinatorDone>(Send(7s, ConnOf(1), wire::JobEndAck{})).empty());
  const Effects done = Send(7s, ConnOf(0), wire::JobEndAck{});
  ASSERT_EQ(All<CoordinatorDone>(done).size(), 1u);
  EXPECT_EQ(All<CoordinatorDone>(done)[0].exit_code, 0);
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kDone);
  // No heartbeats after the end; connections the agents leave open are dropped once silent.
  const Effects after = Tick(1h);
  EXPECT_EQ(All<CloseConn>(after).size(), 2u) << test::Describe(after);
  EXPECT_EQ(after.size(), 2u) << test::Describe(after);
}

TEST_F(CoordinatorTest, ExitBarrierEndsAtItsDeadlineWithoutEveryAck) {
  StartFirstRound(0s);
  Send(5s, ConnOf(1), wire::NodeDone{0});
  Send(5s, ConnOf(0), wire::NodeDone{0});
  Send(5s, ConnOf(0), wire::JobEndAck{});
  // The exit barrier: loss bound (3 heartbeats) 6s + stop_grace 30s + 5s, from the end at 5s.
  const Effects before = BeatUntil(5s, 45s);
  EXPECT_TRUE(All<CoordinatorDone>(before).empty()) << test::Describe(before);
  EXPECT_TRUE(All<CoordinatorDone>(Beat(46s - kNs)).empty());
  const Effects e = Tick(46s);
  EXPECT_EQ(FindLog(e, "exit barrier"), "exit barrier expired before every node confirmed");
  ASSERT_EQ(All<CoordinatorDone>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<CoordinatorDone>(e)[0].exit_code, 0);
}

TEST_F(CoordinatorTest, ExitBarrierCountsANodeThatLeftAsDone) {
  StartFirstRound(0s);
  Send(5s, ConnOf(1), wire::NodeDone{0});
  Send(5s, ConnOf(0), wire::NodeDone{0});
  Send(5s, ConnOf(0), wire::JobEndAck{});
  const Effects e = Feed(6s, PeerClosed{ConnOf(1), ""});
  ASSERT_EQ(All<CoordinatorDone>(e).size(), 1u) << test::Describe(e);
}

TEST_F(CoordinatorTest, InterruptEndsTheJobWith128PlusTheSignal) {
  StartFirstRound(0s);
  const Effects e = Send(3s, ConnOf(1), wire::Interrupted{SIGINT});
  const auto end = Sent<wire::JobEnd>(e);
  ASSERT_EQ(end.size(), 2u) << test::Describe(e);
  EXPECT_EQ(end[0].second,
            (wire::JobEnd{130, "job \"demo\" interrupted: node 1 (gpu-02) received SIGINT; every "
                               "node stops its workers (SIGTERM, SIGKILL after stop_grace = 30s) "
                               "before it exits"}));
  EXPECT_EQ(coordinator_->exit_code(), 130);
  // A second interrupt while ending does not change the outcome.
  EXPECT_TRUE(Sent<wire::JobEnd>(Send(3s, ConnOf(0), wire::Interrupted{SIGTERM})).empty());
}

TEST_F(CoordinatorTest, JoinWhileEndingByANodeThatNeverTookPartIsRefused) {
  Join(0s, 0);
  BeatUntil(0s, 15min, {0});  // the rendezvous timed out; node 0 has not acked yet
  ASSERT_EQ(coordinator_->phase(), Coordinator::Phase::kEnding);
  Connect(15min + 1s, ConnOf(1), "10.0.0.2");
  const Effects e = Send(15min + 1s, ConnOf(1), JoinOf(1));
  EXPECT_TRUE(Sent<wire::JoinAck>(e).empty()) << test::Describe(e);
  EXPECT_TRUE(Sent<wire::JobEnd>(e).empty()) << test::Describe(e);
  ASSERT_EQ(Sent<wire::Reject>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(Sent<wire::Reject>(e)[0].second.reason, "node 1 (host gpu-02) joined after the job ended");
}

// Found by the swarm (issue 10): node 0 paused past the loss bound, the others lost it, and the
// finished coordinator ignored them when they rejoined, so they looped forever. A node away at
// the end is waited for, and a node that rejoins after the end still hears the verdict.
TEST_F(CoordinatorTest, NodeAwayAtTheEndIsWaitedForAndHearsTheVerdictAfterIt) {
  UseJob(Edit(kTwoNodeJob, "max_restarts = 1", "max_restarts = 0"));
  StartFirstRound(0s);
  Feed(1s, PeerClosed{ConnOf(1), "connection reset by peer"});  // round 0 fails; budget is 0
  const Effects ended = Send(2s, ConnOf(0), wire::RoundStopped{0, 2});
  ASSERT_EQ(Sent<wire::JobEnd>(ended).size(), 1u) << test::Describe(ended);
  EXPECT_EQ(Sent<wire::JobEnd>(ended)[0].second.exit_code, 1);
  EXPECT_TRUE(All<CoordinatorDone>(Send(2s, ConnOf(0), wire::JobEndAck{})).empty())
      << "node 1 joined once and is away: it may rejoin to hear the verdict";
  Connect(10s, 201, "10.0.0.2");
  const Effects rejoined = Send(10s, 201, JoinOf(1));
  ASSERT_EQ(Sent<wire::JobEnd>(rejoined).size(), 1u) << test::Describe(rejoined);
  EXPECT_EQ(Sent<wire::JobEnd>(rejoined)[0].second.exit_code, 1);
  const Effects done = Send(10s, 201, wire::JobEndAck{});
  ASSERT_EQ(All<CoordinatorDone>(done).size(), 1u) << test::Describe(done);
  EXPECT_EQ(All<CoordinatorDone>(done)[0].exit_code, 1);

  // Done, and node 1 comes back once more (its ack was lost): it still hears the verdict.
  Connect(20s, 202, "10.0.0.2");
  const Effects late = Send(20s, 202, JoinOf(1));
  ASSERT_EQ(Sent<wire::JobEnd>(late).size(), 1u) << test::Describe(late);
  EXPECT_EQ(Sent<wire::JobEnd>(late)[0].second.exit_code, 1);
  // A different agent for the rank did not take part: it is refused, and exits 3.
  Connect(21s, 203, "10.0.0.9");
  const Effects other = Send(21s, 203, JoinOf(1, /*instance=*/77));
  EXPECT_TRUE(Sent<wire::JobEnd>(other).empty()) << test::Describe(other);
  ASSERT_EQ(Sent<wire::Reject>(other).size(), 1u) << test::Describe(other);
  EXPECT_EQ(Sent<wire::Reject>(other)[0].second.reason,
            "node 1 (host gpu-02) joined after the job ended");
}

// The wait is said rounded up: joined half a second later than below, 35.5 s are left.
TEST_F(CoordinatorTest, TheFenceWaitIsSaidRoundedUp) {
  StartFirstRound(0s);
  Feed(1s, PeerClosed{ConnOf(1), "connection reset by peer"});
  Send(2s, ConnOf(0), wire::RoundStopped{0, 2});
  BeatUntil(2s, 13s, {0});
  Connect(13s + 500ms, 201, "10.0.0.9");
  const Effects joined = Send(13s + 500ms, 201, JoinOf(1, /*instance=*/77));
  EXPECT_EQ(FindLog(joined, "waiting"),
            "round 1: all 2 nodes joined; waiting 36s before starting it: node 1 (gpu-02) was "
            "lost while its workers ran and a different agent now holds its rank, so the old "
            "workers may still run until their agent's lease ends (loss bound + stop_grace + "
            "SIGKILL)");
}

// Found by the swarm (issue 10): a node lost while its workers ran keeps its rank until its
// lease has run out, so a different agent taking the rank cannot overlap the old workers.
TEST_F(CoordinatorTest, RankOfALostNodeIsFencedUntilItsLeaseEndsForADifferentAgent) {
  StartFirstRound(0s);
  Feed(1s, PeerClosed{ConnOf(1), "connection reset by peer"});
  Send(2s, ConnOf(0), wire::RoundStopped{0, 2});
  BeatUntil(2s, 12s, {0});  // backoff 10s
  ASSERT_EQ(coordinator_->phase(), Coordinator::Phase::kRendezvous);
  Connect(13s, 201, "10.0.0.9");
  const Effects joined = Send(13s, 201, JoinOf(1, /*instance=*/77));
  EXPECT_TRUE(All<ReserveStorePort>(joined).empty()) << test::Describe(joined);
  // Lost at 1s; lease = 3 heartbeats 6s + 1 heartbeat 2s + stop_grace 30s + kill allowance 10s.
  EXPECT_EQ(FindLog(joined, "waiting"),
            "round 1: all 2 nodes joined; waiting 36s before starting it: node 1 (gpu-02) was "
            "lost while its workers ran and a different agent now holds its rank, so the old "
            "workers may still run until their agent's lease ends (loss bound + stop_grace + "
            "SIGKILL)");
  Effects quiet;
  for (Duration t = 14s; t < 49s; t += 1s) {
    Send(t, ConnOf(0), wire::Heartbeat{});
    const Effects e = Meaningful(Send(t, 201, wire::Heartbeat{}));
    quiet.insert(quiet.end(), e.begin(), e.end());
  }
  EXPECT_TRUE(quiet.empty()) << test::Describe(quiet);
  EXPECT_EQ(coordinator_->NextDeadline(), At(49s));
  const Effects start = Tick(49s);
  ASSERT_EQ(All<ReserveStorePort>(start).size(), 1u) << test::Describe(start);
  EXPECT_EQ(All<ReserveStorePort>(start)[0].round, 1);
}

// Found by the swarm (seed 610917 of bench/swarm-hangs.toml): the fence belongs to the agent it
// fences. A second agent that took the rank, lost its connection and joined again (with the same
// instance) was taken for the fenced agent rejoining, which lifted the fence while the old
// agent's hung worker still ran. Only the fenced agent itself lifts it, by rejoining.
TEST_F(CoordinatorTest, AFenceHoldsWhenTheNewHolderOfTheRankJoinsAgain) {
  StartFirstRound(0s);
  Feed(1s, PeerClosed{ConnOf(1), "connection reset by peer"});
  Send(2s, ConnOf(0), wire::RoundStopped{0, 2});
  BeatUntil(2s, 12s, {0});  // backoff 10s
  Connect(13s, 201, "10.0.0.9");
  Send(13s, 201, JoinOf(1, /*instance=*/77));
  Feed(14s, PeerClosed{201, "connection reset by peer"});
  Send(14s, ConnOf(0), wire::Heartbeat{});
  Connect(15s, 202, "10.0.0.9");
  const Effects again = Send(15s, 202, JoinOf(1, /*instance=*/77));
  EXPECT_TRUE(All<ReserveStorePort>(again).empty()) << test::Describe(again);
  Effects quiet;
  for (Duration t = 16s; t < 49s; t += 1s) {
    Send(t, ConnOf(0), wire::Heartbeat{});
    const Effects e = Meaningful(Send(t, 202, wire::Heartbeat{}));
    quiet.insert(quiet.end(), e.begin(), e.end());
  }
  EXPECT_TRUE(quiet.empty()) << test::Describe(quiet);
  // Lost at 1s: the lease of its workers ends at 1s + 48s.
  EXPECT_EQ(coordinator_->NextDeadline(), At(49s));
  const Effects start = Tick(49s);
  ASSERT_EQ(All<ReserveStorePort>(start).size(), 1u) << test::Describe(start);
}

// ... and the fenced agent rejoining lifts it at once: agents rejoin only once their workers
// are gone, even after a different agent held the rank meanwhile.
TEST_F(CoordinatorTest, TheFencedAgentRejoiningLiftsItsFence) {
  StartFirstRound(0s);
  Feed(1s, PeerClosed{ConnOf(1), "connection reset by peer"});
  Send(2s, ConnOf(0), wire::RoundStopped{0, 2});
  BeatUntil(2s, 12s, {0});
  Connect(13s, 201, "10.0.0.9");
  Send(13s, 201, JoinOf(1, /*instance=*/77));
  Feed(14s, PeerClosed{201, "connection reset by peer"});
  Send(14s, ConnOf(0), wire::Heartbeat{});
  Connect(15s, 202, "10.0.0.2");
  const Effects back = Send(15s, 202, JoinOf(1));  // node 1's own agent, instance 1001
  ASSERT_EQ(All<ReserveStorePort>(back).size(), 1u) << test::Describe(back);
  EXPECT_EQ(All<ReserveStorePort>(back)[0].round, 1);
}

// The job's record: the round is committed before its store port is even reserved, "workers
// may run" is refreshed every heartbeat, and "every worker stopped" comes only once every node
// confirmed.
TEST_F(CoordinatorTest, TheRecordSaysWorkersMayRunEveryHeartbeatUntilEveryNodeConfirmedTheEnd) {
  Join(0s, 0);
  const Effects waiting = Tick(2s);
  EXPECT_TRUE(All<RecordWorkers>(waiting).empty());  // no round yet: nothing may run
  EXPECT_TRUE(All<CommitRound>(waiting).empty());
  const Effects all_in = Join(2s, 1);
  ASSERT_EQ(All<CommitRound>(all_in).size(), 1u) << test::Describe(all_in);
  EXPECT_EQ(All<CommitRound>(all_in)[0].round, 0);
  ASSERT_EQ(All<ReserveStorePort>(all_in).size(), 1u) << test::Describe(all_in);
  const Effects start = Feed(2s, StorePortReady{0, 41000});
  EXPECT_TRUE(All<RecordWorkers>(start).empty()) << test::Describe(start);  // the commit said so
  const Effects beat = Beat(4s);
  ASSERT_EQ(All<RecordWorkers>(beat).size(), 1u) << test::Describe(beat);
  EXPECT_TRUE(All<RecordWorkers>(beat)[0].rounds_may_run);
  Send(5s, ConnOf(1), wire::NodeDone{0});
  Send(5s, ConnOf(0), wire::NodeDone{0});
  Send(5s, ConnOf(1), wire::JobEndAck{});
  const Effects done = Send(5s, ConnOf(0), wire::JobEndAck{});
  ASSERT_EQ(All<RecordWorkers>(done).size(), 1u) << test::Describe(done);
  EXPECT_FALSE(All<RecordWorkers>(done)[0].rounds_may_run);
  ASSERT_EQ(All<CoordinatorDone>(done).size(), 1u);
}

TEST_F(CoordinatorTest, AnExpiredExitBarrierLeavesTheJournalSayingWorkersMayRun) {
  StartFirstRound(0s);
  Send(5s, ConnOf(1), wire::NodeDone{0});
  Send(5s, ConnOf(0), wire::NodeDone{0});
  Send(5s, ConnOf(0), wire::JobEndAck{});  // node 1 never confirms
  BeatUntil(5s, 45s);
  const Effects e = Tick(46s);
  ASSERT_EQ(All<CoordinatorDone>(e).size(), 1u) << test::Describe(e);
  for (const RecordWorkers& record : All<RecordWorkers>(e)) EXPECT_TRUE(record.rounds_may_run);
}

// A coordinator started again on node 0's host after a crash: the journal's last record was
// 10s ago, so the first round waits for the lease of that record (48s) to end, at 38s.
TEST_F(CoordinatorTest, AfterAnUncleanEndTheFirstRoundWaitsUntilTheLeaseOfTheLastRecordEnds) {
  Effects resumed;
  coordinator_->AfterUncleanEnd(At(0s), 10s, resumed);
  EXPECT_EQ(FindLog(resumed, "previous coordinator"),
            "the previous coordinator of this job on this host did not end it (10s ago it "
            "recorded that workers may run): the first round waits until 48s after that record");
  Join(1s, 0);
  const Effects joined = Join(1s, 1);
  EXPECT_TRUE(All<ReserveStorePort>(joined).empty()) << test::Describe(joined);
  EXPECT_EQ(FindLog(joined, "waiting"),
            "round 0: all 2 nodes joined; waiting 37s before starting it: the previous "
            "coordinator of this job on this host ended without ending the job (its host crashed "
            "or its process was killed), so workers of its rounds may still run until their "
            "agents' lease ends (loss bound + stop_grace + SIGKILL after its last record)");
  const Effects quiet = BeatUntil(1s, 37s);
  EXPECT_TRUE(All<ReserveStorePort>(quiet).empty()) << test::Describe(quiet);
  EXPECT_EQ(coordinator_->NextDeadline(), At(38s));
  const Effects start = Tick(38s);
  ASSERT_EQ(All<ReserveStorePort>(start).size(), 1u) << test::Describe(start);
}

// The journal is read once, before the first round: a driver that calls it later is broken.
TEST_F(CoordinatorTest, AfterUncleanEndOnceARoundRanAborts) {
  StartFirstRound(0s);
  Effects out;
  EXPECT_DEATH(coordinator_->AfterUncleanEnd(At(1s), 1s, out),
               "assertion failed: phase\\(\\) == Phase::kRendezvous && round_ == 0");
}

TEST_F(CoordinatorTest, AJournalRecordOlderThanTheLeaseDelaysNothing) {
  Effects resumed;
  coordinator_->AfterUncleanEnd(At(0s), 48s, resumed);
  EXPECT_TRUE(resumed.empty()) << test::Describe(resumed);
  Join(1s, 0);
  EXPECT_EQ(All<ReserveStorePort>(Join(1s, 1)).size(), 1u);
}

// Node 0's own process stalled (SIGSTOP, a VM pause): every peer looks silent, but the silence
// is its own. The round fails with that as its cause, and no node is dropped for it.
TEST_F(CoordinatorTest, OwnStallIsTheRootCauseNotTheSilentPeers) {
  StartFirstRound(0s);
  Beat(1s);
  EXPECT_EQ(coordinator_->NextDeadline(), At(2s));
  const Effects e = Tick(9s);  // nothing ran for 8 s
  EXPECT_TRUE(All<CloseConn>(e).empty()) << test::Describe(e);
  const auto stops = Sent<wire::StopRound>(e);
  ASSERT_EQ(stops.size(), 2u) << test::Describe(e);
  EXPECT_EQ(stops[0].second.cause,
            "node 0 (gpu-01) stalled for 8.0s: its agent and the coordinator did not run (the "
            "process was stopped or paused: SIGSTOP, a VM pause, swapping, a stuck file "
            "system), so every other node lost the coordinator\n"
            "  the other nodes stop their workers when they lose the coordinator\n");
}

TEST_F(CoordinatorTest, ClosedConnectionDuringARoundLosesTheNode) {
  StartFirstRound(0s);
  const Effects e = Feed(4s, PeerClosed{ConnOf(1), "connection reset by peer"});
  EXPECT_EQ(FindLog(e, "round 0 failed"),
            "round 0 failed: node 1 (gpu-02) was lost: connection reset by peer; stopping every "
            "worker on every node");
  const auto stops = Sent<wire::StopRound>(e);
  ASSERT_EQ(stops.size(), 1u) << test::Describe(e);
  EXPECT_EQ(stops[0].first, 100u);
  EXPECT_EQ(coordinator_->joined_count(), 1);

  const Effects stopped = Send(5s, ConnOf(0), wire::RoundStopped{0, 2});
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kBackoff);
  // After the backoff the coordinator waits for the lost node again, with a fresh timeout.
  BeatUntil(5s, 14s, {0});
  Tick(15s);
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kRendezvous);
  Connect(16s, ConnOf(1), "10.0.0.2");
  const Effects rejoined = Send(16s, ConnOf(1), JoinOf(1));
  ASSERT_EQ(All<ReserveStorePort>(rejoined).size(), 1u) << test::Describe(rejoined);
  EXPECT_EQ(All<ReserveStorePort>(rejoined)[0].round, 1);
}

TEST_F(CoordinatorTest, NodeLeavingDuringRendezvousIsOnlyAWarning) {
  Join(0s, 0);
  const Effects e = Feed(1s, PeerClosed{ConnOf(0), ""});
  EXPECT_EQ(FindLog(e, "left"), "node 0 (gpu-01) left: connection closed");
  EXPECT_EQ(coordinator_->joined_count(), 0);
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kRendezvous);
}

TEST_F(CoordinatorTest, NodeSilentForThreeHeartbeatsIsLost) {
  StartFirstRound(0s);
  // Node 1 is last heard at 1.5 s; heartbeat = 2 s, so it is lost once silent for more than 6 s.
  Beat(1s, {0});
  Beat(1500ms, {1});
  Effects quiet = BeatUntil(1s, 7s, {0});
  const Effects at_bound = Meaningful(Beat(7500ms, {0}));
  quiet.insert(quiet.end(), at_bound.begin(), at_bound.end());
  EXPECT_TRUE(Sent<wire::StopRound>(quiet).empty()) << test::Describe(quiet);
  EXPECT_EQ(coordinator_->NextDeadline(), At(7500ms + kNs));

  const Effects lost = Tick(7500ms + kNs);
  EXPECT_EQ(FindLog(lost, "round 0 failed"),
            "round 0 failed: node 1 (gpu-02) was lost: silent for 6.0s (3 heartbeats); stopping "
            "every worker on every node");
  ASSERT_EQ(All<CloseConn>(lost).size(), 1u) << test::Describe(lost);
  EXPECT_EQ(All<CloseConn>(lost)[0].conn, ConnOf(1));
  ASSERT_EQ(Sent<wire::StopRound>(lost).size(), 1u);
  EXPECT_EQ(Sent<wire::StopRound>(lost)[0].first, ConnOf(0));
}

// The silence index relies on inputs in time order: a driver that feeds an earlier time is
// broken, and the coordinator stops rather than misjudging who is silent.
TEST_F(CoordinatorTest, AnInputEarlierThanThePreviousOneAborts) {
  Join(2s, 0);
  EXPECT_DEATH(Join(1s, 1), "assertion failed: now >= last_input_");
}

TEST_F(CoordinatorTest, SilentUnjoinedConnectionIsDropped) {
  Connect(0s, 55, "10.0.0.55");
  EXPECT_TRUE(All<CloseConn>(Tick(6s)).empty());
  const Effects e = Tick(6s + kNs);
  ASSERT_EQ(All<CloseConn>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<CloseConn>(e)[0].conn, 55u);
}

TEST_F(CoordinatorTest, NodeThatNeverConfirmsTheStopIsDroppedAtTheStopDeadline) {
  StartFirstRound(0s);
  Send(1s, ConnOf(1), RankThreeFailed(0));
  Send(2s, ConnOf(1), wire::RoundStopped{0, 1});
  // The exit barrier (41s, see above) after the stop began at 1s.
  const Effects waiting = BeatUntil(2s, 41s);
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kStopping) << test::Describe(waiting);
  EXPECT_TRUE(All<CloseConn>(Beat(42s - kNs)).empty());
  const Effects e = Tick(42s);
  EXPECT_EQ(FindLog(e, "did not confirm"),
            "node 0 (gpu-01) did not confirm that its workers stopped; dropping it");
  ASSERT_EQ(All<CloseConn>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<CloseConn>(e)[0].conn, ConnOf(0));
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kBackoff);
}

TEST_F(CoordinatorTest, HeartbeatsGoToEveryJoinedNodeEachInterval) {
  Join(0s, 0);
  EXPECT_EQ(coordinator_->NextDeadline(), At(2s));
  const Effects e = Tick(2s);
  ASSERT_EQ(Sent<wire::Heartbeat>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(Sent<wire::Heartbeat>(e)[0].first, 100u);
  EXPECT_TRUE(Sent<wire::Heartbeat>(Beat(4s - kNs, {0})).empty());
  EXPECT_EQ(Sent<wire::Heartbeat>(Beat(4s, {0})).size(), 1u);
}

TEST_F(CoordinatorTest, NextDeadlineIsTheEarliestPendingDeadline) {
  // Rendezvous: heartbeat (2s) before progress (5s) before the timeout (15m).
  EXPECT_EQ(coordinator_->NextDeadline(), At(2s));
  Join(0s, 0);
  for (Duration t = 1s; t <= 4s; t += 1s) Beat(t, {0});
  EXPECT_EQ(coordinator_->NextDeadline(), At(5s));

  // Backoff of 10 s that ends before the next heartbeat would be due.
  UseJob(Edit(kTwoNodeJob, "backoff = \"10s\"", "backoff = \"500ms\""));
  StartFirstRound(0s);
  Send(1s, ConnOf(1), RankThreeFailed(0));
  Send(1s, ConnOf(0), wire::RoundStopped{0, 2});
  Send(1s, ConnOf(1), wire::RoundStopped{0, 1});
  EXPECT_EQ(coordinator_->NextDeadline(), At(1500ms));
}

// With a shared secret: every connection is challenged and only a correct proof joins.
class SecretCoordinatorTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    coordinator_->RequireSecret("s3cret", 99);
  }
  /// Connects `conn` and sends the hello (a join with the agent's nonce and nothing about the
  /// job); returns the nonce of the Challenge it is answered with, after checking its proof.
  std::string Challenged(Duration at, ConnId conn) {
    Connect(at, conn, "10.0.0.9");
    wire::Join hello;
    hello.node_rank = 1;
    hello.nonce = "agent-nonce-" + std::to_string(conn);
    const Effects e = Send(at, conn, hello);
    EXPECT_TRUE(Sent<wire::JoinAck>(e).empty());
    const auto challenges = Sent<wire::Challenge>(e);
    EXPECT_EQ(challenges.size(), 1u) << test::Describe(e);
    if (challenges.empty()) return "";
    EXPECT_EQ(challenges[0].second.proof,
              CoordinatorProof("s3cret", hello.nonce, challenges[0].second.nonce));
    return challenges[0].second.nonce;
  }
};

TEST_F(SecretCoordinatorTest, AnAgentWithoutTheSecretIsRefusedWithTheReasonOnBothSides) {
  Connect(0s, ConnOf(1), "10.0.0.2");
  const Effects e = Send(0s, ConnOf(1), JoinOf(1));  // a full join, no nonce: no secret
  ASSERT_EQ(Sent<wire::Reject>(e).size(), 1u) << test::Describe(e);
  const std::string reason =
      "node 1 (host gpu-02, from 10.0.0.2) has no shared secret and node 0 requires one\n"
      "hint: set DDPRUN_SECRET or DDPRUN_SECRET_FILE to the same secret on every node";
  EXPECT_EQ(Sent<wire::Reject>(e)[0].second.reason, reason);
  EXPECT_EQ(FindLog(e, "refused"), "refused a node: " + reason);
  EXPECT_EQ(coordinator_->joined_count(), 0);
}

// Issue 11: a secret on node 1 only. Node 0 must say why and never count node 1 as joined,
// instead of starting a round and then blaming a lost node.
TEST_F(CoordinatorTest, AnAgentWithASecretIsRefusedByACoordinatorWithoutOne) {
  Join(0s, 0);
  Connect(0s, ConnOf(1), "10.0.0.2");
  wire::Join hello;
  hello.node_rank = 1;
  hello.nonce = "n";
  const Effects e = Send(0s, ConnOf(1), hello);
  ASSERT_EQ(Sent<wire::Reject>(e).size(), 1u) << test::Describe(e);
  const std::string reason =
      "node 1 (from 10.0.0.2) has a shared secret (DDPRUN_SECRET or DDPRUN_SECRET_FILE) and "
      "node 0 has none\nhint: set the same secret on every node, or on none";
  EXPECT_EQ(Sent<wire::Reject>(e)[0].second.reason, reason);
  EXPECT_FALSE(Sent<wire::Reject>(e)[0].second.retry);
  EXPECT_EQ(FindLog(e, "refused"), "refused a node: " + reason);
  EXPECT_TRUE(All<ReserveStorePort>(e).empty());
  EXPECT_EQ(coordinator_->joined_count(), 1);
}

TEST_F(SecretCoordinatorTest, ACorrectProofJoinsAndEveryConnectionGetsItsOwnNonce) {
  const std::string nonce0 = Challenged(0s, ConnOf(0));
  const std::string nonce1 = Challenged(0s, ConnOf(1));
  EXPECT_EQ(nonce0.size(), 32u);
  EXPECT_NE(nonce0, nonce1);
  wire::Join join = JoinOf(0);
  join.proof = JoinProof("s3cret", nonce0, 0, join.fingerprint);
  const Effects e = Send(0s, ConnOf(0), join);
  EXPECT_EQ(Sent<wire::JoinAck>(e).size(), 1u) << test::Describe(e);
}

// Issue 25: with another secret on node 1, node 0 said only "never joined: node 1" and
// suggested a firewall. An agent that leaves after our challenge found our proof wrong: node 0
// says so once (its retries tell the same story) and names it in the rendezvous summary.
TEST_F(SecretCoordinatorTest, ANodeThatLeavesAfterTheChallengeIsNamedAsHavingAnotherSecret) {
  const std::string nonce0 = Challenged(0s, ConnOf(0));
  wire::Join join0 = JoinOf(0);
  join0.proof = JoinProof("s3cret", nonce0, 0, join0.fingerprint);
  ASSERT_EQ(Sent<wire::JoinAck>(Send(0s, ConnOf(0), join0)).size(), 1u);
  Challenged(0s, ConnOf(1));
  const Effects left = Feed(0s, PeerClosed{ConnOf(1), "connection closed"});
  EXPECT_EQ(FindLog(left, "challenge"),
            "a peer from 10.0.0.9 claiming node rank 1 closed the connection without answering "
            "the shared-secret challenge: its DDPRUN_SECRET (or DDPRUN_SECRET_FILE) differs from "
            "node 0's, or it is not this job's agent\nhint: set the same secret on every node");
  Challenged(2s, 300);
  EXPECT_EQ(FindLog(Feed(2s, PeerClosed{300, "connection closed"}), "challenge"), "") << "said once";
  const auto end = Sent<wire::JobEnd>(BeatUntil(2s, 15min, {0}));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].second.summary,
            "rendezvous failed: 1/2 nodes joined within timeouts.rendezvous = 15m; refused: node 1 "
            "(gpu-02): a peer from 10.0.0.9 claiming this rank left without answering the "
            "shared-secret challenge: its secret differs from node 0's\nhint: the refused nodes "
            "printed the reason too; fix it and start them again");
}

TEST_F(SecretCoordinatorTest, AWrongOrMissingProofIsRefusedBeforeAnythingElse) {
  const std::string nonce = Challenged(0s, ConnOf(1));
  wire::Join wrong = JoinOf(1);
  wrong.nproc = 99;  // also a different job: the peer must not learn about it
  wrong.fingerprint = "not-the-same";
  wrong.proof = JoinProof("guess", nonce, 1, wrong.fingerprint);
  Effects e = Send(1s, ConnOf(1), wrong);
  ASSERT_EQ(Sent<wire::Reject>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(Sent<wire::Reject>(e)[0].second.reason,
            "a node from 10.0.0.9 (claiming node rank 1) failed the shared-secret challenge: its "
            "secret differs from node 0's");
  EXPECT_EQ(All<CloseConn>(e).size(), 1u);

  Challenged(2s, 300);
  e = Send(2s, 300, JoinOf(1));
  ASSERT_EQ(Sent<wire::Reject>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(Sent<wire::Reject>(e)[0].second.reason,
            "a node from 10.0.0.9 (claiming node rank 1) sent no proof of the shared secret\n"
            "hint: set DDPRUN_SECRET or DDPRUN_SECRET_FILE to the same secret on every node");
  EXPECT_EQ(coordinator_->joined_count(), 0);
}

TEST_F(SecretCoordinatorTest, AProofForAnotherNonceIsAReplayAndIsRefused) {
  const std::string first = Challenged(0s, ConnOf(1));
  Challenged(0s, 301);
  wire::Join replay = JoinOf(1);
  replay.proof = JoinProof("s3cret", first, 1, replay.fingerprint);
  const Effects e = Send(0s, 301, replay);
  EXPECT_EQ(Sent<wire::Reject>(e).size(), 1u) << test::Describe(e);
}

}  // namespace
}  // namespace ddprun::core

namespace ddprun::core {
namespace {

// restart.never_on: a failure that no restart can fix ends the job at once, budget unspent.
class CoordinatorNeverOnTest : public ::testing::Test, public test::CoordinatorDriver {
 protected:
  /// Both nodes of kTwoNodeJob with `never_on` joined, round 0 running.
  void Start(const std::string& never_on) {
    Use(test::Edit(test::kTwoNodeJob, "backoff = \"10s\"", "backoff = \"10s\"\nnever_on = " + never_on));
    for (int node : {0, 1}) Join(0s, node);
    Feed(0s, StorePortReady{0, 41000});
  }
  /// Rank 3 fails with `stderr_tail`; both nodes confirm the stop. The last effects.
  std::vector<CoordinatorEffect> FailAndStop(const std::string& stderr_tail) {
    Send(1s, 1, wire::WorkerFailed{0, 3, 1, 1, 0, stderr_tail, ""});
    Send(1s, 0, wire::RoundStopped{0, 2});
    return Send(1s, 1, wire::RoundStopped{0, 1});
  }
};

TEST_F(CoordinatorNeverOnTest, ASyntaxErrorEndsTheJobAtOnceWithItsKind) {
  Start("[\"SyntaxError\", \"exit:2\"]");
  const auto out = FailAndStop("  File \"/job/train.py\", line 3\n    def (\n        ^\nSyntaxError: invalid syntax\n");
  const auto end = test::Sent<wire::JobEnd>(out);
  ASSERT_EQ(end.size(), 2u) << test::Describe(out);
  EXPECT_EQ(end[0].second.exit_code, 1);
  EXPECT_EQ(coordinator_->restarts_used(), 0);
  const std::string& summary = end[0].second.summary;
  EXPECT_EQ(summary.substr(0, summary.find('\n')),
            "job \"demo\" FAILED in round 0, not restarted: restart.never_on has \"SyntaxError\" (1 of "
            "1 restart left)");
  EXPECT_NE(summary.find("  kind: SyntaxError, exit:1\n"), std::string::npos) << summary;
  EXPECT_NE(test::FindLog(out, "restart.never_on has \"SyntaxError\": the job ends without a restart"), "");
}

// Anything else still restarts.
TEST_F(CoordinatorNeverOnTest, AnotherFailureStillRestarts) {
  Start("[\"SyntaxError\"]");
  FailAndStop("ValueError: bad lr\n");
  EXPECT_EQ(coordinator_->restarts_used(), 1);
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kBackoff);
}

// rendezvous.backend = "etcd": the coordinator runs wherever the role's holder is, records each
// round in etcd before it starts it, and a new holder takes the job's state over.
class EtcdCoordinatorTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    UseJob(Edit(kTwoNodeJob, "[timeouts]",
                "[rendezvous]\nbackend = \"etcd\"\nendpoints = [\"http://10.0.0.9:2379\"]\n[timeouts]"));
    AnswerRecordsByHand();
  }
};

// What an earlier holder of the coordinator role left in the job's store.
JobRecord Left(int next_round, int restarts_used, std::string holder, bool round_may_run = false) {
  JobRecord record;
  record.next_round = next_round;
  record.restarts_used = restarts_used;
  record.holder = std::move(holder);
  record.round_may_run = round_may_run;
  return record;
}
JobRecord Ended(JobRecord record, int exit_code, std::string summary) {
  record.exit_code = exit_code;
  record.summary = std::move(summary);
  return record;
}

TEST_F(EtcdCoordinatorTest, RankZeroAndMasterAddrFollowTheCoordinatorsAgent) {
  coordinator_->PlaceRankZero(1, "gpu-02");
  EXPECT_EQ(FindLog(Join(0s, 0), "joined"), "node 0 (gpu-01) joined from 10.0.0.1 (1/2); it plays node rank 1");
  const Effects joined = Join(0s, 1);
  EXPECT_EQ(FindLog(joined, "joined"),
            "node 1 (gpu-02) joined from 10.0.0.2 (2/2); it plays node rank 0, the coordinator's");
  // Nothing starts until etcd has the round: a deposed coordinator never gets this far.
  ASSERT_EQ(All<CommitRound>(joined).size(), 1u) << test::Describe(joined);
  EXPECT_EQ(All<CommitRound>(joined)[0].round, 0);
  EXPECT_EQ(All<CommitRound>(joined)[0].restarts_used, 0);
  EXPECT_TRUE(All<ReserveStorePort>(joined).empty());
  EXPECT_TRUE(Meaningful(Feed(1s, RoundCommitted{5})).empty());  // not this round's
  EXPECT_TRUE(Sent<wire::StartRound>(BeatUntil(1s, 20s)).empty());

  const Effects committed = Feed(20s, RoundCommitted{0});
  ASSERT_EQ(All<ReserveStorePort>(committed).size(), 1u) << test::Describe(committed);
  const auto starts = Sent<wire::StartRound>(Feed(20s, StorePortReady{0, 41000}));
  ASSERT_EQ(starts.size(), 2u);
  // Agent 1 (the coordinator's) plays node rank 0; agent 0 takes its place; both learn that
  // MASTER_ADDR is the coordinator's host.
  EXPECT_EQ(starts[0], (std::pair<ConnId, wire::StartRound>{101, {0, 41000, 0, 0, 0, "gpu-02"}}));
  EXPECT_EQ(starts[1], (std::pair<ConnId, wire::StartRound>{100, {0, 41000, 0, 1, 0, "gpu-02"}}));
}

TEST_F(EtcdCoordinatorTest, ARestartAndTheEndAreRecordedInEtcd) {
  Join(0s, 0);
  Join(0s, 1);
  Feed(0s, RoundCommitted{0});
  Feed(0s, StorePortReady{0, 41000});
  Send(1s, ConnOf(1), RankThreeFailed(0));
  Effects stopped = Send(1s, ConnOf(0), wire::RoundStopped{0, 2});
  const Effects both = Send(1s, ConnOf(1), wire::RoundStopped{0, 2});
  stopped.insert(stopped.end(), both.begin(), both.end());
  ASSERT_EQ(All<RecordRestart>(stopped).size(), 1u) << test::Describe(stopped);
  EXPECT_EQ(All<RecordRestart>(stopped)[0].next_round, 1);
  EXPECT_EQ(All<RecordRestart>(stopped)[0].restarts_used, 1);
  EXPECT_FALSE(All<RecordRestart>(stopped)[0].workers_may_run);  // every node confirmed
  const Effects again = BeatUntil(1s, 12s);
  ASSERT_EQ(All<CommitRound>(again).size(), 1u) << test::Describe(again);
  EXPECT_EQ(All<CommitRound>(again)[0].round, 1);
  EXPECT_EQ(All<CommitRound>(again)[0].restarts_used, 1);
  Feed(12s, RoundCommitted{1});
  Feed(12s, StorePortReady{1, 41001});
  Send(13s, ConnOf(0), wire::NodeDone{1});
  const Effects done = Send(13s, ConnOf(1), wire::NodeDone{1});
  ASSERT_EQ(All<RecordEnd>(done).size(), 1u) << test::Describe(done);
  EXPECT_EQ(All<RecordEnd>(done)[0].exit_code, 0);
  EXPECT_TRUE(Sent<wire::JobEnd>(done).empty());  // told once etcd has it
  EXPECT_EQ(Sent<wire::JobEnd>(Feed(13s, EndRecorded{})).size(), 2u);
}

TEST_F(EtcdCoordinatorTest, TakingOverARunningRoundSpendsOneRestartAndWaitsForTheOldWorkers) {
  std::vector<CoordinatorEffect> out;
  coordinator_->PlaceRankZero(1, "gpu-02");
  coordinator_->TakeOver(At(0s), Left(3, 0, "node 0 (gpu-01)", /*round_may_run=*/true), out);
  EXPECT_EQ(FindLog(out, "taking over"),
            "taking over the job from node 0 (gpu-01): round 3 next, 0 of 1 restarts used");
  EXPECT_EQ(FindLog(out, "round 2 failed"),
            "round 2 failed: the coordinator (node 0 (gpu-01)) was lost while round 2 ran; restart 1 of 1");
  EXPECT_EQ(coordinator_->restarts_used(), 1);
  // Both agents are back at once, but the old round's workers may still run until their
  // agents' lease has passed: no commit before then.
  Join(1s, 0);
  const Effects all_in = Join(1s, 1);
  EXPECT_TRUE(All<CommitRound>(all_in).empty());
  EXPECT_NE(FindLog(all_in, "the previous coordinator (node 0 (gpu-01)) was lost while round 2 ran, so "
                            "workers of its rounds may still run"),
            "")
      << test::Describe(all_in);
  const Duration fence = spec_->timeouts.LeaseBound();
  const Effects before = BeatUntil(1s, fence - 1s);
  EXPECT_TRUE(All<CommitRound>(before).empty()) << test::Describe(before);
  const Effects after = BeatUntil(fence - 1s, fence + 1s);
  ASSERT_EQ(All<CommitRound>(after).size(), 1u) << test::Describe(after);
  EXPECT_EQ(All<CommitRound>(after)[0].round, 3);
  EXPECT_EQ(All<CommitRound>(after)[0].restarts_used, 1);
}

TEST_F(EtcdCoordinatorTest, TakingOverACountedRoundWithALostNodesWorkersWaitsWithoutARestart) {
  std::vector<CoordinatorEffect> out;
  JobRecord left = Left(2, 1, "node 0 (gpu-01)");
  left.workers_may_run = true;
  coordinator_->TakeOver(At(0s), left, out);
  EXPECT_EQ(coordinator_->restarts_used(), 1);  // counted once, by the previous holder
  Join(1s, 0);
  const Effects all_in = Join(1s, 1);
  EXPECT_TRUE(All<CommitRound>(all_in).empty());
  EXPECT_NE(FindLog(all_in, "round 1 lost a node whose workers node 0 (gpu-01) never saw stop"), "")
      << test::Describe(all_in);
  const Duration fence = spec_->timeouts.LeaseBound();
  EXPECT_TRUE(All<CommitRound>(BeatUntil(1s, fence - 1s)).empty());
  const Effects after = BeatUntil(fence - 1s, fence + 1s);
  ASSERT_EQ(All<CommitRound>(after).size(), 1u) << test::Describe(after);
  EXPECT_EQ(All<CommitRound>(after)[0].round, 2);
  EXPECT_EQ(All<CommitRound>(after)[0].restarts_used, 1);
}

TEST_F(EtcdCoordinatorTest, TakingOverWithTheBudgetSpentEndsTheJobWithTheCause) {
  std::vector<CoordinatorEffect> out;
  coordinator_->TakeOver(At(0s), Left(2, 1, "node 1 (gpu-02)", /*round_may_run=*/true), out);
  ASSERT_EQ(All<RecordEnd>(out).size(), 1u) << test::Describe(out);
  EXPECT_EQ(All<RecordEnd>(out)[0].exit_code, 1);
  EXPECT_NE(All<RecordEnd>(out)[0].summary.find("the coordinator (node 1 (gpu-02)) was lost while round 1 ran"),
            std::string::npos)
      << All<RecordEnd>(out)[0].summary;
  // Nobody hears a verdict before etcd has it.
  EXPECT_TRUE(Sent<wire::JobEnd>(Join(1s, 0)).empty());
  const Effects recorded = Feed(1s, EndRecorded{});
  ASSERT_EQ(Sent<wire::JobEnd>(recorded).size(), 1u) << test::Describe(recorded);
  EXPECT_EQ(Sent<wire::JobEnd>(recorded)[0].second.exit_code, 1);
}

TEST_F(EtcdCoordinatorTest, TakingOverAnEndedJobTellsTheSameVerdict) {
  std::vector<CoordinatorEffect> out;
  coordinator_->TakeOver(At(0s), Ended(Left(1, 0, "node 0 (gpu-01)"), 0, "job \"demo\" finished"),
                         out);
  EXPECT_EQ(FindLog(out, "had ended"),
            "the job had ended (exit code 0) when node 0 (gpu-01) was lost; telling every agent the "
            "verdict again");
  EXPECT_TRUE(Sent<wire::JobEnd>(Join(1s, 1)).empty());
  const Effects recorded = Feed(1s, EndRecorded{});
  ASSERT_EQ(Sent<wire::JobEnd>(recorded).size(), 1u) << test::Describe(recorded);
  EXPECT_EQ(Sent<wire::JobEnd>(recorded)[0].second, (wire::JobEnd{0, "job \"demo\" finished"}));
}

}  // namespace
}  // namespace ddprun::core

namespace ddprun::core {
namespace {

// rendezvous.probe: before the first round every node probes the others' probe endpoints.
class ReachTest : public CoordinatorTest {
 protected:
  Effects JoinWithProbe(Duration at, int node) {
    Connect(at, ConnOf(node), fmt::format("10.0.0.{}", node + 1));
    wire::Join join = JoinOf(node);
    join.probe_endpoint = fmt::format("10.0.0.{}:4100{}", node + 1, node);
    return Send(at, ConnOf(node), join);
  }
  static wire::ProbeTarget Target(int node) {
    return wire::ProbeTarget{node, fmt::format("gpu-0{}", node + 1), fmt::format("10.0.0.{}:4100{}", node + 1, node)};
  }
};

TEST_F(ReachTest, EveryNodeProbesTheOthersBeforeTheFirstRoundWhichStartsWhenAllReachEachOther) {
  JoinWithProbe(0s, 0);
  const Effects joined = JoinWithProbe(1s, 1);
  EXPECT_TRUE(All<ReserveStorePort>(joined).empty()) << "no round before the probe";
  const auto probes = Sent<wire::ProbePeers>(joined);
  ASSERT_EQ(probes.size(), 2u) << test::Describe(joined);
  EXPECT_EQ(probes[0].first, ConnOf(0));
  EXPECT_EQ(probes[0].second.targets, std::vector<wire::ProbeTarget>{Target(1)});
  EXPECT_EQ(probes[1].first, ConnOf(1));
  EXPECT_EQ(probes[1].second.targets, std::vector<wire::ProbeTarget>{Target(0)});
  EXPECT_EQ(FindLog(joined, "checking"),
            "round 0: all 2 nodes joined; checking that each reaches every other one on a port other "
            "than master_port (rendezvous.probe)");
  EXPECT_TRUE(All<ReserveStorePort>(Send(2s, ConnOf(1), wire::PeersProbed{})).empty());
  const Effects all = Send(2s, ConnOf(0), wire::PeersProbed{});
  EXPECT_EQ(All<ReserveStorePort>(all).size(), 1u) << test::Describe(all);

  // Once per job: the next round starts without a probe.
  Feed(2s, StorePortReady{0, 41000});
  Send(3s, ConnOf(1), RankThreeFailed(0));
  Send(3s, ConnOf(0), wire::RoundStopped{0, 2});
  Send(3s, ConnOf(1), wire::RoundStopped{0, 2});
  const Effects restart = Tick(13s);
  EXPECT_TRUE(Sent<wire::ProbePeers>(restart).empty()) << test::Describe(restart);
  EXPECT_EQ(All<ReserveStorePort>(restart).size(), 1u) << test::Describe(restart);
}

TEST_F(ReachTest, APairThatCannotConnectEndsTheJobWithExit3NamingThePairThePortAndTheFix) {
  JoinWithProbe(0s, 0);
  JoinWithProbe(0s, 1);
  Send(1s, ConnOf(0), wire::PeersProbed{});
  const Effects e =
      Send(4s, ConnOf(1), wire::PeersProbed{{wire::ProbeFailure{Target(0), "timed out (a firewall drops it)"}}});
  EXPECT_TRUE(All<ReserveStorePort>(e).empty());
  const auto end = Sent<wire::JobEnd>(e);
  ASSERT_EQ(end.size(), 2u) << test::Describe(e);
  EXPECT_EQ(end[0].second.exit_code, 3);
  EXPECT_EQ(end[0].second.summary,
            "round 0 not started: a pair of nodes cannot connect on a port other than master_port, as gloo and "
            "NCCL must (they would wait in init_process_group until their timeout):\n"
            "  node 1 (gpu-02) cannot connect to node 0 (gpu-01) at 10.0.0.1:41000: timed out (a firewall drops it)\n"
            "fix: gloo and NCCL connect between all nodes on ports they pick, not only master_port: let TCP from "
            "the job's nodes through the firewall of each node named above (e.g. iptables -I INPUT -s <the "
            "nodes' subnet> -p tcp -j ACCEPT); `ddprun preflight` checks it\n"
            "(rendezvous.probe = \"warn\" starts the job anyway)");
}

TEST_F(ReachTest, UnderWarnTheRoundStartsAndAHangVerdictNamesTheProbe) {
  UseJob(Edit(kTwoNodeJob, "[timeouts]", "[rendezvous]\nprobe = \"warn\"\n[timeouts]\nprogress = \"1m\""));
  JoinWithProbe(0s, 0);
  JoinWithProbe(0s, 1);
  Send(1s, ConnOf(0), wire::PeersProbed{});
  const Effects e =
      Send(1s, ConnOf(1), wire::PeersProbed{{wire::ProbeFailure{Target(0), "timed out (a firewall drops it)"}}});
  EXPECT_EQ(All<ReserveStorePort>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(FindLog(e, "some nodes"),
            "some nodes cannot connect on a port other than master_port; gloo and NCCL will likely hang in "
            "init_process_group (rendezvous.probe = \"warn\" starts round 0 anyway):\n"
            "  node 1 (gpu-02) cannot connect to node 0 (gpu-01) at 10.0.0.1:41000: timed out (a firewall drops it)\n"
            "fix: gloo and NCCL connect between all nodes on ports they pick, not only master_port: let TCP from "
            "the job's nodes through the firewall of each node named above (e.g. iptables -I INPUT -s <the "
            "nodes' subnet> -p tcp -j ACCEPT); `ddprun preflight` checks it");
  Feed(1s, StorePortReady{0, 41000});
  // Every rank sends no first beacon: node 1 reports rank 2 hung, both answer with stacks.
  Send(2s, ConnOf(1), wire::RankHung{0, 2, 0, -1, 600'000, 600'000, true});
  Send(2s, ConnOf(0), wire::RankStacks{0, {{0, -1, 600'000, ""}, {1, -1, 600'000, ""}}});
  const Effects stop = Send(2s, ConnOf(1), wire::RankStacks{0, {{2, -1, 600'000, ""}, {3, -1, 600'000, ""}}});
  const auto stops = Sent<wire::StopRound>(stop);
  ASSERT_FALSE(stops.empty()) << test::Describe(stop);
  EXPECT_NE(stops[0].second.cause.find(
                "  likely cause: before round 0 some nodes could not connect on a port other than master_port "
                "(rendezvous.probe = \"warn\" started the job anyway), so gloo and NCCL cannot connect either:\n"
                "    node 1 (gpu-02) cannot connect to node 0 (gpu-01) at 10.0.0.1:41000: timed out"),
            std::string::npos)
      << stops[0].second.cause;
}

TEST_F(ReachTest, ANodeThatDoesNotAnswerInTimeIsNamedAndTheRoundStarts) {
  JoinWithProbe(0s, 0);
  JoinWithProbe(0s, 1);
  Send(1s, ConnOf(0), wire::PeersProbed{});
  // ProbeWait: ConnectTimeout (4 s at a 2 s heartbeat) + 2 heartbeats.
  EXPECT_TRUE(All<ReserveStorePort>(BeatUntil(1s, 7s)).empty());
  EXPECT_TRUE(All<ReserveStorePort>(Beat(8s - kNs)).empty());
  const Effects e = Tick(8s);
  EXPECT_EQ(All<ReserveStorePort>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(FindLog(e, "did not report"),
            "node 1 (gpu-02) did not report its probe of the other nodes within 8.0s; starting without it");
  // A late answer is stale.
  EXPECT_TRUE(Meaningful(Send(9s, ConnOf(1), wire::PeersProbed{})).empty());
}

TEST_F(ReachTest, NoProbeWhenOffOrWhenAgentsHaveNoEndpoint) {
  Join(0s, 0);
  Effects e = Join(0s, 1);
  EXPECT_TRUE(Sent<wire::ProbePeers>(e).empty());
  EXPECT_EQ(All<ReserveStorePort>(e).size(), 1u) << test::Describe(e);

  UseJob(Edit(kTwoNodeJob, "[timeouts]", "[rendezvous]\nprobe = \"off\"\n[timeouts]"));
  JoinWithProbe(0s, 0);
  e = JoinWithProbe(0s, 1);
  EXPECT_TRUE(Sent<wire::ProbePeers>(e).empty());
  EXPECT_EQ(All<ReserveStorePort>(e).size(), 1u) << test::Describe(e);
}

}  // namespace
}  // namespace ddprun::core
