// Each machine's one transition function (Agent::Enter for its link, its work and its life,
// Coordinator::Enter for its phase, Election::Enter for its phase) stops the process on an edge
// its table does not hold.
// No input takes such an edge (that is the point), so these tests take it through the door the
// machines leave to them (test::Edges).
#include <gtest/gtest.h>

#include "runner/core/agent.h"
#include "runner/core/coordinator.h"
#include "runner/core/election.h"
#include "schema/canonical.h"
#include "tests/core/core_test_util.h"

namespace ddprun::core::test {

struct Edges {
  static void Connect(Agent& agent) { agent.Enter(Agent::Joining{}); }
  static void Join(Agent& agent) { agent.Enter(Agent::Joined{}); }
  static void Leave(Agent& agent) { agent.Enter(Agent::Disconnected{}); }
  static void StartRound(Agent& agent) { agent.Enter(Agent::Running{}); }
  static void StopRound(Agent& agent) { agent.Enter(Agent::Stopping{}); }
  static void Rest(Agent& agent) { agent.Enter(Agent::Idle{}); }
  static void Depart(Agent& agent) { agent.Enter(Agent::Leaving{}); }
  static void Go(Agent& agent) { agent.Enter(Agent::Gone{}); }
  static void End(Coordinator& coordinator) { coordinator.Enter(Coordinator::Ending{}); }
  static void Done(Coordinator& coordinator) { coordinator.Enter(Coordinator::Done{}); }
  static void Run(Coordinator& coordinator) { coordinator.Enter(Coordinator::Running{}); }
  static void Lead(Election& election) { election.Enter(Election::Leading{}); }
  static void Look(Election& election) { election.Enter(Election::Looking{}); }
  static void Idle(Election& election) { election.Enter(Election::Idle{}); }
};

namespace {

TEST(EdgesTest, TheAgentsLinkTakesOnlyItsEdges) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Agent::Config config;
  config.node_rank = 1;
  Agent agent(spec, config);  // connecting
  EXPECT_DEATH(Edges::Join(agent),
               "assertion failed: kLinkEdges\\[link_.index\\(\\)\\]\\[next.index\\(\\)\\]");
  Edges::Connect(agent);
  Edges::Join(agent);
  Edges::Leave(agent);
  Edges::Leave(agent);                                // leaving again, as Finish may
  EXPECT_DEATH(Edges::Connect(agent), "kLinkEdges");  // a left agent only waits to connect again
}

TEST(EdgesTest, TheAgentsWorkTakesOnlyItsEdges) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Agent::Config config;
  config.node_rank = 1;
  Agent agent(spec, config);  // idle
  EXPECT_DEATH(Edges::Rest(agent),
               "assertion failed: kWorkEdges\\[work_.index\\(\\)\\]\\[next.index\\(\\)\\]");
  Edges::StartRound(agent);
  Edges::StartRound(agent);                        // the next round, once the workers all exited 0
  EXPECT_DEATH(Edges::Rest(agent), "kWorkEdges");  // a round ends only through its stop
  Edges::StopRound(agent);
  EXPECT_DEATH(Edges::StopRound(agent), "kWorkEdges");   // one stop at a time
  EXPECT_DEATH(Edges::StartRound(agent), "kWorkEdges");  // no round while workers may run
  Edges::Rest(agent);
  Edges::StopRound(agent);  // a stop without a round: a signal before the first
}

TEST(EdgesTest, TheAgentLeavesBeforeItIsGoneAndNeverComesBack) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Agent::Config config;
  Agent agent(spec, config);  // staying
  EXPECT_DEATH(Edges::Go(agent), "assertion failed: kLifeEdges\\[life_.index\\(\\)\\]\\[next.index\\(\\)\\]");
  Edges::Depart(agent);
  Edges::Depart(agent);  // leaving again (Finish after a JobEnd)
  Edges::Go(agent);
  EXPECT_EQ(agent.exit_code(), 0);
  EXPECT_DEATH(Edges::Depart(agent), "kLifeEdges");
  EXPECT_DEATH(Edges::Go(agent), "kLifeEdges");  // it exits once
}

TEST(EdgesTest, TheCoordinatorsPhaseTakesOnlyItsEdges) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Coordinator coordinator(spec, CanonicalForm(spec), At(Seconds(0)));  // in its rendezvous
  EXPECT_DEATH(Edges::Done(coordinator),
               "assertion failed: kEdges\\[state_.index\\(\\)\\]\\[next.index\\(\\)\\]");
  EXPECT_DEATH(Edges::Run(coordinator), "kEdges");  // a round starts before it runs
  Edges::End(coordinator);
  EXPECT_DEATH(Edges::End(coordinator), "kEdges");  // the job ends once
  Edges::Done(coordinator);
  EXPECT_DEATH(Edges::Run(coordinator), "kEdges");
}

TEST(EdgesTest, TheElectionsPhaseMovesOneStepForwardOrBackToIdle) {
  const JobSpec spec = SpecFromToml(kTwoNodeEtcdJob);
  Election election(spec, "1a2b3c4d5e6f", 0, "gpu-01:29500");
  EXPECT_DEATH(Edges::Lead(election),
               "assertion failed: next.index\\(\\) == 0 \\|\\| next.index\\(\\) == state_.index\\(\\) \\+ 1");
  Edges::Look(election);
  Edges::Idle(election);
  Edges::Idle(election);
}

}  // namespace
}  // namespace ddprun::core::test
