// A node's event log on disk (runner/io/event_file.h): one line per record as the report's
// reader parses it, never over an existing file, bounded with one "truncated" record.

#include "runner/io/event_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "report/event_log.h"

namespace ddprun::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class EventFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "ddprun-events-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    root_ = templ;
    folder_ = UniqueFd(::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(folder_.valid());
  }
  void TearDown() override { fs::remove_all(root_); }
  std::unique_ptr<FileEventLog> Create(uint64_t max_bytes = FileEventLog::kMaxBytes) {
    auto log = FileEventLog::Create(
        folder_.get(), root_, 3, "gpu-03", [this](const std::string& text) { reports_.push_back(text); },
        max_bytes);
    EXPECT_TRUE(log) << log.error();
    return log ? *std::move(log) : nullptr;
  }
  std::string Read() const {
    std::ifstream in(root_ + "/events-node3.jsonl");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  static TimePoint At(int64_t ms) { return TimePoint(std::chrono::milliseconds(ms)); }

  std::string root_;
  UniqueFd folder_;
  std::vector<std::string> reports_;
};

TEST_F(EventFileTest, EachRecordIsOneLineTheReaderParses) {
  auto log = Create();
  ASSERT_TRUE(log);
  EXPECT_EQ(log->path(), root_ + "/events-node3.jsonl");
  host::Event exit{"worker-exit", {}};
  exit.Add("round", int64_t{2})
      .Add("stopped", false)
      .Add("kinds", std::vector<std::string>{"oom", "exit:1"})
      .Add("ranks", std::vector<int64_t>{6, 7})
      .Add("error", std::string("bad \xff byte \"quoted\"\n"));
  log->Record(At(1234), exit);
  log->Record(At(1240), host::Event{"agent-exit", {}}.Add("exit_code", int64_t{1}));
  const std::string text = Read();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  EXPECT_THAT(text, HasSubstr(R"(,"mono_ms":1234,"node":3,"host":"gpu-03","round":2,"stopped":false,)"
                              R"("kinds":["oom","exit:1"],"ranks":[6,7],"error":"bad )"
                              "\xef\xbf\xbd"
                              R"( byte \"quoted\"\n"})"
                              "\n"));
  EXPECT_EQ(text.substr(0, 38), R"({"v":1,"event":"worker-exit","unix_ms")");
  auto parsed = report::ParseEventFile("f", text);
  ASSERT_TRUE(parsed) << parsed.error();
  ASSERT_EQ(parsed->records.size(), 2u);
  const report::EventRecord& r = parsed->records[0];
  EXPECT_EQ(r.type, "worker-exit");
  EXPECT_EQ(r.node, 3);
  EXPECT_EQ(parsed->host, "gpu-03");
  EXPECT_EQ(r.mono_ms, 1234);
  EXPECT_GT(r.unix_ms, 1'700'000'000'000);
  EXPECT_EQ(r.Int("round"), 2);
  EXPECT_EQ(r.Texts("kinds"), (std::vector<std::string>{"oom", "exit:1"}));
  EXPECT_EQ(r.Ints("ranks"), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(r.Text("error"), "bad \xef\xbf\xbd byte \"quoted\"\n");
  EXPECT_EQ(parsed->records[1].Int("exit_code"), 1);
  EXPECT_EQ(log->bytes_written(), text.size());
  EXPECT_TRUE(reports_.empty());
}

TEST_F(EventFileTest, AFileThatExistsIsNeverWrittenOver) {
  std::ofstream(root_ + "/events-node3.jsonl") << "precious\n";
  auto log = FileEventLog::Create(folder_.get(), root_, 3, "h", nullptr);
  ASSERT_FALSE(log);
  EXPECT_THAT(log.error(), HasSubstr("events-node3.jsonl"));
  EXPECT_EQ(Read(), "precious\n");
}

TEST_F(EventFileTest, PastItsBoundTheLogWritesOneTruncatedRecordAndStops) {
  auto log = Create(4096);
  ASSERT_TRUE(log);
  host::Event event{"hang", {}};
  event.Add("text", std::string(300, 'x'));
  for (int i = 0; i < 100; ++i) log->Record(At(i), event);
  const std::string text = Read();
  EXPECT_LE(text.size(), 4096u);
  auto parsed = report::ParseEventFile("f", text);
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_TRUE(parsed->truncated);
  EXPECT_EQ(parsed->records.back().type, "truncated");
  EXPECT_EQ(parsed->records.back().Int("limit_bytes"), 4096);
  EXPECT_EQ(parsed->records.size(), 10u) << "nine records of ~410 bytes fit below the bound and its reserve";
  EXPECT_EQ(reports_, std::vector<std::string>{"event log " + root_ +
                                               "/events-node3.jsonl reached its bound of 4096 "
                                               "bytes: later events of this run are not recorded"});
}

}  // namespace
}  // namespace ddprun::io
