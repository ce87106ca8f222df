// RoundStartLog: each round's "workers-started" record and the summary line, from the order in
// which the launcher reports a round's workers (asked for, started warm or cold, failed).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runner/io/warm_rounds.h"
#include "runner/io/worker_module.h"

namespace ddprun::io {
namespace {

using ::testing::HasSubstr;
using Clock = RoundStartLog::Clock;
using std::chrono::milliseconds;

TEST(RoundStartLog, ARoundIsRecordedOnceItsLastWorkerStarted) {
  std::vector<host::Event> events;
  RoundStartLog log(/*warm_configured=*/true);
  log.SetSink([&](const host::Event& event) { events.push_back(event); });
  const Clock::time_point t0{};
  EXPECT_TRUE(log.Requested(1, t0));
  EXPECT_FALSE(log.Requested(1, t0));
  log.Started(1, t0 + milliseconds(4), /*warm=*/true, /*failed=*/false, "");
  EXPECT_TRUE(events.empty());  // the round has not finished asking
  log.Closed(1, t0 + milliseconds(5));
  EXPECT_TRUE(events.empty());  // one worker still to start
  log.Started(1, t0 + milliseconds(9), /*warm=*/false, /*failed=*/false,
              "the template is still importing torch");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "workers-started");
  std::map<std::string, host::Event::Value> fields(events[0].fields.begin(), events[0].fields.end());
  EXPECT_EQ(std::get<int64_t>(fields.at("round")), 1);
  EXPECT_EQ(std::get<int64_t>(fields.at("warm")), 1);
  EXPECT_EQ(std::get<int64_t>(fields.at("cold")), 1);
  EXPECT_EQ(std::get<int64_t>(fields.at("failed")), 0);
  EXPECT_EQ(std::get<int64_t>(fields.at("start_us")), 9000);
  EXPECT_EQ(std::get<std::string>(fields.at("cold_reason")), "the template is still importing torch");
  log.Stepped(1, t0 + milliseconds(1500));
  EXPECT_EQ(
      log.SummaryLine(),
      "worker starts on this node: round 1: 1 warm, 1 cold in 9.0 ms, first step 1.50 s after the round "
      "began here\n");
}

TEST(RoundStartLog, ColdJobsHaveNoReasonAndTheSummaryKeepsTheNewestRounds) {
  std::vector<host::Event> events;
  RoundStartLog log(/*warm_configured=*/false);
  log.SetSink([&](const host::Event& event) { events.push_back(event); });
  const Clock::time_point t0{};
  for (int round = 0; round < 6; ++round) {
    log.Requested(round, t0);
    log.Started(round, t0 + milliseconds(2), false, round == 5, "");
    log.Closed(round, t0 + milliseconds(3));
  }
  ASSERT_EQ(events.size(), 6u);
  for (const auto& [key, value] : events[0].fields) EXPECT_NE(key, "cold_reason");
  const std::string line = log.SummaryLine();
  EXPECT_THAT(line, HasSubstr("(2 earlier rounds in the event log) round 2: 1 cold in 2.0 ms"));
  EXPECT_THAT(line, HasSubstr("round 5: 1 not started in 2.0 ms"));
}

TEST(WarmTemplateScript, IsStagedBesideTheModuleAndOffThePythonPath) {
  const auto script = DdprunWarmTemplateFor(std::string(DDPRUN_BUILD_DIR) + "/cli/ddprun");
  ASSERT_TRUE(script);
  EXPECT_THAT(*script, HasSubstr("/share/ddprun/warm/template.py"));
  const auto python = DdprunPythonDirFor(std::string(DDPRUN_BUILD_DIR) + "/cli/ddprun");
  ASSERT_TRUE(python);
  EXPECT_EQ(script->find(*python), std::string::npos);
  EXPECT_FALSE(DdprunWarmTemplateFor("/nonexistent/bin/ddprun"));
}

}  // namespace
}  // namespace ddprun::io
