// The agent state machine: connecting and its advice, joining, spawning workers with the
// worker contract, stopping them, losing and regaining the coordinator, signals and exit.

#include "runner/core/agent.h"
#include "runner/core/auth.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
using test::Meaningful;
using test::Sent;
using test::SpecFromToml;
using Effects = std::vector<AgentEffect>;

constexpr Duration kNs = Duration(1);

std::string EnvOf(const WorkerLaunch& launch, const std::string& name) {
  for (const auto& [key, value] : launch.env) {
    if (key == name) return value;
  }
  return "(unset)";
}

class AgentTest : public ::testing::Test, public test::AgentDriver {
 protected:
  void SetUp() override { UseJob(kTwoNodeJob); }

  void UseJob(std::string_view toml, std::string secret = "") {
    Agent::Config config;
    config.node_rank = 1;
    config.host = "gpu-02";
    config.instance = 4242;
    config.ddprun_version = "0.1.0";
    config.logs_dir = "/var/log/ddprun";
    config.inherited_env = {{"PATH", "/usr/bin"}};
    config.secret = std::move(secret);
    Use(toml, std::move(config));
  }
  Effects Tick(Duration at) { return Feed(at, core::Tick{}); }

  Effects Exit(Duration at, int local, int code, int signal = 0, std::string tail = "", int round = 0) {
    return Feed(at, WorkerExited{round, local, code, signal, std::move(tail), ""});
  }

  /// Heartbeats from the master every second in (from, to]; returns the meaningful effects.
  Effects MasterBeatsUntil(Duration from, Duration to) {
    Effects all;
    for (Duration t = from + 1s; t <= to; t += 1s) {
      Effects e = Meaningful(Msg(t, wire::Heartbeat{}));
      all.insert(all.end(), e.begin(), e.end());
    }
    return all;
  }

  void Joined(Duration at) {
    Start(at);
    Feed(at, MasterConnected{});
    Msg(at, wire::JoinAck{2});
    ASSERT_EQ(agent_->phase(), Agent::Phase::kWaiting);
  }

  /// Joined and running round `round` with both workers.
  SpawnWorkers Running(Duration at, int round = 0, uint16_t port = 41000) {
    Joined(at);
    const Effects e = Msg(at, wire::StartRound{round, port});
    const auto spawns = All<SpawnWorkers>(e);
    EXPECT_EQ(spawns.size(), 1u) << test::Describe(e);
    return spawns.empty() ? SpawnWorkers{} : spawns[0];
  }

  /// Drives connect attempts that all fail with `error` until just before `until`.
  void FailConnectsUntil(Duration until, ConnectError error = ConnectError::kRefused) {
    while (auto next = agent_->NextDeadline()) {
      const Duration at = next->time_since_epoch();
      if (at >= until) break;
      const Effects e = Tick(at);
      if (!All<ConnectToMaster>(e).empty()) Feed(at, MasterConnectFailed{error, "Connection refused"});
    }
  }
};

const std::string kRefusedAdvice =
    "connection to gpu-01:50000 refused: node 0's agent is not listening yet, or master_port is "
    "wrong, or a firewall rejects TCP port 50000";

TEST_F(AgentTest, StartConnectsToTheMaster) {
  const Effects e = Start(0s);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<ConnectToMaster>(e[0]));
  EXPECT_EQ(agent_->phase(), Agent::Phase::kConnecting);
  EXPECT_EQ(agent_->NextDeadline(), At(15min));
}

// Time that moves back is a driver's bug, not a state the agent can act on.
TEST_F(AgentTest, TimeThatMovesBackIsAnAssertion) {
  Joined(5s);
  Tick(5s);  // the same instant is fine
  EXPECT_DEATH(Tick(4s), "assertion failed: !last_input_ \\|\\| now >= \\*last_input_");
}

TEST_F(AgentTest, ConnectErrorsAreExplained) {
  struct Case {
    ConnectError error;
    std::string detail;
    std::string advice;
  };
  const std::vector<Case> cases = {
      {ConnectError::kRefused, "Connection refused", kRefusedAdvice},
      {ConnectError::kTimedOut, "Connection timed out",
       "connection to gpu-01:50000 timed out: a firewall drops TCP port 50000 or the host is "
       "down; open TCP port 50000 on gpu-01 for the other nodes"},
      {ConnectError::kUnreachable, "No route to host",
       "gpu-01 is unreachable (No route to host): check cluster.master_addr and the routes"},
      {ConnectError::kNameNotResolved, "Name or service not known",
       "cannot resolve the host name \"gpu-01\" (Name or service not known): check "
       "cluster.master_addr, DNS or /etc/hosts"},
      {ConnectError::kOther, "Too many open files", "cannot connect to gpu-01:50000: Too many open files"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.detail);
    UseJob(kTwoNodeJob);
    Start(0s);
    const Effects e = Feed(1s, MasterConnectFailed{c.error, c.detail});
    EXPECT_EQ(test::LogTexts(e), std::vector<std::string>{c.advice + "; retrying for 14m59s more"});
    EXPECT_EQ(agent_->phase(), Agent::Phase::kRetryWait);
  }
}

