// Each invariant of sim/invariants.h, broken on purpose: a misbehaving sequence of observations
// (what a buggy agent, coordinator or worker model would produce) must give the exact violation.
#include "sim/invariants.h"

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

using sim::Invariants;
using sim::RoundKey;
using sim::WorkerStart;

constexpr int64_t kSecond = 1'000'000'000;

// 2 nodes x 2 workers; stop bound 1m36s (30s grace + 3 x 2s + 1m), lease 1m06s.
class InvariantsTest : public ::testing::Test {
 protected:
  InvariantsTest()
      : invariants_(sim::InvariantBounds{2, 4, Seconds(96), Seconds(66), std::nullopt},
                    [this](int64_t at) { checks_.push_back(at); }) {
    invariants_.AddNode(0, "node 0");
    invariants_.AddNode(1, "node 1");
    invariants_.AddNode(2, "node 1 (extra agent on node-0002)");
  }

  // Starts the worker of `rank` on the node that holds it (2 per node) with a correct env.
  void Start(int64_t at_s, int round, int rank, uint32_t node = UINT32_MAX, uint64_t coordinator = 1) {
    WorkerStart start;
    start.node = node == UINT32_MAX ? static_cast<uint32_t>(rank / 2) : node;
    start.round = RoundKey{coordinator, round};
    start.world = 4;
    start.global_rank = rank;
    start.local_rank = rank % 2;
    start.pid = Pid(round, rank, coordinator) + (node == UINT32_MAX ? 0 : 50);
    start.rank_env = std::to_string(rank);
    start.world_env = "4";
    start.node_rank_env = std::to_string(rank / 2);
    invariants_.WorkerStarted(start);
    invariants_.AfterEvent(at_s * kSecond);
  }
  static uint64_t Pid(int round, int rank, uint64_t coordinator = 1) {
    return 1000 + 100 * coordinator + 10 * static_cast<uint64_t>(round) + static_cast<uint64_t>(rank);
  }
  void StartRound(int64_t at_s, int round) {
    for (int rank = 0; rank < 4; ++rank) Start(at_s, round, rank);
  }
  void End(int64_t at_s, int round, int rank, bool zero) {
    invariants_.WorkerEnded(Pid(round, rank), zero);
    invariants_.AfterEvent(at_s * kSecond);
  }
  // Heartbeats from the coordinator to every node, every 2 s from `from_s` to `to_s`.
  void Heartbeats(int64_t from_s, int64_t to_s, std::vector<uint32_t> nodes = {0, 1}) {
    for (int64_t t = from_s; t <= to_s; t += 2) {
      for (uint32_t node : nodes) invariants_.HeardFromCoordinator(node, t * kSecond);
      invariants_.AfterEvent(t * kSecond);
    }
  }
  std::string Violation() const { return invariants_.violation().value_or("(none)"); }

  Invariants invariants_;
  std::vector<int64_t> checks_;
};

TEST_F(InvariantsTest, ACorrectRoundBreaksNothing) {
  StartRound(20, 0);
  Heartbeats(20, 600);
  for (int rank = 0; rank < 4; ++rank) End(600, 0, rank, true);
  invariants_.AgentExited(0, 0, RoundKey{1, 0});
  invariants_.AgentExited(1, 0, RoundKey{1, 0});
  invariants_.AfterEvent(601 * kSecond);
  invariants_.AtEnd(601 * kSecond, sim::RunEnd{});
  EXPECT_FALSE(invariants_.violation()) << Violation();
}

TEST_F(InvariantsTest, WorldSizeThatDiffersFromTheJob) {
  WorkerStart start{1, RoundKey{1, 0}, 4, 2, 0, 1012, "2", "2", "1"};
  invariants_.WorkerStarted(start);
  invariants_.AfterEvent(20 * kSecond);
  EXPECT_EQ(Violation(), "node 1 rank 2: WORLD_SIZE=2 but the job has 4 ranks (at 20s)");
}

TEST_F(InvariantsTest, RankOutsideTheJob) {
  WorkerStart start{1, RoundKey{1, 0}, 4, 2, 0, 1012, "7", "4", "1"};
  invariants_.WorkerStarted(start);
  invariants_.AfterEvent(20 * kSecond);
  EXPECT_EQ(Violation(), "node 1: RANK=7 is not a rank of a 4-rank job (at 20s)");
}

TEST_F(InvariantsTest, RankStartedTwiceInOneRound) {
  StartRound(20, 0);
  End(30, 0, 3, false);
  Start(31, 0, 3, 1);
  EXPECT_EQ(Violation(), "round 0: rank 3 started twice (again on node 1) (at 31s)");
}

