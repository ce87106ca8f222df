// The agent without its coordinator: a closed or silent coordinator, the workers' lease across
// the agent's own stalls, rejoining until the rendezvous timeout, and refusals.

#include "tests/core/agent_fixture.h"

namespace ddprun::core {
namespace {

TEST_F(AgentTest, ClosedCoordinatorStopsWorkersAndRejoins) {
  Running(0s);
  const Effects e = Feed(5s, MasterClosed{"connection reset by peer"});
  EXPECT_EQ(FindLog(e, "lost the coordinator"),
            "lost the coordinator at gpu-01:50000 (connection reset by peer); stopping this node's "
            "workers and rejoining for up to 15m");
  ASSERT_EQ(All<SignalWorkers>(e).size(), 1u);
  EXPECT_EQ(All<SignalWorkers>(e)[0].signal, SIGTERM);
  EXPECT_EQ(agent_->phase(), Agent::Phase::kRetryWait);
  // It rejoins only once its workers are gone, so the coordinator can count on a joining
  // node having nothing left to stop: the next deadline is the SIGKILL, not the retry.
  EXPECT_EQ(agent_->NextDeadline(), At(5s + 30s));
  EXPECT_TRUE(All<ConnectToMaster>(Exit(6s, 0, 0, SIGTERM)).empty());
  const Effects last = Exit(6s, 1, 0, SIGTERM);
  EXPECT_TRUE(All<SendToMaster>(last).empty()) << "nobody to confirm the stop to";
  EXPECT_EQ(All<ConnectToMaster>(last).size(), 1u);
  const Effects rejoin = Feed(7s, MasterConnected{});
  EXPECT_EQ(Sent<wire::Join>(rejoin).size(), 1u);
  EXPECT_EQ(Sent<wire::Join>(rejoin)[0].instance, 4242u);
  Msg(7s, wire::JoinAck{2});
  EXPECT_EQ(agent_->phase(), Agent::Phase::kWaiting);
  MasterBeatsUntil(7s, 20s);
  const auto spawn = All<SpawnWorkers>(Msg(20s, wire::StartRound{1, 41001}));
  ASSERT_EQ(spawn.size(), 1u);
  EXPECT_EQ(spawn[0].round, 1);
}

TEST_F(AgentTest, SilentCoordinatorIsLostAfterThreeHeartbeats) {
  Running(0s);
  Msg(1s, wire::Heartbeat{});
  // The driver wakes the agent at each of its deadlines (its heartbeats); a longer gap would be
  // its own stall (AStallWithinTheLeaseIsNotTheCoordinatorsSilence).
  Tick(2s);
  Tick(4s);
  Tick(6s);
  const Effects quiet = Tick(7s);
  EXPECT_TRUE(All<DisconnectFromMaster>(quiet).empty()) << test::Describe(quiet);
  EXPECT_EQ(agent_->NextDeadline(), At(7s + kNs));
  const Effects e = Tick(7s + kNs);
  ASSERT_EQ(All<DisconnectFromMaster>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(FindLog(e, "lost"),
            "lost the coordinator at gpu-01:50000 (silent for 6.0s (3 heartbeats)); stopping this "
            "node's workers and rejoining for up to 15m");
  EXPECT_EQ(All<SignalWorkers>(e).size(), 1u);
}

// Found by the 100,000-seed swarm: an agent that was itself stopped for a while noticed the loss
// late and gave its workers a full stop_grace from then, so they outlived the fence after which
// the coordinator gave their ranks to another agent. The lease counts from the last word heard.
TEST_F(AgentTest, AnAgentThatNoticesTheLossLateStillKillsItsWorkersWithinItsLease) {
  Running(0s);
  Msg(1s, wire::Heartbeat{});
  // Nothing ran from 1 s to 50 s (SIGSTOP): loss bound 6 s + stop_grace 30 s from 1 s is 37 s.
  const Effects e = Tick(50s);
  const auto signals = All<SignalWorkers>(e);
  ASSERT_EQ(signals.size(), 2u) << test::Describe(e);
  EXPECT_EQ(signals[0].signal, SIGTERM);
  EXPECT_EQ(signals[1].signal, SIGKILL);
  EXPECT_EQ(FindLog(e, "SIGKILL"),
            "2 workers last heard from the coordinator 49s ago (this agent did not run meanwhile), "
            "past the loss bound + stop_grace; sending SIGKILL");

  // Noticed in time, the full stop_grace applies: SIGKILL at 7 s + 30 s.
  UseJob(kTwoNodeJob);
  Running(0s);
  Msg(1s, wire::Heartbeat{});
  Tick(2s);
  Tick(4s);
  Tick(6s);
  Tick(7s + kNs);
  EXPECT_EQ(agent_->NextDeadline(), At(37s));
}

// Issue 37: an agent that did not run for 11 s (SIGSTOP, a VM pause) within its workers' lease
// (loss bound 6 s + stop_grace 30 s) reads the heartbeats that waited in its socket before it
// judges the coordinator's silence: node 0 lost its own coordinator this way. A coordinator that
// is really silent is still lost, a loss bound after the agent runs again.
TEST_F(AgentTest, AStallWithinTheLeaseIsNotTheCoordinatorsSilence) {
  Running(0s);
  Msg(1s, wire::Heartbeat{});
  const Effects resumed = Tick(12s);
  EXPECT_TRUE(All<DisconnectFromMaster>(resumed).empty()) << test::Describe(resumed);
  EXPECT_TRUE(All<SignalWorkers>(resumed).empty()) << test::Describe(resumed);
  const Effects read = Msg(12s, wire::Heartbeat{});
  EXPECT_TRUE(All<DisconnectFromMaster>(read).empty()) << test::Describe(read);
  Tick(14s);
  Tick(16s);
  EXPECT_TRUE(All<DisconnectFromMaster>(Tick(18s)).empty());
  const Effects lost = Tick(18s + kNs);
  ASSERT_EQ(All<DisconnectFromMaster>(lost).size(), 1u) << test::Describe(lost);
  EXPECT_EQ(
      FindLog(lost, "lost").rfind("lost the coordinator at gpu-01:50000 (silent for 6.0s (3 heartbeats))", 0),
      0u);
}

// Issue 37: words read after our own stall renewed no lease only within one heartbeat of
// resuming, and a loaded machine let the agent read later than that (the liveness test's
// scripts hid it). Now nothing renews the lease after a stall until the coordinator answers the
// echo the agent sends on resuming: TCP keeps the order, so what follows the answer is new.
TEST_F(AgentTest, AfterAStallOnlyTheCoordinatorsEchoRenewsTheWorkersLease) {
  Running(0s);
  Msg(1s, wire::Heartbeat{});
  const Effects resumed = Tick(12s);
  // The echo first, then the heartbeat that came due meanwhile.
  EXPECT_EQ(Sent<wire::Heartbeat>(resumed),
            (std::vector<wire::Heartbeat>{wire::Heartbeat{1}, wire::Heartbeat{}}))
      << test::Describe(resumed);
  // Read 2.5 s after resuming, later than a heartbeat (2 s): still a word that waited.
  EXPECT_TRUE(All<RenewLease>(Msg(14s + 500ms, wire::Heartbeat{})).empty());
  EXPECT_TRUE(All<RenewLease>(Msg(14s + 600ms, wire::Heartbeat{7})).empty()) << "not our echo";
  const Effects echoed = Msg(14s + 700ms, wire::Heartbeat{1});
  ASSERT_EQ(All<RenewLease>(echoed).size(), 1u) << test::Describe(echoed);
  EXPECT_EQ(All<RenewLease>(echoed)[0].kill_at, At(14s + 700ms + 36s));
  EXPECT_EQ(All<RenewLease>(Msg(15s, wire::Heartbeat{})).size(), 1u) << "what follows the echo is new";
}

// The workers' lease for the guardian: renewed by every word from the coordinator (and the
// connection), before what that word makes the agent do, at the same time as the agent's own
// SIGKILL would come; never by the agent merely running. Found by the swarm (seed 600612 of
// examples/lightning-2x8.toml): the guardian counted from the agent's last loop, so an agent
// paused in the middle of its own stop gave its worker a whole lease more, past the fence.
TEST_F(AgentTest, EveryWordFromTheCoordinatorRenewsTheWorkersLeaseBeforeAnythingElse) {
  Start(0s);
  // A connect is not a word from the coordinator: anything may listen on the port (issue 25).
  EXPECT_TRUE(All<RenewLease>(Feed(0s, MasterConnected{})).empty());
  const Effects acked = Msg(0s, wire::JoinAck{2});
  ASSERT_FALSE(acked.empty());
  ASSERT_TRUE(std::holds_alternative<RenewLease>(acked.front())) << test::Describe(acked);
  // Loss bound 6 s + stop_grace 30 s.
  EXPECT_EQ(std::get<RenewLease>(acked.front()).kill_at, At(36s));
  Tick(2s);  // the driver wakes the agent at its heartbeats
  Tick(4s);
  const Effects start = Msg(5s, wire::StartRound{0, 41000});
  const auto first = [&start](auto is) {
    return std::find_if(start.begin(), start.end(), is) - start.begin();
  };
  const auto renewal = first([](const AgentEffect& e) { return std::holds_alternative<RenewLease>(e); });
  const auto spawn = first([](const AgentEffect& e) { return std::holds_alternative<SpawnWorkers>(e); });
  ASSERT_LT(spawn, std::ssize(start)) << test::Describe(start);
  EXPECT_LT(renewal, spawn) << test::Describe(start);
  EXPECT_EQ(All<RenewLease>(start).at(0).kill_at, At(41s));
  EXPECT_EQ(All<RenewLease>(Msg(6s, wire::Heartbeat{})).at(0).kill_at, At(42s));
  // The agent runs (its own heartbeats, a worker's exit) without a word: no renewal.
  EXPECT_TRUE(All<RenewLease>(Tick(8s)).empty());
  EXPECT_TRUE(All<RenewLease>(Exit(9s, 0, 0)).empty());
  // It loses the coordinator, stops its workers, and its SIGKILL comes when the lease ends.
  Tick(12s + kNs);
  EXPECT_EQ(agent_->NextDeadline(), At(42s));
  const Effects kill = Tick(42s);
  ASSERT_EQ(All<SignalWorkers>(kill).size(), 1u) << test::Describe(kill);
  EXPECT_EQ(All<SignalWorkers>(kill)[0].signal, SIGKILL);
  EXPECT_TRUE(All<RenewLease>(kill).empty()) << test::Describe(kill);
}

TEST_F(AgentTest, GivesUpRejoiningAfterTheRendezvousTimeout) {
  Running(0s);
  Feed(5s, MasterClosed{""});
  // The retry was due at 5.25 s, but a node rejoins only once its workers are gone.
  ASSERT_TRUE(All<ConnectToMaster>(Exit(6s, 0, 0, SIGTERM)).empty());
  ASSERT_EQ(All<ConnectToMaster>(Exit(6s, 1, 0, SIGTERM)).size(), 1u);
  Feed(6s, MasterConnectFailed{ConnectError::kRefused, "Connection refused"});
  FailConnectsUntil(15min + 5s);
  EXPECT_TRUE(All<AgentExit>(Tick(15min + 5s - kNs)).empty());
  const Effects e = Tick(15min + 5s);
  ASSERT_EQ(All<PrintSummary>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<PrintSummary>(e)[0].text,
            "node 1 lost the coordinator at gpu-01:50000 and could not rejoin within "
            "timeouts.rendezvous = 15m\n  last error: " +
                kRefusedAdvice);
  ASSERT_EQ(All<AgentExit>(e).size(), 1u);
  EXPECT_EQ(All<AgentExit>(e)[0].code, 3);
}

TEST_F(AgentTest, ARetryableRejectIsRetriedUntilTheRendezvousTimeout) {
  // A rebooted host whose old connection is not yet declared dead is refused as a duplicate
  // for a few heartbeats; it must keep asking, and give up only at the rendezvous timeout.
  Start(0s);
  Feed(0s, MasterConnected{});
  Effects e = Msg(0s, wire::Reject{"node rank 1 is claimed twice", true});
  EXPECT_TRUE(All<AgentExit>(e).empty()) << test::Describe(e);
  EXPECT_EQ(All<DisconnectFromMaster>(e).size(), 1u);
  EXPECT_EQ(FindLog(e, "claimed twice"),
            "the coordinator refused this node: node rank 1 is claimed twice\nretrying every "
            "2.0s for 15m00s more (until timeouts.rendezvous)");
  EXPECT_EQ(agent_->NextDeadline(), At(2s));
  EXPECT_EQ(All<ConnectToMaster>(Tick(2s)).size(), 1u);
  // Issue 12: the retries do not repeat "connected ... joining" on the console.
  const Effects again = Feed(2s, MasterConnected{});
  for (const LogLine& line : All<LogLine>(again)) {
    if (line.text.find("connected") != std::string::npos) {
      EXPECT_EQ(line.level, LogLevel::kDebug);
    }
  }
  Msg(2s, wire::JoinAck{2});
  EXPECT_EQ(agent_->phase(), Agent::Phase::kWaiting) << "joined once the slot was free";
}

TEST_F(AgentTest, ARetryableRejectEndsAtTheRendezvousTimeoutWithTheReason) {
  Start(0s);
  for (Duration t = 0s; t < 15min; t += 2s) {
    Feed(t, MasterConnected{});
    Msg(t, wire::Reject{"node rank 1 is claimed twice", true});
    if (t + 2s < 15min) Tick(t + 2s);
  }
  const Effects e = Tick(15min);
  ASSERT_EQ(All<AgentExit>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<AgentExit>(e)[0].code, 3);
  EXPECT_NE(All<PrintSummary>(e).at(0).text.find(
                "last error: the coordinator refused this node: node rank 1 is claimed twice"),
            std::string::npos)
      << All<PrintSummary>(e).at(0).text;
}

// Issue 40: the duplicate of a node rank is refused until the job it wanted to join ends; its
// summary blamed "connection refused ... master_port is wrong", the last error when its
// rendezvous timed out. The refusal comes first now.
TEST_F(AgentTest, ARefusalThenAGoneCoordinatorEndsWithTheRefusalAsTheReason) {
  Start(0s);
  Feed(0s, MasterConnected{});
  Msg(0s, wire::Reject{"node rank 1 is claimed twice", true});
  for (Duration t = 2s; t < 15min; t += 2s) {
    if (!All<ConnectToMaster>(Tick(t)).empty())
      Feed(t, MasterConnectFailed{ConnectError::kRefused, "Connection refused"});
  }
  const Effects e = Tick(15min);
  ASSERT_EQ(All<AgentExit>(e).size(), 1u) << test::Describe(e);
  const std::string summary = All<PrintSummary>(e).at(0).text;
  EXPECT_NE(
      summary.find("last error: the coordinator refused this node: node rank 1 is claimed twice\n  (since "
                   "then: connection to gpu-01:50000 refused"),
      std::string::npos)
      << summary;
}

TEST_F(AgentTest, RejectExitsThreeWithTheReason) {
  Start(0s);
  Feed(0s, MasterConnected{});
  const Effects e = Msg(0s, wire::Reject{"node 1 (host gpu-02) runs a different job file", false});
  ASSERT_EQ(All<PrintSummary>(e).size(), 1u);
  EXPECT_EQ(All<PrintSummary>(e)[0].text,
            "the coordinator refused this node: node 1 (host gpu-02) runs a different job file");
  EXPECT_EQ(All<DisconnectFromMaster>(e).size(), 1u);
  ASSERT_EQ(All<AgentExit>(e).size(), 1u);
  EXPECT_EQ(All<AgentExit>(e)[0].code, 3);
}

}  // namespace
}  // namespace ddprun::core
