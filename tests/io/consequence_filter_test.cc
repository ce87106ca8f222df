// ConsequenceFilter and the digest line: which stderr lines the console shows while a round fails.

#include "runner/io/consequence_filter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runner/io/output_splitter.h"

namespace ddprun::io {
namespace {

using Lines = std::vector<std::string>;
using namespace std::chrono_literals;

const ConsequenceFilter::Clock::time_point kT0{};

const Lines kLostPeer = {
    "Traceback (most recent call last):",
    "  File \"train.py\", line 115, in main",
    "    model = DistributedDataParallel(module)",
    "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:29824",
};
const Lines kOwnError = {
    "Traceback (most recent call last):",
    "  File \"train.py\", line 103, in main",
    "    raise RuntimeError(f\"rank {rank} fails on purpose\")",
    "RuntimeError: rank 3 fails on purpose",
};

Lines Feed(ConsequenceFilter& filter, const Lines& lines, ConsequenceFilter::Clock::time_point now = kT0) {
  Lines shown;
  for (const std::string& line : lines) filter.Line(line, now, shown);
  return shown;
}

TEST(ConsequenceFilterTest, PlainLinesAndOwnErrorsAreShownAtOnce) {
  ConsequenceFilter filter;
  EXPECT_EQ(Feed(filter, {"warning: something", ""}), (Lines{"warning: something", ""}));
  // A traceback is shown once complete, whole, because it is not a consequence.
  EXPECT_EQ(Feed(filter, {kOwnError.begin(), kOwnError.end() - 1}), Lines{});
  EXPECT_FALSE(filter.Settled());
  EXPECT_EQ(Feed(filter, {kOwnError.back()}), kOwnError);
  EXPECT_TRUE(filter.Settled());
}

TEST(ConsequenceFilterTest, ALostPeerIsHeldAndCollapsedWhenAnotherRankIsTheCause) {
  ConsequenceFilter filter;
  EXPECT_EQ(Feed(filter, kLostPeer), Lines{});
  EXPECT_EQ(Feed(filter, {"[W ProcessGroupGloo.cpp] warning after it"}), Lines{});
  EXPECT_EQ(filter.Deadline(), kT0 + ConsequenceFilter::kHold);
  Lines shown;
  filter.Verdict(/*is_cause=*/false, /*provisional=*/false, shown);
  EXPECT_EQ(shown, Lines{});
  EXPECT_TRUE(filter.Settled());
  EXPECT_TRUE(filter.collapsing());
  EXPECT_EQ(filter.collapsed_lines(), 5u);
  EXPECT_TRUE(filter.collapsed_lost_peer());
  EXPECT_FALSE(filter.collapsed_the_stop());
  // From now on its plain lines are counted, not shown; a stop's traceback too.
  EXPECT_EQ(Feed(filter, {"more noise", "Traceback (most recent call last):", "  File \"x\"",
                          "lightning.fabric.utilities.exceptions.SignalException: got signal: 15"}),
            Lines{});
  EXPECT_EQ(filter.collapsed_lines(), 9u);
  EXPECT_TRUE(filter.collapsed_the_stop());
  // A traceback of its own is still shown: it may turn out to be the real cause.
  EXPECT_EQ(Feed(filter, kOwnError), kOwnError);
}

TEST(ConsequenceFilterTest, HeldLinesAreShownWhenThisRankIsTheCause) {
  ConsequenceFilter filter;
  Feed(filter, kLostPeer);
  Lines shown;
  filter.Verdict(/*is_cause=*/true, /*provisional=*/false, shown);
  EXPECT_EQ(shown, kLostPeer);
  EXPECT_EQ(Feed(filter, {"after"}), Lines{"after"});
  EXPECT_EQ(filter.collapsed_lines(), 0u);
}

// Rank 0 lost rank 3 and exited first, so the coordinator's first verdict names rank 0 with an
// error that says it lost a peer (CI saw this race in the torch console test): rank 0's
// traceback stays held until the revision names rank 3, and is collapsed then.
TEST(ConsequenceFilterTest, AProvisionalVerdictNamingThisRankKeepsItsLostPeerHeldUntilTheRevision) {
  ConsequenceFilter filter;
  Feed(filter, kLostPeer, kT0);
  Lines shown;
  filter.Verdict(/*is_cause=*/true, /*provisional=*/true, shown);
  EXPECT_EQ(shown, Lines{});
  EXPECT_FALSE(filter.Settled());
  EXPECT_FALSE(filter.collapsing());
  EXPECT_EQ(Feed(filter, {"a line after it"}), Lines{}) << "kept with the held error";
  filter.Verdict(/*is_cause=*/false, /*provisional=*/false, shown);
  EXPECT_EQ(shown, Lines{});
  EXPECT_TRUE(filter.Settled());
  EXPECT_EQ(filter.collapsed_lines(), kLostPeer.size() + 1);
  EXPECT_TRUE(filter.collapsed_lost_peer());
}

// ... and when no revision comes, the rank was the first failure after all: shown after kHold.
TEST(ConsequenceFilterTest, AProvisionalVerdictWithoutARevisionShowsTheHeldErrorAfterTheHold) {
  ConsequenceFilter filter;
  Feed(filter, kLostPeer, kT0);
  Lines shown;
  filter.Verdict(/*is_cause=*/true, /*provisional=*/true, shown);
  EXPECT_EQ(filter.Deadline(), kT0 + ConsequenceFilter::kHold);
  filter.Expire(kT0 + ConsequenceFilter::kHold, shown);
  EXPECT_EQ(shown, kLostPeer);
  EXPECT_TRUE(filter.Settled());
}

TEST(ConsequenceFilterTest, WithoutAVerdictHeldLinesAreShownAfterTheHold) {
  ConsequenceFilter filter;
  Feed(filter, kLostPeer, kT0);
  Lines shown;
  filter.Expire(kT0 + ConsequenceFilter::kHold - 1ns, shown);
  EXPECT_EQ(shown, Lines{});
  filter.Expire(kT0 + ConsequenceFilter::kHold, shown);
  EXPECT_EQ(shown, kLostPeer);
  EXPECT_EQ(filter.Deadline(), std::nullopt);
}

TEST(ConsequenceFilterTest, ATracebackWithoutItsLastLineIsJudgedAtTheEndOfTheStream) {
  ConsequenceFilter filter;
  const Lines cut(kOwnError.begin(), kOwnError.end() - 1);
  EXPECT_EQ(Feed(filter, cut), Lines{});
  Lines shown;
  filter.Finish(shown);
  EXPECT_EQ(shown, cut);
}

TEST(ConsequenceFilterTest, AnEndlessTracebackIsShownAtTheBound) {
  ConsequenceFilter filter;
  Lines lines = {"Traceback (most recent call last):"};
  for (size_t i = 0; i < ConsequenceFilter::kMaxHeldLines; ++i) lines.push_back("  frame");
  EXPECT_EQ(Feed(filter, lines).size(), lines.size());
}

TEST(ConsequenceFilterTest, TheSplitterHoldsAPeersTracebackUntilTheVerdict) {
  OutputSplitter splitter("[n0 r1] ", /*show=*/true, /*keep_tail=*/true, /*triage=*/true);
  std::string console;
  std::string bytes;
  for (const std::string& line : kLostPeer) bytes += line + "\n";
  splitter.Feed("starting\n" + bytes, kT0, console);
  EXPECT_EQ(console, "[n0 r1] starting\n");
  EXPECT_EQ(splitter.ProgressDeadline(), kT0 + ConsequenceFilter::kHold);
  EXPECT_EQ(splitter.tail().size(), 5u) << "the failure summary still gets the tail";
  console.clear();
  splitter.Finish(console);
  splitter.Verdict(/*is_cause=*/false, /*provisional=*/false, console);
  EXPECT_EQ(console, "");
  EXPECT_EQ(splitter.filter().collapsed_lines(), 4u);
}

TEST(ConsequenceDigestTest, NamesTheRanksByKindTheCountAndTheFolder) {
  EXPECT_EQ(ConsequenceDigest(0, 3, {{0, 15, true, false}, {1, 15, true, false}}, "/l/run/attempt-0"),
            "round 0: after rank 3 failed, ranks 0-1 lost a peer, as expected; 30 lines of their "
            "stderr are not shown here (every byte is in /l/run/attempt-0/rank-<r>.log)");
  EXPECT_EQ(
      ConsequenceDigest(
          2, -1, {{4, 1, false, true}, {6, 2, true, false}, {7, 1, false, false}, {9, 3, true, false}}, "d"),
      "round 2: after the root cause, ranks 6, 9 lost a peer, as expected; rank 4 was stopped; "
      "rank 7 kept writing to stderr; 7 lines of their stderr are not shown here (every byte is in "
      "d/rank-<r>.log)");
  EXPECT_EQ(ConsequenceDigest(1, 3, {{2, 1, true, false}}, "d"),
            "round 1: after rank 3 failed, rank 2 lost a peer, as expected; 1 line of its stderr is not "
            "shown here (every byte is in d/rank-<r>.log)");
}

}  // namespace
}  // namespace ddprun::io