TEST_F(InvariantsTest, OneHolderPerRankAcrossNodes) {
  // Node 1 is lost with its worker still running (hung, ignoring SIGTERM); an extra agent that
  // claims node 1's rank starts rank 2 while the old holder runs.
  StartRound(20, 0);
  for (int rank : {0, 1, 3}) End(40, 0, rank, false);
  Start(45, 1, 2, 2);
  EXPECT_EQ(Violation(),
            "one holder per rank: rank 2 starts on node 1 (extra agent on node-0002) in round 1 "
            "while rank 2 of round 0 still runs on node 1 (pid 1102) (at 45s)");
}

TEST_F(InvariantsTest, OneRoundAtATime) {
  StartRound(20, 0);
  for (int rank : {0, 1, 2}) End(40, 0, rank, false);
  Start(45, 1, 0);
  EXPECT_EQ(Violation(),
            "one round at a time: node 0 starts round 1 while 1 worker(s) of round 0 still run "
            "(at 45s)");
}

TEST_F(InvariantsTest, RestartsBeyondTheBudget) {
  invariants_.CoordinatorRestarts(2);
  invariants_.AfterEvent(100 * kSecond);
  EXPECT_FALSE(invariants_.violation());
  invariants_.CoordinatorRestarts(3);
  invariants_.AfterEvent(200 * kSecond);
  EXPECT_EQ(Violation(), "the coordinator used 3 restarts; restart.max_restarts = 2 (at 3m20s)");
}

// etcd: two coordinators never act at once (Invariants::CheckCoordinatorStart), each clause.
TEST_F(InvariantsTest, ARoundNumberIsStartedByOneCoordinator) {
  invariants_.CoordinatorStartedRound(1, "node 0", RoundKey{1, 3});
  invariants_.AfterEvent(20 * kSecond);
  invariants_.CoordinatorGone(1);
  invariants_.AfterEvent(30 * kSecond);
  EXPECT_FALSE(invariants_.violation());
  invariants_.CoordinatorStartedRound(2, "node 1", RoundKey{1, 3});
  invariants_.AfterEvent(90 * kSecond);
  EXPECT_EQ(Violation(),
            "two coordinators act at once: round 3 was started by the coordinator on node 0 and "
            "again by the one on node 1 (at 1m30s)");
}

TEST_F(InvariantsTest, NoRoundWhileAnotherCoordinatorThatStartedALaterOneStillLeads) {
  invariants_.CoordinatorStartedRound(1, "node 0", RoundKey{1, 3});
  invariants_.AfterEvent(20 * kSecond);
  // A new holder that goes on from the state continues with later rounds: fine while the old
  // one lingers without acting (a hung agent).
  invariants_.CoordinatorStartedRound(2, "node 1", RoundKey{1, 4});
  invariants_.AfterEvent(90 * kSecond);
  EXPECT_FALSE(invariants_.violation()) << Violation();
  // The deposed one starts a round of its own (fencing failed).
  invariants_.CoordinatorStartedRound(1, "node 0", RoundKey{1, 5});
  invariants_.AfterEvent(95 * kSecond);
  invariants_.CoordinatorStartedRound(2, "node 1", RoundKey{1, 5});
  invariants_.AfterEvent(96 * kSecond);
  EXPECT_EQ(Violation(),
            "two coordinators act at once: round 5 was started by the coordinator on node 0 and "
            "again by the one on node 1 (at 1m36s)");
}

TEST_F(InvariantsTest, AnOldCoordinatorStartsNoRoundOnceANewOneStartedALaterOne) {
  invariants_.CoordinatorStartedRound(1, "node 0", RoundKey{1, 3});
  invariants_.AfterEvent(20 * kSecond);
  invariants_.CoordinatorStartedRound(2, "node 1", RoundKey{1, 4});
  invariants_.AfterEvent(90 * kSecond);
  // The old holder resumes and, unfenced, commits and starts the round it would have run next.
  invariants_.CoordinatorStartedRound(1, "node 0", RoundKey{1, 4});
  invariants_.AfterEvent(91 * kSecond);
  EXPECT_EQ(Violation(),
            "two coordinators act at once: round 4 was started by the coordinator on node 1 and "
            "again by the one on node 0 (at 1m31s)");
}

TEST_F(InvariantsTest, ANewCoordinatorStartsOnceTheOldOnesWorkersAreGone) {
  invariants_.CoordinatorStartedRound(1, "node 0", RoundKey{1, 0});
  invariants_.AfterEvent(19 * kSecond);
  StartRound(20, 0);
  for (int rank : {0, 1, 3}) End(40, 0, rank, false);
  invariants_.CoordinatorGone(1);
  invariants_.CoordinatorStartedRound(2, "node 1", RoundKey{1, 1});
  invariants_.AfterEvent(45 * kSecond);
  EXPECT_EQ(Violation(),
            "two coordinators act at once: the coordinator on node 1 starts round 1 while 1 "
            "worker(s) of round 0, which the one on node 0 started, still run (at 45s)");
}

