// base/result.h: a value or the reason, and misuse (reading the wrong side) stops the program.
#include "base/result.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>

namespace ddprun {
namespace {

Result<int> Half(int n) {
  if (n % 2 != 0) return Fail(std::to_string(n) + " is odd");
  return n / 2;
}

Status Check(bool good) {
  if (!good) return Fail("not good");
  return {};
}

TEST(ResultTest, HoldsTheValueOrTheReason) {
  const Result<int> half = Half(8);
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(*half, 4);
  const Result<int> odd = Half(3);
  ASSERT_FALSE(odd);
  EXPECT_EQ(odd.error(), "3 is odd");
  EXPECT_TRUE(Check(true).ok());
  EXPECT_EQ(Check(false).error(), "not good");
}

TEST(ResultTest, AMoveOnlyValueIsMovedOut) {
  Result<std::unique_ptr<int>> boxed = std::make_unique<int>(5);
  std::unique_ptr<int> taken = *std::move(boxed);
  EXPECT_EQ(*taken, 5);
}

TEST(ResultDeathTest, ReadingTheValueOfAFailureOrTheReasonOfASuccessAborts) {
  const Result<int> odd = Half(3);
  EXPECT_DEATH((void)odd.value(), "assertion failed: ok\\(\\)");
  EXPECT_DEATH((void)Check(true).error(), "assertion failed: !ok\\(\\)");
}

}  // namespace
}  // namespace ddprun
