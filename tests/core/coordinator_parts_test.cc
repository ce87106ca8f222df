// The coordinator's parts on their own: admission as a pure judgement, the quarantine book,
// the roster's counts, the connections' silence index, the hang watch; and the deadline table
// that keeps NextDeadline and ExpireDeadlines in step.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runner/core/admission.h"
#include "runner/core/auth.h"
#include "runner/core/coordinator.h"
#include "runner/core/hang_watch.h"
#include "runner/core/links.h"
#include "runner/core/placement.h"
#include "runner/core/roster.h"
#include "schema/canonical.h"
#include "tests/core/core_test_util.h"
#include "tests/core/drivers.h"

namespace ddprun::core {
namespace {

using namespace std::chrono_literals;
using test::At;
using test::Edit;
using test::FindLog;
using test::kTwoNodeJob;
using test::SpecFromToml;
using Outcome = JoinVerdict::Outcome;

// ---- Admission ----------------------------------------------------------------------------

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest()
      : spec_(SpecFromToml(kTwoNodeJob)),
        canonical_(CanonicalForm(spec_)),
        fingerprint_(FingerprintOfCanonical(canonical_)),
        roster_(spec_, At(0s)) {}

  JoinFacts Facts(int claimed = 1) const {
    JoinFacts f;
    f.from = "10.0.0.2:4000";
    f.fingerprint = fingerprint_;
    f.canonical = canonical_;
    f.nnodes = 2;
    f.agents = 2;
    f.claimed = claimed >= 0 ? &roster_.at(claimed) : nullptr;
    return f;
  }
  wire::Join JoinOf(int node_rank, uint64_t instance = 7) const {
    return wire::Join{node_rank, "gpu-02", 2, "0.1.0", fingerprint_, canonical_, instance, "", "", ""};
  }