TEST_F(InvariantsTest, AStartWhileAnotherLeadsWithALaterRound) {
  invariants_.CoordinatorStartedRound(1, "node 0", RoundKey{1, 7});
  invariants_.AfterEvent(20 * kSecond);
  invariants_.CoordinatorStartedRound(2, "node 1", RoundKey{1, 6});
  invariants_.AfterEvent(21 * kSecond);
  EXPECT_EQ(Violation(),
            "two coordinators act at once: the coordinator on node 1 starts round 6 while the "
            "one on node 0, which still holds its state, started round 7 (at 21s)");
}

TEST_F(InvariantsTest, TheJobEndsOnce) {
  // A new holder of an ended job tells the same verdict again: fine.
  invariants_.CoordinatorEnded(100 * kSecond, 1, "node 0", 1);
  invariants_.CoordinatorEnded(120 * kSecond, 1, "node 1", 1);
  // An agent started after the end begins a new launch, which ends on its own.
  invariants_.CoordinatorEnded(125 * kSecond, 2, "node 2", 3);
  EXPECT_FALSE(invariants_.violation());
  invariants_.CoordinatorEnded(130 * kSecond, 1, "spare 0", 0);
  EXPECT_EQ(Violation(),
            "the job ends once: the coordinator on node 0 ended it with exit code 1, the one on "
            "spare 0 with 0 (at 2m10s)");
}

TEST_F(InvariantsTest, AgentExitsWithWorkersRunning) {
  StartRound(20, 0);
  End(50, 0, 2, true);
  invariants_.AgentExited(1, 1, RoundKey{1, 0});
  invariants_.AfterEvent(51 * kSecond);
  EXPECT_EQ(Violation(), "node 1's agent exited with 1 worker(s) still running (at 51s)");
}

TEST_F(InvariantsTest, SuccessWithoutEveryRankExitingZero) {
  StartRound(20, 0);
  End(50, 0, 0, true);
  End(50, 0, 1, true);
  End(50, 0, 2, true);
  End(50, 0, 3, false);
  invariants_.AgentExited(0, 0, RoundKey{1, 0});
  invariants_.AfterEvent(51 * kSecond);
  EXPECT_EQ(Violation(), "node 0 exited 0 but only 3 of 4 ranks of round 0 exited 0 (at 51s)");
}

TEST_F(InvariantsTest, WorkerStillRunningPastTheStopBound) {
  StartRound(20, 0);
  Heartbeats(20, 98);
  End(100, 0, 0, false);
  invariants_.RoundFailed(RoundKey{1, 0});
  invariants_.AfterEvent(100 * kSecond);
  ASSERT_EQ(checks_.back(), 196 * kSecond) << "the bound schedules its own check";
  for (int rank : {1, 2}) End(110, 0, rank, false);
  Heartbeats(110, 194);
  EXPECT_FALSE(invariants_.violation());
  invariants_.AfterEvent(196 * kSecond);
  EXPECT_EQ(Violation(),
            "round 0 failed 1m36s ago but rank 3 on node 1 (pid 1103) still runs; every worker "
            "should be gone within 1m36s (at 3m16s)");
}

TEST_F(InvariantsTest, StopBoundStartsAgainWhenAHungAgentResumes) {
  StartRound(20, 0);
  Heartbeats(20, 98);
  invariants_.AgentHung(1, 150 * kSecond);  // resumes within its lease (last heard at 98 s)
  End(100, 0, 0, false);
  invariants_.RoundFailed(RoundKey{1, 0});
  invariants_.AfterEvent(100 * kSecond);
  End(101, 0, 1, false);
  // The bound would end at 196s; the agent resumed at 150s, so it ends at 246s. (The old
  // checker rescheduled itself for the same instant here and never fired.)
  Heartbeats(150, 244, {1});
  EXPECT_FALSE(invariants_.violation()) << Violation();
  ASSERT_NE(std::find(checks_.begin(), checks_.end(), 246 * kSecond), checks_.end());
  invariants_.AfterEvent(246 * kSecond);
  EXPECT_EQ(Violation(),
            "round 0 failed 2m26s ago but rank 2 on node 1 (pid 1102) still runs; every worker "
            "should be gone within 1m36s (at 4m06s)");
}

TEST_F(InvariantsTest, WorkerOutlivesItsAgentsLease) {
  // Node 1 stops hearing from the coordinator at 100s (a partition); its agent must have killed
  // its workers by 100s + 1m06s.
  StartRound(20, 0);
  Heartbeats(20, 100);
  Heartbeats(102, 300, {0});
  EXPECT_EQ(Violation(),
            "rank 2 on node 1 (pid 1102) still runs 1m06s after its agent last heard from the "
            "coordinator; an agent (or the guardian of a hung one) stops its workers within 1m06s "
            "(at 2m46s)");
}

