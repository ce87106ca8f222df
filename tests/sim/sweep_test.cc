// The sweep's pieces on their own: how a --sweep value list is split, and what the chart draws
// (issue 40: list values were split at every comma, bars on a zoomed axis misstated the ratio of
// two goodputs, and long titles were clipped).
#include <regex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/sweep.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(SweepTest, ListValuesAreNotSplitAtTheirOwnCommas) {
  const auto axis = sim::ParseSweepFlag(R"(cluster.nodes=["a","b"],["a", "b", "c"],['x,y'])");
  ASSERT_TRUE(axis) << axis.error();
  EXPECT_EQ(axis->key, "cluster.nodes");
  EXPECT_EQ(axis->values, (std::vector<std::string>{R"(["a","b"])", R"(["a", "b", "c"])", "['x,y']"}));
  const auto plain = sim::ParseSweepFlag("cluster.spares=0,1,2");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->values, (std::vector<std::string>{"0", "1", "2"}));
  const auto quoted = sim::ParseSweepFlag(R"(job.name="a,b","c")");
  ASSERT_TRUE(quoted);
  EXPECT_EQ(quoted->values, (std::vector<std::string>{R"("a,b")", R"("c")"}));
  const auto open = sim::ParseSweepFlag(R"(cluster.nodes=["a","b")");
  ASSERT_FALSE(open);
  EXPECT_THAT(open.error(), HasSubstr("has an unclosed bracket"));
  const auto empty = sim::ParseSweepFlag("cluster.spares=0,,2");
  ASSERT_FALSE(empty);
  EXPECT_THAT(empty.error(), HasSubstr("an empty value"));
}

sim::SweepRow Row(std::string value, double mean, double p10, double p90) {
  sim::SweepRow row;
  row.values = {std::move(value)};
  row.runs = 10;
  row.finished = 10;
  row.goodput_mean = mean;
  row.goodput_median = mean;
  row.goodput_p10 = p10;
  row.goodput_p90 = p90;
  return row;
}

sim::SweepResult Result(std::vector<sim::SweepRow> rows, std::string job = "job.toml") {
  sim::SweepResult sweep;
  sweep.job_path = std::move(job);
  sweep.keys = {"cluster.spares"};
  sweep.seeds = 10;
  sweep.rows = std::move(rows);
  return sweep;
}

std::vector<int> Numbers(const std::string& svg, const std::string& pattern) {
  std::vector<int> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    out.push_back(std::stoi((*it)[1]));
  }
  return out;
}

// 90.5% and 95.7% on an axis from 80%: drawn as bars from the axis, the first looked half the
// second. On a zoomed axis the mean is a dot, and the subtitle says where the axis starts.
TEST(SweepTest, OnAnAxisThatDoesNotStartAtZeroTheMeanIsADotNotABar) {
  const std::string svg =
      sim::SweepChartSvg(Result({Row("0", 0.905, 0.88, 0.93), Row("1", 0.957, 0.94, 0.97)}));
  EXPECT_THAT(svg, Not(HasSubstr("class=\"bar\"")));
  EXPECT_EQ(Numbers(svg, R"re(<circle class="mean" cx="(\d+)")re").size(), 2u);
  EXPECT_THAT(svg, HasSubstr("dot: mean (the axis starts at 80%)"));
}

// On an axis from 0 a bar's length is the goodput: twice the goodput, twice the bar.
TEST(SweepTest, OnAnAxisFromZeroBarsAreProportionalToTheGoodput) {
  const std::string svg = sim::SweepChartSvg(Result({Row("0", 0.8, 0.05, 0.9), Row("1", 0.4, 0.02, 0.6)}));
  const std::vector<int> widths = Numbers(svg, R"re(<rect class="bar" x="\d+" y="\d+" width="(\d+)")re");
  ASSERT_EQ(widths.size(), 2u);
  EXPECT_NEAR(static_cast<double>(widths[0]) / widths[1], 2.0, 0.01);
  EXPECT_THAT(svg, HasSubstr("bar: mean, whisker"));
}

// A long job path (and --set changes) in the title: the picture is wide enough for it.
TEST(SweepTest, ALongTitleIsNotClipped) {
  const std::string job = "/home/someone/projects/" + std::string(150, 'x') + "/job.toml";
  const std::string svg = sim::SweepChartSvg(Result({Row("0", 0.8, 0.7, 0.9)}, job));
  const std::vector<int> width = Numbers(svg, R"re(<svg [^>]*width="(\d+)")re");
  ASSERT_EQ(width.size(), 1u);
  const size_t title = std::string("Goodput per setting: ").size() + job.size();
  EXPECT_GE(width[0], 10 + static_cast<int>(title) * 9) << "15 px bold: about 9 px a character";
  EXPECT_THAT(svg, HasSubstr(job));
}

}  // namespace
}  // namespace ddprun::testing
