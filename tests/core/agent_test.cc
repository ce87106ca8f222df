// The agent state machine: connecting and its advice, joining, spawning workers with the worker
// contract, stopping them, the job's end and the heartbeats. The coordinator's loss, signals
// and the shared secret have files of their own (agent_loss_test.cc, agent_signal_test.cc,
// agent_secret_test.cc).

#include "tests/core/agent_fixture.h"

namespace ddprun::core {
namespace {

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

}  // namespace
}  // namespace ddprun::core
