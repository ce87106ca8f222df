// PrepareLaunch: how job.command[0] is found and what environment a worker gets.

#include "runner/io/process_launcher.h"

#include <gtest/gtest.h>

namespace ddprun::io {
namespace {

auto OnlyExecutable(std::string path) {
  return [path](const std::string& candidate) { return candidate == path; };
}

TEST(PrepareLaunch, FindsTheCommandOnTheWorkersPathAndMergesTheEnvironment) {
  std::string error;
  const auto plan = PrepareLaunch({"python3", "train.py", "--lr", "0.1"}, "/work",
                                  {{"PATH", "/usr/bin"}, {"HOME", "/root"}, {"RANK", "stale"}},
                                  {{"PATH", "/venv/bin:/usr/bin"}, {"RANK", "3"}},
                                  OnlyExecutable("/usr/bin/python3"), error);
  ASSERT_TRUE(plan) << error;
  EXPECT_EQ(plan->executable, "/usr/bin/python3");
  EXPECT_EQ(plan->argv, (std::vector<std::string>{"/usr/bin/python3", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(plan->env, (std::vector<std::string>{"HOME=/root", "PATH=/venv/bin:/usr/bin", "RANK=3"}));
}

TEST(PrepareLaunch, APathWithASlashIsRelativeToTheWorkdir) {
  std::string error;
  const auto plan = PrepareLaunch({"./run.sh"}, "/work/job", {}, {}, OnlyExecutable(""), error);
  ASSERT_TRUE(plan) << error;
  EXPECT_EQ(plan->executable, "/work/job/./run.sh");
  const auto absolute = PrepareLaunch({"/opt/x"}, "/work/job", {}, {}, OnlyExecutable(""), error);
  ASSERT_TRUE(absolute) << error;
  EXPECT_EQ(absolute->executable, "/opt/x");
}

TEST(PrepareLaunch, SaysWhatIsMissing) {
  std::string error;
  EXPECT_FALSE(PrepareLaunch({"nope"}, "/w", {{"PATH", "/a:/b"}}, {}, OnlyExecutable(""), error));
  EXPECT_EQ(error, "command not found: \"nope\" is not on PATH");
  EXPECT_FALSE(PrepareLaunch({}, "/w", {}, {}, OnlyExecutable(""), error));
  EXPECT_EQ(error, "job.command is empty");
}

}  // namespace
}  // namespace ddprun::io
