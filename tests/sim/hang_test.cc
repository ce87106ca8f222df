// Hung ranks and stragglers in the simulator: beacons from the training model, faulthandler
// stacks, the core's detection end to end, and jobs without timeouts.progress run as before.
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runner/core/progress.h"
#include "sim/workers.h"
#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// 2 nodes x 2 workers, 20 minutes of training; `timeouts` is added to [timeouts] (e.g.
// `progress = "2m"`), `extra` after [simulate].
std::string HangJob(std::string_view timeouts, std::string_view extra = "", int max_restarts = 3) {
  return fmt::format(R"(version = 1
[job]
name = "t"
command = ["python", "train.py"]
[cluster]
nnodes = 2
master_addr = "127.0.0.1"
nproc_per_node = 2
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 2
[restart]
max_restarts = {}
backoff = "10s"
[timeouts]
rendezvous = "5m"
{}
[simulate]
seed = 3
train_time = "20m"
checkpoint_every = "5m"
worker_startup = "20s"
{}
)",
                     max_restarts, timeouts, extra);
}

// The time stamp of the first line that contains `what`, in seconds; -1 if none.
double TimeOf(const std::string& output, const std::string& what) {
  const size_t at = output.find(what);
  if (at == std::string::npos) return -1;
  const size_t open = output.rfind('[', at);
  const std::string stamp = output.substr(open + 1, output.find(']', open) - open - 1);
  const size_t m = stamp.find('m');
  return std::stod(stamp.substr(0, m)) * 60 + std::stod(stamp.substr(m + 1));
}

