// Invariants and liveness hold across a bounded swarm of seeds with random fault mixes.
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schema/loader.h"
#include "sim/swarm.h"
#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

TEST(SwarmTest, ThirtySeedsHoldEveryInvariant) {
  LoadResult loaded = ParseJobText(SmallJob("", 3, 2, 3), "job.toml");
  ASSERT_TRUE(loaded.spec);
  sim::SimOptions options;
  options.seed = 1000;
  std::ostringstream out;
  const sim::SwarmResult swarm = sim::RunSwarm(*loaded.spec, options, 30, out);
  EXPECT_EQ(swarm.runs, 30);
  EXPECT_EQ(swarm.failures, 0) << out.str();
  EXPECT_THAT(out.str(), ::testing::HasSubstr("swarm: 30 seeds (1000..1029), 0 failed"));
}

// 5,000 seeds of each example job (a few seconds each in an optimised build); bench/swarm.sh
// runs 100,000 of each and of a 64-node job.
class ExampleSwarmTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ExampleSwarmTest, FiveThousandSeedsHoldEveryInvariant) {
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/examples/" + GetParam());
  std::stringstream text;
  text << in.rdbuf();
  LoadResult loaded = ParseJobText(text.str(), std::string("examples/") + GetParam());
  ASSERT_TRUE(loaded.spec);
  sim::SimOptions options;
  options.seed = 1000;
  options.quiet = true;
  options.job_path = std::string("examples/") + GetParam();
  std::ostringstream out;
  const sim::SwarmResult swarm = sim::RunSwarm(*loaded.spec, options, 5000, out);
  EXPECT_EQ(swarm.runs, 5000);
  EXPECT_EQ(swarm.failures, 0) << out.str();
}

INSTANTIATE_TEST_SUITE_P(Examples, ExampleSwarmTest,
                         ::testing::Values("laptop.toml", "lightning-2x8.toml", "lightning-4x8.toml"));

// Jobs that detect hung ranks (timeouts.progress, a duration or "auto"), with random hangs and
// stragglers besides the swarm's faults; bench/swarm.sh runs 100,000 seeds of each.
class HangSwarmTest : public ::testing::TestWithParam<const char*> {};

TEST_P(HangSwarmTest, OneThousandSeedsHoldEveryInvariant) {
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/bench/" + GetParam());
  std::stringstream text;
  text << in.rdbuf();
  LoadResult loaded = ParseJobText(text.str(), std::string("bench/") + GetParam());
  ASSERT_TRUE(loaded.spec);
  ASSERT_TRUE(loaded.spec->timeouts.DetectsHangs());
  sim::SimOptions options;
  options.seed = 1000;
  options.quiet = true;
  options.job_path = std::string("bench/") + GetParam();
  std::ostringstream out;
  const sim::SwarmResult swarm = sim::RunSwarm(*loaded.spec, options, 1000, out);
  EXPECT_EQ(swarm.runs, 1000);
  EXPECT_EQ(swarm.failures, 0) << out.str();
}

INSTANTIATE_TEST_SUITE_P(Bench, HangSwarmTest,
                         ::testing::Values("swarm-hangs.toml", "swarm-hangs-auto.toml"));