TEST_F(AgentTest, ConnectRetriesBackOffFrom250msTo2sAndLogAtMostEvery10s) {
  Start(0s);
  EXPECT_EQ(test::LogTexts(Feed(0s, MasterConnectFailed{ConnectError::kRefused, ""})).size(), 1u);
  const std::vector<Duration> expected_delays = {250ms, 500ms, 1s, 2s, 2s, 2s};
  Duration now = 0s;
  for (Duration delay : expected_delays) {
    EXPECT_EQ(agent_->NextDeadline(), At(now + delay));
    EXPECT_TRUE(All<ConnectToMaster>(Tick(now + delay - kNs)).empty());
    now += delay;
    const Effects retry = Tick(now);
    ASSERT_EQ(All<ConnectToMaster>(retry).size(), 1u) << test::Describe(retry);
    // 7.75 s in: still inside the 10 s quiet period.
    EXPECT_TRUE(test::LogTexts(Feed(now, MasterConnectFailed{ConnectError::kRefused, ""})).empty());
  }
  ASSERT_EQ(now, 7750ms);
  Tick(9750ms);
  EXPECT_TRUE(test::LogTexts(Feed(9750ms, MasterConnectFailed{ConnectError::kRefused, ""})).empty());
  Tick(11750ms);
  const Effects logged = Feed(11750ms, MasterConnectFailed{ConnectError::kRefused, ""});
  EXPECT_EQ(test::LogTexts(logged), std::vector<std::string>{kRefusedAdvice + "; retrying for 14m48s more"});
}

TEST_F(AgentTest, RendezvousTimeoutWithoutEverConnectingExitsThreeAtTheDeadline) {
  Start(0s);
  Feed(0s, MasterConnectFailed{ConnectError::kRefused, "Connection refused"});
  FailConnectsUntil(15min);
  EXPECT_EQ(agent_->NextDeadline(), At(15min));
  EXPECT_TRUE(All<AgentExit>(Tick(15min - kNs)).empty());
  const Effects e = Tick(15min);
  ASSERT_EQ(All<PrintSummary>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<PrintSummary>(e)[0].text,
            "rendezvous failed: node 1 could not join the coordinator at gpu-01:50000 within "
            "timeouts.rendezvous = 15m\n  last error: " +
                kRefusedAdvice);
  ASSERT_EQ(All<AgentExit>(e).size(), 1u);
  EXPECT_EQ(All<AgentExit>(e)[0].code, 3);
  EXPECT_EQ(agent_->exit_code(), 3);
  EXPECT_EQ(agent_->NextDeadline(), std::nullopt);
}

TEST_F(AgentTest, ConnectedAgentJoinsWithItsFingerprintAndInstance) {
  Start(0s);
  const Effects e = Feed(1s, MasterConnected{});
  EXPECT_EQ(FindLog(e, "connected"), "connected to the coordinator at gpu-01:50000; joining as node 1");
  const auto joins = Sent<wire::Join>(e);
  ASSERT_EQ(joins.size(), 1u) << test::Describe(e);
  EXPECT_EQ(joins[0],
            (wire::Join{1, "gpu-02", 2, "0.1.0", config_.fingerprint, config_.canonical, 4242, "", "", ""}));
  EXPECT_EQ(agent_->phase(), Agent::Phase::kJoining);

  const Effects acked = Msg(1s, wire::JoinAck{2});
  EXPECT_EQ(test::LogTexts(acked), std::vector<std::string>{"node 1 joined; waiting for the other nodes"});
  EXPECT_EQ(agent_->phase(), Agent::Phase::kWaiting);
}

TEST_F(AgentTest, TheJoinCarriesTheProbeEndpointAndAProbeIsRunByTheHostAndAnswered) {
  config_.probe_endpoint = "10.77.0.2:41001";
  agent_ = std::make_unique<Agent>(*spec_, config_);
  Start(0s);
  const auto joins = Sent<wire::Join>(Feed(1s, MasterConnected{}));
  ASSERT_EQ(joins.size(), 1u);
  EXPECT_EQ(joins[0].probe_endpoint, "10.77.0.2:41001");
  Msg(1s, wire::JoinAck{2});

  const std::vector<wire::ProbeTarget> targets = {{0, "gpu-01", "10.77.0.1:41000"}};
  const Effects probe = Msg(2s, wire::ProbePeers{targets});
  const auto asked = All<ProbeEndpoints>(probe);
  ASSERT_EQ(asked.size(), 1u) << test::Describe(probe);
  EXPECT_EQ(asked[0].targets, targets);
  const std::vector<wire::ProbeFailure> failures = {{targets[0], "timed out (a firewall drops it)"}};
  const Effects answered = Feed(5s, ProbesDone{failures});
  EXPECT_EQ(Sent<wire::PeersProbed>(answered), std::vector<wire::PeersProbed>{wire::PeersProbed{failures}});
}

