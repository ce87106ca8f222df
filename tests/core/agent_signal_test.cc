// The agent and the signals it receives: SIGINT forwarded to the job (a second one kills), an
// interrupt that crosses a round's start or the job's end, SIGTERM before joining.

#include "tests/core/agent_fixture.h"

namespace ddprun::core {
namespace {

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

TEST_F(AgentTest, InterruptedAgentThatLostTheCoordinatorHasNoStaleRetryDeadline) {
  Running(0s);
  Feed(5s, MasterClosed{""});
  Feed(5s, SignalReceived{SIGINT});
  // Workers are still stopping; no reconnect is due, so nothing may be in the past.
  const Effects e = Tick(6s);
  EXPECT_TRUE(All<ConnectToMaster>(e).empty()) << test::Describe(e);
  EXPECT_EQ(agent_->NextDeadline(), At(35s));  // the SIGKILL after stop_grace
}

}  // namespace
}  // namespace ddprun::core
