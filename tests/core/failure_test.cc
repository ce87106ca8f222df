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
TEST(FailureTest, AnErrorThatOnlyLostAPeerIsRecognised) {
  EXPECT_TRUE(LooksLikeALostPeer("", "Traceback ...\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:1234\n"));
  EXPECT_TRUE(LooksLikeALostPeer("torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error", ""));
  EXPECT_TRUE(LooksLikeALostPeer("", "ConnectionResetError: [Errno 104] Connection reset by peer\n"));
  EXPECT_FALSE(LooksLikeALostPeer("RuntimeError: CUDA out of memory", ""));
  EXPECT_FALSE(LooksLikeALostPeer("", "ValueError: bad batch\n"));
  // Only the end of stderr counts: a log line long before the error is not the error.
  EXPECT_FALSE(LooksLikeALostPeer(
      "", "warning: Connection reset by peer, retrying\nstep 1\nstep 2\nstep 3\nstep 4\nKeyError: 'x'\n"));
}

TEST(FailureTest, AnErrorThatIsTheStopItselfIsRecognised) {
  EXPECT_TRUE(LooksLikeTheStop("SignalException: Process 4242 got signal: 15", ""));
  EXPECT_TRUE(LooksLikeTheStop("", "Traceback ...\nKeyboardInterrupt\n"));
  EXPECT_FALSE(LooksLikeTheStop("RuntimeError: rank 3 fails on purpose", ""));
}

}  // namespace ddprun::core
