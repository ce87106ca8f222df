// Bad input never crashes or hangs: garbage, NUL, invalid UTF-8, truncation, deep nesting,
// huge numbers, oversized and empty files all come back as errors, with a place and a message.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

using testing::Diags;
using testing::Parse;

TEST(Robustness, NulByte) {
  std::string text = "version = 1\nna";
  text += '\0';
  text += "me = 1\n";
  auto r = Parse(text);
  EXPECT_FALSE(r.spec);
  EXPECT_EQ(Diags(r),
            "2:3: error: the job file contains a NUL byte; it must be UTF-8 text\n"
            "  hint: is this the right file? a job file is TOML text\n");
}

TEST(Robustness, InvalidUtf8) {
  auto r = Parse("version = 1\n# caf\xc3\x28\n");
  EXPECT_EQ(Diags(r),
            "2:6: error: the job file is not valid UTF-8 (byte 0xc3 at offset 17)\n"
            "  hint: save the file as UTF-8\n");
  EXPECT_FALSE(Parse("a = \"\xed\xa0\x80\"\n").spec);  // surrogate
  EXPECT_FALSE(Parse("a = \"\xc0\xaf\"\n").spec);      // overlong
  EXPECT_FALSE(Parse("a = \"\xf0\x9f\x98\"").spec);    // truncated at end
  EXPECT_TRUE(Parse("a = \"caf\xc3\xa9 \xf0\x9f\x98\x80\"").diagnostics.items.size() > 0);
}

TEST(Robustness, ValidUtf8IsAccepted) {
  auto r = Parse(testing::WithBase("# h\xc3\xa9llo \xf0\x9f\x98\x80\n"));
  EXPECT_TRUE(r.spec) << Diags(r);
}

TEST(Robustness, DeepNestingIsRejectedBeforeParsing) {
  const std::string deep = "a = " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  auto r = Parse(deep);
  EXPECT_EQ(Diags(r),
            "1:37: error: arrays and inline tables are nested more than 32 deep\n"
            "  hint: a job file needs at most two levels\n");
  auto tables = Parse("a = " + std::string(5000, '{') + "\n");
  EXPECT_FALSE(tables.spec);
  // Brackets inside strings and comments do not count.
  auto quoted = Parse(testing::WithBase("# " + std::string(100, '[') + "\n[job.env]\nX = \"" +
                                        std::string(100, '{') + "\"\n"));
  EXPECT_TRUE(quoted.spec) << Diags(quoted);
}

TEST(Robustness, HugeNumbers) {
  auto r = Parse(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
      "nnodes = 99999999999999999999999\n");
  EXPECT_FALSE(r.spec);
  ASSERT_EQ(r.diagnostics.items.size(), 1u);
  EXPECT_EQ(r.diagnostics.items[0].loc.line, 6u);
  EXPECT_EQ(r.diagnostics.items[0].message.rfind("invalid TOML: ", 0), 0u);
  auto big = Parse(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
      "nnodes = 9223372036854775807\n");
  EXPECT_EQ(Diags(big),
            "6:10: error: cluster.nnodes = 9223372036854775807 is out of range "
            "(1..10000)\n");
  EXPECT_FALSE(Parse("version = 1e999999\n").spec);
}

TEST(Robustness, OversizedText) {
  auto r = Parse(std::string((1 << 20) + 1, '#'));
  EXPECT_EQ(Diags(r),
            "0:0: error: the job file is larger than 1048576 bytes\n"
            "  hint: a job file is a short TOML text; is this the right file?\n");
}

