// Hot spares: a spare agent joins and waits; a node rank whose agent is away for longer than
// timeouts.replace goes to it at the next round, after the old holder's lease; the spare's
// workers get that node rank's environment.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runner/core/agent.h"
#include "runner/core/coordinator.h"
#include "schema/canonical.h"
#include "tests/core/core_test_util.h"
#include "tests/core/drivers.h"

namespace ddprun::core {
namespace {

using namespace std::chrono_literals;
using test::All;
using test::At;
using test::Edit;
using test::FindLog;
using test::kTwoNodeJob;
using test::Sent;
using test::SpecFromToml;
using Effects = std::vector<CoordinatorEffect>;

// kTwoNodeJob with one spare (agent 2, host gpu-09) and a replace timeout of 5 s.
std::string SpareJob() {
  return Edit(Edit(kTwoNodeJob, "nodes = [\"gpu-01\", \"gpu-02\"]",
                   "nodes = [\"gpu-01\", \"gpu-02\"]\nspares = [\"gpu-09\"]"),
              "stop_grace = \"30s\"", "stop_grace = \"30s\"\nreplace = \"5s\"");
}

class SparesTest : public ::testing::Test, public test::CoordinatorDriver {
 protected:
  void SetUp() override { Use(SpareJob()); }
};

TEST_F(SparesTest, TheFirstRoundStartsWithoutTheSpareAndTheSpareWaits) {
  const Effects spare = Join(0s, 2);
  const auto ack = Sent<wire::JoinAck>(spare);
  ASSERT_EQ(ack.size(), 1u);
  EXPECT_TRUE(ack[0].second.standby);
  EXPECT_NE(FindLog(spare,
                    "spare 0 (gpu-09) joined from 10.0.0.3; it waits to take the node rank of a "
                    "node that is lost"),
            "")
      << test::Describe(spare);
  Join(0s, 0);
  EXPECT_EQ(All<ReserveStorePort>(Join(0s, 1)).size(), 1u);
  const Effects start = Feed(0s, StorePortReady{0, 41000});
  const auto starts = Sent<wire::StartRound>(start);
  ASSERT_EQ(starts.size(), 2u) << test::Describe(start);
  EXPECT_EQ(starts[0], (std::pair<ConnId, wire::StartRound>{Conn(0), {0, 41000, 0, 0}}));
  EXPECT_EQ(starts[1], (std::pair<ConnId, wire::StartRound>{Conn(1), {0, 41000, 0, 1}}));
}

TEST_F(SparesTest, ALostNodesRankGoesToTheSpareAfterReplaceAndTheOldLease) {
  Join(0s, 0);
  Join(0s, 1);
  Join(0s, 2);
  Feed(0s, StorePortReady{0, 41000});
  BeatUntil(0s, 10s, {{0, 0}, {1, 0}, {2, 0}});
  // Node 1's host dies: its connection resets at 10 s while its workers ran.
  const Effects lost = Feed(10s, PeerClosed{Conn(1), "connection reset"});
  const auto stops = Sent<wire::StopRound>(lost);
  ASSERT_EQ(stops.size(), 2u) << test::Describe(lost);  // node 0 and the waiting spare hear it
  EXPECT_EQ(stops[0].second.cause.rfind("node 1 (gpu-02) was lost: connection reset", 0), 0u);
  // Only node 0 confirms: the spare had nothing to stop.
  Send(11s, 0, wire::RoundStopped{0, 2});
  EXPECT_EQ(coordinator_->phase(), Coordinator::Phase::kBackoff);
  // Backoff 10 s: at 21 s node 1 has been away 11 s (> replace), but its lease (loss bound 6 s
  // + heartbeat 2 s + stop bound 40 s = 48 s from 10 s) holds the round until 58 s.
  Effects wait = BeatUntil(11s, 57s, {{0, 0}, {2, 0}});
  EXPECT_NE(FindLog(wait,
                    "spare 0 (gpu-09) takes node rank 1 in place of node 1 (gpu-02), away for 11s "
                    "(more than timeouts.replace = 5s)"),
            "")
      << test::Describe(wait);
  EXPECT_TRUE(All<ReserveStorePort>(wait).empty());
  Effects gate = BeatUntil(57s, 58s, {{0, 0}, {2, 0}});
  ASSERT_EQ(All<ReserveStorePort>(gate).size(), 1u) << test::Describe(gate);
  const auto starts = Sent<wire::StartRound>(Feed(58s, StorePortReady{1, 41001}));
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[1], (std::pair<ConnId, wire::StartRound>{Conn(2), {1, 41001, 0, 1}}));
  // A failure of the spare's workers names the spare, its host and the node rank it plays.
  const auto failed = Sent<wire::StopRound>(Send(60s, 2, wire::WorkerFailed{1, 3, 1, 1, 0, "boom\n", ""}));
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_EQ(failed[0].second.cause.rfind(
                "rank 3 (spare 0 (gpu-09, node rank 1), local rank 1) exited with code 1", 0),
            0u)
      << failed[0].second.cause;
}

TEST_F(SparesTest, TheEndDoesNotWaitForTheReplacedNode) {
  Join(0s, 0);
  Join(0s, 1);
  Join(0s, 2);
  Feed(0s, StorePortReady{0, 41000});
  Feed(10s, PeerClosed{Conn(1), "connection reset"});
  Send(10s, 0, wire::RoundStopped{0, 2});
  BeatUntil(10s, 58s, {{0, 0}, {2, 0}});
  Feed(58s, StorePortReady{1, 41001});
  Send(59s, 0, wire::NodeDone{1});
  EXPECT_EQ(Sent<wire::JobEnd>(Send(59s, 2, wire::NodeDone{1})).size(), 2u);
  Send(59s, 0, wire::JobEndAck{});
  // Node 1 is away for good; its rank went to the spare: the two that played acknowledge, and
  // node 0 is done at once, with the journal saying that no workers may run.
  const Effects done = Send(59s, 2, wire::JobEndAck{});
  ASSERT_EQ(All<CoordinatorDone>(done).size(), 1u) << test::Describe(done);
  const auto journal = All<RecordWorkers>(done);
  ASSERT_EQ(journal.size(), 1u);
  EXPECT_FALSE(journal[0].rounds_may_run);
}

TEST_F(SparesTest, ANodeThatComesBackInTimeKeepsItsRank) {
  Join(0s, 0);
  Join(0s, 1);
  Join(0s, 2);
  Feed(0s, StorePortReady{0, 41000});
  Feed(10s, PeerClosed{Conn(1), "connection reset"});
  Send(10s, 0, wire::RoundStopped{0, 2});
  // The same agent comes back after 3 s (its workers are gone): no replacement, no fence.
  BeatUntil(10s, 13s, {{0, 0}, {2, 0}});
  Feed(13s, PeerAccepted{Conn(1, 1), "10.0.0.2"});
  Send(13s, 1,
       wire::Join{1, "gpu-02", 2, "0.1.0", FingerprintOfCanonical(canonical_), canonical_, 1001, "", "", ""},
       1);
  Effects e = BeatUntil(13s, 20s, {{0, 0}, {1, 1}, {2, 0}});
  EXPECT_EQ(FindLog(e, "takes node rank"), "") << test::Describe(e);
  ASSERT_EQ(All<ReserveStorePort>(e).size(), 1u) << test::Describe(e);
  const auto starts = Sent<wire::StartRound>(Feed(20s, StorePortReady{1, 41001}));
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[1].first, Conn(1, 1));
  EXPECT_EQ(starts[1].second.node_rank, 1);
}

