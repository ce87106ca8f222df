// OutputSplitter: console lines with the rank's prefix, live '\r' progress at most once per
// interval (always the latest), the stderr tail, lines without end.

#include "runner/io/output_splitter.h"

#include <gtest/gtest.h>

namespace ddprun::io {
namespace {

using namespace std::chrono_literals;
using Clock = OutputSplitter::Clock;

class SplitterTest : public ::testing::Test {
 protected:
  /// Feeds `bytes` at t0 + `at` and returns what the console gets.
  std::string Feed(std::string_view bytes, Clock::duration at = 0s) {
    std::string console;
    splitter_.Feed(bytes, t0_ + at, console);
    return console;
  }
  std::string Flush(Clock::duration at) {
    std::string console;
    splitter_.FlushProgress(t0_ + at, console);
    return console;
  }
  std::string Finish() {
    std::string console;
    splitter_.Finish(console);
    return console;
  }

  OutputSplitter splitter_{"[n0 r1] ", /*show=*/true, /*keep_tail=*/true};
  Clock::time_point t0_ = Clock::time_point(100s);
};

TEST_F(SplitterTest, WholeLinesArePrefixedAndAPartialLineWaitsForItsEnd) {
  EXPECT_EQ(Feed("epoch 1\nepoch"), "[n0 r1] epoch 1\n");
  EXPECT_EQ(Feed(" 2\n"), "[n0 r1] epoch 2\n");
  EXPECT_EQ(Feed("no newline"), "");
  EXPECT_EQ(Finish(), "[n0 r1] no newline\n");
}

TEST_F(SplitterTest, ProgressUpdatesShowAtOncePerIntervalAndAlwaysTheLatest) {
  EXPECT_EQ(Feed("\r  1%|          | 1/100"), "[n0 r1]   1%|          | 1/100\n");
  EXPECT_FALSE(splitter_.ProgressDeadline());
  EXPECT_EQ(Feed("\r  2%|          | 2/100", 100ms), "");
  EXPECT_EQ(splitter_.ProgressDeadline(), t0_ + OutputSplitter::kProgressInterval);
  EXPECT_EQ(Feed("\r  3%|          | 3/100", 200ms), "");
  EXPECT_EQ(Flush(999ms), "");
  EXPECT_EQ(Flush(1s), "[n0 r1]   3%|          | 3/100\n");
  EXPECT_FALSE(splitter_.ProgressDeadline());
  // The end of the bar is a line: shown at once, not rate-limited.
  EXPECT_EQ(Feed("\r100%|##########| 100/100\n", 1100ms), "[n0 r1] 100%|##########| 100/100\n");
  EXPECT_EQ(Feed("next\n", 1200ms), "[n0 r1] next\n");
}

TEST_F(SplitterTest, UpdatesEndedByACarriageReturnShowToo) {
  EXPECT_EQ(Feed("10%\r"), "[n0 r1] 10%\n");
  EXPECT_EQ(Feed("20%\r", 500ms), "");
  EXPECT_EQ(Feed("30%\r", 2s), "[n0 r1] 30%\n");
  EXPECT_EQ(Feed("done\n", 2100ms), "[n0 r1] done\n");
}

TEST_F(SplitterTest, TheLastUpdateIsNotRepeatedWhenItsLineEnds) {
  EXPECT_EQ(Feed("\r100%"), "[n0 r1] 100%\n");
  EXPECT_EQ(Feed("\n", 100ms), "");
  EXPECT_EQ(splitter_.tail().back(), "100%") << "the tail keeps what the terminal shows";
}

TEST_F(SplitterTest, AnUpdateCutByAReadIsCompletedByTheNext) {
  EXPECT_EQ(Feed("\r 5%|#"), "[n0 r1]  5%|#\n");
  EXPECT_EQ(Feed("#   |", 2s), "[n0 r1]  5%|##   |\n");
}

TEST_F(SplitterTest, CrLfEndsALine) {
  EXPECT_EQ(Feed("windows\r"), "[n0 r1] windows\n");
  EXPECT_EQ(Feed("\n", 10ms), "");
  EXPECT_EQ(Feed("line\r\n", 20ms), "[n0 r1] line\n");
  EXPECT_EQ(splitter_.tail().size(), 2u);
}

TEST_F(SplitterTest, TheTailKeepsTheLastLinesAsTheTerminalShowsThem) {
  for (int i = 0; i < 30; ++i) Feed("\rstep " + std::to_string(i) + "\rline " + std::to_string(i) + "\n");
  ASSERT_EQ(splitter_.tail().size(), OutputSplitter::kTailLines);
  EXPECT_EQ(splitter_.tail().front(), "line 10");
  EXPECT_EQ(splitter_.tail().back(), "line 29");
}

TEST_F(SplitterTest, ALineWithoutEndIsShownInPieces) {
  const std::string piece(OutputSplitter::kMaxLine + 1, 'x');
  EXPECT_EQ(Feed(piece), "[n0 r1] " + piece + "\n");
  EXPECT_EQ(Feed("y\n"), "[n0 r1] y\n");
}

TEST(Splitter, AHiddenStreamShowsNothingButKeepsItsTail) {
  OutputSplitter hidden("[n0 r2] ", /*show=*/false, /*keep_tail=*/true);
  std::string console;
  hidden.Feed("Traceback\n\rbar", Clock::time_point(1s), console);
  hidden.Finish(console);
  EXPECT_EQ(console, "");
  ASSERT_EQ(hidden.tail().size(), 2u);
  EXPECT_EQ(hidden.tail()[0], "Traceback");
  EXPECT_EQ(hidden.tail()[1], "bar");
}

}  // namespace
}  // namespace ddprun::io