// A hung agent cannot stop its workers, but its guardian kills them when their lease ends: the
// lease runs from the last word heard, not from when the agent resumes (it used to, which let a
// guardian that counted from the agent's pause pass the checks).
TEST_F(InvariantsTest, TheLeaseHoldsWhileTheAgentIsHung) {
  StartRound(20, 0);
  Heartbeats(20, 100);
  invariants_.AgentHung(1, 200 * kSecond);
  Heartbeats(102, 164, {0});
  EXPECT_FALSE(invariants_.violation()) << Violation();
  Heartbeats(166, 166, {0});
  EXPECT_EQ(Violation(),
            "rank 2 on node 1 (pid 1102) still runs 1m06s after its agent last heard from the "
            "coordinator (the agent is hung); an agent (or the guardian of a hung one) stops its "
            "workers within 1m06s (at 2m46s)");
}

TEST_F(InvariantsTest, TheLeaseHoldsForAnAgentHungForGood) {
  StartRound(20, 0);
  Heartbeats(20, 100);
  invariants_.AgentHung(1, INT64_MAX);
  Heartbeats(102, 166, {0});
  EXPECT_EQ(Violation(),
            "rank 2 on node 1 (pid 1102) still runs 1m06s after its agent last heard from the "
            "coordinator (the agent is hung); an agent (or the guardian of a hung one) stops its "
            "workers within 1m06s (at 2m46s)");
}

TEST_F(InvariantsTest, StoreRelayConnectsAClientToAnotherRoundsStore) {
  StartRound(20, 0);
  invariants_.StoreConnected(Pid(0, 3), RoundKey{1, 0}, RoundKey{1, 0}, 40000);
  invariants_.AfterEvent(21 * kSecond);
  EXPECT_FALSE(invariants_.violation()) << Violation();
  invariants_.StoreConnected(Pid(0, 2), RoundKey{1, 0}, RoundKey{1, 1}, 40001);
  invariants_.AfterEvent(22 * kSecond);
  EXPECT_EQ(Violation(),
            "store relay: rank 2 on node 1 (pid 1102) of round 0 reached the store of round 1 "
            "(port 40001) (at 22s)");
}

TEST_F(InvariantsTest, HangWhenNothingIsLeftToHappen) {
  sim::RunEnd end;
  end.deadlock = true;
  end.unfinished = {"node 1"};
  end.unfinished_count = 1;
  invariants_.AtEnd(300 * kSecond, end);
  EXPECT_EQ(Violation(), "hang: nothing left to happen but node 1 never finished (at 5m00s)");
}

TEST_F(InvariantsTest, HangPastTheLivenessBound) {
  sim::RunEnd end;
  end.liveness_limit = true;
  end.limit_ns = 3600 * kSecond;
  end.unfinished = {"node 0", "node 1"};
  end.unfinished_count = 2;
  invariants_.AtEnd(3600 * kSecond, end);
  EXPECT_EQ(Violation(),
            "hang: node 0, node 1 still running 1h00m after the start, past the liveness bound "
            "(all faults healed; the restart budget bounds the rounds) (at 1h00m)");
}

TEST_F(InvariantsTest, HangAtMaxTime) {
  sim::RunEnd end;
  end.max_time = Hours(24);
  end.unfinished = {"node 1"};
  end.unfinished_count = 1;
  invariants_.AtEnd(86400 * kSecond, end);
  EXPECT_EQ(Violation(), "hang: node 1 still running when simulate.max_time = 1d was reached (at 1d00h)");
}

TEST_F(InvariantsTest, ExitOneWithRestartsLeft) {
  sim::RunEnd end;
  end.exit_code = 1;
  end.restarts_used = 1;
  invariants_.AtEnd(300 * kSecond, end);
  EXPECT_EQ(Violation(), "the job failed (exit 1) with restarts left (1 of 2 used) (at 5m00s)");
}

// Issue 26: a round whose ranks all hang for good with no timeouts.progress cannot be ended by
// anything: no end is owed. The same run with an end owed is still a hang (above).
TEST_F(InvariantsTest, NoEndIsOwedWhenEveryRankHangsForGoodWithoutAProgressTimeout) {
  sim::RunEnd end;
  end.liveness_limit = true;
  end.limit_ns = 3600 * kSecond;
  end.unfinished = {"node 0", "node 1"};
  end.unfinished_count = 2;
  end.stuck_for_good = true;
  invariants_.AtEnd(3600 * kSecond, end);
  EXPECT_FALSE(invariants_.violation()) << Violation();
}