TEST_F(AgentTest, ProgressIsPrintedWithTheMissingHosts) {
  Joined(0s);
  const Effects e = Msg(1s, wire::Progress{1, 2, {0}, 41'000, 900'000, {"gpu-01"}, {""}});
  EXPECT_EQ(test::LogTexts(e),
            std::vector<std::string>{"1/2 nodes joined; waiting for node 0 (gpu-01); 41s of 15m"});
  // Issue 37: the agent the coordinator expects for the rank (a spare that took it), named as it
  // was started and with its host, not entry 0 of cluster.nodes (seed 100506 named the
  // coordinator's own host as missing).
  const Effects spare = Msg(2s, wire::Progress{1, 2, {2}, 42'000, 900'000, {"gpu-09"}, {""}});
  EXPECT_EQ(test::LogTexts(spare),
            std::vector<std::string>{"1/2 nodes joined; waiting for spare 0 (gpu-09); 42s of 15m"});
  // Issue 40: a node refused for good does not come by itself; the line says why it is missing.
  const Effects refused =
      Msg(3s, wire::Progress{1, 2, {0}, 43'000, 900'000, {"gpu-01"}, {"it runs a different job file"}});
  EXPECT_EQ(test::LogTexts(refused),
            std::vector<std::string>{
                "1/2 nodes joined; waiting for node 0 (gpu-01; refused: it runs a different job "
                "file); 43s of 15m"});
}

