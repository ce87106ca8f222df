// The coordinator state machine, the second half: the end and its barrier, fences and the job's
// record, lost nodes, deadlines and the shared secret, driven with inputs and virtual time.

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
#include "tests/core/coordinator_fixture.h"
#include "tests/core/core_test_util.h"

namespace ddprun::core {
namespace {
TEST_F(CoordinatorTest, EveryNodeDoneEndsTheJobWithZeroAfterTheExitBarrier) {
  StartFirstRound(0s);
  EXPECT_TRUE(Meaningful(Send(5s, ConnOf(1), wire::NodeDone{0})).empty());
  const Effects e = Send(6s, ConnOf(0), wire::NodeDone{0});
  const auto end = Sent<wire::JobEnd>(e);
  ASSERT_EQ(end.size(), 2u) << test::Describe(e);
  EXPECT_EQ(end[0].second, (wire::JobEnd{0,
                                         "job \"demo\" succeeded: all 4 ranks on 2 nodes exited 0 in round 0 "
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
  EXPECT_EQ(end[0].second, (wire::JobEnd{130,
                                         "job \"demo\" interrupted: node 1 (gpu-02) received SIGINT; every "
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
  EXPECT_EQ(Sent<wire::Reject>(other)[0].second.reason, "node 1 (host gpu-02) joined after the job ended");
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
