// The coordinator under restart.never_on, with etcd (the job's record in the store, taking
// over) and with the reachability probe, driven with inputs and virtual time.

#include "runner/core/auth.h"
#include "runner/core/coordinator.h"
#include "runner/core/coordinator_text.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
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
  const auto out =
      FailAndStop("  File \"/job/train.py\", line 3\n    def (\n        ^\nSyntaxError: invalid syntax\n");
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
  EXPECT_EQ(FindLog(Join(0s, 0), "joined"),
            "node 0 (gpu-01) joined from 10.0.0.1 (1/2); it plays node rank 1");
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
  EXPECT_NE(FindLog(all_in,
                    "the previous coordinator (node 0 (gpu-01)) was lost while round 2 ran, so "
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

// Issue 37: etcd without a majority just as the job finished; the holder could not record the
// end, stepped down, and the next one counted the round as lost (shape seed 108189: exit 1 after
// every rank had exited 0). The rejoining agents say how their last round ended.
class UnjudgedRoundTest : public EtcdCoordinatorTest {
 protected:
  // Agent `agent` rejoins having played node rank `as` in round 2, which ended (`ok`) or not.
  Effects Rejoin(Duration at, int agent, int as, bool ok) {
    wire::Join join = JoinOf(agent);
    join.ran_round = 2;
    join.ran_as = as;
    join.ran_ok = ok;
    Feed(at, PeerAccepted{ConnOf(agent), fmt::format("10.0.0.{}", agent + 1)});
    return Feed(at, PeerMessage{ConnOf(agent), join});
  }
  Effects TakeOverRoundTwo() {
    Effects out;
    coordinator_->PlaceRankZero(1, "gpu-02");
    JobRecord left = Left(3, 0, "node 1 (gpu-02)", /*round_may_run=*/true);
    left.round_nodes = 2;
    coordinator_->TakeOver(At(0s), left, out);
    return out;
  }
};

TEST_F(UnjudgedRoundTest, EveryNodeOfTheRoundSayingItsWorkersExited0IsTheJobsSuccess) {
  const Effects taken = TakeOverRoundTwo();
  EXPECT_EQ(
      FindLog(taken, "never judged"),
      "round 2 was never judged: waiting up to 48s for its 2 nodes to rejoin and say whether their workers "
      "exited 0");
  EXPECT_EQ(coordinator_->restarts_used(), 0);
  EXPECT_TRUE(All<RecordEnd>(Rejoin(1s, 0, 1, true)).empty());
  // Agent 1 played node rank 0 (the old coordinator's), agent 0 node rank 1.
  const Effects all = Rejoin(1s, 1, 0, true);
  ASSERT_EQ(All<RecordEnd>(all).size(), 1u) << test::Describe(all);
  EXPECT_EQ(All<RecordEnd>(all)[0].exit_code, 0);
  EXPECT_THAT(
      All<RecordEnd>(all)[0].summary,
      ::testing::StartsWith("job \"demo\" succeeded: all 4 ranks on 2 nodes exited 0 in round 2 (0 restarts "
                            "used)\n  its coordinator was lost before it could record the end"));
  EXPECT_TRUE(All<CommitRound>(all).empty());
  EXPECT_EQ(coordinator_->restarts_used(), 0);
}

TEST_F(UnjudgedRoundTest, ANodeWhoseWorkersDidNotAllExit0FailsTheRoundAtOnce) {
  TakeOverRoundTwo();
  Rejoin(1s, 1, 0, true);
  const Effects failed = Rejoin(1s, 0, 1, false);
  EXPECT_EQ(FindLog(failed, "round 2 failed"),
            "round 2 failed: the coordinator (node 1 (gpu-02)) was lost while round 2 ran; restart 1 of 1");
  EXPECT_EQ(coordinator_->restarts_used(), 1);
  // The next round still waits for the old workers' lease.
  EXPECT_TRUE(All<CommitRound>(failed).empty());
  const Duration fence = spec_->timeouts.LeaseBound();
  const Effects after = BeatUntil(1s, fence + 1s);
  ASSERT_EQ(All<CommitRound>(after).size(), 1u) << test::Describe(after);
  EXPECT_EQ(All<CommitRound>(after)[0].round, 3);
}

TEST_F(UnjudgedRoundTest, ANodeThatNeverSaysSoFailsTheRoundWhenTheLeasePasses) {
  TakeOverRoundTwo();
  // Agent 1 says it finished node rank 1, then, joining again on a new connection, node rank 0
  // too: one agent counts for one node rank.
  {
    wire::Join first = JoinOf(1);
    first.ran_round = 2;
    first.ran_as = 1;
    first.ran_ok = true;
    Feed(1s, PeerAccepted{ConnOf(7), "10.0.0.2"});
    EXPECT_TRUE(All<RecordEnd>(Feed(1s, PeerMessage{ConnOf(7), first})).empty());
  }
  EXPECT_TRUE(All<RecordEnd>(Rejoin(1s, 1, 0, true)).empty());
  Join(1s, 0);  // a fresh agent for node 0's host: it ran nothing
  const Duration fence = spec_->timeouts.LeaseBound();
  const Effects before = BeatUntil(2s, fence - 1s);
  EXPECT_EQ(FindLog(before, "failed"), "") << test::Describe(before);
  EXPECT_EQ(coordinator_->restarts_used(), 0);
  const Effects after = BeatUntil(fence - 1s, fence + 1s);
  EXPECT_NE(FindLog(after, "round 2 failed: the coordinator (node 1 (gpu-02)) was lost while round 2 ran"),
            "")
      << test::Describe(after);
  ASSERT_EQ(All<CommitRound>(after).size(), 1u) << test::Describe(after);
  EXPECT_EQ(All<CommitRound>(after)[0].restarts_used, 1);
}

TEST_F(UnjudgedRoundTest, TheLostRoundsSummaryPointsAtTheOldCoordinatorsLogs) {
  Effects out;
  coordinator_->PlaceRankZero(0, "gpu-01");
  JobRecord left = Left(3, 1, "node 1 (gpu-02)", /*round_may_run=*/true);
  left.round_nodes = 2;
  left.holder_agent = 1;
  coordinator_->TakeOver(At(0s), left, out);
  const Effects ended = Rejoin(1s, 1, 0, false);
  ASSERT_EQ(All<RecordEnd>(ended).size(), 1u) << test::Describe(ended);
  // Agent 1 held the role (and node rank 0): its host has the round's logs, not agent 0's.
  EXPECT_THAT(All<RecordEnd>(ended)[0].summary,
              ::testing::HasSubstr("logs: logs/demo/latest-n1/attempt-2/ on node 1 (gpu-02),"));
  EXPECT_THAT(All<RecordEnd>(ended)[0].summary,
              ::testing::HasSubstr("node 1 (gpu-02) says its workers of round 2 did not all exit 0"));
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
  EXPECT_NE(
      All<RecordEnd>(out)[0].summary.find("the coordinator (node 1 (gpu-02)) was lost while round 1 ran"),
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
  coordinator_->TakeOver(At(0s), Ended(Left(1, 0, "node 0 (gpu-01)"), 0, "job \"demo\" finished"), out);
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
    return wire::ProbeTarget{node, fmt::format("gpu-0{}", node + 1),
                             fmt::format("10.0.0.{}:4100{}", node + 1, node)};
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
  const Effects e = Send(
      4s, ConnOf(1), wire::PeersProbed{{wire::ProbeFailure{Target(0), "timed out (a firewall drops it)"}}});
  EXPECT_TRUE(All<ReserveStorePort>(e).empty());
  const auto end = Sent<wire::JobEnd>(e);
  ASSERT_EQ(end.size(), 2u) << test::Describe(e);
  EXPECT_EQ(end[0].second.exit_code, 3);
  EXPECT_EQ(
      end[0].second.summary,
      "round 0 not started: a pair of nodes cannot connect on a port other than master_port, as gloo and "
      "NCCL must (they would wait in init_process_group until their timeout):\n"
      "  node 1 (gpu-02) cannot connect to node 0 (gpu-01) at 10.0.0.1:41000: timed out (a firewall drops "
      "it)\n"
      "fix: gloo and NCCL connect between all nodes on ports they pick, not only master_port: let TCP from "
      "the job's nodes through the firewall of each node named above (e.g. iptables -I INPUT -s <the "
      "nodes' subnet> -p tcp -j ACCEPT); `ddprun preflight` checks it\n"
      "(rendezvous.probe = \"warn\" starts the job anyway)");
}

// Issue 39.4: 64 hosts whose probes all failed printed 4,032 pair lines on every console (17 MB
// in all). Beyond kReachPairsShown pairs the summary counts them and names the nodes that
// appear most often: here node 3, which nobody reaches, and node 7, which reaches nobody.
TEST_F(ReachTest, ManyFailingPairsAreCountedAndTheNodesNamedMostOftenAreSaid) {
  std::string nodes;
  for (int n = 0; n < 16; ++n) nodes += fmt::format("{}\"gpu-0{}\"", n == 0 ? "" : ", ", n + 1);
  UseJob(Edit(kTwoNodeJob, "nodes = [\"gpu-01\", \"gpu-02\"]", "nodes = [" + nodes + "]"));
  for (int n = 0; n < 16; ++n) JoinWithProbe(0s, n);
  Effects e;
  for (int n = 0; n < 16; ++n) {
    wire::PeersProbed probed;
    for (int t = 0; t < 16; ++t) {
      if (t != n && (t == 3 || n == 7))
        probed.failures.push_back({Target(t), "timed out (a firewall drops it)"});
    }
    e = Send(1s, ConnOf(n), probed);
  }
  const auto end = Sent<wire::JobEnd>(e);
  ASSERT_FALSE(end.empty()) << test::Describe(e);
  const std::string& summary = end[0].second.summary;
  size_t listed = 0;
  for (size_t at = summary.find("\n  node "); at != std::string::npos; at = summary.find("\n  node ", at + 1))
    ++listed;
  EXPECT_EQ(listed, kReachPairsShown) << summary;
  EXPECT_THAT(summary,
              ::testing::HasSubstr(
                  "  node 7 (gpu-08) cannot connect to node 5 (gpu-06) at 10.0.0.6:41005: timed out "
                  "(a firewall drops it)\n  ... and 17 more pairs; the nodes named most often: node 3 "
                  "(gpu-04) in 15, node 7 (gpu-08) in 15, node 0 (gpu-01) in 2, node 1 (gpu-02) in 2, "
                  "node 2 (gpu-03) in 2\nfix: "));
}

TEST_F(ReachTest, UnderWarnTheRoundStartsAndAHangVerdictNamesTheProbe) {
  UseJob(Edit(kTwoNodeJob, "[timeouts]", "[rendezvous]\nprobe = \"warn\"\n[timeouts]\nprogress = \"1m\""));
  JoinWithProbe(0s, 0);
  JoinWithProbe(0s, 1);
  Send(1s, ConnOf(0), wire::PeersProbed{});
  const Effects e = Send(
      1s, ConnOf(1), wire::PeersProbed{{wire::ProbeFailure{Target(0), "timed out (a firewall drops it)"}}});
  EXPECT_EQ(All<ReserveStorePort>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(
      FindLog(e, "some nodes"),
      "some nodes cannot connect on a port other than master_port; gloo and NCCL will likely hang in "
      "init_process_group (rendezvous.probe = \"warn\" starts round 0 anyway):\n"
      "  node 1 (gpu-02) cannot connect to node 0 (gpu-01) at 10.0.0.1:41000: timed out (a firewall drops "
      "it)\n"
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
  EXPECT_NE(
      stops[0].second.cause.find(
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
