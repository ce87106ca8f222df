// The event log of real runs and `ddprun report` on it: two agents on 127.0.0.1, a rank that
// fails in round 0, the restart, a clean round 1; every node's events-node<k>.jsonl in its run
// folder, and the page, trace and timeline that `ddprun report` rebuilds from them.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "report/event_log.h"
#include "report/rebuild.h"
#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Every events file below `dir`, parsed.
std::vector<report::EventFile> EventFiles(const std::string& dir) {
  std::vector<report::EventFile> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_symlink() || !report::IsEventFileName(entry.path().filename().string())) continue;
    auto file = report::ParseEventFile(entry.path().string(), ReadFile(entry.path().string()));
    EXPECT_TRUE(file) << file.error();
    if (file) files.push_back(*std::move(file));
  }
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return a.records.front().node < b.records.front().node; });
  return files;
}

const report::EventRecord* Find(const report::EventFile& file, const std::string& type, int skip = 0) {
  for (const report::EventRecord& r : file.records) {
    if (r.type == type && skip-- == 0) return &r;
  }
  return nullptr;
}

class ReportTest : public ::testing::Test {
 protected:
  AgentProcess& Run(const std::vector<std::string>& args, const std::string& name) {
    agents_.push_back(std::make_unique<AgentProcess>(args, dir_.path() + "/" + name + ".out"));
    return *agents_.back();
  }
  std::string Describe() const { return DescribeAgents(agents_); }
  ScratchDir dir_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

TEST_F(ReportTest, ARestartedRunIsRecordedAndReportedOnEveryNode) {
  TestJob job;
  job.name = "rec";
  job.master_port = FreePort();
  job.max_restarts = 1;
  job.backoff = "0s";
  // Round 0: rank 3 (node 1, local rank 1) fails with exit code 7; the others wait to be
  // stopped. Round 1: every rank exits 0.
  job.script =
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
      "  if [ \"$RANK\" = 3 ]; then sleep 0.5; echo 'ValueError: boom' >&2; exit 7; fi; "
      "  exec sleep 30; "
      "fi; exit 0";
  dir_.Write("job.toml", job.Toml());
  const std::string job_path = dir_.path() + "/job.toml";
  AgentProcess& node0 = Run({job_path, "--node-rank", "0"}, "agent-0");
  AgentProcess& node1 = Run({job_path, "--node-rank", "1"}, "agent-1");
  ASSERT_EQ(node0.Wait(60s), 0) << Describe();
  ASSERT_EQ(node1.Wait(30s), 0) << Describe();

  // Each agent's file is in its own run folder, beside its rank logs.
  const std::string logs = dir_.path() + "/logs/rec";
  const std::vector<report::EventFile> files = EventFiles(logs);
  ASSERT_EQ(files.size(), 2u) << Describe();
  for (int node = 0; node < 2; ++node) {
    const report::EventFile& file = files[static_cast<size_t>(node)];
    EXPECT_THAT(file.path, HasSubstr("-n" + std::to_string(node) + "-"));
    EXPECT_THAT(file.path, HasSubstr("/events-node" + std::to_string(node) + ".jsonl"));
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(file.path).parent_path() / "attempt-0"))
        << "the events file is in the run folder of the rank logs";
    const report::EventRecord& start = file.records.front();
    EXPECT_EQ(start.type, "agent-start");
    EXPECT_EQ(start.node, node);
    EXPECT_EQ(start.Text("job"), "rec");
    EXPECT_EQ(start.Int("nnodes"), 2);
    EXPECT_EQ(start.Int("nproc"), 2);
    ASSERT_NE(Find(file, "agent-exit"), nullptr) << file.path;
    EXPECT_EQ(Find(file, "agent-exit")->Int("exit_code"), 0);
    ASSERT_NE(Find(file, "workers-start", 1), nullptr) << "two rounds on node " << node;
    EXPECT_EQ(Find(file, "workers-start", 0)->Ints("ranks"), (std::vector<int64_t>{2 * node, 2 * node + 1}));
    EXPECT_EQ(Find(file, "workers-start", 1)->Int("round"), 1);
    // Times only go forward within a file.
    for (size_t i = 1; i < file.records.size(); ++i) {
      EXPECT_GE(file.records[i].mono_ms, file.records[i - 1].mono_ms) << file.path << ":" << i + 1;
    }
  }
  // Node 1 saw its rank 3 fail on its own (not stopped), with the failure's kinds.
  const report::EventRecord* exit = nullptr;
  for (const report::EventRecord& r : files[1].records) {
    if (r.type == "worker-exit" && r.Int("rank") == 3 && r.Int("round") == 0) exit = &r;
  }
  ASSERT_NE(exit, nullptr) << Describe();
  EXPECT_EQ(exit->Int("exit_code"), 7);
  EXPECT_EQ(exit->Int("local_rank"), 1);
  EXPECT_FALSE(exit->Flag("stopped"));
  EXPECT_EQ(exit->Texts("kinds"), (std::vector<std::string>{"ValueError", "exit:7"}));
  EXPECT_EQ(exit->Text("error"), "ValueError: boom");
  // Node 0's coordinator: both joins, the root cause with its rank, the restart, the result.
  const report::EventFile& zero = files[0];
  ASSERT_NE(Find(zero, "node-joined", 1), nullptr);
  const report::EventRecord* failed = Find(zero, "round-failed");
  ASSERT_NE(failed, nullptr) << Describe();
  EXPECT_EQ(failed->Int("round"), 0);
  EXPECT_EQ(failed->Int("peer"), 1);
  EXPECT_EQ(failed->Int("rank"), 3);
  EXPECT_EQ(failed->Texts("kinds"), (std::vector<std::string>{"ValueError", "exit:7"}));
  EXPECT_THAT(failed->Text("cause"), HasSubstr("rank 3 (node 1"));
  const report::EventRecord* restart = Find(zero, "restart");
  ASSERT_NE(restart, nullptr);
  EXPECT_EQ(restart->Int("restart"), 1);
  EXPECT_EQ(restart->Int("round"), 1);
  ASSERT_NE(Find(zero, "job-result"), nullptr);
  EXPECT_EQ(Find(zero, "job-result")->Int("exit_code"), 0);

  // `ddprun report` on the job's folder: the page, the trace, and what it says.
  AgentProcess& report =
      Run({"report", logs, "--out", dir_.path() + "/page.html", "--trace", dir_.path() + "/trace.json"},
          "report");
  ASSERT_EQ(report.Wait(30s), 0) << report.Output();
  EXPECT_THAT(report.Output(), HasSubstr("rec: 2 nodes x 2 workers, started "));
  EXPECT_THAT(report.Output(), HasSubstr("2 rounds begun, 1 restart used, exit code 0"));
  const std::string page = ReadFile(dir_.path() + "/page.html");
  EXPECT_THAT(page, HasSubstr("ddprun run: rec: 2 nodes x 2 workers"));
  EXPECT_THAT(page, HasSubstr("rank 3 exited with code 7: ValueError: boom"));
  EXPECT_THAT(page, HasSubstr("round 0 failed: rank 3 (node 1"));
  EXPECT_THAT(page, HasSubstr("job &quot;rec&quot; succeeded: all 4 ranks on 2 nodes exited 0 in round 1"));
  const std::string trace = ReadFile(dir_.path() + "/trace.json");
  EXPECT_THAT(trace, HasSubstr("\"name\":\"node 1 (")) << trace.substr(0, 2000);
  EXPECT_THAT(trace, HasSubstr("\"cat\":\"failure\""));

  // The timeline itself, as the report drew it.
  auto runs = report::GroupRuns(files);
  ASSERT_TRUE(runs);
  ASSERT_EQ(runs->size(), 1u);
  const report::RebuiltRun rebuilt = report::RebuildTimeline(runs->front());
  EXPECT_EQ(rebuilt.rounds, 2);
  EXPECT_EQ(rebuilt.restarts, 1);
  EXPECT_EQ(rebuilt.exit_code, 0);
  EXPECT_TRUE(rebuilt.notes.empty()) << rebuilt.notes.front();
  const report::Timeline& t = rebuilt.timeline;
  ASSERT_EQ(t.labels.size(), 2u);
  EXPECT_TRUE(t.focus[1]);
  EXPECT_FALSE(t.focus[0]);
  std::vector<std::string> job_marks;
  const report::Mark* fault = nullptr;
  for (const report::Mark& m : t.marks) {
    if (m.node == report::Mark::kJob) job_marks.push_back(m.text.substr(0, m.text.find(':')));
    if (m.node == 1 && m.kind == report::MarkKind::kFault) fault = &m;
  }
  EXPECT_EQ(job_marks, (std::vector<std::string>{"round 0", "round 0 failed", "round 1"}));
  ASSERT_NE(fault, nullptr);
  EXPECT_EQ(fault->text, "rank 3 exited with code 7: ValueError: boom");
  // Each node: rendezvous, then round 0's workers, stopping, waiting, round 1, and exited.
  for (size_t row = 0; row < 2; ++row) {
    std::vector<report::NodePhase> phases;
    for (const report::Segment& s : t.segments[row]) phases.push_back(s.phase);
    using P = report::NodePhase;
    EXPECT_EQ(phases.front(), P::kRendezvous) << "row " << row;
    EXPECT_EQ(phases.back(), P::kDone) << "row " << row;
    EXPECT_NE(std::find(phases.begin(), phases.end(), P::kStopping), phases.end()) << "row " << row;
    EXPECT_EQ(std::count(phases.begin(), phases.end(), P::kTraining), 2)
        << "row " << row << ": no beacons: running is training";
  }
  EXPECT_EQ(t.training.size(), 2u);
}

