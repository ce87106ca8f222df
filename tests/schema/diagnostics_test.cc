// Rendering of diagnostics: layout, caret, hint, note, sorting, count line, color.
#include <gtest/gtest.h>

#include "schema/diagnostics.h"
#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

TEST(Diagnostics, RendersLikeACompiler) {
  auto r = testing::Parse(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nnnodes = 2\n"
      "nproc_per_node = 4\n[trainer]\ndevices = 8\nnum_nodes = 2\n");
  EXPECT_EQ(RenderDiagnostics(r.diagnostics, "job.toml", r.source_text, false),
            "job.toml:7:18: error: cluster.nproc_per_node = 4 does not match trainer.devices = 8\n"
            "    7 | nproc_per_node = 4\n"
            "      |                  ^\n"
            "   hint: set trainer.devices = 4 or cluster.nproc_per_node = 8\n"
            "1 error, 0 warnings\n");
}

TEST(Diagnostics, SortsByPositionWithFileLevelFirstAndRendersNotes) {
  Diagnostics d;
  d.Warning({3, 2}, "b", "later");
  d.Error({1, 5}, "a", "first", "fix it");
  d.AddNote({2, 1}, "see here");
  d.Error({}, "", "whole file");
  const std::string text = "abcdefg\n\tx = 1\n  y\n";
  EXPECT_EQ(RenderDiagnostics(d, "f.toml", text, false),
            "f.toml: error: whole file\n"
            "f.toml:1:5: error: first\n"
            "    1 | abcdefg\n"
            "      |     ^\n"
            "   hint: fix it\n"
            "f.toml:2:1: note: see here\n"
            "    2 | \tx = 1\n"
            "      | ^\n"
            "f.toml:3:2: warning: later\n"
            "    3 |   y\n"
            "      |  ^\n"
            "2 errors, 1 warning\n");
  EXPECT_EQ(DiagnosticsSummary(d), "2 errors, 1 warning");
  EXPECT_EQ(d.ErrorCount(), 2);
  EXPECT_EQ(d.WarningCount(), 1);
  EXPECT_TRUE(d.HasErrors());
}

TEST(Diagnostics, TabsAndMultibyteKeepTheCaretAligned) {
  Diagnostics d;
  d.Error({1, 4}, "", "m");
  EXPECT_EQ(RenderDiagnostics(d, "f", "\té=x\n", false),
            "f:1:4: error: m\n"
            "    1 | \té=x\n"
            "      | \t  ^\n"
            "1 error, 0 warnings\n");
}

TEST(Diagnostics, NothingToSayIsEmpty) {
  EXPECT_EQ(RenderDiagnostics(Diagnostics{}, "f", "", false), "");
  EXPECT_EQ(DiagnosticsSummary(Diagnostics{}), "");
}

TEST(Diagnostics, ColorOnlyWhenAsked) {
  Diagnostics d;
  d.Error({1, 1}, "", "m", "h");
  const std::string plain = RenderDiagnostics(d, "f", "x\n", false);
  const std::string colored = RenderDiagnostics(d, "f", "x\n", true);
  EXPECT_EQ(plain.find('\x1b'), std::string::npos);
  EXPECT_NE(colored.find("\x1b[1;31merror:\x1b[0m"), std::string::npos);
}

TEST(Diagnostics, LineBeyondTheTextStillRenders) {
  Diagnostics d;
  d.Error({9, 3}, "", "eof");
  EXPECT_EQ(RenderDiagnostics(d, "f", "a\n", false),
            "f:9:3: error: eof\n"
            "    9 | \n"
            "      |   ^\n"
            "1 error, 0 warnings\n");
}

// A line of a binary or hostile file reaches the terminal escaped, as clang does.
TEST(Diagnostics, EscapesWhatIsNotPrintableUtf8) {
  Diagnostics d;
  d.Error({1, 9}, "", "bad \x1b[2J byte");
  const std::string text = std::string("\x1b[31mred\0\xff\xe2\x80\xaeok\t\xc3\xa9", 18) + "\n";
  EXPECT_EQ(RenderDiagnostics(d, "f.toml", text, false),
            "f.toml:1:9: error: bad <U+001B>[2J byte\n"
            "    1 | <U+001B>[31mred<U+0000><FF><U+202E>ok\t\xc3\xa9\n"
            "      |                ^\n"
            "1 error, 0 warnings\n");
}

// Multi-line text from outside (a peer's reason, a traceback) keeps its lines, and nothing in
// them reaches the terminal as a control sequence.
TEST(Diagnostics, EscapesTextLineByLineKeepingLineBreaks) {
  EXPECT_EQ(EscapeLinesForTerminal("Traceback:\n  \x1b]0;owned\x07 line\r\n\tboom\xff\n"),
            "Traceback:\n  <U+001B>]0;owned<U+0007> line<U+000D>\n\tboom<FF>\n");
  EXPECT_EQ(EscapeLinesForTerminal(""), "");
  EXPECT_EQ(EscapeLinesForTerminal("\n\n"), "\n\n");
}

// A 10,000-character line is cut to a window around the caret with "..." at each cut.
TEST(Diagnostics, ShowsAWindowOfALongLine) {
  std::string line;
  for (int i = 0; i < 10'000; ++i) line += static_cast<char>('a' + i % 26);
  Diagnostics d;
  d.Error({1, 5001}, "", "here");
  const std::string out = RenderDiagnostics(d, "f.toml", line, false);
  // 94 columns of text around column 5001: 47 before the caret, the caret's, 46 after.
  EXPECT_EQ(out,
            "f.toml:1:5001: error: here\n"
            "    1 | ..." +
                line.substr(5000 - 47, 94) +
                "...\n"
                "      | " +
                std::string(3 + 47, ' ') +
                "^\n"
                "1 error, 0 warnings\n");
  Diagnostics start;
  start.Error({1, 3}, "", "near the start");
  EXPECT_EQ(RenderDiagnostics(start, "f.toml", line, false),
            "f.toml:1:3: error: near the start\n"
            "    1 | " +
                line.substr(0, 94) +
                "...\n"
                "      |   ^\n"
                "1 error, 0 warnings\n");
}

}  // namespace
}  // namespace ddprun
