// The words for how a worker ended, as summaries and logs print them.

#include "runner/core/failure.h"

#include <gtest/gtest.h>

#include <csignal>

namespace ddprun::core {
namespace {

TEST(FailureTest, SignalNames) {
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(SignalName(42), "signal 42");
}

TEST(FailureTest, DescribeExit) {
  EXPECT_EQ(DescribeExit(1, 0), "exited with code 1");
  EXPECT_EQ(DescribeExit(0, 9), "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(DescribeExit(-1, 0), "exited with code -1");
}

TEST(FailureTest, IndentPrefixesEveryLineAndDropsTrailingBlankLines) {
  EXPECT_EQ(Indent("a\nb", "  | "), "  | a\n  | b\n");
  EXPECT_EQ(Indent("a\nb\n\n\n", "  | "), "  | a\n  | b\n");
  EXPECT_EQ(Indent("a\n\nb\n", "> "), "> a\n> \n> b\n");
  EXPECT_EQ(Indent("", "> "), "");
}

}  // namespace
}  // namespace ddprun::core
