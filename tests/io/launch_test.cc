// PrepareLaunch: how job.command[0] is found and what environment a worker gets.

#include "runner/io/worker_start.h"

#include <gtest/gtest.h>

namespace ddprun::io {
namespace {

auto OnlyExecutable(std::string path) {
  return [path](const std::string& candidate) { return candidate == path; };
}

TEST(PrepareLaunch, FindsTheCommandOnTheWorkersPathAndMergesTheEnvironment) {
  const auto plan =
      PrepareLaunch({"python3", "train.py", "--lr", "0.1"}, "/work",
                    {{"PATH", "/usr/bin"}, {"HOME", "/root"}, {"RANK", "stale"}},
                    {{"PATH", "/venv/bin:/usr/bin"}, {"RANK", "3"}}, OnlyExecutable("/usr/bin/python3"));
  ASSERT_TRUE(plan) << plan.error();
  EXPECT_EQ(plan->executable, "/usr/bin/python3");
  EXPECT_EQ(plan->argv, (std::vector<std::string>{"/usr/bin/python3", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(plan->env, (std::vector<std::string>{"HOME=/root", "PATH=/venv/bin:/usr/bin", "RANK=3"}));
}

TEST(PrepareLaunch, APathWithASlashIsRelativeToTheWorkdir) {
  const auto plan = PrepareLaunch({"./run.sh"}, "/work/job", {}, {}, OnlyExecutable(""));
  ASSERT_TRUE(plan) << plan.error();
  EXPECT_EQ(plan->executable, "/work/job/./run.sh");
  const auto absolute = PrepareLaunch({"/opt/x"}, "/work/job", {}, {}, OnlyExecutable(""));
  ASSERT_TRUE(absolute) << absolute.error();
  EXPECT_EQ(absolute->executable, "/opt/x");
}

TEST(PrepareLaunch, SaysWhatIsMissing) {
  const auto missing = PrepareLaunch({"nope"}, "/w", {{"PATH", "/a:/b"}}, {}, OnlyExecutable(""));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error(), "command not found: \"nope\" is not on PATH");
  const auto empty = PrepareLaunch({}, "/w", {}, {}, OnlyExecutable(""));
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error(), "job.command is empty");
}

}  // namespace
}  // namespace ddprun::io