TEST_F(SparesTest, ANodeThatNeverCameIsReplacedAfterReplaceAndTheJobRuns) {
  Join(0s, 0);
  Join(0s, 2);
  Effects e = BeatUntil(0s, 4s, {{0, 0}, {2, 0}});
  EXPECT_TRUE(All<ReserveStorePort>(e).empty());
  e = BeatUntil(4s, 5s, {{0, 0}, {2, 0}});
  EXPECT_NE(FindLog(e, "spare 0 (gpu-09) takes node rank 1 in place of node 1 (gpu-02), away for 5.0s"), "")
      << test::Describe(e);
  ASSERT_EQ(All<ReserveStorePort>(e).size(), 1u);
  const auto starts = Sent<wire::StartRound>(Feed(5s, StorePortReady{0, 41000}));
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[1].first, Conn(2));
  // The late node joins and waits as a spare; the job ends with both playing nodes done.
  const Effects late = Join(6s, 1);
  EXPECT_NE(FindLog(late, "node 1 (gpu-02) joined from 10.0.0.2; it waits"), "") << test::Describe(late);
  Send(7s, 0, wire::NodeDone{0});
  const auto end = Sent<wire::JobEnd>(Send(7s, 2, wire::NodeDone{0}));
  ASSERT_EQ(end.size(), 3u);  // every connected agent hears the verdict
  EXPECT_EQ(end[0].second.exit_code, 0);
}