  JobSpec spec_;
  std::string canonical_;
  std::string fingerprint_;
  Roster roster_;
};

TEST_F(AdmissionTest, AJoinOfThisJobIsAdmitted) {
  const JoinVerdict v = JudgeJoin(Facts(), JoinOf(1));
  EXPECT_EQ(v.outcome, Outcome::kAdmit);
  EXPECT_FALSE(v.replaces_connection);
  EXPECT_EQ(v.differences, "");
}

TEST_F(AdmissionTest, WithASecretTheFirstJoinIsChallengedAndOnlyTheRightProofGetsIn) {
  JoinFacts facts = Facts();
  facts.secret = "s3cret";
  wire::Join hello = JoinOf(1);
  hello.nonce = "agent-nonce";
  EXPECT_EQ(JudgeJoin(facts, hello).outcome, Outcome::kChallenge);

  facts.nonce = "coordinator-nonce";
  wire::Join join = JoinOf(1);
  join.proof = JoinProof("s3cret", "coordinator-nonce", 1, fingerprint_);
  EXPECT_EQ(JudgeJoin(facts, join).outcome, Outcome::kAdmit);

  join.proof = JoinProof("other", "coordinator-nonce", 1, fingerprint_);
  const JoinVerdict wrong = JudgeJoin(facts, join);
  EXPECT_EQ(wrong.outcome, Outcome::kRefuse);
  EXPECT_EQ(wrong.reason,
            "a node from 10.0.0.2:4000 (claiming node rank 1) failed the shared-secret challenge: "
            "its secret differs from node 0's");
  EXPECT_EQ(wrong.why, "a peer from 10.0.0.2:4000 claiming this rank failed the shared-secret challenge");
  EXPECT_FALSE(wrong.retry);
}

TEST_F(AdmissionTest, SecretsMustAgree) {
  wire::Join hello = JoinOf(1);
  hello.nonce = "agent-nonce";
  const JoinVerdict theirs = JudgeJoin(Facts(), hello);
  EXPECT_EQ(theirs.outcome, Outcome::kRefuse);
  EXPECT_EQ(theirs.why, "it has a shared secret and node 0 has none");

  JoinFacts facts = Facts();
  facts.secret = "s3cret";
  const JoinVerdict ours = JudgeJoin(facts, JoinOf(1));
  EXPECT_EQ(ours.outcome, Outcome::kRefuse);
  EXPECT_EQ(ours.why, "it has no shared secret and node 0 requires one");
}

TEST_F(AdmissionTest, ARankOutOfRangeOrAnotherJobFileIsRefused) {
  const JoinVerdict range = JudgeJoin(Facts(-1), JoinOf(5));
  EXPECT_EQ(range.outcome, Outcome::kRefuse);
  EXPECT_EQ(range.reason,
            "node rank 5 (host gpu-02, from 10.0.0.2:4000) is out of range: the job has 2 nodes "
            "(ranks 0..1)");

  const JobSpec other = SpecFromToml(Edit(kTwoNodeJob, "max_restarts = 1", "max_restarts = 3"));
  wire::Join join = JoinOf(1);
  join.canonical = CanonicalForm(other);
  join.fingerprint = FingerprintOfCanonical(join.canonical);
  const JoinVerdict differs = JudgeJoin(Facts(), join);
  EXPECT_EQ(differs.outcome, Outcome::kRefuse);
  EXPECT_EQ(differs.reason,
            "node 1 (host gpu-02) runs a different job file than node 0:\n"
            "  restart.max_restarts: node 1 has 3, node 0 has 1\n"
            "hint: use the same job file on every node (ddprun check prints its fingerprint)");
  EXPECT_EQ(differs.why, "it runs a different job file");

  // A spare is named as the log names it, not "node 2" (agent 2 of a job of 2 nodes).
  JoinFacts with_spare = Facts(-1);
  with_spare.agents = 3;
  join.node_rank = 2;
  const JoinVerdict spare = JudgeJoin(with_spare, join);
  EXPECT_EQ(spare.reason.rfind("spare 0 (host gpu-02) runs a different job file than node 0:\n"
                               "  restart.max_restarts: spare 0 has 3, node 0 has 1\n",
                               0),
            0u)
      << spare.reason;
}

TEST_F(AdmissionTest, ARankHeldByAnotherAgentIsRefusedForNowAndTheSameAgentReplacesItsConnection) {
  roster_.SetConn(1, ConnId(5));
  roster_.at(1).instance = 7;
  roster_.at(1).host = "gpu-02";
  const JoinVerdict twice = JudgeJoin(Facts(), JoinOf(1, /*instance=*/8));
  EXPECT_EQ(twice.outcome, Outcome::kRefuse);
  EXPECT_TRUE(twice.retry);
  EXPECT_EQ(
      twice.reason.rfind("node rank 1 is claimed twice: by host gpu-02 (already joined) and by host gpu-02 "
                         "from 10.0.0.2:4000",
                         0),
      0u);
  const JoinVerdict again = JudgeJoin(Facts(), JoinOf(1, /*instance=*/7));
  EXPECT_EQ(again.outcome, Outcome::kAdmit);
  EXPECT_TRUE(again.replaces_connection);
}

TEST_F(AdmissionTest, AfterTheEndOnlyAnAgentThatTookPartHearsTheVerdict) {
  JoinFacts facts = Facts();
  facts.job_over = true;
  const JoinVerdict stranger = JudgeJoin(facts, JoinOf(1));
  EXPECT_EQ(stranger.outcome, Outcome::kRefuse);
  EXPECT_EQ(stranger.reason, "node 1 (host gpu-02) joined after the job ended");
  roster_.at(1).ever_joined = true;
  roster_.at(1).instance = 7;
  EXPECT_EQ(JudgeJoin(facts, JoinOf(1)).outcome, Outcome::kHearVerdict);
  // Another agent for the rank only after a takeover (the new holder does not know instances).
  EXPECT_EQ(JudgeJoin(facts, JoinOf(1, 9)).outcome, Outcome::kRefuse);
  facts.took_over = true;
  EXPECT_EQ(JudgeJoin(facts, JoinOf(1, 9)).outcome, Outcome::kHearVerdict);
}

// ---- The quarantine book ------------------------------------------------------------------

TEST(QuarantineBookTest, AHostSitsOutAfterEnoughFailuresWithinTheWindowForTwiceAsLongEachTime) {
  JobSpec::Quarantine policy;
  policy.failures = 2;
  policy.window = 10min;
  policy.cooldown = 30min;
  QuarantineBook book(policy);
  EXPECT_FALSE(book.Count("gpu-02", At(0s)));
  // Outside the window the first failure no longer counts.
  EXPECT_FALSE(book.Count("gpu-02", At(11min)));
  const auto first = book.Count("gpu-02", At(12min));
  ASSERT_TRUE(first);
  EXPECT_EQ(first->cooldown, 30min);
  EXPECT_EQ(first->times, 1);
  EXPECT_TRUE(book.Holds("gpu-02", At(41min)));
  EXPECT_FALSE(book.Holds("gpu-02", At(42min)));
  EXPECT_FALSE(book.Holds("gpu-03", At(13min)));
  EXPECT_EQ(book.Note(At(32min)), "quarantined: gpu-02 for 10m00s more");
  EXPECT_EQ(book.Sitting(At(32min)), 1);
  book.Count("gpu-02", At(50min));
  const auto second = book.Count("gpu-02", At(51min));
  ASSERT_TRUE(second);
  EXPECT_EQ(second->cooldown, 60min);
  EXPECT_EQ(second->times, 2);

  // What is recorded is what an earlier launch restores: the count goes on.
  const RecordQuarantine record = book.Record(At(61min));
  ASSERT_EQ(record.hosts.size(), 1u);
  EXPECT_EQ(record.hosts[0], (QuarantinedHost{"gpu-02", 50min, 2}));
  QuarantineBook restored(policy);
  EXPECT_EQ(restored.Restore(record.hosts, At(0s)), std::vector<std::string>{"gpu-02 for 50m00s more"});
  EXPECT_TRUE(restored.Holds("gpu-02", At(49min)));
  restored.Count("gpu-02", At(60min));
  EXPECT_EQ(restored.Count("gpu-02", At(61min))->cooldown, 120min);
}

// ---- The roster ---------------------------------------------------------------------------

TEST(RosterTest, CountsFollowConnectionsAndMovedRanks) {
  const JobSpec spec = SpecFromToml(Edit(kTwoNodeJob, "nodes = [\"gpu-01\", \"gpu-02\"]",
                                         "nodes = [\"gpu-01\", \"gpu-02\"]\nspares = [\"gpu-09\"]"));
  Roster roster(spec, At(0s));
  EXPECT_EQ(roster.agents(), 3);
  roster.SetConn(0, ConnId(1));
  roster.SetConn(2, ConnId(3));  // the spare
  EXPECT_EQ(roster.connected(), 2);
  EXPECT_FALSE(roster.PositionsFilled());
  EXPECT_EQ(roster.NodeName(2), "spare 0 (gpu-09)");
  roster.MoveRank(1, 2);
  EXPECT_TRUE(roster.PositionsFilled());
  // Named as it was started, whatever rank it holds: "node 1" stays gpu-02's name.
  EXPECT_EQ(roster.NodeName(2), "spare 0 (gpu-09, node rank 1)");
  EXPECT_EQ(roster.AgentName(2), "spare 0 (gpu-09)");
  EXPECT_EQ(roster.at(1).position, -1);
  roster.SetConn(2, std::nullopt);
  EXPECT_FALSE(roster.PositionsFilled());
  EXPECT_EQ(roster.connected(), 1);
  roster.players() = {0, 2};
  EXPECT_EQ(roster.RankName(3), "rank 3 (spare 0 (gpu-09, node rank 1), local rank 1)");
}

// ---- The connections' silence index --------------------------------------------------------

TEST(LinksTest, TheSilentAreFoundOldestFirstAndAWordHeardAgainClearsOne) {
  Links links;
  links.Accept(ConnId(3), "a", At(0s));
  links.Accept(ConnId(1), "b", At(0s));
  links.Accept(ConnId(2), "c", At(1s));
  links.Heard(ConnId(1), At(5s));
  links.Trim();
  EXPECT_EQ(links.OldestHeard(), At(0s));
  const auto silent = links.TakeSilent(At(8s), 6s);
  ASSERT_EQ(silent.size(), 2u);  // 3 (heard at 0 s), then 2 (at 1 s); 1 was heard again
  EXPECT_EQ(silent[0], (std::pair<TimePoint, ConnId>{At(0s), ConnId(3)}));
  EXPECT_EQ(silent[1], (std::pair<TimePoint, ConnId>{At(1s), ConnId(2)}));
  links.Erase(ConnId(3));
  links.Erase(ConnId(2));
  links.Trim();
  EXPECT_EQ(links.OldestHeard(), At(5s));
  EXPECT_TRUE(links.TakeSilent(At(11s), 6s).empty());
  links.HearAll(At(20s));
  links.Trim();
  EXPECT_EQ(links.OldestHeard(), At(20s));
}

// ---- The hang watch -----------------------------------------------------------------------

/// A roster where nodes 0 and 1 play node ranks 0 and 1.
Roster TwoPlayers(const JobSpec& spec) {
  Roster roster(spec, At(0s));
  roster.players() = {0, 1};
  roster.at(0).plays = 0;
  roster.at(1).plays = 1;
  return roster;
}

TEST(HangWatchTest, OnlyAPlayersOwnRankStartsAProbeWhichEndsWithEveryAnswer) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Roster roster = TwoPlayers(spec);
  HangWatch watch(spec, roster);
  std::vector<CoordinatorEffect> out;
  // Rank 0 is node 0's, not node 1's; a stale round is ignored too.
  EXPECT_FALSE(watch.OnRankHung(At(1s), 0, 1, wire::RankHung{0, 0, 0, 5, 60'000, 60'000, false}, out));
  EXPECT_FALSE(watch.OnRankHung(At(1s), 1, 1, wire::RankHung{0, 3, 1, 5, 60'000, 60'000, false}, out));
  EXPECT_FALSE(watch.DeadlineOf(HangWatch::Deadline::kProbe));
  ASSERT_TRUE(watch.OnRankHung(At(1s), 0, 1, wire::RankHung{0, 3, 1, 5, 60'000, 60'000, false}, out));
  EXPECT_EQ(watch.DeadlineOf(HangWatch::Deadline::kProbe), At(1s) + spec.timeouts.StacksWait());
  EXPECT_NE(FindLog(out, "round 0: rank 3 (node 1 (gpu-02), local rank 1) sent no progress beacon for 1m00s"),
            "");
  EXPECT_FALSE(watch.OnRankStacks(0, 1, wire::RankStacks{0, {{2, 7, 100, ""}, {3, 5, 60'000, ""}}}, 2));
  // The same node answering twice counts once.
  EXPECT_FALSE(watch.OnRankStacks(0, 1, wire::RankStacks{0, {}}, 2));
  EXPECT_TRUE(watch.OnRankStacks(0, 0, wire::RankStacks{0, {{0, 7, 100, ""}, {1, 7, 100, ""}}}, 2));
  const std::optional<RoundFailure> verdict = watch.Verdict(0, {});
  ASSERT_TRUE(verdict);
  const RoundFailure& failure = *verdict;
  EXPECT_EQ(failure.global_rank, 3);
  EXPECT_EQ(KindTexts(failure.kinds), std::vector<std::string>{"hang"});
  EXPECT_EQ(failure.what.rfind(
                "rank 3 (node 1 (gpu-02), local rank 1) hung: no progress for 1m00s after step 5", 0),
            0u)
      << failure.what;
  EXPECT_FALSE(watch.probing());
  EXPECT_EQ(watch.judgements(), 1u);
  EXPECT_EQ(watch.last_judgement().culprits, std::vector<int>{3});
}

// Issue 37: the stacks are the second look. A rank reported silent for its timeout that has
// progressed again by the time the stacks come back, with every other rank progressing too, is
// no hang: no verdict, no rank named (before, the ranks one step behind were called hung).
TEST(HangWatchTest, NoVerdictWhenNoRankIsStillSilentForTheTimeoutWhenTheStacksComeBack) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Roster roster = TwoPlayers(spec);
  HangWatch watch(spec, roster);
  std::vector<CoordinatorEffect> out;
  ASSERT_TRUE(watch.OnRankHung(At(1s), 0, 0, wire::RankHung{0, 0, 0, 372, 30'000, 30'000, false}, out));
  const std::string all_reduce =
      "File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 2501 in "
      "all_reduce\n"
      "File \"/job/train.py\", line 88 in train_step\n";
  EXPECT_FALSE(watch.OnRankStacks(
      0, 0, wire::RankStacks{0, {{0, 373, 687, all_reduce}, {1, 373, 687, all_reduce}}}, 2));
  EXPECT_TRUE(watch.OnRankStacks(
      0, 1, wire::RankStacks{0, {{2, 374, 120, all_reduce}, {3, 374, 90, all_reduce}}}, 2));
  EXPECT_FALSE(watch.Verdict(0, {}));
  EXPECT_FALSE(watch.probing());
  EXPECT_EQ(watch.judgements(), 0u);
  EXPECT_EQ(watch.clearances(), 1u);
  EXPECT_NE(watch.cleared().find(
                "round 0: no hang: rank 0 (node 0 (gpu-01), local rank 0) sent no progress beacon for "
                "30s, but when the stacks came back every rank had progressed again (the longest "
                "silence, rank 0 (node 0 (gpu-01), local rank 0)'s, was 687ms, under the 30s it passed)"),
            std::string::npos)
      << watch.cleared();

  // The same, but rank 3 is still silent for the timeout: it alone can be named, though ranks
  // 0 and 1 are a step behind it.
  ASSERT_TRUE(watch.OnRankHung(At(40s), 0, 0, wire::RankHung{0, 0, 0, 380, 30'000, 30'000, false}, out));
  EXPECT_FALSE(watch.OnRankStacks(
      0, 0, wire::RankStacks{0, {{0, 380, 900, all_reduce}, {1, 380, 900, all_reduce}}}, 2));
  EXPECT_TRUE(watch.OnRankStacks(
      0, 1, wire::RankStacks{0, {{2, 381, 500, all_reduce}, {3, 381, 31'000, all_reduce}}}, 2));
  const std::optional<RoundFailure> verdict = watch.Verdict(0, {});
  ASSERT_TRUE(verdict);
  EXPECT_EQ(verdict->global_rank, 3);
  EXPECT_EQ(watch.last_judgement().culprits, std::vector<int>{3});
}

// ---- The deadline table -------------------------------------------------------------------

// Every node joined, one of them on a quarantined host, and a spare may still come within
// timeouts.replace: the round waits for the spare past timeouts.rendezvous. The rendezvous
// deadline no longer applies (nobody is missing), so it must not be the next deadline: before
// the deadline table, NextDeadline kept returning it, in the past, and the driver spun.
class DeadlineTableTest : public ::testing::Test, public test::CoordinatorDriver {};

TEST_F(DeadlineTableTest, AFilledRendezvousWaitingForASpareDoesNotSpinPastTheRendezvousTimeout) {
  Use(Edit(Edit(Edit(kTwoNodeJob, "nodes = [\"gpu-01\", \"gpu-02\"]",
                     "nodes = [\"gpu-01\", \"gpu-02\"]\nspares = [\"gpu-09\"]"),
                "rendezvous = \"15m\"", "rendezvous = \"1m\""),
           "stop_grace = \"30s\"", "stop_grace = \"30s\"\nreplace = \"3m\""));
  std::vector<CoordinatorEffect> restored;
  coordinator_->RestoreQuarantine({{"gpu-02", 1h, 1}}, restored);
  Join(0s, 0);
  Join(0s, 1);
  // Feed checks that every next deadline lies after the input: through 1 m and on to 3 m.
  const Effects waited = BeatUntil(0s, 179s, {{0, 0}, {1, 0}});
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kRendezvous);
  EXPECT_EQ(FindLog(waited, "rendezvous failed"), "") << test::Describe(waited);
  // At 3 m no spare came: the quarantined host takes part after all.
  const Effects after = BeatUntil(179s, 181s, {{0, 0}, {1, 0}});
  EXPECT_NE(
      FindLog(after, "round 0: quarantined hosts take part after all: no spare waits to run without them"),
      "")
      << test::Describe(after);
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kStarting);
}

}  // namespace
}  // namespace ddprun::core
