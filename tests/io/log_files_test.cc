// Files below logs.dir: created new, never through a planted link, never over a file.

#include "runner/io/log_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

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
  EXPECT_EQ(refused.error(), "logs/attempt-0/rank-1.log is a symbolic link; ddprun follows no link below "
                   "logs.dir (someone may have planted it to make ddprun write elsewhere)");
  EXPECT_EQ(Read("victim.txt"), "precious\n");
}

TEST_F(LogFilesTest, APlantedFolderLinkIsNotFollowed) {
  fs::create_directories(fs::path(root_) / "elsewhere");
  fs::create_directory_symlink(fs::path(root_) / "elsewhere", fs::path(root_) / "attempt-0");
  const auto refused = CreateFileBelow(root_fd_.get(), "logs", "attempt-0/rank-1.log");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), "logs/attempt-0 is a symbolic link; ddprun follows no link below logs.dir "
                   "(someone may have planted it to make ddprun write elsewhere)");
  EXPECT_TRUE(fs::is_empty(fs::path(root_) / "elsewhere"));
}

TEST_F(LogFilesTest, AnExistingFileIsNeitherTruncatedNorWritten) {
  Write("attempt-0/rank-1.log", "an earlier run\n");
  const auto refused = CreateFileBelow(root_fd_.get(), "logs", "attempt-0/rank-1.log");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), "logs/attempt-0/rank-1.log exists already; ddprun writes only files it created "
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

}  // namespace
}  // namespace ddprun::io