TEST_F(ReportTest, AMissingOrEmptyFolderIsExplained) {
  AgentProcess& missing = Run({"report", dir_.path() + "/nothing-here"}, "missing");
  EXPECT_EQ(missing.Wait(10s), 2);
  EXPECT_EQ(missing.Output(), "ddprun report: error: " + dir_.path() + "/nothing-here does not exist\n");
  std::filesystem::create_directories(dir_.path() + "/empty/sub");
  AgentProcess& empty = Run({"report", dir_.path() + "/empty"}, "empty");
  EXPECT_EQ(empty.Wait(10s), 2);
  EXPECT_THAT(empty.Output(), HasSubstr("ddprun report: error: no event files (events-node<k>.jsonl) in " +
                                        dir_.path() + "/empty or below it"));
  dir_.Write(
      "bad/run/events-node0.jsonl",
      "{\"v\":1,\"event\":\"agent-start\",\"unix_ms\":1,\"mono_ms\":1,\"node\":0,\"host\":\"a\"}\n{oops\n");
  AgentProcess& bad = Run({"report", dir_.path() + "/bad"}, "bad");
  EXPECT_EQ(bad.Wait(10s), 2);
  EXPECT_EQ(bad.Output(),
            "ddprun report: error: " + dir_.path() + "/bad/run/events-node0.jsonl:2: not JSON\n");
}