/// The lines of `text`; a text that does not end in a newline has a last, partial line.
std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string_view::npos; start = end + 1) {
    lines.push_back(text.substr(start, end - start));
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

// A file cut short (a full disk, an interrupted copy) at any byte either loads, or says where
// and what: every diagnostic has a message and points inside the text that is there (or at no
// place, for a key that is missing altogether). A cut inside a key or a table header is a TOML
// error at the cut. A cut at the end of a line names the key or table the cut removed.
TEST(Robustness, AFileCutAtAnyByteLoadsOrSaysWhereAndWhat) {
  const std::string text = testing::WithBase(
      "[logs]\nconsole = [0, 1]\n[[simulate.faults]]\nat = \"1m\"\nkind = \"node-crash\"\n");
  const LoadResult full = Parse(text);
  ASSERT_TRUE(full.spec) << Diags(full);
  EXPECT_TRUE(full.diagnostics.items.empty()) << Diags(full);
  const std::vector<std::string_view> full_lines = Lines(text);
  for (size_t n = 0; n < text.size(); ++n) {
    const std::string_view cut = std::string_view(text).substr(0, n);
    const std::string_view removed = std::string_view(text).substr(n);
    SCOPED_TRACE("cut after byte " + std::to_string(n) + ": ..." +
                 std::string(cut.substr(cut.size() < 20 ? 0 : cut.size() - 20)));
    const LoadResult r = Parse(cut);
    EXPECT_EQ(r.spec.has_value(), !r.diagnostics.HasErrors()) << Diags(r);
    const std::vector<std::string_view> lines = Lines(cut);
    for (const Diagnostic& d : r.diagnostics.items) {
      EXPECT_FALSE(d.message.empty()) << Diags(r);
      if (d.loc == SourceLoc{}) continue;  // not tied to a place: a key the text lacks entirely
      ASSERT_GE(d.loc.line, 1u) << Diags(r);
      ASSERT_LE(d.loc.line, lines.size()) << Diags(r);
      EXPECT_GE(d.loc.column, 1u) << Diags(r);
      EXPECT_LE(d.loc.column, lines[d.loc.line - 1].size() + 1) << Diags(r);
    }

    const bool at_line_end = cut.empty() || cut.back() == '\n';
    if (at_line_end) {
      // Whole lines are gone: each error names a key or table that was in them.
      for (const Diagnostic& d : r.diagnostics.items) {
        if (d.severity != Severity::kError) continue;
        ASSERT_FALSE(d.key_path.empty()) << Diags(r);
        const std::string name = d.key_path.substr(d.key_path.rfind('.') + 1);
        EXPECT_NE(d.message.find(name), std::string::npos) << Diags(r);
        EXPECT_NE(removed.find(name), std::string_view::npos) << "names what is still there: " << Diags(r);
      }
      continue;
    }
    // The cut is inside line `lines.size()`: inside its key (before the '=') or inside its table
    // header, the text is not TOML, and the error points at the cut.
    const std::string_view last = lines.back();
    const std::string_view whole = full_lines[lines.size() - 1];
    const bool in_header = whole.front() == '[' && last.size() < whole.size();
    const bool in_key = whole.front() != '[' && last.find('=') == std::string_view::npos;
    if (!in_header && !in_key) continue;  // inside a value: some prefixes are values too ("295")
    ASSERT_FALSE(r.spec) << "a cut key or table header loaded";
    bool at_cut = false;
    for (const Diagnostic& d : r.diagnostics.items) {
      at_cut = at_cut || (d.message.rfind("invalid TOML: ", 0) == 0 &&
                          d.loc == SourceLoc{static_cast<uint32_t>(lines.size()),
                                             static_cast<uint32_t>(last.size() + 1)});
    }
    EXPECT_TRUE(at_cut) << "no TOML error at the cut: " << Diags(r);
  }
}

TEST(Robustness, RandomGarbageNeverCrashes) {
  // The bytes come straight from the engine, eight to each output: the standard fixes
  // std::mt19937_64's outputs for a seed, but not what std::uniform_int_distribution makes of
  // them, so only these bytes are the same with every standard library.
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 300; ++round) {
    SCOPED_TRACE("round " + std::to_string(round) + " of seed 12345");
    std::string text(static_cast<size_t>(round * 7 % 600), ' ');
    uint64_t bits = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      if (i % 8 == 0) bits = rng();
      text[i] = static_cast<char>(bits & 0xff);
      bits >>= 8;
    }
    auto r = Parse(text);
    EXPECT_FALSE(r.spec);
    EXPECT_TRUE(r.diagnostics.HasErrors());
  }
}

TEST(Robustness, TomlSyntaxErrorsCarryTheirPosition) {
  auto r = Parse("version = 1\n[job\n");
  ASSERT_EQ(r.diagnostics.items.size(), 1u);
  EXPECT_EQ(r.diagnostics.items[0].loc.line, 2u);
  EXPECT_EQ(r.diagnostics.items[0].message.rfind("invalid TOML: ", 0), 0u);
  auto dup = Parse("version = 1\nversion = 1\n");
  ASSERT_EQ(dup.diagnostics.items.size(), 1u);
  EXPECT_EQ(dup.diagnostics.items[0].loc.line, 2u);
}

TEST(Robustness, MissingFile) {
  auto r = LoadJobFile("/nonexistent/ddprun/job.toml");
  EXPECT_FALSE(r.spec);
  EXPECT_EQ(Diags(r),
            "0:0: error: cannot read job file /nonexistent/ddprun/job.toml\n"
            "  hint: check the path; `ddprun check` takes the job file as argument\n");
}

}  // namespace
}  // namespace ddprun
