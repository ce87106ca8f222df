// Same seed and job file: byte-identical output and trace; the fault flag syntax round-trips.
#include <sstream>

#include <gtest/gtest.h>

#include "report/render.h"
#include "schema/loader.h"
#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

std::string TraceOf(const SimRun& run) {
  std::ostringstream out;
  report::WriteChromeTrace(run.timeline, out);
  return out.str();
}

std::string ReportOf(const SimRun& run) {
  std::ostringstream out;
  report::WriteHtmlReport(run.timeline, run.output, out);
  return out.str();
}

const std::vector<std::string> kFaults = {
    "worker-exit@4m:node=1,local_rank=1,exit_code=7", "node-crash@9m:node=2,reboot_after=1m",
    "partition@14m:node=3,duration=20s", "agent-hang@16m:node=1,duration=15s"};

TEST(DeterminismTest, SameSeedGivesIdenticalOutputAndTrace) {
  const std::string job = SmallJob("", 4, 2, 5);
  const SimRun a = Simulate(job, kFaults, 11, true);
  const SimRun b = Simulate(job, kFaults, 11, true);
  EXPECT_FALSE(a.result.violation) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(TraceOf(a), TraceOf(b));
  EXPECT_EQ(ReportOf(a), ReportOf(b));
  EXPECT_EQ(a.result.stats.events, b.result.stats.events);
}

TEST(DeterminismTest, AnotherSeedGivesAnotherRun) {
  const std::string job = SmallJob("", 4, 2, 5);
  const SimRun a = Simulate(job, kFaults, 11);
  const SimRun b = Simulate(job, kFaults, 12);
  EXPECT_NE(a.output, b.output);
}

TEST(DeterminismTest, RecordingATimelineDoesNotChangeTheRun) {
  const std::string job = SmallJob("", 4, 2, 5);
  EXPECT_EQ(Simulate(job, kFaults, 11, false).output, Simulate(job, kFaults, 11, true).output);
}

TEST(DeterminismTest, TraceIsChromeTraceJson) {
  const SimRun run = Simulate(SmallJob(), {"node-crash@6m:node=1,reboot_after=1m"}, 5, true);
  const std::string trace = TraceOf(run);
  EXPECT_EQ(trace.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0), 0u);
  EXPECT_NE(trace.find("\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"node "
                       "1 (node-0001)\"}"),
            std::string::npos);
  EXPECT_NE(trace.find("\"name\":\"training\",\"cat\":\"job\",\"ph\":\"X\""), std::string::npos);
  EXPECT_NE(trace.find("\"name\":\"crash\",\"cat\":\"fault\",\"ph\":\"i\""), std::string::npos);
  EXPECT_NE(trace.find("\"name\":\"down\""), std::string::npos);
  EXPECT_EQ(trace.substr(trace.size() - 4), "\n]}\n");
  const std::string report = ReportOf(run);
  EXPECT_NE(report.find("<svg"), std::string::npos);
  EXPECT_EQ(report.find("http://"), report.find("http://www.w3.org/2000/svg")) << "no fetches";
  // One inline script (zoom and pan), nothing loaded from elsewhere.
  EXPECT_EQ(report.find("<script src"), std::string::npos);
  EXPECT_EQ(report.find("<script"), report.rfind("<script"));
}

TEST(DeterminismTest, FaultFlagsRoundTrip) {
  for (const std::string& text : kFaults) {
    auto fault = ParseFaultFlag(text);
    ASSERT_TRUE(fault) << fault.error();
    auto again = ParseFaultFlag(sim::FormatFaultFlag(*fault));
    ASSERT_TRUE(again) << sim::FormatFaultFlag(*fault) << ": " << again.error();
    EXPECT_EQ(*fault, *again);
  }
}

TEST(DeterminismTest, ReproCommandNamesSeedAndFaults) {
  sim::SimOptions options;
  options.job_path = "job.toml";
  options.seed = 123;
  options.flag_faults.push_back(*ParseFaultFlag("node-crash@40m:node=1"));
  EXPECT_EQ(sim::ReproCommand(options),
            "ddprun --simulate job.toml --seed 123 --fault node-crash@40m:node=1");
}

TEST(DeterminismTest, SimTimeFormat) {
  EXPECT_EQ(sim::FormatSimTime(Minutes(40).count()), "[  40m00.000s]");
  EXPECT_EQ(sim::FormatSimTime((Minutes(40) + Millis(6012)).count()), "[  40m06.012s]");
  EXPECT_EQ(sim::FormatSimTime((Hours(27) + Seconds(1)).count()), "[1d03h00m01.000s]");
}

}  // namespace
}  // namespace ddprun::testing
