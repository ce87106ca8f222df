// Node 0's journal on disk: what a coordinator started again reads of the previous one.

#include "runner/io/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ddprun::io {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

int64_t NowMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "ddprun-journal-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    root_ = templ;
    folder_ = root_ + "/logs/job";
  }
  void TearDown() override { fs::remove_all(root_); }
  FileJournal Open() {
    return FileJournal(folder_, [this](const std::string& text) { reports_.push_back(text); });
  }
  void WriteRecord(const std::string& text) {
    fs::create_directories(folder_);
    std::ofstream(folder_ + "/" + FileJournal::kFileName) << text;
  }
  std::string ReadRecord() {
    std::ifstream in(folder_ + "/" + FileJournal::kFileName);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string root_;
  std::string folder_;
  std::vector<std::string> reports_;
};

TEST_F(JournalTest, NoRecordMeansNothingToWaitFor) {
  FileJournal journal = Open();
  EXPECT_EQ(journal.SinceRoundsMayRun(), std::nullopt);
  EXPECT_TRUE(fs::is_directory(folder_));  // created for the records to come
  EXPECT_TRUE(reports_.empty());
}

TEST_F(JournalTest, ARecordThatWorkersMayRunIsReadBackWithItsAge) {
  WriteRecord(FileJournal::Format(true, NowMillis() - 20'000));
  FileJournal journal = Open();
  const auto since = journal.SinceRoundsMayRun();
  ASSERT_TRUE(since.has_value());
  EXPECT_GE(*since, 20s);
  EXPECT_LT(*since, 25s);
}

TEST_F(JournalTest, RecordsReplaceEachOtherAndTheEndClearsTheWait) {
  {
    FileJournal journal = Open();
    journal.Record(true);
    EXPECT_EQ(ReadRecord().rfind("ddprun-journal 1 rounds_may_run=1 unix_ms=", 0), 0u) << ReadRecord();
  }
  FileJournal again = Open();
  const auto since = again.SinceRoundsMayRun();
  ASSERT_TRUE(since.has_value());
  EXPECT_LT(*since, 5s);
  again.Record(false);
  EXPECT_EQ(ReadRecord().rfind("ddprun-journal 1 rounds_may_run=0 ", 0), 0u) << ReadRecord();
  EXPECT_EQ(Open().SinceRoundsMayRun(), std::nullopt);
  EXPECT_FALSE(fs::exists(folder_ + "/" + FileJournal::kFileName + ".new"));
  EXPECT_TRUE(reports_.empty());
}

TEST_F(JournalTest, ARecordFromTheFutureCountsAsMadeNow) {
  WriteRecord(FileJournal::Format(true, NowMillis() + 3'600'000));
  EXPECT_EQ(Open().SinceRoundsMayRun(), std::chrono::milliseconds(0));
}

TEST_F(JournalTest, AnUnreadableRecordCountsAsMadeNowAndIsSaidOnce) {
  WriteRecord("ddprun-journal 1 rounds_may_run=7 unix_ms=12\n");
  FileJournal journal = Open();
  EXPECT_EQ(journal.SinceRoundsMayRun(), std::chrono::milliseconds(0));
  WriteRecord("garbage");
  EXPECT_EQ(journal.SinceRoundsMayRun(), std::chrono::milliseconds(0));
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("coordinator.journal is not a journal record; assuming workers of a "
                             "previous run may still run"),
            std::string::npos)
      << reports_[0];
}

TEST_F(JournalTest, ALinkPlantedForTheJobFolderIsNotFollowed) {
  fs::create_directories(root_ + "/logs");
  fs::create_directories(root_ + "/elsewhere");
  fs::create_symlink(root_ + "/elsewhere", folder_);
  FileJournal journal = Open();
  journal.Record(true);
  EXPECT_FALSE(fs::exists(root_ + "/elsewhere/" + FileJournal::kFileName));
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("coordinator journal: "), std::string::npos) << reports_[0];
}

// ---- The quarantine state beside it ------------------------------------------------------

TEST_F(JournalTest, TheQuarantineStateIsReadBackWithTheTimeLeftAndItsCounts) {
  FileJournal journal = Open();
  EXPECT_TRUE(journal.Quarantined().empty());
  journal.RecordQuarantine({{"gpu-02", 20min, 1}, {"10.0.0.7", -5min, 3}, {"bad host name", 1h, 1}});
  std::ifstream in(folder_ + "/" + FileJournal::kQuarantineFileName);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str().rfind("ddprun-quarantine 1\nhost=gpu-02 until_unix_ms=", 0), 0u) << text.str();
  EXPECT_EQ(text.str().find("bad host"), std::string::npos) << text.str();
  const auto hosts = Open().Quarantined();
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].host, "gpu-02");
  EXPECT_EQ(hosts[0].times, 1);
  EXPECT_GT(hosts[0].left, 19min);
  EXPECT_LE(hosts[0].left, 20min);
  EXPECT_EQ(hosts[1].host, "10.0.0.7");
  EXPECT_EQ(hosts[1].times, 3);
  EXPECT_LE(hosts[1].left, Duration::zero());  // over: written as "until now", its count kept
  EXPECT_TRUE(reports_.empty());
}

