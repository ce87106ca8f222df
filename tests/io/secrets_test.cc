// The shared secret from DDPRUN_SECRET or DDPRUN_SECRET_FILE, and its removal from the workers'
// environment (runner/io/secrets.h), word for word.
#include "runner/io/secrets.h"

#include <filesystem>
#include <fstream>

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "tests/support/scoped_env.h"

namespace ddprun::io {
namespace {

namespace fs = std::filesystem;
using test::ScopedEnv;

class SecretsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "ddprun-secrets-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    root_ = templ;
  }
  void TearDown() override { fs::remove_all(root_); }
  /// A file holding `text` with `mode`; its path.
  std::string File(const std::string& text, mode_t mode) {
    const std::string path = root_ + "/secret";
    std::ofstream(path, std::ios::binary) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::string root_;
};

TEST_F(SecretsTest, TheVariableWinsOverTheFile) {
  ScopedEnv file("DDPRUN_SECRET_FILE", File("from-file\n", 0600).c_str());
  ScopedEnv secret("DDPRUN_SECRET", "from-variable");
  auto shared = ReadSharedSecret();
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->secret, "from-variable");
  EXPECT_EQ(shared->warning, "");
}

TEST_F(SecretsTest, NeitherVariableMeansNoSecret) {
  ScopedEnv secret("DDPRUN_SECRET", nullptr);
  ScopedEnv file("DDPRUN_SECRET_FILE", "");
  auto shared = ReadSharedSecret();
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->secret, "");
  EXPECT_EQ(shared->warning, "");
}

TEST_F(SecretsTest, TheFileLosesItsLineEndsAndAnEmptyVariableCountsAsUnset) {
  ScopedEnv secret("DDPRUN_SECRET", "");
  ScopedEnv file("DDPRUN_SECRET_FILE", File("s3 cret\r\n\n", 0600).c_str());
  auto shared = ReadSharedSecret();
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->secret, "s3 cret");
  EXPECT_EQ(shared->warning, "");
}

TEST_F(SecretsTest, AFileOthersCanReadIsUsedWithAWarning) {
  ScopedEnv secret("DDPRUN_SECRET", nullptr);
  const std::string path = File("s3cret", 0644);
  ScopedEnv file("DDPRUN_SECRET_FILE", path.c_str());
  auto shared = ReadSharedSecret();
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->secret, "s3cret");
  EXPECT_EQ(shared->warning, "DDPRUN_SECRET_FILE " + path + " is readable by other users (chmod 600 it)");
}

TEST_F(SecretsTest, AnEmptyOrMissingFileIsAFailure) {
  ScopedEnv secret("DDPRUN_SECRET", nullptr);
  const std::string empty = File("\n\r\n", 0600);
  {
    ScopedEnv file("DDPRUN_SECRET_FILE", empty.c_str());
    EXPECT_EQ(ReadSharedSecret().error(), "DDPRUN_SECRET_FILE " + empty + " is empty");
  }
  const std::string missing = root_ + "/nothing-here";
  ScopedEnv file("DDPRUN_SECRET_FILE", missing.c_str());
  EXPECT_EQ(ReadSharedSecret().error(),
            "cannot read DDPRUN_SECRET_FILE " + missing + ": No such file or directory");
}

TEST(RemoveSharedSecretTest, WorkersGetNeitherVariable) {
  std::map<std::string, std::string> env = {
      {"DDPRUN_SECRET", "s"}, {"DDPRUN_SECRET_FILE", "/f"}, {"DDPRUN_NODE_RANK", "1"}, {"PATH", "/bin"}};
  RemoveSharedSecret(env);
  EXPECT_EQ(env, (std::map<std::string, std::string>{{"DDPRUN_NODE_RANK", "1"}, {"PATH", "/bin"}}));
}

}  // namespace
}  // namespace ddprun::io