// Issue 26: restart.never_on ends the job at once, with restarts left, by design.
TEST_F(InvariantsTest, ExitOneWithRestartsLeftIsAskedForByNeverOn) {
  sim::RunEnd end;
  end.exit_code = 1;
  end.restarts_used = 1;
  end.ended_by_rule = true;
  invariants_.AtEnd(300 * kSecond, end);
  EXPECT_FALSE(invariants_.violation()) << Violation();
}

TEST_F(InvariantsTest, ExitThreeWithoutAFaultThatKeptANodeAway) {
  sim::RunEnd end;
  end.exit_code = 3;
  invariants_.AtEnd(300 * kSecond, end);
  EXPECT_EQ(Violation(),
            "the rendezvous failed (exit 3) although no fault kept a node away long enough "
            "(at 5m00s)");
}

// Hung ranks (timeouts.progress = 2m): a round that a hung rank stalled is stopped within the
// silence allowed + 1m (stacks, stop and slack in these bounds), and a verdict that had the hung
// rank's stack names it.
class HangInvariantsTest : public InvariantsTest {
 protected:
  HangInvariantsTest()
      : hangs_(sim::InvariantBounds{2, 4, Seconds(96), Seconds(66),
                                    sim::HangBounds{Minutes(2), Minutes(10), 5, Seconds(10), Minutes(1)}},
               [this](int64_t at) { checks_.push_back(at); }) {
    hangs_.AddNode(0, "node 0");
    hangs_.AddNode(1, "node 1");
  }
  void StartAndStep(int64_t at_s) {
    for (int rank = 0; rank < 4; ++rank) {
      WorkerStart start{static_cast<uint32_t>(rank / 2),
                        RoundKey{1, 0},
                        4,
                        rank,
                        rank % 2,
                        Pid(0, rank),
                        std::to_string(rank),
                        "4",
                        std::to_string(rank / 2)};
      hangs_.WorkerStarted(start);
    }
    hangs_.AfterEvent(at_s * kSecond);
    for (int64_t t = at_s + 20; t <= at_s + 30; ++t) {
      for (int rank = 0; rank < 4; ++rank) hangs_.StepBeacon(Pid(0, rank), t * kSecond);
      Beat(t);
    }
  }
  void Beat(int64_t t) {
    hangs_.HeardFromCoordinator(0, t * kSecond);
    hangs_.HeardFromCoordinator(1, t * kSecond);
    hangs_.AfterEvent(t * kSecond);
  }
  std::string HangViolation() const { return hangs_.violation().value_or("(none)"); }

  Invariants hangs_;
};

TEST_F(HangInvariantsTest, AHungRoundStillRunningPastTheBound) {
  StartAndStep(0);
  hangs_.GangHung(RoundKey{1, 0}, {3});
  hangs_.AfterEvent(31 * kSecond);
  ASSERT_EQ(checks_.back(), (31 + 180) * kSecond) << "2m of silence, then 1m";
  for (int64_t t = 32; t < 211; t += 2) Beat(t);
  EXPECT_FALSE(hangs_.violation()) << HangViolation();
  Beat(211);
  EXPECT_EQ(HangViolation(),
            "round 0 stopped training 3m00s ago because rank 3 hung, but rank 0 on node 0 (pid "
            "1100) still runs; with timeouts.progress the round is stopped within 3m00s (a silence "
            "of 2m00s, then the stacks, the stop and slack) (at 3m31s)");
}

TEST_F(HangInvariantsTest, ARoundStoppedInTimeOrRunningAgainBreaksNothing) {
  StartAndStep(0);
  hangs_.GangHung(RoundKey{1, 0}, {3});
  hangs_.AfterEvent(31 * kSecond);
  hangs_.GangResumed(RoundKey{1, 0});  // the hang healed before any agent saw it
  for (int64_t t = 32; t < 400; t += 2) Beat(t);
  EXPECT_FALSE(hangs_.violation()) << HangViolation();
  hangs_.GangHung(RoundKey{1, 0}, {1});
  hangs_.AfterEvent(400 * kSecond);
  for (int64_t t = 402; t < 560; t += 2) Beat(t);
  hangs_.RoundFailed(RoundKey{1, 0});
  for (int rank = 0; rank < 4; ++rank) hangs_.WorkerEnded(Pid(0, rank), false);
  for (int64_t t = 560; t < 700; t += 2) Beat(t);
  EXPECT_FALSE(hangs_.violation()) << HangViolation();
}

