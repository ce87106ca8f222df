// Predicted versus actual (report/replay.h): a real run's failures become simulator faults at
// their times, node 0's records become the sequence both sides are compared on, and where two
// sequences part is marked.

#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "report/event_log.h"
#include "report/replay.h"
#include "schema/loader.h"

namespace ddprun::report {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string Line(const std::string& type, int64_t ms, int node, const std::string& extra = "") {
  return fmt::format(R"({{"v":1,"event":"{}","unix_ms":{},"mono_ms":{},"node":{},"host":"h{}"{}{}}})", type,
                     1'700'000'000'000 + ms, 5'000 + ms, node, node, extra.empty() ? "" : ",", extra) +
         "\n";
}
std::string Start(int64_t ms, int node) {
  return Line("agent-start", ms, node, R"("job":"j","fingerprint":"abc","nnodes":3,"spares":0,"nproc":2)");
}

JobSpec Spec() {
  auto loaded = ParseJobText(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nnnodes = 3\nnproc_per_node = 2\n"
      "[timeouts]\nheartbeat = \"1s\"\n",
      "job.toml");
  EXPECT_TRUE(loaded.spec);
  return loaded.spec ? *loaded.spec : JobSpec{};
}

struct Files {
  std::vector<EventFile> files;
  std::vector<Run> runs;
  void Add(const std::string& path, const std::string& text) {
    auto file = ParseEventFile(path, text);
    ASSERT_TRUE(file) << file.error();
    files.push_back(*file);
  }
  const Run& Group() {
    auto grouped = GroupRuns(files);
    EXPECT_TRUE(grouped) << grouped.error();
    runs = *grouped;
    return runs.front();
  }
};

// Node 0 starts at 0; node 2 starts 5 s late. Round 0: rank 3 (node 1) exits 7 at 20 s; a
// first record blames a rank that only lost its peer, the revision names rank 3. Round 1:
// node 2 is lost (silent) at 40 s and comes back at 70 s. Round 2: rank 1 on node 0 hangs,
// silent since 90 s. Round 3 succeeds at 130 s.
std::string NodeZero() {
  return Start(0, 0) + Line("round-begin", 6'000, 0, R"("round":0,"restarts_used":0,"nodes":3)") +
         Line("round-failed", 20'010, 0,
              R"("round":0,"peer":2,"rank":4,"kinds":["lost-peer","exit:1"],"cause":"x")") +
         Line("round-failed", 20'020, 0,
              R"("round":0,"peer":1,"rank":3,"kinds":["ValueError","exit:7"],"cause":"y")") +
         Line("restart", 21'000, 0, R"("restart":1,"max_restarts":5,"round":1,"backoff_ms":0)") +
         Line("round-begin", 22'000, 0, R"("round":1,"restarts_used":1,"nodes":3)") +
         Line("node-lost", 43'000, 0, R"("peer":2,"reason":"silent for 3 heartbeats")") +
         Line("round-failed", 43'001, 0,
              R"("round":1,"peer":2,"rank":-1,"kinds":["lost-node"],"cause":"z")") +
         Line("restart", 44'000, 0, R"("restart":2,"max_restarts":5,"round":2,"backoff_ms":0)") +
         Line("round-begin", 75'000, 0, R"("round":2,"restarts_used":2,"nodes":3)") +
         Line("hang", 100'000, 0,
              R"("round":2,"rank":1,"local_rank":1,"step":4,"silent_ms":10000,"timeout_ms":10000)") +
         Line("round-failed", 101'000, 0, R"("round":2,"peer":0,"rank":1,"kinds":["hang"],"cause":"w")") +
         Line("restart", 102'000, 0, R"("restart":3,"max_restarts":5,"round":3,"backoff_ms":0)") +
         Line("round-begin", 103'000, 0, R"("round":3,"restarts_used":3,"nodes":3)") +
         Line("job-result", 130'000, 0, R"("exit_code":0,"restarts_used":3,"summary":"ok")");
}

TEST(ReplayTest, TheSequenceIsNodeZerosRoundsWithTheLastRevisionOfEachRootCause) {
  Files f;
  f.Add("n0", NodeZero());
  const report::Run& run = f.Group();
  EXPECT_THAT(
      RoundSequence(CoordinatorRecords(run)),
      ElementsAre("round 0 begins on 3 nodes", "round 0 fails: rank 3 (node 1), exit:7", "restart 1 of 5",
                  "round 1 begins on 3 nodes", "round 1 fails: node 2, lost-node", "restart 2 of 5",
                  "round 2 begins on 3 nodes", "round 2 fails: rank 1 (node 0), hang", "restart 3 of 5",
                  "round 3 begins on 3 nodes", "the job ends with exit code 0"));
}

TEST(ReplayTest, TheRunsFailuresBecomeFaultsAtTheirTimes) {
  Files f;
  f.Add("n0", NodeZero());
  f.Add("n1", Start(100, 1) +
                  Line("worker-exit", 19'900, 1,
                       R"("round":0,"rank":3,"local_rank":1,"exit_code":7,"signal":0,"stopped":false)"));
  f.Add("n2", Start(5'000, 2) +
                  Line("worker-exit", 20'500, 2,
                       R"("round":0,"rank":4,"local_rank":0,"exit_code":1,"signal":0,"stopped":true)"));
  f.Add("n2b", Start(70'000, 2));
  const report::Run& run = f.Group();
  const ReplayPlan plan = PlanReplay(run, Spec());
  ASSERT_EQ(plan.faults.size(), 4u);
  // Node 2 started 5 s after node 0.
  EXPECT_EQ(plan.faults[0].kind, FaultKind::kSlowJoiner);
  EXPECT_EQ(plan.faults[0].node, 2);
  EXPECT_EQ(plan.faults[0].duration, 5s);
  // Rank 3's own exit, when its worker exited (not when node 0 heard of it).
  EXPECT_EQ(plan.faults[1].kind, FaultKind::kWorkerExit);
  EXPECT_EQ(plan.faults[1].at, 19'900ms);
  EXPECT_EQ(plan.faults[1].node, 1);
  EXPECT_EQ(plan.faults[1].local_rank, 1);
  EXPECT_EQ(plan.faults[1].exit_code, 7);
  // Node 2 went silent a loss bound (3 s) before node 0 gave up on it, and came back at 70 s.
  EXPECT_EQ(plan.faults[2].kind, FaultKind::kNodeCrash);
  EXPECT_EQ(plan.faults[2].at, 40s);
  EXPECT_EQ(plan.faults[2].node, 2);
  EXPECT_EQ(plan.faults[2].reboot_after, 30s);
  // Rank 1 hung from its last beacon, 10 s before it was reported.
  EXPECT_EQ(plan.faults[3].kind, FaultKind::kWorkerHang);
  EXPECT_EQ(plan.faults[3].at, 90s);
  EXPECT_EQ(plan.faults[3].node, 0);
  EXPECT_EQ(plan.faults[3].local_rank, 1);
  // The last round trained from its start to the result.
  EXPECT_EQ(plan.train_time, 27s - plan.worker_startup);
  EXPECT_TRUE(plan.notes.empty());
}

TEST(ReplayTest, WhereTheSequencesPartIsMarked) {
  const auto same = CompareSequences({"round 0 begins on 2 nodes", "the job ends with exit code 0"},
                                     {"round 0 begins on 2 nodes", "the job ends with exit code 0"});
  EXPECT_TRUE(same.match);
  EXPECT_THAT(same.text, HasSubstr("the sequences match (2 steps)"));
  const auto differ =
      CompareSequences({"round 0 begins on 2 nodes", "restart 1 of 2", "the job ends with exit code 0"},
                       {"round 0 begins on 2 nodes", "the job ends with exit code 1"});
  EXPECT_FALSE(differ.match);
  EXPECT_THAT(differ.text, HasSubstr("! restart 1 of 2                  the job ends with exit code 1\n"));
  EXPECT_THAT(differ.text, HasSubstr("! the job ends with exit code 0   -\n"));
  EXPECT_THAT(differ.text, HasSubstr("the sequences differ from step 2 on (marked !)"));
  EXPECT_FALSE(CompareSequences({}, {}).match);
}

// Issue 37: each failed round's stop (failure to restart) and restart (failure to the next
// round), from the first record of the failure (a revision does not move it).
TEST(ReplayTest, EachFailedRoundsStopAndRestartAreMeasuredFromItsFirstFailure) {
  Files f;
  f.Add("n0", NodeZero());
  const std::vector<StepDuration> steps = RoundDurations(CoordinatorRecords(f.Group()));
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_EQ(steps[0].what, "round 0 stop");
  EXPECT_EQ(steps[0].took, 990ms);
  EXPECT_EQ(steps[1].what, "round 0 restart");
  EXPECT_EQ(steps[1].took, 1990ms);
  EXPECT_EQ(steps[3].what, "round 1 restart");
  EXPECT_EQ(steps[3].took, 31999ms);
  EXPECT_EQ(steps[5].what, "round 2 restart");
  EXPECT_EQ(steps[5].took, 2000ms);
}

TEST(ReplayTest, ADurationOffByMoreThanAFifthAndASecondIsMarked) {
  const std::vector<StepDuration> real = {
      {"round 0 stop", 30s}, {"round 0 restart", 40s}, {"round 1 stop", 2ms}};
  // 24 s is 20% under 30 s: a prediction. 1.7 s for 2 ms is not, however small both are.
  const DurationComparison close =
      CompareDurations(real, {{"round 0 stop", 24s}, {"round 0 restart", 47s}, {"round 1 stop", 450ms}});
  EXPECT_TRUE(close.within) << close.text;
  EXPECT_THAT(close.text, HasSubstr("the durations match (each within 20% or 1s of the real one)"));
  const DurationComparison off =
      CompareDurations(real, {{"round 0 stop", 1700ms}, {"round 0 restart", 40s}, {"round 1 stop", 1700ms}});
  EXPECT_FALSE(off.within);
  EXPECT_THAT(off.text, HasSubstr("! round 0 stop"));
  EXPECT_THAT(off.text, HasSubstr("(-94%)"));
  EXPECT_THAT(off.text, HasSubstr("  round 0 restart"));
  EXPECT_THAT(off.text,
              HasSubstr("2 of the durations are more than 20% (and 1s) off the real one (marked !)"));
  // A step only the real run has is listed, not judged: the sequences say that it is missing.
  const DurationComparison missing = CompareDurations(real, {{"round 0 stop", 30s}});
  EXPECT_TRUE(missing.within) << missing.text;
  EXPECT_THAT(missing.text, ::testing::ContainsRegex("  round 1 stop +2ms +-\n"));
}

}  // namespace
}  // namespace ddprun::report
