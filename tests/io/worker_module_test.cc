// Finding the staged `ddprun` Python module beside the binary, and adding it to PYTHONPATH.

#include "runner/io/worker_module.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace ddprun::io {
namespace {

namespace fs = std::filesystem;

class DdprunPythonDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "ddprun-prefix-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    prefix_ = fs::canonical(templ);
    fs::create_directories(prefix_ / "bin");
  }
  void TearDown() override { fs::remove_all(prefix_); }
  void Stage(const fs::path& package) {
    fs::create_directories(package);
    std::ofstream(package / "__init__.py") << "\n";
  }

  fs::path prefix_;
};

TEST_F(DdprunPythonDirTest, FindsThePackageInShareBesideTheBinFolder) {
  Stage(prefix_ / "share/ddprun/python/ddprun");
  EXPECT_EQ(DdprunPythonDirFor((prefix_ / "bin/ddprun").string()),
            (prefix_ / "share/ddprun/python").string());
}

TEST_F(DdprunPythonDirTest, ReturnsACanonicalPathThroughALinkedBinFolder) {
  Stage(prefix_ / "real/share/ddprun/python/ddprun");
  fs::create_directories(prefix_ / "real/bin");
  fs::create_directory_symlink(prefix_ / "real/bin", prefix_ / "linked-bin");
  // The kernel resolves ".." in the link's target folder, so the result is below real/.
  EXPECT_EQ(DdprunPythonDirFor((prefix_ / "linked-bin/ddprun").string()),
            (prefix_ / "real/share/ddprun/python").string());
}

TEST_F(DdprunPythonDirTest, NothingWhenThePackageHasNoInitFile) {
  fs::create_directories(prefix_ / "share/ddprun/python/ddprun");
  EXPECT_EQ(DdprunPythonDirFor((prefix_ / "bin/ddprun").string()), std::nullopt);
}

TEST_F(DdprunPythonDirTest, NothingWhenShareIsMissing) {
  EXPECT_EQ(DdprunPythonDirFor((prefix_ / "bin/ddprun").string()), std::nullopt);
}

TEST(DdprunPythonDir, TheBuildStagesThePackageWhereTheBuiltBinaryLooks) {
  // A binary at <build>/cli/ddprun looks in <build>/share/ddprun/python (worker/CMakeLists.txt).
  EXPECT_EQ(DdprunPythonDirFor(DDPRUN_BUILD_DIR "/cli/ddprun"),
            fs::canonical(DDPRUN_BUILD_DIR "/share/ddprun/python").string());
}

TEST(DdprunPythonDir, LooksBesideTheRunningBinary) {
  // This test binary is <build>/tests/io/io_unit_test: stage a package at <build>/tests/share.
  const fs::path share = fs::canonical("/proc/self/exe").parent_path().parent_path() / "share";
  ASSERT_FALSE(fs::exists(share)) << share << " is left from an earlier run; remove it";
  EXPECT_EQ(DdprunPythonDir(), std::nullopt);
  fs::create_directories(share / "ddprun/python/ddprun");
  std::ofstream(share / "ddprun/python/ddprun/__init__.py") << "\n";
  EXPECT_EQ(DdprunPythonDir(), (share / "ddprun/python").string());
  fs::remove_all(share);
}

}  // namespace
}  // namespace ddprun::io