TEST_F(HangInvariantsTest, BeforeTheFirstStepProgressStartApplies) {
  for (int rank = 0; rank < 4; ++rank) {
    hangs_.WorkerStarted(WorkerStart{static_cast<uint32_t>(rank / 2), RoundKey{1, 0}, 4, rank, rank % 2,
                                     Pid(0, rank), std::to_string(rank), "4", std::to_string(rank / 2)});
  }
  hangs_.AfterEvent(0);
  hangs_.GangHung(RoundKey{1, 0}, {2});
  hangs_.AfterEvent(10 * kSecond);
  EXPECT_EQ(checks_.back(), (10 + 660) * kSecond) << "10m of silence, then 1m";
}

TEST_F(HangInvariantsTest, AHungAgentRestartsTheBound) {
  StartAndStep(0);
  hangs_.GangHung(RoundKey{1, 0}, {3});
  hangs_.AfterEvent(31 * kSecond);
  hangs_.AgentHung(1, 200 * kSecond);  // node 1's agent cannot see the silence until 200 s
  for (int64_t t = 32; t < 380; t += 2) Beat(t);
  EXPECT_FALSE(hangs_.violation()) << HangViolation();
  Beat(380);
  EXPECT_THAT(HangViolation(),
              ::testing::HasSubstr("round 0 stopped training 5m49s ago because rank 3 hung"));
}

TEST_F(HangInvariantsTest, AVerdictThatNamesARankThatDidNotHang) {
  StartAndStep(0);
  hangs_.GangHung(RoundKey{1, 0}, {3});
  hangs_.AfterEvent(31 * kSecond);
  for (int64_t t = 32; t < 152; t += 2) Beat(t);
  for (int rank = 0; rank < 4; ++rank)
    hangs_.StacksTaken(RoundKey{1, 0}, rank, rank == 3, /*training=*/false);
  hangs_.AfterEvent(152 * kSecond);
  hangs_.HangJudged(RoundKey{1, 0}, {3}, {0, 1, 2, 3});
  hangs_.AfterEvent(157 * kSecond);
  EXPECT_FALSE(hangs_.violation()) << HangViolation();
  // Without the hung rank's stack, the coordinator can only guess: not held to it.
  hangs_.HangJudged(RoundKey{1, 0}, {0}, {0, 1, 2});
  hangs_.AfterEvent(158 * kSecond);
  EXPECT_FALSE(hangs_.violation()) << HangViolation();
  hangs_.HangJudged(RoundKey{1, 0}, {2}, {0, 1, 2, 3});
  hangs_.AfterEvent(159 * kSecond);
  EXPECT_EQ(HangViolation(),
            "round 0 was stopped as hung naming rank 2, which did not hang; rank 3 hung (its "
            "stack was taken) (at 2m39s)");
}

// Issue 37: a rank stalled for almost timeouts.progress and went on; the stacks were taken while
// every rank trained, and the ranks one step behind were called hung. The checker passed it
// (no hung rank's stack to hold the verdict to); a verdict given while the round trained at
// every stack taken names ranks that did not hang.
TEST_F(HangInvariantsTest, AVerdictGivenWhileEveryRankTrainedNamesRanksThatDidNotHang) {
  StartAndStep(0);
  for (int64_t t = 2; t < 40; t += 2) Beat(t);
  for (int rank = 0; rank < 4; ++rank) hangs_.StacksTaken(RoundKey{1, 0}, rank, false, /*training=*/true);
  hangs_.AfterEvent(40 * kSecond);
  EXPECT_FALSE(hangs_.violation()) << HangViolation();
  hangs_.HangJudged(RoundKey{1, 0}, {1, 0}, {0, 1, 2, 3});
  hangs_.AfterEvent(41 * kSecond);
  EXPECT_EQ(HangViolation(),
            "round 0 was stopped as hung naming rank 0, 1, but every rank was training when the "
            "stacks were taken: none hung (at 41s)");
}

// Hot spares: agent 3 is spare 0. Starts `rank` on `node` as node rank `plays`.
class SpareInvariantsTest : public InvariantsTest {
 protected:
  SpareInvariantsTest() { invariants_.AddNode(3, "spare 0", /*spare=*/true); }
  void StartAs(int64_t at_s, int round, int rank, uint32_t node, int plays, uint64_t pid) {
    WorkerStart start{node, RoundKey{1, round},   4, rank, rank % 2, pid, std::to_string(rank),
                      "4",  std::to_string(plays)};
    invariants_.WorkerStarted(start);
    invariants_.AfterEvent(at_s * kSecond);
  }
};

TEST_F(SpareInvariantsTest, ASpareThatTakesALostNodesRankBreaksNothing) {
  StartRound(20, 0);
  // Node 1 is lost: its workers are gone (crashed) before the spare's round starts.
  for (int rank = 0; rank < 4; ++rank) End(40, 0, rank, false);
  Start(100, 1, 0, 0);
  Start(100, 1, 1, 0);
  StartAs(100, 1, 2, 3, 1, 5002);
  StartAs(100, 1, 3, 3, 1, 5003);
  EXPECT_FALSE(invariants_.violation()) << Violation();
}