TEST_F(SparesTest, WithoutASpareTheRoundWaitsForTheNodeAsBefore) {
  Use(std::string(kTwoNodeJob));
  Join(0s, 0);
  const Effects e = BeatUntil(0s, 60s, {{0, 0}});
  EXPECT_TRUE(All<ReserveStorePort>(e).empty());
  EXPECT_EQ(FindLog(e, "takes node rank"), "");
}

// The agent of a spare plays the node rank it is given.
TEST(SpareAgentTest, TheSparesWorkersGetTheReplacedNodesRanks) {
  Agent::Config config;
  config.node_rank = 2;
  config.host = "gpu-09";
  config.logs_dir = "/logs";
  test::AgentDriver agent;
  agent.Use(SpareJob(), config);
  std::vector<AgentEffect> out = agent.Start(0s);
  test::Append(out, agent.Feed(0s, MasterConnected{}));
  test::Append(out, agent.Msg(0s, wire::JoinAck{2, true}));
  EXPECT_NE(FindLog(out, "spare 0 joined; it waits to take the node rank of a node that is lost"), "");
  // A standby agent waits as long as the coordinator beats: no rendezvous backstop.
  for (Duration t = 1s; t <= 40min; t += 1s) agent.Msg(t, wire::Heartbeat{});
  EXPECT_FALSE(agent.agent_->exit_code());
  out = agent.Msg(40min, wire::StartRound{1, 41001, 0, 1});
  const auto spawns = All<SpawnWorkers>(out);
  ASSERT_EQ(spawns.size(), 1u) << test::Describe(out);
  ASSERT_EQ(spawns[0].workers.size(), 2u);
  EXPECT_EQ(spawns[0].workers[0].global_rank, 2);
  EXPECT_EQ(spawns[0].workers[1].global_rank, 3);
  auto env = [&](const WorkerLaunch& w, const std::string& name) {
    for (const auto& [k, v] : w.env) {
      if (k == name) return v;
    }
    return std::string("(unset)");
  };
  EXPECT_EQ(env(spawns[0].workers[1], "RANK"), "3");
  EXPECT_EQ(env(spawns[0].workers[1], "NODE_RANK"), "1");
  EXPECT_EQ(env(spawns[0].workers[1], "GROUP_RANK"), "1");
  EXPECT_EQ(env(spawns[0].workers[1], "WORLD_SIZE"), "4");
  EXPECT_NE(FindLog(out, "round 1: this agent (spare 0) takes node rank 1 from now on"), "")
      << test::Describe(out);
  // A node rank the job does not have is refused.
  test::AgentDriver other;
  other.Use(SpareJob(), config);
  other.Start(0s);
  other.Feed(0s, MasterConnected{});
  other.Msg(0s, wire::JoinAck{2, true});
  const std::vector<AgentEffect> o = other.Msg(1s, wire::StartRound{0, 41000, 0, 5});
  EXPECT_TRUE(All<SpawnWorkers>(o).empty());
}

}  // namespace
}  // namespace ddprun::core
