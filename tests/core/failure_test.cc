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
  EXPECT_TRUE(
      LooksLikeALostPeer("",
                         "Traceback ...\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
                         "Connection closed by peer [127.0.0.1]:1234\n"));
  EXPECT_TRUE(LooksLikeALostPeer(
      "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error",
      ""));
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

TEST(FailureKindsTest, TheExceptionTypeComesFromTheErrorFileElseTheLastLinesOfStderr) {
  EXPECT_EQ(ExceptionType("Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: x\n", ""),
            "ValueError");
  EXPECT_EQ(ExceptionType("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate", ""),
            "torch.cuda.OutOfMemoryError");
  // A script that does not parse: Python prints no "Traceback" header.
  EXPECT_EQ(ExceptionType("",
                          "  File \"/job/train.py\", line 3\n    def (\n        ^\n"
                          "SyntaxError: invalid syntax\n"),
            "SyntaxError");
  EXPECT_EQ(ExceptionType("",
                          "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
                          "    import lightning\nModuleNotFoundError: No module named 'lightning'\n"),
            "ModuleNotFoundError");
  EXPECT_EQ(ExceptionType("", "KeyboardInterrupt\n"), "KeyboardInterrupt");
  // Indented, quoted, or not an exception name: nothing.
  EXPECT_EQ(ExceptionType("", "    raise ValueError('x')\nloss: 0.31\nEpoch 3: 100%\n"), "");
  EXPECT_EQ(ExceptionType("", "Segmentation fault (core dumped)\n"), "");
  // The error file wins over stderr.
  EXPECT_EQ(ExceptionType("RuntimeError: boom", "ValueError: later\n"), "RuntimeError");
}

std::vector<std::string> Texts(int exit_code, int signal, const std::string& error_file,
                               const std::string& tail) {
  return KindTexts(FailureKinds(exit_code, signal, error_file, tail));
}

TEST(FailureKindsTest, KindsGoFromTheMostSpecific) {
  EXPECT_EQ(Texts(1, 0, "", "SyntaxError: invalid syntax\n"),
            (std::vector<std::string>{"SyntaxError", "exit:1"}));
  EXPECT_EQ(Texts(0, 11, "", ""), (std::vector<std::string>{"signal:SIGSEGV"}));
  EXPECT_EQ(Texts(1, 0, "", "torch.cuda.OutOfMemoryError: CUDA out of memory.\n"),
            (std::vector<std::string>{"torch.cuda.OutOfMemoryError", "oom", "exit:1"}));
  EXPECT_EQ(Texts(1, 0, "",
                  "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                  "Connection closed by peer [127.0.0.1]:4242\n"),
            (std::vector<std::string>{"RuntimeError", "lost-peer", "exit:1"}));
  EXPECT_EQ(Texts(2, 0, "", "usage: train.py [-h]\ntrain.py: error: unrecognized arguments: --lr\n"),
            (std::vector<std::string>{"exit:2"}));
}

TEST(FailureKindsTest, NeverOnRulesMatchKinds) {
  const std::vector<FailureKind> oom = ParseKinds({"torch.cuda.OutOfMemoryError", "oom", "exit:1"});
  EXPECT_TRUE(RuleMatches("OutOfMemoryError", oom));
  EXPECT_TRUE(RuleMatches("torch.cuda.OutOfMemoryError", oom));
  EXPECT_TRUE(RuleMatches("oom", oom));
  EXPECT_TRUE(RuleMatches("exit:1", oom));
  EXPECT_FALSE(RuleMatches("exit:2", oom));
  EXPECT_FALSE(RuleMatches("MemoryError", oom));  // a suffix, not a name
  EXPECT_FALSE(RuleMatches("cuda.OutOfMemory", oom));
  const std::vector<FailureKind> segv = {FailureKind::Signal(11)};
  EXPECT_TRUE(RuleMatches("signal:SIGSEGV", segv));
  EXPECT_TRUE(RuleMatches("signal:11", segv));
  EXPECT_FALSE(RuleMatches("signal:9", segv));
  EXPECT_FALSE(RuleMatches("signal:99999999999", segv));
  EXPECT_FALSE(RuleMatches("SIGSEGV", segv));  // an exception name, not the signal
  // A signal no name is known for here matches by number, and only by number.
  const std::vector<FailureKind> usr1 = {FailureKind::Signal(10)};
  EXPECT_TRUE(RuleMatches("signal:10", usr1));
  EXPECT_FALSE(RuleMatches("signal:SIGUSR1", usr1));
  EXPECT_FALSE(RuleMatches("signal:SIGUSR1", {FailureKind::Parse("signal:SIGUSR1")}));
}

// Every kind read back from its text (an event log) is the kind that wrote it.
TEST(FailureKindsTest, TextAndParseAreInverse) {
  using Type = FailureKind::Type;
  const std::vector<FailureKind> kinds = {FailureKind::Exception("torch.cuda.OutOfMemoryError"),
                                          FailureKind::Of(Type::kOom),
                                          FailureKind::Of(Type::kNccl),
                                          FailureKind::Of(Type::kLostPeer),
                                          FailureKind::Signal(9),
                                          FailureKind::Signal(42),
                                          FailureKind::Exit(1),
                                          FailureKind::Exit(-3),
                                          FailureKind::Of(Type::kHang),
                                          FailureKind::Of(Type::kLostNode),
                                          FailureKind::Of(Type::kStall)};
  const std::vector<std::string> texts = KindTexts(kinds);
  EXPECT_EQ(texts, (std::vector<std::string>{"torch.cuda.OutOfMemoryError", "oom", "nccl", "lost-peer",
                                             "signal:SIGKILL", "signal:signal 42", "exit:1", "exit:-3",
                                             "hang", "lost-node", "stall"}));
  EXPECT_EQ(ParseKinds(texts), kinds);
  EXPECT_TRUE(HasKind(kinds, Type::kStall));
  EXPECT_FALSE(HasKind({FailureKind::Exit(0)}, Type::kHang));
  // A word none of the kinds spells is an exception's name.
  EXPECT_EQ(FailureKind::Parse("exit:x"), FailureKind::Exception("exit:x"));
}

}  // namespace ddprun::core
