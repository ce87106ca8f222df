// Messages per node stay flat as the cluster grows (counts, not times).
#include <gtest/gtest.h>

#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

struct PerNode {
  double agent = 0;        // frames each non-zero node sent, averaged
  double coordinator = 0;  // frames the coordinator sent, per node
};

PerNode MessagesPerNode(int nnodes) {
  // Same virtual scenario at every size: rendezvous, a failure, a restart, success.
  const SimRun run = Simulate(SmallJob("", nnodes, 1, 2), {"worker-exit@5m:node=1,local_rank=0,exit_code=1"});
  EXPECT_EQ(run.result.exit_code, 0) << nnodes << " nodes";
  const auto& by_node = run.result.stats.messages_by_node;
  double agents = 0;
  for (size_t i = 1; i < by_node.size(); ++i) agents += static_cast<double>(by_node[i]);
  PerNode per;
  per.agent = agents / (nnodes - 1);
  per.coordinator = static_cast<double>(run.result.stats.coordinator_messages) / nnodes;
  return per;
}

TEST(ScaleTest, MessagesPerNodeStayFlat) {
  const PerNode small = MessagesPerNode(4);
  for (int nnodes : {16, 64, 256}) {
    const PerNode big = MessagesPerNode(nnodes);
    EXPECT_LT(big.agent, small.agent * 1.1) << nnodes << " nodes";
    EXPECT_GT(big.agent, small.agent * 0.9) << nnodes << " nodes";
    EXPECT_LT(big.coordinator, small.coordinator * 1.1) << nnodes << " nodes";
    EXPECT_GT(big.coordinator, small.coordinator * 0.9) << nnodes << " nodes";
  }
}

TEST(ScaleTest, LargeClusterOutputIsCondensed) {
  const SimRun run = Simulate(SmallJob("", 128, 1, 2), {"worker-exit@5m:node=7,local_rank=0,exit_code=1"});
  EXPECT_EQ(run.result.exit_code, 0);
  EXPECT_NE(run.output.find("other nodes not shown)"), std::string::npos);
  EXPECT_NE(run.output.find("node 7: rank 7 (local rank 0"), std::string::npos);
  EXPECT_EQ(run.output.find("node 5: "), std::string::npos) << "an untouched node's lines are condensed";
}

}  // namespace
}  // namespace ddprun::testing