TEST(SwarmTest, OnlyJobsThatDetectHangsGetStragglers) {
  LoadResult plain = ParseJobText(SmallJob("", 3, 2, 3), "job.toml");
  std::string text = SmallJob("", 3, 2, 3);
  text.replace(text.find("[timeouts]\n"), 11, "[timeouts]\nprogress = \"2m\"\n");
  LoadResult watching = ParseJobText(text, "job.toml");
  ASSERT_TRUE(plain.spec && watching.spec);
  int slow = 0, near = 0;
  const auto progress = std::chrono::milliseconds(120'000);
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const auto mix = sim::DrawSwarmFaults(*plain.spec, seed);
    auto with = sim::DrawSwarmFaults(*watching.spec, seed);
    for (const FaultSpec& fault : mix) EXPECT_NE(fault.kind, FaultKind::kWorkerSlow);
    // The same mix, then sometimes a rank that stalls for 0.8x-1.2x of timeouts.progress and
    // goes on (issue 37), and sometimes a straggler before it.
    if (with.size() > mix.size() && with.back().kind == FaultKind::kWorkerHang) {
      ASSERT_TRUE(with.back().duration);
      EXPECT_GE(*with.back().duration, progress * 8 / 10);
      EXPECT_LE(*with.back().duration, progress * 12 / 10);
      with.pop_back();
      ++near;
    }
    if (with.size() > mix.size()) {
      EXPECT_EQ(with.back().kind, FaultKind::kWorkerSlow);
      with.pop_back();
      ++slow;
    }
    EXPECT_EQ(with, mix);
  }
  EXPECT_GT(slow, 50);
  EXPECT_GT(near, 50);
}

TEST(SwarmTest, QuietSwarmPrintsOnlyFailuresAndTheCount) {
  LoadResult loaded = ParseJobText(SmallJob("", 2, 2, 3), "job.toml");
  ASSERT_TRUE(loaded.spec);
  sim::SimOptions options;
  options.seed = 1000;
  options.quiet = true;
  std::ostringstream out;
  const sim::SwarmResult swarm = sim::RunSwarm(*loaded.spec, options, 5, out);
  // The count, then the goodput across the seeds and the exit codes (nothing per seed).
  EXPECT_THAT(out.str(),
              ::testing::MatchesRegex("swarm: 5 seeds \\(1000\\.\\.1004\\), 0 failed\n"
                                      "swarm goodput: mean [0-9.]+%, p10 [0-9.]+%, median [0-9.]+%, "
                                      "p90 [0-9.]+%; exit [0-9]+: [0-9]+(, exit [0-9]+: [0-9]+)*\n"));
  int seeds = 0;
  for (const auto& [code, n] : swarm.exit_codes) seeds += n;
  EXPECT_EQ(seeds, 5);
  EXPECT_GT(swarm.mean_goodput, 0.0);
  EXPECT_LE(swarm.mean_goodput, 1.0);
}

TEST(SwarmTest, FaultMixIsAFunctionOfTheSeed) {
  LoadResult loaded = ParseJobText(SmallJob(), "job.toml");
  ASSERT_TRUE(loaded.spec);
  EXPECT_EQ(sim::DrawSwarmFaults(*loaded.spec, 5), sim::DrawSwarmFaults(*loaded.spec, 5));
  EXPECT_NE(sim::DrawSwarmFaults(*loaded.spec, 5), sim::DrawSwarmFaults(*loaded.spec, 6));
  for (uint64_t seed = 0; seed < 50; ++seed) {
    for (const FaultSpec& fault : sim::DrawSwarmFaults(*loaded.spec, seed)) {
      const Status fits = FaultFitsJob(fault, *loaded.spec);
      EXPECT_TRUE(fits) << fits.error();
    }
  }
}

// The shrinking job: rounds with fewer nodes (cluster.min_nodes) and quarantined hosts.
TEST(ShrinkSwarmTest, OneThousandSeedsHoldEveryInvariant) {
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/bench/swarm-shrink.toml");
  std::stringstream text;
  text << in.rdbuf();
  LoadResult loaded = ParseJobText(text.str(), "bench/swarm-shrink.toml");
  ASSERT_TRUE(loaded.spec);
  ASSERT_LT(loaded.spec->cluster.min_nodes, loaded.spec->cluster.nnodes);
  sim::SimOptions options;
  options.seed = 1000;
  options.quiet = true;
  options.job_path = "bench/swarm-shrink.toml";
  std::ostringstream out;
  const sim::SwarmResult swarm = sim::RunSwarm(*loaded.spec, options, 1000, out);
  EXPECT_EQ(swarm.runs, 1000);
  EXPECT_EQ(swarm.failures, 0) << out.str();
}
}  // namespace
}  // namespace ddprun::testing
