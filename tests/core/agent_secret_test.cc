// The agent with a shared secret: it answers the coordinator's challenge, refuses to join a
// coordinator that never asks, and believes nothing an unproven peer sends.

#include "runner/core/auth.h"
#include "tests/core/agent_fixture.h"

namespace ddprun::core {
namespace {

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
