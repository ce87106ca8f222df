// Bad input never crashes or hangs: garbage, NUL, invalid UTF-8, truncation, deep nesting,
// huge numbers, oversized and empty files all come back as errors.
#include <gtest/gtest.h>

#include <random>

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
  EXPECT_FALSE(Parse("a = \"\xed\xa0\x80\"\n").spec);          // surrogate
  EXPECT_FALSE(Parse("a = \"\xc0\xaf\"\n").spec);              // overlong
  EXPECT_FALSE(Parse("a = \"\xf0\x9f\x98\"").spec);            // truncated at end
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
  auto big = Parse("version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
                   "nnodes = 9223372036854775807\n");
  EXPECT_EQ(Diags(big), "6:10: error: cluster.nnodes = 9223372036854775807 is out of range "
                        "(1..10000)\n");
  EXPECT_FALSE(Parse("version = 1e999999\n").spec);
}

TEST(Robustness, OversizedText) {
  auto r = Parse(std::string((1 << 20) + 1, '#'));
  EXPECT_EQ(Diags(r),
            "0:0: error: the job file is larger than 1048576 bytes\n"
            "  hint: a job file is a short TOML text; is this the right file?\n");
}

TEST(Robustness, TruncatedAtEveryByteNeverCrashes) {
  const std::string text = testing::WithBase(
      "[logs]\nconsole = [0, 1]\n[[simulate.faults]]\nat = \"1m\"\nkind = \"node-crash\"\n");
  ASSERT_TRUE(Parse(text).spec) << Diags(Parse(text));
  for (size_t n = 0; n < text.size(); ++n) {
    auto r = Parse(std::string_view(text).substr(0, n));
    if (!r.spec) {
      EXPECT_TRUE(r.diagnostics.HasErrors()) << n;
    }
  }
}

TEST(Robustness, RandomGarbageNeverCrashes) {
  std::mt19937 rng(12345);  // fixed seed: the same bytes every run
  std::uniform_int_distribution<int> byte(0, 255);
  for (int round = 0; round < 300; ++round) {
    std::string text(static_cast<size_t>(round * 7 % 600), ' ');
    for (char& c : text) c = static_cast<char>(byte(rng));
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