TEST_F(AgentTest, StartRoundSpawnsWorkersWithTheWorkerContract) {
  const SpawnWorkers spawn = Running(0s, 0, 41000);
  EXPECT_EQ(spawn.round, 0);
  ASSERT_EQ(spawn.workers.size(), 2u);
  const WorkerLaunch& w0 = spawn.workers[0];
  const WorkerLaunch& w1 = spawn.workers[1];
  EXPECT_EQ(w0.local_rank, 0);
  EXPECT_EQ(w0.global_rank, 2);
  EXPECT_EQ(w1.global_rank, 3);
  EXPECT_EQ(EnvOf(w0, "RANK"), "2");
  EXPECT_EQ(EnvOf(w1, "RANK"), "3");
  EXPECT_EQ(EnvOf(w1, "LOCAL_RANK"), "1");
  EXPECT_EQ(EnvOf(w0, "WORLD_SIZE"), "4");
  // Not rank 0: the store is reached through the relay on master_port.
  EXPECT_EQ(EnvOf(w0, "MASTER_PORT"), "50000");
  EXPECT_EQ(EnvOf(w0, "MASTER_ADDR"), "gpu-01");
  EXPECT_EQ(EnvOf(w0, "TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_EQ(EnvOf(w1, "TORCHELASTIC_ERROR_FILE"), "/var/log/ddprun/attempt-0/rank-3.error.json");
  EXPECT_EQ(w1.log_path, "attempt-0/rank-3.log");
  EXPECT_EQ(agent_->phase(), Agent::Phase::kRunning);
  EXPECT_EQ(agent_->running_workers(), 2);
}

TEST_F(AgentTest, LaterRoundsCountRestartsAndUseTheirOwnPort) {
  Joined(0s);
  const Effects e = Msg(1s, wire::StartRound{2, 41002});
  EXPECT_EQ(FindLog(e, "round 2"),
            "round 2: starting 2 workers (ranks 2..3 of 4), store through master_port 50000");
  const auto spawn = All<SpawnWorkers>(e).at(0);
  EXPECT_EQ(EnvOf(spawn.workers[0], "TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(EnvOf(spawn.workers[0], "MASTER_PORT"), "50000");
  EXPECT_EQ(EnvOf(spawn.workers[0], "TORCHELASTIC_ERROR_FILE"),
            "/var/log/ddprun/attempt-2/rank-2.error.json");
  // A duplicate or older StartRound spawns nothing.
  EXPECT_TRUE(All<SpawnWorkers>(Msg(2s, wire::StartRound{1, 41001})).empty());
}

TEST_F(AgentTest, WorkerFailureIsReportedOnceAndStopsTheRestAtOnce) {
  Running(0s);
  const Effects e = Exit(5s, 1, 1, 0, "RuntimeError: boom\n");
  EXPECT_EQ(FindLog(e, "rank 3"), "rank 3 (local rank 1) exited with code 1");
  EXPECT_EQ(Sent<wire::WorkerFailed>(e),
            (std::vector<wire::WorkerFailed>{{0, 3, 1, 1, 0, "RuntimeError: boom\n", ""}}));
  const auto signals = All<SignalWorkers>(e);
  ASSERT_EQ(signals.size(), 1u) << test::Describe(e);
  EXPECT_EQ(signals[0].round, 0);
  EXPECT_EQ(signals[0].signal, SIGTERM);

  const Effects rest = Exit(6s, 0, 1);
  EXPECT_TRUE(Sent<wire::WorkerFailed>(rest).empty());
  EXPECT_EQ(Sent<wire::RoundStopped>(rest), (std::vector<wire::RoundStopped>{{0, 1}}));
  EXPECT_EQ(FindLog(rest, "stopped"), "round 0: stopped 1 worker");
  EXPECT_EQ(agent_->phase(), Agent::Phase::kWaiting);
}

// During a stop, a worker that exits with an error file raised on its own before the stop
// reached it: the coordinator hears of it (it may be the real root cause). One that exits
// without an error file was only stopped.
TEST_F(AgentTest, AWorkerThatWroteItsErrorFileBeforeTheStopIsReportedToo) {
  Running(0s);
  Exit(5s, 0, 1, 0, "RuntimeError: [gloo] Connection closed by peer\n");
  const Effects own = Feed(6s, WorkerExited{0, 1, 0, SIGTERM, "", "RuntimeError: rank 3 fails\n"});
  EXPECT_EQ(Sent<wire::WorkerFailed>(own),
            (std::vector<wire::WorkerFailed>{{0, 3, 1, 0, SIGTERM, "", "RuntimeError: rank 3 fails\n"}}));
  EXPECT_EQ(Sent<wire::RoundStopped>(own), (std::vector<wire::RoundStopped>{{0, 1}}));
}

TEST_F(AgentTest, AWorkerStoppedWithoutAnErrorFileIsNotReported) {
  Running(0s);
  Exit(5s, 0, 1, 0, "RuntimeError: boom\n");
  const Effects stopped = Feed(6s, WorkerExited{0, 1, 0, SIGTERM, "", ""});
  EXPECT_TRUE(Sent<wire::WorkerFailed>(stopped).empty()) << test::Describe(stopped);
}

TEST_F(AgentTest, SpawnFailureIsAWorkerFailure) {
  Running(0s);
  const Effects e = Feed(1s, WorkerSpawnFailed{0, 0, "python: No such file or directory"});
  EXPECT_EQ(
      Sent<wire::WorkerFailed>(e),
      (std::vector<wire::WorkerFailed>{
          {0, 2, 0, 127, 0, "ddprun could not start the worker: python: No such file or directory", ""}}));
}

TEST_F(AgentTest, SigkillFollowsStopGraceExactly) {
  Running(0s);
  MasterBeatsUntil(0s, 10s);
  Exit(10s, 1, 1);
  const Effects waiting = MasterBeatsUntil(10s, 39s);
  EXPECT_TRUE(All<SignalWorkers>(waiting).empty()) << test::Describe(waiting);
  EXPECT_EQ(agent_->NextDeadline(), At(40s));
  EXPECT_TRUE(All<SignalWorkers>(Tick(40s - kNs)).empty());
  const Effects e = Tick(40s);
  EXPECT_EQ(FindLog(e, "SIGKILL"), "1 worker still running 30s after SIGTERM; sending SIGKILL");
  const auto signals = All<SignalWorkers>(e);
  ASSERT_EQ(signals.size(), 1u) << test::Describe(e);
  EXPECT_EQ(signals[0].signal, SIGKILL);
  EXPECT_EQ(Sent<wire::RoundStopped>(Exit(41s, 0, 0, SIGKILL)), (std::vector<wire::RoundStopped>{{0, 1}}));
}

TEST_F(AgentTest, StopRoundStopsEveryWorkerAndConfirmsWithTheCount) {
  Running(0s);
  EXPECT_TRUE(Meaningful(Msg(1s, wire::StopRound{5, "stale"})).empty());
  const Effects e =
      Msg(2s, wire::StopRound{0, "rank 0 (node 0 (gpu-01), local rank 0) exited with code 1", false, 0});
  EXPECT_EQ(FindLog(e, "round 0 failed"),
            "round 0 failed: rank 0 (node 0 (gpu-01), local rank 0) exited with code 1");
  // The host's console learns which rank is the cause, to collapse the others' consequences.
  ASSERT_EQ(All<RootCauseKnown>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<RootCauseKnown>(e)[0].round, 0);
  EXPECT_EQ(All<RootCauseKnown>(e)[0].cause_rank, 0);
  EXPECT_FALSE(All<RootCauseKnown>(e)[0].provisional);
  ASSERT_EQ(All<SignalWorkers>(e).size(), 1u);
  EXPECT_EQ(All<SignalWorkers>(e)[0].signal, SIGTERM);
  // Workers dying of the SIGTERM are not failures to report.
  EXPECT_TRUE(Sent<wire::WorkerFailed>(Exit(3s, 0, 0, SIGTERM)).empty());
  EXPECT_EQ(Sent<wire::RoundStopped>(Exit(3s, 1, 143)), (std::vector<wire::RoundStopped>{{0, 2}}));
}

// A cause that only lost a peer may be revised: the console hears that it is provisional.
TEST_F(AgentTest, AStopNamingARankThatLostAPeerIsAProvisionalRootCause) {
  Running(0s);
  const Effects e =
      Msg(2s, wire::StopRound{0, "rank 1 (node 0 (gpu-01), local rank 1) exited with code 1", false, 1,
                              /*cause_lost_peer=*/true});
  ASSERT_EQ(All<RootCauseKnown>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<RootCauseKnown>(e)[0].cause_rank, 1);
  EXPECT_TRUE(All<RootCauseKnown>(e)[0].provisional);
}

TEST_F(AgentTest, StopRoundWithNothingRunningConfirmsAtOnce) {
  Running(0s);
  Exit(1s, 0, 0);
  Exit(1s, 1, 0);
  const Effects e = Msg(2s, wire::StopRound{0, "node 0 was lost"});
  EXPECT_TRUE(All<SignalWorkers>(e).empty());
  EXPECT_EQ(Sent<wire::RoundStopped>(e), (std::vector<wire::RoundStopped>{{0, 0}}));
}

TEST_F(AgentTest, StaleWorkerExitOfAnOlderRoundIsIgnored) {
  Running(0s);
  Exit(1s, 1, 1);
  Exit(1s, 0, 0, SIGTERM);
  MasterBeatsUntil(1s, 12s);
  Msg(12s, wire::StartRound{1, 41001});
  EXPECT_TRUE(Meaningful(Exit(13s, 0, 1, 0, "", /*round=*/0)).empty());
  EXPECT_TRUE(Meaningful(Exit(13s, 7, 1, 0, "", /*round=*/1)).empty());
  EXPECT_EQ(agent_->running_workers(), 2);
}

TEST_F(AgentTest, AllWorkersExitingZeroReportsNodeDone) {
  Running(0s);
  EXPECT_TRUE(Sent<wire::NodeDone>(Exit(5s, 1, 0)).empty());
  const Effects e = Exit(6s, 0, 0);
  EXPECT_EQ(Sent<wire::NodeDone>(e), (std::vector<wire::NodeDone>{{0}}));
  EXPECT_EQ(FindLog(e, "exited 0"), "round 0: all 2 workers of node 1 exited 0");
}

TEST_F(AgentTest, JobEndPrintsAcksAndExitsOnlyAfterWorkersExited) {
  Running(0s);
  const Effects e = Msg(5s, wire::JobEnd{130, "job \"demo\" interrupted"});
  ASSERT_EQ(All<PrintSummary>(e).size(), 1u);
  EXPECT_EQ(All<PrintSummary>(e)[0].text, "job \"demo\" interrupted");
  EXPECT_EQ(All<SignalWorkers>(e).size(), 1u);
  EXPECT_TRUE(Sent<wire::JobEndAck>(e).empty());
  EXPECT_TRUE(All<AgentExit>(e).empty());
  EXPECT_TRUE(All<AgentExit>(Exit(6s, 0, 0, SIGTERM)).empty());
  const Effects last = Meaningful(Exit(7s, 1, 0, SIGTERM));
  ASSERT_EQ(last.size(), 2u) << test::Describe(last);
  EXPECT_EQ(Sent<wire::JobEndAck>(last).size(), 1u);
  ASSERT_TRUE(std::holds_alternative<AgentExit>(last[1]));
  EXPECT_EQ(std::get<AgentExit>(last[1]).code, 130);
  EXPECT_EQ(agent_->phase(), Agent::Phase::kExited);
}

TEST_F(AgentTest, JobEndWithNothingRunningExitsAtOnce) {
  Running(0s);
  Exit(1s, 0, 0);
  Exit(1s, 1, 0);
  const Effects e = Meaningful(Msg(2s, wire::JobEnd{0, "job \"demo\" succeeded"}));
  ASSERT_EQ(e.size(), 3u) << test::Describe(e);
  EXPECT_TRUE(std::holds_alternative<PrintSummary>(e[0]));
  EXPECT_EQ(Sent<wire::JobEndAck>(e).size(), 1u);
  EXPECT_EQ(std::get<AgentExit>(e[2]).code, 0);
}

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

TEST_F(AgentTest, SigintIsForwardedToTheJobAndASecondOneKills) {
  Running(0s);
  const Effects e = Feed(5s, SignalReceived{SIGINT});
  EXPECT_EQ(FindLog(e, "received"), "received SIGINT; stopping the job on every node");
  ASSERT_EQ(All<SignalWorkers>(e).size(), 1u);
  EXPECT_EQ(All<SignalWorkers>(e)[0].signal, SIGTERM);
  EXPECT_EQ(Sent<wire::Interrupted>(e), (std::vector<wire::Interrupted>{{SIGINT}}));

  const Effects again = Feed(6s, SignalReceived{SIGINT});
  EXPECT_EQ(FindLog(again, "second"), "second SIGINT: killing workers now");
  ASSERT_EQ(All<SignalWorkers>(again).size(), 1u);
  EXPECT_EQ(All<SignalWorkers>(again)[0].signal, SIGKILL);

  Msg(6s, wire::JobEnd{130, "interrupted"});
  Exit(7s, 0, 0, SIGKILL);
  const Effects last = Exit(7s, 1, 0, SIGKILL);
  EXPECT_EQ(Sent<wire::JobEndAck>(last).size(), 1u);
  ASSERT_EQ(All<AgentExit>(last).size(), 1u);
  EXPECT_EQ(All<AgentExit>(last)[0].code, 130);
}

// A SIGINT while waiting for a round crosses the StartRound the coordinator sent before it read
// the Interrupted; its JobEnd comes next. The coordinator did end the job: on 2254559 the
// interrupt's deadline still fired ("did not end the job after the interrupt"), and the agent
// left again without the JobEndAck the coordinator waits for.
TEST_F(AgentTest, AJobEndAfterAnInterruptIsTheEndTheInterruptAskedFor) {
  Joined(0s);
  ASSERT_EQ(All<SpawnWorkers>(Msg(1s, wire::StartRound{0, 41000})).size(), 1u);
  const Effects interrupted = Feed(2s, SignalReceived{SIGINT});
  EXPECT_EQ(Sent<wire::Interrupted>(interrupted), (std::vector<wire::Interrupted>{{SIGINT}}));
  EXPECT_EQ(All<SignalWorkers>(interrupted).size(), 1u) << test::Describe(interrupted);
  Msg(5s, wire::JobEnd{130, "job \"demo\" interrupted"});
  // The workers ignore SIGTERM and SIGKILL does not end them: the agent gives up on them. The
  // interrupt's own deadline (the exit barrier) must not fire after the JobEnd it asked for.
  Effects after;
  for (Duration t = 6s; t <= 60s && !agent_->exit_code(); t += 1s) {
    const Effects e = Meaningful(Msg(t, wire::Heartbeat{}));
    after.insert(after.end(), e.begin(), e.end());
  }
  EXPECT_EQ(FindLog(after, "did not end the job"), "") << test::Describe(after);
  EXPECT_EQ(Sent<wire::JobEndAck>(after).size(), 1u) << test::Describe(after);
  ASSERT_EQ(All<AgentExit>(after).size(), 1u);
  EXPECT_EQ(All<AgentExit>(after)[0].code, 130);
}

TEST_F(AgentTest, ARoundThatStartsAfterAnInterruptStartsNoWorkers) {
  // The SIGINT crossed a StartRound: the coordinator started the round before it read the
  // Interrupted, which ends the job. Starting the workers would run training the user asked to
  // stop, only to stop it again.
  Joined(0s);
  EXPECT_EQ(Sent<wire::Interrupted>(Feed(1s, SignalReceived{SIGINT})),
            (std::vector<wire::Interrupted>{{SIGINT}}));
  const Effects start = Msg(3s, wire::StartRound{0, 41000});
  EXPECT_TRUE(All<SpawnWorkers>(start).empty()) << test::Describe(start);
  EXPECT_EQ(FindLog(start, "round 0 started"),
            "round 0 started after this agent received SIGINT; starting no workers (the coordinator ends "
            "the job)");
  const Effects end = Msg(5s, wire::JobEnd{130, "job \"demo\" interrupted"});
  EXPECT_TRUE(All<SignalWorkers>(end).empty()) << test::Describe(end);
  EXPECT_EQ(Sent<wire::JobEndAck>(end).size(), 1u) << test::Describe(end);
  ASSERT_EQ(All<AgentExit>(end).size(), 1u) << test::Describe(end);
  EXPECT_EQ(All<AgentExit>(end)[0].code, 130);
}

TEST_F(AgentTest, SigtermBeforeJoiningExitsAtOnce) {
  Start(0s);
  const Effects e = Feed(1s, SignalReceived{SIGTERM});
  ASSERT_EQ(All<AgentExit>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<AgentExit>(e)[0].code, 143);
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

TEST_F(AgentTest, SendsHeartbeatsEveryIntervalWhileConnected) {
  Start(0s);
  Feed(0s, MasterConnected{});
  EXPECT_EQ(agent_->NextDeadline(), At(2s));
  // Before the join is acknowledged a heartbeat would be a protocol error.
  EXPECT_TRUE(Sent<wire::Heartbeat>(Tick(2s)).empty());
  EXPECT_TRUE(Sent<wire::Heartbeat>(Msg(4s - kNs, wire::JoinAck{2})).empty());
  EXPECT_EQ(Sent<wire::Heartbeat>(Tick(4s)).size(), 1u);
  EXPECT_EQ(Sent<wire::Heartbeat>(Tick(6s)).size(), 1u);
}

TEST_F(AgentTest, LongRoundKeepsItsDeadlinesInTheFuture) {
  // A round that trains past the rendezvous timeout: the rendezvous backstop no longer applies
  // and must not be reported as a deadline (the fixture checks after every input).
  Running(0s);
  const Effects e = MasterBeatsUntil(0s, 20min);
  EXPECT_TRUE(All<AgentExit>(e).empty()) << test::Describe(e);
  EXPECT_EQ(agent_->running_workers(), 2);
}

TEST_F(AgentTest, InterruptedAgentThatLostTheCoordinatorHasNoStaleRetryDeadline) {
  Running(0s);
  Feed(5s, MasterClosed{""});
  Feed(5s, SignalReceived{SIGINT});
  // Workers are still stopping; no reconnect is due, so nothing may be in the past.
  const Effects e = Tick(6s);
  EXPECT_TRUE(All<ConnectToMaster>(e).empty()) << test::Describe(e);
  EXPECT_EQ(agent_->NextDeadline(), At(35s));  // the SIGKILL after stop_grace
}

// Found by the core fuzzer: the exit code of a JobEnd comes off the network.
TEST_F(AgentTest, AJobEndWithAnImpossibleExitCodeExitsWithTheInternalErrorCode) {
  Start(0s);
  Feed(0s, MasterConnected{});
  Msg(0s, wire::JoinAck{2});
  const Effects e = Msg(1s, wire::JobEnd{-2105375998, "job ended"});
  ASSERT_EQ(All<AgentExit>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<AgentExit>(e)[0].code, 70);
  EXPECT_EQ(FindLog(e, "exit code"),
            "the coordinator sent exit code -2105375998, which no process can exit with; exiting "
            "with 70 (internal error)");
}

// With a shared secret the agent answers the coordinator's challenge, and refuses to join a
// coordinator that never asks. Without one, a challenge ends it with advice.
class SecretAgentTest : public AgentTest {
 protected:
  void SetUp() override { UseJob(kTwoNodeJob, "s3cret"); }
};

TEST_F(SecretAgentTest, SpeaksFirstThenAnswersTheChallengeWithItsProof) {
  Start(0s);
  // The relay tells agents from store clients by their first bytes, so the agent joins at once.
  const auto first = Sent<wire::Join>(Feed(1s, MasterConnected{}));
  ASSERT_EQ(first.size(), 1u);
  // The hello says nothing about the job before the coordinator proved it knows the secret.
  EXPECT_EQ(first[0].proof, "");
  EXPECT_EQ(first[0].canonical, "");
  EXPECT_EQ(first[0].fingerprint, "");
  EXPECT_EQ(first[0].host, "");
  EXPECT_EQ(first[0].node_rank, 1);
  EXPECT_EQ(first[0].nonce.size(), 32u);
  const Effects e = Msg(1s, wire::Challenge{"abc", CoordinatorProof("s3cret", first[0].nonce, "abc")});
  const auto joins = Sent<wire::Join>(e);
  ASSERT_EQ(joins.size(), 1u) << test::Describe(e);
  EXPECT_EQ(joins[0].proof, JoinProof("s3cret", "abc", 1, config_.fingerprint));
  EXPECT_EQ(joins[0].canonical, config_.canonical);
  EXPECT_TRUE(Sent<wire::Join>(Msg(2s, wire::Challenge{"again", ""})).empty()) << "one proof per connection";
}

// Issue 11: a fake listener on the master port captured job.env. Now it learns nothing: it
// cannot prove the secret. Issue 25: nor can it end the agent; the agent says why at once,
// leaves the connection, tries again, and exits 3 only at its rendezvous timeout.
TEST_F(SecretAgentTest, AListenerThatCannotProveTheSecretLearnsNothingAndEndsNothing) {
  for (const bool empty_proof : {true, false}) {
    SCOPED_TRACE(empty_proof);
    UseJob(kTwoNodeJob, "s3cret");
    Start(0s);
    const auto hello = Sent<wire::Join>(Feed(1s, MasterConnected{}));
    ASSERT_EQ(hello.size(), 1u);
    const std::string proof = empty_proof ? "" : CoordinatorProof("guess", hello[0].nonce, "abc");
    const Effects e = Msg(1s, wire::Challenge{"abc", proof});
    EXPECT_TRUE(Sent<wire::Join>(e).empty()) << test::Describe(e);
    EXPECT_TRUE(All<AgentExit>(e).empty()) << test::Describe(e);
    EXPECT_TRUE(All<PrintSummary>(e).empty()) << test::Describe(e);
    EXPECT_EQ(All<DisconnectFromMaster>(e).size(), 1u) << test::Describe(e);
    EXPECT_EQ(FindLog(e, "did not prove"),
              "the process listening on gpu-01:50000 did not prove that it knows this node's shared "
              "secret: either the secrets of this node and node 0 differ, or the listener is not "
              "this job's coordinator (another job, or an impostor); nothing about this job was "
              "sent to it\nhint: set the same DDPRUN_SECRET (or DDPRUN_SECRET_FILE) on every node, "
              "and check that nothing else listens on master_port\nretrying every 2.0s for 14m59s "
              "more (until timeouts.rendezvous)");
    EXPECT_EQ(agent_->NextDeadline(), At(3s)) << "connects again after 2s";
    // Each retry meets the same listener: the same story is not told again every 2 s.
    Tick(3s);
    Feed(3s, MasterConnected{});
    const Effects again = Msg(3s, wire::Challenge{"abc", proof});
    EXPECT_EQ(FindLog(again, "did not prove"), "") << test::Describe(again);
    // At the rendezvous timeout the agent exits 3 with the reason.
    const Effects end = Tick(15min);
    ASSERT_EQ(All<AgentExit>(end).size(), 1u) << test::Describe(end);
    EXPECT_EQ(All<AgentExit>(end)[0].code, 3);
    EXPECT_NE(All<PrintSummary>(end).at(0).text.find(
                  "last error: the process listening on gpu-01:50000 did not prove that it knows "
                  "this node's shared secret"),
              std::string::npos)
        << All<PrintSummary>(end).at(0).text;
  }
}

TEST_F(SecretAgentTest, ACoordinatorThatNeverChallengesIsNotJoined) {
  Start(0s);
  Feed(1s, MasterConnected{});
  const Effects e = Msg(1s, wire::JoinAck{2});
  EXPECT_TRUE(All<AgentExit>(e).empty()) << test::Describe(e);
  EXPECT_EQ(agent_->phase(), Agent::Phase::kRetryWait);
  EXPECT_EQ(All<DisconnectFromMaster>(e).size(), 1u) << test::Describe(e);
  EXPECT_NE(FindLog(e,
                    "did not ask for the shared secret: node 0 runs without one, or the "
                    "listener is not this job's coordinator"),
            "")
      << test::Describe(e);
}

// Issue 25: a listener on the master port answered the hello with JobEnd(0), and the agent
// printed "job succeeded" and exited 0; a Reject was believed and its reason printed raw.
// Nothing an unproven peer sends is believed, printed, acted on, or counted as hearing from
// the coordinator.
TEST_F(SecretAgentTest, NothingAnUnprovenPeerSendsIsBelievedOrPrinted) {
  const std::string hostile = "\x1b]0;owned\x07\x1b[2Jjob succeeded";
  const std::vector<wire::Message> messages = {
      wire::JobEnd{0, hostile},    wire::Reject{hostile, false},
      wire::Reject{hostile, true}, wire::StartRound{0, 41000},
      wire::StopRound{0, hostile}, wire::Progress{1, 2, {0}, 1, 2, {}, {}},
      wire::DumpStacks{0},         wire::Heartbeat{}};
  for (const wire::Message& message : messages) {
    SCOPED_TRACE(wire::MessageName(message));
    UseJob(kTwoNodeJob, "s3cret");
    Start(0s);
    Feed(1s, MasterConnected{});
    const Effects e = Msg(1s, message);
    EXPECT_TRUE(All<AgentExit>(e).empty()) << test::Describe(e);
    EXPECT_TRUE(All<PrintSummary>(e).empty()) << test::Describe(e);
    EXPECT_TRUE(All<SpawnWorkers>(e).empty()) << test::Describe(e);
    EXPECT_TRUE(Sent<wire::Join>(e).empty()) << "nothing about the job: " << test::Describe(e);
    EXPECT_EQ(All<DisconnectFromMaster>(e).size(), 1u) << test::Describe(e);
    EXPECT_EQ(agent_->phase(), Agent::Phase::kRetryWait);
    for (const LogLine& line : All<LogLine>(e)) {
      EXPECT_EQ(line.text.find("owned"), std::string::npos) << line.text;
      EXPECT_EQ(line.text.find("succeeded"), std::string::npos) << line.text;
    }
    EXPECT_NE(FindLog(e, fmt::format("answered with a {} message before proving that it knows "
                                     "this node's shared secret; not believed",
                                     wire::MessageName(message))),
              "")
        << test::Describe(e);
    // The real coordinator answers the next connection: the agent joins as if nothing happened.
    Tick(3s);
    const auto hello = Sent<wire::Join>(Feed(3s, MasterConnected{}));
    ASSERT_EQ(hello.size(), 1u);
    const Effects proven = Msg(3s, wire::Challenge{"n2", CoordinatorProof("s3cret", hello[0].nonce, "n2")});
    ASSERT_EQ(Sent<wire::Join>(proven).size(), 1u) << test::Describe(proven);
    Msg(3s, wire::JoinAck{2});
    EXPECT_EQ(agent_->phase(), Agent::Phase::kWaiting);
  }
}

// An impostor's words are not the coordinator's: they do not renew this node's lease, so the
// workers of an agent that lost the coordinator are still killed on time.
TEST_F(SecretAgentTest, AnImpostorDoesNotExtendTheLeaseOfRunningWorkers) {
  Start(0s);
  const auto hello = Sent<wire::Join>(Feed(0s, MasterConnected{}));
  ASSERT_EQ(hello.size(), 1u);
  Msg(0s, wire::Challenge{"n1", CoordinatorProof("s3cret", hello[0].nonce, "n1")});
  Msg(0s, wire::JoinAck{2});
  ASSERT_EQ(All<SpawnWorkers>(Msg(0s, wire::StartRound{0, 41000})).size(), 1u);
  Feed(100ms, MasterClosed{"connection reset"});  // last heard at 0s
  // An impostor answers every reconnect with heartbeats; none of them is hearing from node 0.
  bool killed = false;
  Duration killed_at{0};
  for (Duration t = 200ms; t < 1min && !killed; t += 100ms) {
    Effects e = Tick(t);
    if (!All<ConnectToMaster>(e).empty()) {
      Feed(t, MasterConnected{});
      Effects answer = Msg(t, wire::Heartbeat{});
      e.insert(e.end(), answer.begin(), answer.end());
    }
    for (const SignalWorkers& signal : All<SignalWorkers>(e)) {
      if (signal.signal == SIGKILL) {
        killed = true;
        killed_at = t;
      }
    }
  }
  ASSERT_TRUE(killed);
  EXPECT_LE(At(killed_at), At(0s) + spec_->timeouts.LossBound() + spec_->timeouts.stop_grace + 100ms);
}

TEST_F(AgentTest, WithoutASecretAChallengeEndsTheAgentWithAdvice) {
  Start(0s);
  Feed(1s, MasterConnected{});
  const Effects e = Msg(1s, wire::Challenge{"abc", ""});
  ASSERT_EQ(All<AgentExit>(e).size(), 1u) << test::Describe(e);
  EXPECT_EQ(All<AgentExit>(e)[0].code, 3);
  EXPECT_NE(All<PrintSummary>(e).at(0).text.find("requires a shared secret and this node has none"),
            std::string::npos);
}

}  // namespace
}  // namespace ddprun::core
