// Seeds the long swarm once failed on, replayed with the command line it printed
// (`reproduce with: ...`), so each fix stays fixed.
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

using ::testing::HasSubstr;

std::string Example(const std::string& name) {
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/examples/" + name);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << name;
  return text.str();
}

// Issue 10, kind 3 (false alarm): the swarm drew job-file-differs for every node, so every node
// ran the same changed file (1 worker per node instead of 2) and the coordinator rightly
// started a 2-rank job; the checker compared WORLD_SIZE with the original file's 4 ranks.
// ddprun --simulate examples/laptop.toml --seed 2002 --fault agent-hang@18m53s149ms:node=1,duration=43s
//   --fault job-file-differs@0s:node=0 --fault job-file-differs@0s:node=1
TEST(RegressionTest, EveryNodeWithTheSameChangedFileRunsThatJob) {
  const SimRun run = Simulate(Example("laptop.toml"),
                              {"agent-hang@18m53s149ms:node=1,duration=43s", "job-file-differs@0s:node=0",
                               "job-file-differs@0s:node=1"},
                              2002);
  EXPECT_FALSE(run.result.violation) << run.output;
  EXPECT_EQ(run.result.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("coordinator: round 0: all 2 nodes joined; starting 2 workers"));
  EXPECT_THAT(run.output, HasSubstr("sim: training: round 0: all 2 ranks up; training from"));
}

}  // namespace
}  // namespace ddprun::testing
