// ParseDuration / FormatDuration / HumanDuration, including round trips.
#include <gtest/gtest.h>

#include "schema/duration.h"

namespace ddprun {
namespace {

TEST(Duration, Parses) {
  EXPECT_EQ(ParseDuration("250ms"), Millis(250));
  EXPECT_EQ(ParseDuration("30s"), Seconds(30));
  EXPECT_EQ(ParseDuration("15m"), Minutes(15));
  EXPECT_EQ(ParseDuration("2h"), Hours(2));
  EXPECT_EQ(ParseDuration("1d"), Hours(24));
  EXPECT_EQ(ParseDuration("1h30m"), Minutes(90));
  EXPECT_EQ(ParseDuration("1.5s"), Millis(1500));
  EXPECT_EQ(ParseDuration("0s"), Duration::zero());
  EXPECT_EQ(ParseDuration("10us"), std::chrono::microseconds(10));
  EXPECT_EQ(ParseDuration("7ns"), Duration(7));
}

TEST(Duration, Rejects) {
  for (const char* bad :
       {"", "30", "s", "-1s", "1.s", ".5s", "1 s", "1x", "1sm", "1e3s", "101000000h", "1h 30m"}) {
    EXPECT_FALSE(ParseDuration(bad)) << bad;
  }
}

TEST(Duration, FormatsCanonically) {
  EXPECT_EQ(FormatDuration(Duration::zero()), "0s");
  EXPECT_EQ(FormatDuration(Seconds(60)), "1m");
  EXPECT_EQ(FormatDuration(Minutes(90)), "1h30m");
  EXPECT_EQ(FormatDuration(Millis(250)), "250ms");
  EXPECT_EQ(FormatDuration(Millis(1500)), "1s500ms");
  EXPECT_EQ(FormatDuration(Hours(49)), "2d1h");
}

TEST(Duration, RoundTrips) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{999}, int64_t{1'000'000}, int64_t{1'500'000'000},
                    int64_t{59'999'999'999}, int64_t{3'600'000'000'001}, int64_t{86'400'000'000'000} * 365}) {
    const Duration d(n);
    EXPECT_EQ(ParseDuration(FormatDuration(d)), d) << FormatDuration(d);
  }
  for (const char* text : {"60s", "1m", "90m", "1500ms", "2h0m"}) {
    const auto d = ParseDuration(text);
    ASSERT_TRUE(d) << text;
    EXPECT_EQ(ParseDuration(FormatDuration(*d)), d);
  }
}

TEST(Duration, Human) {
  EXPECT_EQ(HumanDuration(Millis(250)), "250ms");
  EXPECT_EQ(HumanDuration(Millis(1500)), "1.5s");
  EXPECT_EQ(HumanDuration(Seconds(41)), "41s");
  EXPECT_EQ(HumanDuration(Seconds(125)), "2m05s");
  EXPECT_EQ(HumanDuration(Minutes(192)), "3h12m");
}

}  // namespace
}  // namespace ddprun
