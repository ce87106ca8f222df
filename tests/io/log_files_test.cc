// Files below logs.dir: created new, never through a planted link, never over a file; read
// back only when regular, without following links or blocking, within a bound (safe_file.h).

#include "runner/io/log_files.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "runner/io/safe_file.h"

namespace ddprun::io {
namespace {

namespace fs = std::filesystem;

class LogFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "ddprun-logs-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    root_ = templ;
    root_fd_ = UniqueFd(::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_fd_.valid());
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& name, const std::string& text) {
    fs::create_directories((fs::path(root_) / name).parent_path());
    std::ofstream(fs::path(root_) / name) << text;
  }
  std::string Read(const std::string& name) {
    std::ifstream in(fs::path(root_) / name);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string root_;
  UniqueFd root_fd_;
};

TEST_F(LogFilesTest, CreatesTheFileAndItsFolders) {
  auto created = CreateFileBelow(root_fd_.get(), "logs", "attempt-0/rank-1.log");
  ASSERT_TRUE(created) << created.error();
  const UniqueFd fd = *std::move(created);
  ASSERT_EQ(::write(fd.get(), "hi\n", 3), 3);
  EXPECT_EQ(Read("attempt-0/rank-1.log"), "hi\n");
  EXPECT_EQ(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

TEST_F(LogFilesTest, APlantedLinkToAVictimIsNotFollowed) {
  Write("victim.txt", "precious\n");
  fs::create_directories(fs::path(root_) / "attempt-0");
  fs::create_symlink(fs::path(root_) / "victim.txt", fs::path(root_) / "attempt-0/rank-1.log");
  const auto refused = CreateFileBelow(root_fd_.get(), "logs", "attempt-0/rank-1.log");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(),
            "logs/attempt-0/rank-1.log is a symbolic link; ddprun follows no link below "
            "logs.dir (someone may have planted it to make ddprun write elsewhere)");
  EXPECT_EQ(Read("victim.txt"), "precious\n");
}

TEST_F(LogFilesTest, APlantedFolderLinkIsNotFollowed) {
  fs::create_directories(fs::path(root_) / "elsewhere");
  fs::create_directory_symlink(fs::path(root_) / "elsewhere", fs::path(root_) / "attempt-0");
  const auto refused = CreateFileBelow(root_fd_.get(), "logs", "attempt-0/rank-1.log");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(),
            "logs/attempt-0 is a symbolic link; ddprun follows no link below logs.dir "
            "(someone may have planted it to make ddprun write elsewhere)");
  EXPECT_TRUE(fs::is_empty(fs::path(root_) / "elsewhere"));
}

TEST_F(LogFilesTest, AnExistingFileIsNeitherTruncatedNorWritten) {
  Write("attempt-0/rank-1.log", "an earlier run\n");
  const auto refused = CreateFileBelow(root_fd_.get(), "logs", "attempt-0/rank-1.log");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(),
            "logs/attempt-0/rank-1.log exists already; ddprun writes only files it created "
            "in this run");
  EXPECT_EQ(Read("attempt-0/rank-1.log"), "an earlier run\n");
}

TEST_F(LogFilesTest, ARunFolderMustBeNew) {
  const auto first = OpenFolderBelow(root_fd_.get(), "logs", "job/run-1", true);
  EXPECT_TRUE(first) << first.error();
  const auto again = OpenFolderBelow(root_fd_.get(), "logs", "job/run-1", true);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error(), "logs/job/run-1 exists already; ddprun writes only files it created in this run");
  const auto job = OpenFolderBelow(root_fd_.get(), "logs", "job", false);
  EXPECT_TRUE(job) << job.error();
}

// ---- Reading back (safe_file.h) ------------------------------------------------------------

TEST_F(LogFilesTest, ARegularFileIsReadAndAMissingOneIsNone) {
  Write("run/attempt-0/rank-1.error.json", "{}");
  auto read = ReadRegularFile(root_fd_.get(), "run/attempt-0/rank-1.error.json", "shown", 64);
  ASSERT_TRUE(read) << read.error();
  EXPECT_EQ(read->value_or("none"), "{}");
  auto missing = ReadRegularFile(root_fd_.get(), "run/attempt-0/rank-2.error.json", "shown", 64);
  ASSERT_TRUE(missing) << missing.error();
  EXPECT_FALSE(*missing);
}

TEST_F(LogFilesTest, WhatIsNotARegularFileIsRefusedAndNamed) {
  Write("victim", "secret");
  Write("run/attempt-0/placeholder", "");
  fs::create_symlink(root_ + "/victim", root_ + "/run/attempt-0/link.json");
  fs::create_directory_symlink(root_ + "/run/attempt-0", root_ + "/run/attempt-9");
  ASSERT_EQ(::mkfifo((root_ + "/run/attempt-0/fifo.json").c_str(), 0600), 0);
  fs::create_directory(root_ + "/run/attempt-0/folder.json");
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string socket_path = root_ + "/run/attempt-0/socket.json";
  ASSERT_LT(socket_path.size(), sizeof addr.sun_path);
  socket_path.copy(addr.sun_path, socket_path.size());
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  auto refusal = [&](const std::string& relative) {
    auto read = ReadRegularFile(root_fd_.get(), relative, "logs/" + relative, 64);
    return read ? std::string("read") : read.error();
  };
  EXPECT_EQ(refusal("run/attempt-0/link.json"),
            "logs/run/attempt-0/link.json is a symbolic link, not a regular file");
  EXPECT_EQ(refusal("run/attempt-0/fifo.json"), "logs/run/attempt-0/fifo.json is a FIFO, not a regular file");
  EXPECT_EQ(refusal("run/attempt-0/socket.json"),
            "logs/run/attempt-0/socket.json is a socket, not a regular file");
  EXPECT_EQ(refusal("run/attempt-0/folder.json"),
            "logs/run/attempt-0/folder.json is a folder, not a regular file");
  EXPECT_EQ(refusal("run/attempt-9/placeholder"),
            "attempt-9 (on the way to logs/run/attempt-9/placeholder) is a symbolic link, not a folder");
  ::close(listener);
}

TEST_F(LogFilesTest, AFileOverItsBoundIsRefusedWithTheBound) {
  Write("big", std::string(2 * 1024 * 1024 + 1, 'x'));
  auto read = ReadRegularFile(root_fd_.get(), "big", "logs/big", 2 * 1024 * 1024);
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error(), "logs/big is larger than 2 MiB");
}

TEST_F(LogFilesTest, ReplacingAFileRemovesWhatWasPlantedAsItsTemporaryName) {
  Write("victim", "keep");
  fs::create_symlink(root_ + "/victim", root_ + "/state.new");
  ASSERT_TRUE(ReplaceFile(root_fd_.get(), "logs", "state", "new text"));
  EXPECT_EQ(Read("state"), "new text");
  EXPECT_EQ(Read("victim"), "keep");
  EXPECT_FALSE(fs::exists(fs::symlink_status(root_ + "/state.new")));
}

}  // namespace
}  // namespace ddprun::io
