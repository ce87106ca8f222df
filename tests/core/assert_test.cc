// DDPRUN_ASSERT stays on in every build type and names the file, line and condition.
#include "base/assert.h"

#include <string>

#include <gtest/gtest.h>

namespace ddprun::testing {
namespace {

TEST(AssertDeathTest, FailingConditionAbortsWithFileLineAndCondition) {
  const int round = 2;
  // The line number is the one of the DDPRUN_ASSERT below.
  const int line = __LINE__ + 1;
  EXPECT_DEATH(DDPRUN_ASSERT(round == 3),
               std::string("assert_test.cc:") + std::to_string(line) + ": assertion failed: round == 3");
}

TEST(AssertDeathTest, TrueConditionDoesNothing) {
  int evaluated = 0;
  DDPRUN_ASSERT(++evaluated == 1);
  EXPECT_EQ(evaluated, 1) << "the condition is evaluated exactly once, in every build";
}

}  // namespace
}  // namespace ddprun::testing