// Two runs of a job in one folder (say, copied from the nodes): the newest is reported unless
// --run picks another, and the runs are listed.
TEST_F(ReportTest, SeveralRunsInOneFolderAreListedAndOneIsChosen) {
  const auto record = [](const std::string& type, int64_t ms, int node, const std::string& extra) {
    return "{\"v\":1,\"event\":\"" + type + "\",\"unix_ms\":" + std::to_string(1'800'000'000'000 + ms) +
           ",\"mono_ms\":" + std::to_string(ms) + ",\"node\":" + std::to_string(node) + ",\"host\":\"h\"" +
           extra + "}\n";
  };
  const std::string start = ",\"job\":\"j\",\"fingerprint\":\"f\",\"nnodes\":1,\"nproc\":1";
  dir_.Write("runs/a/events-node0.jsonl",
             record("agent-start", 0, 0, start) +
                 record("job-result", 1000, 0, ",\"exit_code\":1,\"summary\":\"first\"") +
                 record("agent-exit", 1000, 0, ",\"exit_code\":1"));
  dir_.Write("runs/b/events-node0.jsonl",
             record("agent-start", 60'000, 0, start) +
                 record("job-result", 61'000, 0, ",\"exit_code\":0,\"summary\":\"second\"") +
                 record("agent-exit", 61'000, 0, ",\"exit_code\":0"));
  AgentProcess& newest = Run({"report", dir_.path() + "/runs", "--out", dir_.path() + "/b.html"}, "newest");
  EXPECT_EQ(newest.Wait(10s), 0);
  EXPECT_THAT(newest.Output(),
              HasSubstr(dir_.path() +
                        "/runs holds 2 runs; this report is of run 2, the newest (--run N "
                        "picks another):\n"
                        "    1  job \"j\" from 2027-01-15 08:00:00 UTC to 2027-01-15 08:00:01 UTC, 1 event "
                        "file\n"
                        "    2  job \"j\" from 2027-01-15 08:01:00 UTC to 2027-01-15 08:01:01 UTC, 1 event "
                        "file\n"));
  EXPECT_THAT(newest.Output(), HasSubstr("exit code 0\n"));
  AgentProcess& first =
      Run({"report", dir_.path() + "/runs", "--run", "1", "--out", dir_.path() + "/a.html"}, "first");
  EXPECT_EQ(first.Wait(10s), 0);
  EXPECT_THAT(first.Output(), HasSubstr("exit code 1\n"));
  EXPECT_THAT(ReadFile(dir_.path() + "/a.html"), HasSubstr("<pre>first\n"));
  AgentProcess& third = Run({"report", dir_.path() + "/runs", "--run", "3"}, "third");
  EXPECT_EQ(third.Wait(10s), 2);
  EXPECT_THAT(third.Output(), HasSubstr("ddprun report: error: --run 3 is out of range: " + dir_.path() +
                                        "/runs holds 2 runs\n"));
}

// Issue 25: event files sit in shared folders; what they say reaches the terminal escaped.
TEST_F(ReportTest, WhatAnEventFileSaysIsEscapedOnTheTerminal) {
  const std::string hostile = "\\u001b]0;owned\\u0007\\u001b[2Jj";
  const auto run = [&](int64_t ms) {
    return "{\"v\":1,\"event\":\"agent-start\",\"unix_ms\":" + std::to_string(1'800'000'000'000 + ms) +
           ",\"mono_ms\":" + std::to_string(ms) + ",\"node\":0,\"host\":\"h\",\"job\":\"" + hostile +
           "\",\"fingerprint\":\"f\",\"nnodes\":1,\"nproc\":1}\n"
           "{\"v\":1,\"event\":\"agent-exit\",\"unix_ms\":" +
           std::to_string(1'800'000'001'000 + ms) + ",\"mono_ms\":" + std::to_string(ms + 1000) +
           ",\"node\":0,\"host\":\"h\",\"exit_code\":0}\n";
  };
  dir_.Write("runs/a/events-node0.jsonl", run(0));
  dir_.Write("runs/b/events-node0.jsonl", run(60'000));
  AgentProcess& report = Run({"report", dir_.path() + "/runs", "--out", dir_.path() + "/r.html"}, "hostile");
  EXPECT_EQ(report.Wait(10s), 0) << report.Output();
  EXPECT_THAT(report.Output(), HasSubstr("job \"<U+001B>]0;owned<U+0007><U+001B>[2Jj\" from"));
  EXPECT_THAT(report.Output(), HasSubstr("\n<U+001B>]0;owned<U+0007><U+001B>[2Jj: 1 node x 1 worker"));
  EXPECT_EQ(report.Output().find('\x1b'), std::string::npos) << report.Output();
}

}  // namespace
}  // namespace ddprun::e2e