TEST_F(JournalTest, AMalformedQuarantineStateKeepsNoHostOutAndSaysWhy) {
  const int64_t now = NowMillis();
  std::string error;
  EXPECT_EQ(
      FileJournal::ParseQuarantine(FileJournal::FormatQuarantine({{"gpu-02", 1min, 2}}, now), now, &error)[0],
      (core::QuarantinedHost{"gpu-02", 1min, 2}));
  EXPECT_EQ(error, "");
  EXPECT_TRUE(
      FileJournal::ParseQuarantine("ddprun-quarantine 1\nhost=a until_unix_ms=x times=1\n", now, &error)
          .empty());
  EXPECT_EQ(error, "line 2 is not \"host=NAME until_unix_ms=N times=K\"");
  EXPECT_TRUE(
      FileJournal::ParseQuarantine("ddprun-quarantine 1\nhost=a until_unix_ms=5 times=0\n", now, &error)
          .empty());
  EXPECT_TRUE(FileJournal::ParseQuarantine("something else\n", now, &error).empty());
  EXPECT_EQ(error, "line 1 is not \"ddprun-quarantine 1\"");
  fs::create_directories(folder_);
  std::ofstream(folder_ + "/" + FileJournal::kQuarantineFileName) << "garbage\n";
  EXPECT_TRUE(Open().Quarantined().empty());
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("quarantine state: "), std::string::npos) << reports_[0];
  EXPECT_NE(reports_[0].find("delete the file to start afresh"), std::string::npos) << reports_[0];
}

TEST_F(JournalTest, AQuarantineStateThatIsALinkIsNotFollowed) {
  fs::create_directories(folder_);
  std::ofstream(root_ + "/elsewhere")
      << "ddprun-quarantine 1\nhost=gpu-02 until_unix_ms=99999999999999 times=1\n";
  fs::create_symlink(root_ + "/elsewhere", folder_ + "/" + FileJournal::kQuarantineFileName);
  EXPECT_TRUE(Open().Quarantined().empty());
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find(folder_ + "/quarantine.state is a symbolic link, not a regular file"),
            std::string::npos)
      << reports_[0];
}

// ---- Files planted in their place: nothing blocks, nothing over its bound is read --------

/// Whether `call` returns within 5 s. When it does not (blocked opening the FIFO `fifo`), the
/// FIFO's other end is opened and closed, which wakes the open: a reader then reads the end of
/// the file, a writer gets EPIPE (SIGPIPE is ignored here), and the test goes on.
template <typename Call>
bool ReturnsWithoutBlockingOn(const std::string& fifo, Call call) {
  ::signal(SIGPIPE, SIG_IGN);
  auto done = std::async(std::launch::async, call);
  if (done.wait_for(5s) == std::future_status::ready) return true;
  ::close(::open(fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  done.wait();
  return false;
}

TEST_F(JournalTest, AFifoPlantedAsTheJournalIsRefusedWithoutBlocking) {
  fs::create_directories(folder_);
  const std::string fifo = folder_ + "/" + FileJournal::kFileName;
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  FileJournal journal = Open();
  std::optional<Duration> since;
  EXPECT_TRUE(ReturnsWithoutBlockingOn(fifo, [&] { since = journal.SinceRoundsMayRun(); }))
      << "reading the journal waited for a writer of the FIFO";
  EXPECT_EQ(since, Duration::zero());  // assume the worst
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("coordinator journal: " + fifo +
                             " is a FIFO, not a regular file; assuming workers "
                             "of a previous run may still run"),
            std::string::npos)
      << reports_[0];
}

TEST_F(JournalTest, AFifoPlantedAsTheQuarantineStateIsRefusedWithoutBlocking) {
  fs::create_directories(folder_);
  const std::string fifo = folder_ + "/" + FileJournal::kQuarantineFileName;
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  FileJournal journal = Open();
  std::vector<core::QuarantinedHost> hosts;
  EXPECT_TRUE(ReturnsWithoutBlockingOn(fifo, [&] { hosts = journal.Quarantined(); }))
      << "reading the quarantine state waited for a writer of the FIFO";
  EXPECT_TRUE(hosts.empty());
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("quarantine state: " + fifo + " is a FIFO, not a regular file"),
            std::string::npos)
      << reports_[0];
}

TEST_F(JournalTest, AFifoPlantedAsTheTemporaryFileIsReplacedNotWrittenThrough) {
  fs::create_directories(folder_);
  const std::string fifo = folder_ + "/" + FileJournal::kFileName + ".new";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  FileJournal journal = Open();
  EXPECT_TRUE(ReturnsWithoutBlockingOn(fifo, [&] { journal.Record(true); }))
      << "writing the journal waited for a reader of the FIFO";
  EXPECT_EQ(ReadRecord().rfind("ddprun-journal 1 rounds_may_run=1 unix_ms=", 0), 0u) << ReadRecord();
  EXPECT_TRUE(reports_.empty()) << reports_[0];
}

TEST_F(JournalTest, AnOversizedJournalIsRefusedNotReadInPart) {
  // A good record first: a reader of only the beginning would take it.
  WriteRecord(FileJournal::Format(false, NowMillis()) + std::string(1 << 20, ' '));
  EXPECT_EQ(Open().SinceRoundsMayRun(), Duration::zero());
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("coordinator journal: " + folder_ + "/coordinator.journal is larger than 4 KiB"),
            std::string::npos)
      << reports_[0];
}

TEST_F(JournalTest, AnOversizedQuarantineStateIsRefused) {
  fs::create_directories(folder_);
  std::ofstream(folder_ + "/" + FileJournal::kQuarantineFileName)
      << "ddprun-quarantine 1\n"
      << std::string(FileJournal::kMaxQuarantineBytes, '\n');
  EXPECT_TRUE(Open().Quarantined().empty());
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("quarantine state: " + folder_ + "/quarantine.state is larger than 1 MiB"),
            std::string::npos)
      << reports_[0];
}

}  // namespace
}  // namespace ddprun::io