TEST(HangTest, AHungRankIsNamedWithItsStackAndTheRoundRestarts) {
  const SimRun run = Simulate(HangJob(R"(progress = "2m")"), {"worker-hang@5m:node=1,local_rank=1"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output, HasSubstr("node 1: rank 3 (local rank 1, pid 1003) hangs; it ignores SIGTERM"));
  // Every agent sees its ranks fall silent; the coordinator asks all of them for their stacks and
  // names the rank that is not waiting for the others.
  EXPECT_THAT(run.output, HasSubstr("sent no progress beacon for 2m00s after step"));
  EXPECT_THAT(run.output, HasSubstr("asking every node where its ranks are before stopping the round"));
  EXPECT_THAT(run.output,
              HasSubstr("coordinator: round 0 failed: rank 3 (node 1 (node-0001), local rank 1) hung: "
                        "no progress for 2m"));
  EXPECT_THAT(run.output, HasSubstr("(timeouts.progress = 2m); stopping every worker on every node"));
  EXPECT_THAT(run.output, HasSubstr("  why rank 3: the only rank not waiting for the others\n"));
  EXPECT_THAT(run.output, HasSubstr(": in wait at train.py:57\n"));
  EXPECT_THAT(run.output,
              HasSubstr("File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line "
                        "631 in __next__\n"));
  EXPECT_THAT(run.output, HasSubstr("File \"/job/train.py\", line 57 in next_batch\n"));
  EXPECT_THAT(run.output, HasSubstr("3 ranks 0-2, last step"));
  EXPECT_THAT(run.output, HasSubstr(": in all_reduce at train.py:88\n"));
  // The hung worker ignores SIGTERM, and so do the others (the job has a [trainer]: Lightning's
  // handler only sets a flag, simulate.sigterm = "auto"): SIGKILL after stop_grace, then the
  // next round.
  EXPECT_THAT(run.output, HasSubstr("node 1: 2 workers still running 30s after SIGTERM; sending SIGKILL"));
  EXPECT_THAT(run.output, HasSubstr("node 0: 2 workers still running 30s after SIGTERM; sending SIGKILL"));
  EXPECT_THAT(run.output,
              HasSubstr("succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)"));
  EXPECT_THAT(run.output, HasSubstr("  hangs:             1 worker hung (1 round stopped as hung, "
                                    "timeouts.progress = 2m)\n"));
  EXPECT_EQ(run.result.stats.hangs_judged, 1);
  EXPECT_EQ(run.result.stats.restarts_used, 1);
  // Stopped 2m (+ up to a beacon period and the stacks) after the hang, not after the NCCL
  // watchdog's 10 minutes.
  const double failed = TimeOf(run.output, "coordinator: round 0 failed");
  EXPECT_GE(failed, 5 * 60 + 119);
  EXPECT_LE(failed, 5 * 60 + 120 + 6);
  EXPECT_THAT(run.output, Not(HasSubstr("Watchdog caught collective operation timeout")));
  EXPECT_GT(run.result.stats.beacons, 0u);
}

TEST(HangTest, WithoutProgressTimeoutTheWatchdogEndsTheHang) {
  const SimRun run = Simulate(HangJob(""), {"worker-hang@5m:node=1,local_rank=1"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("training: round 0: the NCCL watchdog times out after 10m"));
  EXPECT_THAT(run.output, Not(HasSubstr("progress beacon")));
  EXPECT_EQ(run.result.stats.beacons, 0u);
  EXPECT_EQ(run.result.stats.hangs_judged, 0);
}

TEST(HangTest, AutoUsesProgressStartUntilItHasLearnt) {
  // The rank hangs 5 s into training: fewer than 10 intervals seen, nothing learnt yet.
  const SimRun run = Simulate(HangJob("progress = \"auto\"\nprogress_start = \"3m\""),
                              {"worker-hang@26s:node=0,local_rank=1"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output,
              HasSubstr("coordinator: round 0 failed: rank 1 (node 0 (node-0000), local rank 1) hung"));
  EXPECT_THAT(run.output, HasSubstr("(timeouts.progress = \"auto\", nothing learnt yet: "
                                    "timeouts.progress_start = 3m); asking every rank"));
  const double failed = TimeOf(run.output, "coordinator: round 0 failed");
  EXPECT_GE(failed, 26 + 179);
  EXPECT_LE(failed, 26 + 180 + 6);
}

TEST(HangTest, AutoLearnsFromTheBeaconsThenDetects) {
  // One step a second for minutes: the learnt timeout is its floor, 10 s (5 x 1 s < 10 s).
  const SimRun run = Simulate(HangJob("progress = \"auto\"\nprogress_start = \"3m\""),
                              {"worker-hang@5m:node=1,local_rank=0"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output,
              HasSubstr("coordinator: round 0 failed: rank 2 (node 1 (node-0001), local rank 0) hung: "
                        "no progress for 1"));
  EXPECT_THAT(run.output, HasSubstr("(timeouts.progress = \"auto\", 10s learnt from this job)"));
  const double failed = TimeOf(run.output, "coordinator: round 0 failed");
  EXPECT_GE(failed, 5 * 60 + 9);
  EXPECT_LE(failed, 5 * 60 + 10 + 6);
}

TEST(HangTest, SlowerStepsAreLearntToo) {
  // 4-second steps: beacons every 4 s, a learnt timeout of 5 x 4 s.
  const SimRun run = Simulate(HangJob("progress = \"auto\"\nprogress_start = \"3m\"", "step_time = \"4s\""),
                              {"worker-hang@8m:node=1,local_rank=0"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("(timeouts.progress = \"auto\", 20s learnt from this job)"));
}

TEST(HangTest, AStragglerIsReportedAndListedInTheSummary) {
  const SimRun run =
      Simulate(HangJob(R"(progress = "5m")"), {"worker-slow@5m:node=1,local_rank=1,percent=100"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation);
  EXPECT_THAT(run.output,
              HasSubstr("node 1: local rank 1's GPU slows down: 100% more own work per step; the gang "
                        "steps at the pace of its slowest rank"));
  // Reported once the window's median says so (1.5x), while the window still holds faster steps.
  EXPECT_THAT(run.output,
              HasSubstr("coordinator: rank 3 (node 1 (node-0001), local rank 1) is a straggler: its own "
                        "work per step is 1.51s, 1.5x the median 1s of 4 ranks over the last 2m "
                        "(stragglers.slower_percent = 50)\n"));
  EXPECT_THAT(run.output, HasSubstr("stragglers (more than 50% slower than the median rank for 2m):\n"));
  EXPECT_THAT(run.output,
              HasSubstr("    rank 3 (node 1 (node-0001), local rank 1) in round 0: its own work per step"));
  // The gang steps at its slowest rank's pace from 5m: 15 minutes of training take 30.
  EXPECT_EQ(run.result.stats.useful_ns, Minutes(20).count());
  EXPECT_GT(run.result.stats.training_ns, Minutes(34).count());
  EXPECT_LT(run.result.stats.training_ns, Minutes(36).count());
}

TEST(HangTest, AStragglerIsFoundWithoutProgressTimeoutToo) {
  // A worker-slow fault alone turns the beacons on: stragglers need no hang detection.
  const SimRun run = Simulate(HangJob(""), {"worker-slow@2m:node=0,local_rank=0,percent=60,duration=8m"});
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("coordinator: rank 0 (node 0 (node-0000), local rank 0) is a straggler"));
  EXPECT_THAT(run.output, HasSubstr("node 0: local rank 0's GPU runs at full speed again"));
  EXPECT_THAT(run.output,
              HasSubstr("coordinator: rank 0 (node 0 (node-0000), local rank 0) is no longer a straggler"));
  EXPECT_THAT(run.output, Not(HasSubstr("  hangs:")));
}

TEST(HangTest, RandomHangsAreDetectedEveryTime) {
  const SimRun run = Simulate(HangJob(R"(progress = "2m")", "worker_hang_mtbf = \"30m\"", 20));
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_FALSE(run.result.violation) << *run.result.violation;
  EXPECT_THAT(run.output, HasSubstr("hangs (random hang (simulate.worker_hang_mtbf)); it ignores SIGTERM"));
  EXPECT_GT(run.result.stats.worker_hangs, 1);
  // Every round a hang interrupted was stopped as hung (two hangs in one round: both named).
  EXPECT_EQ(run.result.stats.hangs_judged, run.result.stats.interruptions) << run.output;
  EXPECT_GT(run.result.stats.hangs_judged, 0);
  EXPECT_THAT(run.output,
              HasSubstr("round 0 failed: ranks 1-2 (rank 1 (node 0 (node-0000), local rank 1) first) "
                        "hung: no progress for 2m01s"));
}

TEST(HangTest, SameSeedGivesIdenticalOutput) {
  const std::string job = HangJob(R"(progress = "auto")", "worker_hang_mtbf = \"3h\"", 10);
  const std::vector<std::string> faults = {"worker-slow@3m:node=1,local_rank=0,percent=80",
                                           "agent-hang@9m:node=1,duration=40s"};
  const SimRun a = Simulate(job, faults, 21, true);
  const SimRun b = Simulate(job, faults, 21, true);
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(a.result.stats.events, b.result.stats.events);
  EXPECT_EQ(a.result.stats.beacons, b.result.stats.beacons);
}

// Jobs without timeouts.progress must run exactly as before beacons existed: no beacon event is
// scheduled, and the summary (with its event and message counts) is the one the code before
// them printed (commit 09b691b, `ddprun --simulate examples/laptop.toml --seed 11 --fault
// worker-hang@4m:node=1,local_rank=1,duration=1m --fault worker-exit@12m:node=0,local_rank=1,
// exit_code=3 --fault partition@15m:node=1,duration=30s`), but for the counts of events and
// messages, pinned again when heartbeats got latencies of their own (Network::BeatLatency) and
// when the rendezvous progress line learnt to back off (issue 39). Its workers end on SIGTERM,
// as every simulated worker did then (simulate.sigterm = "exits"), and they leave 10-500 ms after it
// (200 ms-2 s before issue 37 calibrated it): the event count and the times moved with that.
TEST(HangTest, AJobWithoutProgressTimeoutRunsAsBeforeBeacons) {
  const SimRun run =
      Simulate(WithWorkersThatExitOnSigterm(ExampleJob("laptop.toml")),
               {"worker-hang@4m:node=1,local_rank=1,duration=1m",
                "worker-exit@12m:node=0,local_rank=1,exit_code=3", "partition@15m:node=1,duration=30s"},
               11);
  EXPECT_EQ(run.result.stats.beacons, 0u);
  const std::string summary = run.output.substr(run.output.find("simulation summary:"));
  EXPECT_EQ(summary,
            "simulation summary: job \"laptop\", 2 nodes x 2 workers, seed 11\n"
            "  outcome:           job exit code 0\n"
            "                     nodes 0-1: exit 0\n"
            // 8,626 events beat by beat; quiet stretches are computed (sim/quiet.cc), the rest
            // of the run is the same.
            "  virtual time:      35m56s (321 events, 4199 messages, at most 18 events queued)\n"
            "  first training:    after 21s\n"
            "  rounds:            4 started, 3 interrupted; restarts used: 3 of 3\n"
            "  failures:          1 node crash, 1 worker failure\n"
            "  training:          20m00s of 20m00s kept (30m47s spent training)\n"
            "  downtime:          5m09s (14.3% of the wall time not training)\n"
            "  lost work:         10m47s (progress since the last checkpoint, every 5m)\n"
            "  goodput:           55.6% (useful training / wall time)\n");
}

// The dumps the simulated workers write are what the agent and coordinator parse: the main
// thread is found among two, and the hung rank is the one not waiting for the others.
TEST(HangTest, SimulatedStacksParseAndNameTheHungRank) {
  const std::string hung = sim::FaulthandlerDump(sim::StackAt::kDataLoader, 1003);
  EXPECT_THAT(hung, HasSubstr("Thread 0x00007f03eb000700 (most recent call first):\n"
                              "  File \"/usr/lib/python3.10/threading.py\", line 324 in wait\n"));
  const std::vector<core::Frame> frames = core::MainThreadStack(hung);
  ASSERT_EQ(frames.size(), 9u);
  EXPECT_EQ(frames.front(), (core::Frame{"/usr/lib/python3.10/threading.py", 324, "wait"}));
  EXPECT_EQ(frames[6], (core::Frame{"/job/train.py", 57, "next_batch"}));
  EXPECT_EQ(frames.back(), (core::Frame{"/job/train.py", 120, "<module>"}));
  EXPECT_EQ(core::DescribeStack(frames), "in wait at train.py:57");
  EXPECT_FALSE(core::WaitsForOtherRanks(frames));

  const std::vector<core::Frame> waiting =
      core::MainThreadStack(sim::FaulthandlerDump(sim::StackAt::kAllReduce, 1001));
  ASSERT_EQ(waiting.size(), 4u);
  EXPECT_EQ(waiting.front(),
            (core::Frame{"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 2501,
                         "all_reduce"}));
  EXPECT_EQ(core::DescribeStack(waiting), "in all_reduce at train.py:88");
  EXPECT_TRUE(core::WaitsForOtherRanks(waiting));
  const std::vector<core::Frame> starting =
      core::MainThreadStack(sim::FaulthandlerDump(sim::StackAt::kInit, 1002));
  EXPECT_EQ(core::DescribeStack(starting), "in init_process_group at train.py:31");
  EXPECT_TRUE(core::WaitsForOtherRanks(starting));

  std::vector<core::RankAtHang> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    ranks.push_back(core::RankAtHang{rank, rank / 2, rank % 2, 278, 120'000, rank == 3 ? frames : waiting});
  }
  const core::HangVerdict verdict = core::FindHungRanks(ranks, 0);
  EXPECT_EQ(verdict.culprits, std::vector<int>{3});
  EXPECT_EQ(verdict.reason, "the only rank not waiting for the others");
}

}  // namespace
}  // namespace ddprun::testing