TEST_F(SpareInvariantsTest, ASpareNeverPlaysNodeRankZero) {
  StartAs(20, 0, 0, 3, 0, 5000);
  EXPECT_EQ(Violation(),
            "a spare never plays node rank 0: spare 0 starts rank 0 of round 0 as node rank 0 (at 20s)");
}

TEST_F(SpareInvariantsTest, OneHolderPerNodeRankInARound) {
  // Node 1 runs rank 2 of node rank 1; the spare starts rank 3 as node rank 1 in the same round.
  Start(20, 0, 0);
  Start(20, 0, 1);
  Start(20, 0, 2);
  StartAs(21, 0, 3, 3, 1, 5003);
  EXPECT_EQ(Violation(),
            "one holder per node rank: round 0 runs node rank 1 on both node 1 and spare 0 (at 21s)");
}

TEST_F(SpareInvariantsTest, FencingANewHolderWaitsForTheOldHoldersWorkers) {
  // Node 1 is lost while its rank 3 still runs; the spare takes node rank 1 in round 1 and
  // starts rank 2 first (free as a rank, but its node rank's old holder still runs).
  StartRound(20, 0);
  for (int rank : {0, 1, 2}) End(40, 0, rank, false);
  StartAs(45, 1, 2, 3, 1, 5002);
  EXPECT_EQ(Violation(),
            "fencing: spare 0 starts node rank 1 in round 1 while 1 worker(s) of node 1 that held "
            "it in round 0 still run (at 45s)");
}

TEST_F(SpareInvariantsTest, AWaitingSpareVouchesForTheJobsLastRound) {
  // A spare that ran nothing exits 0: only if every rank of the job's last round exited 0.
  StartRound(20, 0);
  Heartbeats(20, 600);
  for (int rank = 0; rank < 4; ++rank) End(600, 0, rank, rank != 3);
  invariants_.AgentExited(3, 0, std::nullopt);
  invariants_.AfterEvent(601 * kSecond);
  EXPECT_EQ(Violation(), "spare 0 exited 0 but only 3 of 4 ranks of round 0 exited 0 (at 10m01s)");
}

TEST_F(SpareInvariantsTest, AWaitingSpareExitsZeroAfterASuccessfulRound) {
  StartRound(20, 0);
  Heartbeats(20, 600);
  for (int rank = 0; rank < 4; ++rank) End(600, 0, rank, true);
  invariants_.AgentExited(3, 0, std::nullopt);
  invariants_.AfterEvent(601 * kSecond);
  EXPECT_FALSE(invariants_.violation()) << Violation();
}

TEST_F(SpareInvariantsTest, WorldSizeOutsideItsBounds) {
  // Every rank agrees on WORLD_SIZE=6, but the job has 2 nodes x 2 workers.
  WorkerStart start{0, RoundKey{1, 0}, 6, 0, 0, 1000, "0", "6", "0"};
  invariants_.WorkerStarted(start);
  invariants_.AfterEvent(20 * kSecond);
  EXPECT_EQ(Violation(),
            "world size: round 0 runs with WORLD_SIZE=6 (node 0 rank 0); the job allows 4 (at 20s)");
}

TEST_F(SpareInvariantsTest, WorldSizeBoundsAreARange) {
  // A job that may shrink to 1 node: 2 ranks are allowed, 6 are not.
  invariants_.SetWorldBounds(2, 4);
  WorkerStart small{0, RoundKey{1, 0}, 2, 0, 0, 1000, "0", "2", "0"};
  invariants_.WorkerStarted(small);
  invariants_.AfterEvent(20 * kSecond);
  EXPECT_FALSE(invariants_.violation()) << Violation();
  invariants_.WorkerEnded(1000, false);
  invariants_.AfterEvent(30 * kSecond);
  WorkerStart big{0, RoundKey{1, 1}, 6, 0, 0, 1001, "0", "6", "0"};
  invariants_.WorkerStarted(big);
  invariants_.AfterEvent(40 * kSecond);
  EXPECT_EQ(Violation(),
            "world size: round 1 runs with WORLD_SIZE=6 (node 0 rank 0); the job allows 2..4 (at 40s)");
}

// Through the whole simulator: a misbehaving node (a test-only sabotage) makes the invariant
// fire in a real run, printed as the user sees it.
using Sabotage = sim::SimOptions::Sabotage;

