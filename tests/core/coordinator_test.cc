// The coordinator state machine: admission, rounds, restarts, liveness, the root-cause summary
// and the exit barrier, driven with inputs and virtual time.

#include "runner/core/coordinator.h"
#include "runner/core/auth.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "schema/canonical.h"
#include "tests/core/coordinator_fixture.h"
#include "tests/core/core_test_util.h"

namespace ddprun::core {
namespace {

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
  EXPECT_NE(Sent<wire::Reject>(Send(0s, 8, join))[0].second.reason.find("node rank -1"), std::string::npos);
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

// Issue 40: a rank started twice retries every few seconds for the whole rendezvous, and node 0
// printed the refusal each time (about 450 times). The same story is said once; later ones go
// to the debug level, and a different story is said again.
TEST_F(CoordinatorTest, ARepeatedRefusalIsSaidOnce) {
  Join(0s, 1);
  wire::Join impostor = JoinOf(1, /*instance=*/777);
  impostor.host = "gpu-99";
  auto refusal_level = [&](Duration at, ConnId conn, const std::string& addr) {
    Connect(at, conn, addr);
    const Effects e = Send(at, conn, impostor);
    for (const LogLine& line : All<LogLine>(e)) {
      if (line.text.starts_with("refused a node: ")) return line.level;
    }
    return LogLevel::kInfo;
  };
  EXPECT_EQ(refusal_level(1s, 9, "10.0.0.9"), LogLevel::kError);
  EXPECT_EQ(refusal_level(2s, 10, "10.0.0.9"), LogLevel::kDebug);
  EXPECT_EQ(refusal_level(3s, 11, "10.0.0.9"), LogLevel::kDebug);
  EXPECT_EQ(refusal_level(4s, 12, "10.0.0.7"), LogLevel::kError);  // another host: another story
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
  EXPECT_EQ(progress[0].second, (wire::Progress{1, 2, {1}, 5000, 900'000, {"gpu-02"}, {""}}));
  EXPECT_TRUE(Sent<wire::Progress>(Beat(9s + 999ms, {0})).empty());
  const auto next = Sent<wire::Progress>(Beat(10s, {0}));
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].second.elapsed_ms, 10'000);
}

// Issue 39: the line went to every agent every 5 s for the whole rendezvous (2,048 nodes waiting
// 10 minutes: 120 lines on every console). It backs off while it says the same (5 s, doubling
// to a minute), and a change comes within 5 s of the last line: here a refusal, which the line
// names (issue 40: after a refusal it kept saying only "waiting for node 1").
TEST_F(CoordinatorTest, TheProgressLineBacksOffAndSaysARefusalWithinFiveSeconds) {
  Join(0s, 0);
  std::vector<int64_t> sent_at;
  for (Duration t = 1s; t <= 150s; t += 1s) {
    for (const auto& [conn, progress] : Sent<wire::Progress>(Beat(t, {0})))
      sent_at.push_back(progress.elapsed_ms);
  }
  EXPECT_EQ(sent_at, (std::vector<int64_t>{5'000, 10'000, 20'000, 40'000, 80'000, 140'000}));
  const JobSpec other = SpecFromToml(Edit(kTwoNodeJob, "nproc_per_node = 2", "nproc_per_node = 4"));
  wire::Join join = JoinOf(1);
  join.canonical = CanonicalForm(other);
  join.fingerprint = Fingerprint(other);
  Connect(150s, ConnOf(1), "10.0.0.2");
  ASSERT_EQ(Sent<wire::Reject>(Send(150s, ConnOf(1), join)).size(), 1u);
  // 140 s + 5 s has passed: at once (100 ms on, so that a burst of joins is one line).
  EXPECT_TRUE(Sent<wire::Progress>(Beat(150s + 50ms, {0})).empty());
  const auto told = Sent<wire::Progress>(Beat(150s + 100ms, {0}));
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].second.missing_why, (std::vector<std::string>{"it runs a different job file"}));
  // Then backing off from 5 s again.
  EXPECT_TRUE(Sent<wire::Progress>(BeatUntil(150s + 100ms, 155s, {0})).empty());
  EXPECT_EQ(Sent<wire::Progress>(Beat(155s + 100ms, {0})).size(), 1u);
}

// Issue 37: an agent that ran again after a stall asks for an echo; only that connection gets it.
TEST_F(CoordinatorTest, AHeartbeatWithAnEchoIsAnsweredOnItsConnection) {
  Join(0s, 0);
  const Effects e = Send(1s, ConnOf(0), wire::Heartbeat{42});
  const auto sent = Sent<wire::Heartbeat>(e);
  ASSERT_EQ(sent.size(), 1u) << test::Describe(e);
  EXPECT_EQ(sent[0].first, ConnOf(0));
  EXPECT_EQ(sent[0].second.echo, 42u);
  for (const auto& [conn, beat] : Sent<wire::Heartbeat>(Send(1s + 100ms, ConnOf(0), wire::Heartbeat{}))) {
    EXPECT_EQ(beat.echo, 0u) << "a plain heartbeat asks for no echo";
  }
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
  UseJob(
      Edit(kTwoNodeJob, "nodes = [\"gpu-01\", \"gpu-02\"]", "nodes = [\"gpu-01\", \"gpu-02\", \"gpu-03\"]"));
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
  UseJob(Edit(kTwoNodeJob, "nodes = [\"gpu-01\", \"gpu-02\"]", "nnodes = 2\nmaster_addr = \"10.0.0.1\""));
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
  EXPECT_EQ(FindLog(stopped, "restart"), "all workers stopped (3 stopped by ddprun); restart 1 of 1 in 10s");
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
  EXPECT_EQ(Sent<wire::StopRound>(first)[0].second.cause.rfind("rank 2 (node 1 (gpu-02), local rank 0)", 0),
            0u);

  const wire::WorkerFailed also_lost{
      0, 0, 0, 1, 0, "", "ncclRemoteError: remote process exited or there was a network error"};
  EXPECT_TRUE(Meaningful(Send(1s, ConnOf(0), also_lost)).empty());

  const Effects revised =
      Send(2s, ConnOf(1), RankThreeFailed(0, "", "RuntimeError: rank 3 fails on purpose\n"));
  EXPECT_EQ(FindLog(revised, "the root cause is"),
            "round 0: the root cause is rank 3 (node 1 (gpu-02), local rank 1) exited with code 1; "
            "rank 2 (node 1 (gpu-02), local rank 0) exited with code 1 failed first, but its error "
            "says only that it lost a peer");
  const auto stops = Sent<wire::StopRound>(revised);
  ASSERT_EQ(stops.size(), 2u) << test::Describe(revised);
  EXPECT_EQ(stops[0].second.cause_rank, 3);
  EXPECT_EQ(Sent<wire::StopRound>(first)[0].second.cause_rank, 2);
  // The first names a rank that only lost a peer, so agents hold its error back; the revision
  // is final.
  EXPECT_TRUE(Sent<wire::StopRound>(first)[0].second.cause_lost_peer);
  EXPECT_FALSE(stops[0].second.cause_lost_peer);
  EXPECT_EQ(stops[0].second.cause,
            "rank 3 (node 1 (gpu-02), local rank 1) exited with code 1\n"
            "  error (from TORCHELASTIC_ERROR_FILE):\n"
            "    | RuntimeError: rank 3 fails on purpose\n"
            "  (rank 2 failed before it, with an error that says it lost a peer: a consequence, not "
            "the cause)\n");
  // Once revised, it stays: a third failure is not news.
  EXPECT_TRUE(
      Meaningful(Send(2s, ConnOf(0), wire::WorkerFailed{0, 1, 1, 1, 0, "", "ValueError: x\n"})).empty());
}

// An error file written because of the stop itself (Lightning turns SIGTERM into a
// SignalException) is not a cause: the first failure stays.
TEST_F(CoordinatorTest, AnErrorThatIsTheStopItselfRevisesNothing) {
  StartFirstRound(0s);
  Send(1s, ConnOf(1),
       wire::WorkerFailed{0, 2, 0, 1, 0, "RuntimeError: [gloo] Connection closed by peer\n", ""});
  const Effects later = Send(2s, ConnOf(0),
                             wire::WorkerFailed{0, 0, 0, 1, 0, "",
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

  const Effects failed = Send(20s, ConnOf(1), wire::WorkerFailed{1, 2, 0, 0, SIGSEGV, "", ""});
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
            "logs: logs/demo/latest-n1/attempt-1/rank-2.log on node 1 (gpu-02), in its job file's folder; "
            "each node keeps its own runs under logs/demo/latest-n<node>");
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
  EXPECT_EQ(SummaryAfter(RankThreeFailed(0,
                                         "gpu-02:1:1 [1] NCCL WARN Net : Connection closed by remote peer\n"
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
            "logs: logs/demo/latest-n1/attempt-0/rank-3.log on node 1 (gpu-02), in its job file's folder; "
            "each node keeps its own runs under logs/demo/latest-n<node>");
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
            "logs: logs/demo/latest-n1/attempt-0/rank-3.log on node 1 (gpu-02), in its job file's folder; "
            "each node keeps its own runs under logs/demo/latest-n<node>");
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
            "logs: logs/demo/latest-n1/attempt-0/rank-3.log on node 1 (gpu-02), in its job file's folder; "
            "each node keeps its own runs under logs/demo/latest-n<node>");
  // Only the traceback on stderr: no stderr section at all.
  UseJob(Edit(kTwoNodeJob, "max_restarts = 1", "max_restarts = 0"));
  const std::string summary = SummaryAfter(RankThreeFailed(0, traceback, traceback));
  EXPECT_EQ(summary.find("last lines of its stderr"), std::string::npos) << summary;
}

// Issue 40: a long traceback's stderr tail begins inside it, after its "Traceback" line, and
// was shown again in full under the error file's copy.
TEST_F(CoordinatorNoRestartTest, ATracebackCutAtTheStartOfTheTailIsNotRepeatedEither) {
  std::string traceback = "Traceback (most recent call last):\n";
  for (int i = 0; i < 40; ++i) {
    traceback +=
        fmt::format("  File \"lightning/loop{}.py\", line {}, in run\n    self.advance()\n", i, 100 + i);
  }
  traceback += "RuntimeError: boom\n";
  // The agent keeps the tail: cut inside the 7th frame's line, long after "Traceback".
  const std::string tail = traceback.substr(traceback.find("loop6.py") + 3);
  const std::string summary = SummaryAfter(RankThreeFailed(0, tail, traceback));
  EXPECT_EQ(summary.find("last lines of its stderr"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("loop39.py"), summary.rfind("loop39.py")) << summary;  // once
  // Text of its own before the cut traceback is not a copy: kept whole.
  const std::string other = "epoch 3 done\n" + tail;
  UseJob(Edit(kTwoNodeJob, "max_restarts = 1", "max_restarts = 0"));
  EXPECT_NE(SummaryAfter(RankThreeFailed(0, other, traceback)).find("    | epoch 3 done\n"),
            std::string::npos);
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

}  // namespace
}  // namespace ddprun::core
