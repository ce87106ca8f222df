// tests/support/require.h: how DDPRUN_REQUIRE is read, and that DDPRUN_REQUIRE_OR_SKIP skips a
// test whose part is missing, fails it when the part is required, and fails on an unknown part.

#include "tests/support/require.h"

#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::test {
namespace {

using ::testing::HasSubstr;
using Parts = std::vector<std::string>;

TEST(ParseRequirementsTest, ReadsACommaListAndTheTestbedAlias) {
  EXPECT_EQ(ParseRequirements(nullptr, nullptr).parts, Parts{});
  EXPECT_EQ(ParseRequirements("", nullptr).parts, Parts{});
  EXPECT_EQ(ParseRequirements("etcd, torch,,chromium ", nullptr).parts, (Parts{"etcd", "torch", "chromium"}));
  EXPECT_EQ(ParseRequirements("etcd", "1").parts, (Parts{"etcd", "testbed"}));
  EXPECT_EQ(ParseRequirements(nullptr, "0").parts, Parts{});
  EXPECT_EQ(ParseRequirements("etcd,chromium", nullptr).error, "");
}

TEST(ParseRequirementsTest, AnUnknownPartIsAnErrorNotIgnored) {
  const Requirements r = ParseRequirements("etcd,etdc", nullptr);
  EXPECT_EQ(r.parts, Parts{"etcd"});
  EXPECT_EQ(r.error,
            "DDPRUN_REQUIRE names \"etdc\", which is no part a test knows (etcd, testbed, torch, chromium, "
            "sshd, slurm, prometheus, gpu; tests/support/require.h lists them)");
}

// Sets DDPRUN_REQUIRE (and clears the alias) for one test, and puts both back.
class ScopedRequire {
 public:
  explicit ScopedRequire(const char* value) {
    Save("DDPRUN_REQUIRE", require_);
    Save("DDPRUN_REQUIRE_TESTBED", testbed_);
    ::unsetenv("DDPRUN_REQUIRE_TESTBED");
    if (value) {
      ::setenv("DDPRUN_REQUIRE", value, 1);
    } else {
      ::unsetenv("DDPRUN_REQUIRE");
    }
  }
  ~ScopedRequire() {
    Restore("DDPRUN_REQUIRE", require_);
    Restore("DDPRUN_REQUIRE_TESTBED", testbed_);
  }
  ScopedRequire(const ScopedRequire&) = delete;
  ScopedRequire& operator=(const ScopedRequire&) = delete;

 private:
  static void Save(const char* name, std::optional<std::string>& into) {
    if (const char* v = std::getenv(name)) into = v;
  }
  static void Restore(const char* name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  std::optional<std::string> require_, testbed_;
};

bool reached_end = false;

void NeedsMissingEtcd() {
  reached_end = false;
  DDPRUN_REQUIRE_OR_SKIP("etcd", false, "etcd is not installed");
  reached_end = true;
}

void NeedsPresentEtcd() {
  reached_end = false;
  DDPRUN_REQUIRE_OR_SKIP("etcd", true, "etcd is not installed");
  reached_end = true;
}

void NeedsAnUnknownPart() {
  reached_end = false;
  DDPRUN_REQUIRE_OR_SKIP("etdc", true, "-");
  reached_end = true;
}

/// What `body` reported to GoogleTest, intercepted so that it does not end this test.
std::vector<testing::TestPartResult> Reported(void (*body)()) {
  testing::TestPartResultArray results;
  {
    testing::ScopedFakeTestPartResultReporter intercept(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    body();
  }
  std::vector<testing::TestPartResult> out;
  for (int i = 0; i < results.size(); ++i) out.push_back(results.GetTestPartResult(i));
  return out;
}

TEST(RequireOrSkipTest, AMissingPartSkipsWithItsReasonWhenNotRequired) {
  ScopedRequire env("torch,chromium");
  const auto reported = Reported(NeedsMissingEtcd);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_TRUE(reported[0].skipped());
  EXPECT_THAT(reported[0].message(),
              HasSubstr("etcd is not installed (with DDPRUN_REQUIRE=etcd this fails instead)"));
  EXPECT_FALSE(reached_end);
}

TEST(RequireOrSkipTest, AMissingPartFailsWhenRequired) {
  ScopedRequire env("torch, etcd");
  const auto reported = Reported(NeedsMissingEtcd);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_TRUE(reported[0].fatally_failed());
  EXPECT_THAT(reported[0].message(),
              HasSubstr("DDPRUN_REQUIRE names etcd, which this machine lacks: etcd is not installed"));
  EXPECT_FALSE(reached_end);
}

TEST(RequireOrSkipTest, TheOlderTestbedVariableStillRequiresTheBed) {
  ScopedRequire env(nullptr);
  ::setenv("DDPRUN_REQUIRE_TESTBED", "1", 1);
  EXPECT_FATAL_FAILURE(DDPRUN_REQUIRE_OR_SKIP("testbed", false, "not root"),
                       "DDPRUN_REQUIRE names testbed, which this machine lacks: not root");
}

TEST(RequireOrSkipTest, APresentPartRunsTheTest) {
  ScopedRequire env("etcd");
  EXPECT_TRUE(Reported(NeedsPresentEtcd).empty());
  EXPECT_TRUE(reached_end);
}

TEST(RequireOrSkipTest, AnUnknownPartFailsEvenWhereEverythingIsPresent) {
  {
    ScopedRequire env("etcd,slrum");
    const auto reported = Reported(NeedsPresentEtcd);
    ASSERT_EQ(reported.size(), 1u);
    EXPECT_TRUE(reported[0].fatally_failed());
    EXPECT_NE(std::string(reported[0].message()).find("DDPRUN_REQUIRE names \"slrum\""), std::string::npos)
        << reported[0].message();
  }
  ScopedRequire env(nullptr);
  const auto reported = Reported(NeedsAnUnknownPart);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_TRUE(reported[0].fatally_failed());
  EXPECT_THAT(reported[0].message(),
              HasSubstr("DDPRUN_REQUIRE_OR_SKIP(\"etdc\"): no such part in kRequirableParts"));
}

}  // namespace
}  // namespace ddprun::test