TEST(InvariantsFireInTheSimulatorTest, WrongWorldSize) {
  const SimRun run = Simulate(SmallJob(), {}, std::nullopt, false, Sabotage::kWrongWorldSize);
  EXPECT_EQ(run.result.exit_code, 70);
  EXPECT_EQ(run.result.violation.value_or(""),
            "node 1 rank 2: WORLD_SIZE=5 but the job has 4 ranks (at 0ms)");
  EXPECT_THAT(run.output,
              ::testing::HasSubstr("] INVARIANT VIOLATED: node 1 rank 2: WORLD_SIZE=5 but the job has 4 "
                                   "ranks\n"));
}

TEST(InvariantsFireInTheSimulatorTest, RankStartedWhileItsHolderRuns) {
  const SimRun run = Simulate(SmallJob(), {}, std::nullopt, false, Sabotage::kSpawnTwice);
  EXPECT_EQ(run.result.violation.value_or(""),
            "one holder per rank: rank 2 starts on node 1 in round 0 while rank 2 "
            "of round 0 still runs on node 1 (pid 1003) (at 0ms)");
}

TEST(InvariantsFireInTheSimulatorTest, UnkillableWorkersOutliveTheRound) {
  const SimRun run = Simulate(SmallJob(), {"worker-exit@7m:node=0,local_rank=0,exit_code=3"}, std::nullopt,
                              false, Sabotage::kUnkillableWorkers);
  // The agent gives up on workers that survive SIGKILL and rejoins; the next round must not
  // start their ranks while they run.
  EXPECT_EQ(run.result.violation.value_or(""),
            "one round at a time: node 0 starts round 1 while 2 worker(s) of round 0 still run (at 7m50s)");
}

TEST(InvariantsFireInTheSimulatorTest, UnkillableWorkersOutliveTheirAgentsLease) {
  const SimRun run = Simulate(SmallJob(), {"partition@6m:node=1,duration=5m"}, std::nullopt, false,
                              Sabotage::kUnkillableWorkers);
  EXPECT_EQ(run.result.violation.value_or(""),
            "rank 2 on node 1 (pid 1002) still runs 1m06s after its agent last "
            "heard from the coordinator; an agent (or the guardian of a hung "
            "one) stops its workers within 1m06s (at 7m04s)");
}

TEST(InvariantsFireInTheSimulatorTest, ASparePlayingNodeRankZero) {
  // One spare; node 1 crashes for good and the spare takes its rank, but its workers say they
  // play node rank 0.
  std::string job = SmallJob();
  job.replace(job.find("nproc_per_node = 2\n"), 19, "nproc_per_node = 2\nspares = 1\n");
  const SimRun run =
      Simulate(job, {"node-crash@5m:node=1"}, std::nullopt, false, Sabotage::kSparePlaysNodeZero);
  EXPECT_EQ(run.result.exit_code, 70);
  EXPECT_THAT(run.result.violation.value_or(""),
              ::testing::StartsWith(
                  "a spare never plays node rank 0: spare 0 starts rank 2 of round 1 as node rank 0"));
}

std::string ProgressJob(std::string_view progress) {
  std::string job = SmallJob();
  const std::string timeouts = "[timeouts]\nrendezvous = \"5m\"\n";
  job.replace(job.find(timeouts), timeouts.size(), timeouts + std::string(progress) + "\n");
  return job;
}

TEST(InvariantsFireInTheSimulatorTest, AHangNobodySeesOutlivesTheHangBound) {
  // Workers that beacon from a thread keep "stepping" while their gang stalls: no agent sees the
  // hang, and the round runs on until the NCCL watchdog's 10 minutes.
  const SimRun run = Simulate(ProgressJob("progress = \"2m\""), {"worker-hang@5m:node=1,local_rank=1"},
                              std::nullopt, false, Sabotage::kBeaconsFromAThread);
  EXPECT_EQ(
      run.result.violation.value_or(""),
      "round 0 stopped training 3m23s ago because rank 3 hung, but rank 0 on node 0 (pid 1000) still runs; "
      "with timeouts.progress the round is stopped within 3m23s (a silence of 2m00s, then the stacks, the "
      "stop and slack) (at 8m23s)");
}

TEST(InvariantsFireInTheSimulatorTest, AVerdictNamingARankThatDidNotHang) {
  // Node 1's stacks lie: its hung rank 3 shows an all_reduce, its rank 2 a data-loader wait.
  const SimRun run = Simulate(ProgressJob("progress = \"2m\""), {"worker-hang@5m:node=1,local_rank=1"},
                              std::nullopt, false, Sabotage::kHungStackLooksWaiting);
  EXPECT_THAT(
      run.result.violation.value_or(""),
      ::testing::StartsWith("round 0 was stopped as hung naming rank 2, which did not hang; rank 3 hung "
                            "(its stack was taken) (at 7m"));
  EXPECT_THAT(run.output,
              ::testing::HasSubstr("] INVARIANT VIOLATED: round 0 was stopped as hung naming rank 2"));
}

}  // namespace
}  // namespace ddprun::testing
