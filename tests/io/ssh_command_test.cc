// What `ddprun up` hands to ssh (argv, remote lines), how it reads ssh's failures, and the stop
// line of the agent's link: word for word.

#include "runner/io/ssh_command.h"

#include <csignal>

#include <gtest/gtest.h>

#include "runner/io/controller_link.h"

namespace ddprun::io {
namespace {

TEST(SshArgvTest, PlainSshGetsOptionsDestinationAndOneRemoteLine) {
  EXPECT_EQ(SshArgv("", {"-o", "BatchMode=yes"}, "gpu-01", "ddprun --version"),
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "gpu-01", "ddprun --version"}));
}

TEST(SshArgvTest, DdprunSshCommandIsRunByTheShellLikeGitSshCommand) {
  EXPECT_EQ(SshArgv("ssh -F my config", {"-o", "BatchMode=yes"}, "gpu-01", "true"),
            (std::vector<std::string>{"/bin/sh", "-c", "ssh -F my config \"$@\"", "ssh -F my config", "-o",
                                      "BatchMode=yes", "gpu-01", "true"}));
}

TEST(SshArgvTest, AHostThatLooksLikeAnOptionIsRefused) {
  EXPECT_EQ(CheckDestination("-oProxyCommand=touch /tmp/x").error(),
            "host \"-oProxyCommand=touch /tmp/x\" cannot be given to ssh (it would read it as an option)");
  EXPECT_TRUE(CheckDestination("gpu-01"));
}

TEST(AgentRemoteLineTest, QuotesEveryWordAndGivesTheNodeRank) {
  AgentCommand agent;
  agent.program = "/opt/dd prun/ddprun";
  agent.job_path = "/home/me/jobs/job.toml";
  agent.node_rank = 2;
  agent.script_args = {"--lr", "0.1", "it's"};
  agent.secret_file = "/home/me/.ddprun-secret";
  EXPECT_EQ(AgentRemoteLine(agent),
            "cd /home/me/jobs && DDPRUN_SECRET_FILE=/home/me/.ddprun-secret exec '/opt/dd prun/ddprun' run "
            "/home/me/jobs/job.toml --node-rank 2 --under-up -- --lr 0.1 'it'\\''s'");
}

TEST(ProbeTest, CommandChecksDdprunThenTheJobFile) {
  EXPECT_EQ(ProbeCommand("ddprun", "/j/job.toml", false),
            "if test -r /j/job.toml; then echo job-file-found; else echo job-file-missing; fi; "
            "command -v ddprun >/dev/null 2>&1 || exit 127; ddprun --version || exit 126");
  EXPECT_EQ(ProbeCommand("ddprun", "/j/job.toml", true),
            "command -v ddprun >/dev/null 2>&1 || exit 127; ddprun --version || exit 126");
}

ProbeOutcome Read(int status, const std::string& out, const std::string& err) {
  return ReadProbe("gpu-02", status, out, err, "ddprun", "/j/job.toml", "1.2.3", 10);
}

TEST(ProbeTest, ReadsEachFailureWithItsFix) {
  EXPECT_TRUE(Read(0, "ddprun 1.2.3\njob-file-found\n", "").ok);
  auto host_key = Read(255, "", "Host key verification failed.\n");
  EXPECT_EQ(host_key.what, "its host key is not known here (ssh runs with BatchMode=yes and asks nothing)");
  EXPECT_EQ(
      host_key.fix,
      "hint: check the key's fingerprint with whoever runs gpu-02 (`ssh-keyscan gpu-02 | ssh-keygen -lf -` "
      "shows what it offers), then add it to known_hosts");
  EXPECT_EQ(Read(255, "", "ssh: connect to host gpu-02 port 22: No route to host\n").what,
            "no route to the host: ssh: connect to host gpu-02 port 22: No route to host");
  // The port ssh tried, not an assumed 22.
  const auto timed_out = Read(255, "", "ssh: connect to host gpu-02 port 2222: Connection timed out\n");
  EXPECT_EQ(timed_out.what,
            "connection timed out (10 s): ssh: connect to host gpu-02 port 2222: Connection timed out");
  EXPECT_NE(timed_out.fix.find("is the host up and port 2222 open?"), std::string::npos) << timed_out.fix;
  EXPECT_EQ(Read(255, "", "ssh: connect to host gpu-02 port 2200: Connection refused\n").what,
            "connection refused: no ssh server listens on port 2200: ssh: connect to host gpu-02 port 2200: "
            "Connection refused");
  EXPECT_EQ(Read(-1, "", "").what, "no answer within 15 s");
  EXPECT_EQ(Read(255, "", "banner\nkex_exchange_identification: read: Connection reset by peer\n").what,
            "ssh failed: kex_exchange_identification: read: Connection reset by peer");
  EXPECT_EQ(Read(1, "", "Segmentation fault\n").what,
            "`ddprun --version` failed there (exit 1): Segmentation fault");
  EXPECT_EQ(Read(0, "ddprun 1.2.3\njob-file-missing\n", "").what, "the job file is not at /j/job.toml there");
}

// A changed host key is what an interception looks like: said so, and never "accept the key".
TEST(ProbeTest, AChangedHostKeyIsReportedAsAPossibleAttack) {
  const std::string err =
      "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
      "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
      "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
      "IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n"
      "Someone could be eavesdropping on you right now (man-in-the-middle attack)!\n"
      "Host key for gpu-02 has changed and you have requested strict checking.\n"
      "Host key verification failed.\n";
  const auto changed = Read(255, "", err);
  EXPECT_EQ(changed.what,
            "its host key has CHANGED since it was recorded in known_hosts: someone may be intercepting the "
            "connection (a man-in-the-middle attack), or the host was reinstalled");
  EXPECT_EQ(changed.fix.find("accept the key"), std::string::npos) << changed.fix;
  EXPECT_NE(changed.fix.find("do not accept the new key"), std::string::npos) << changed.fix;
}

// The host's side is ddprun itself: no shell decides what to signal, every path is quoted.
TEST(RemoteLineTest, UpDetachStatusDownAndCopyRunDdprunOnTheHost) {
  EXPECT_EQ(CopyCommand("/opt/dd prun", "/j/job.toml"),
            "exec '/opt/dd prun' __up-remote copy --to /j/job.toml");
  AgentCommand agent;
  agent.job_path = "/j/job.toml";
  agent.node_rank = 1;
  agent.script_args = {"--lr", "it's"};
  EXPECT_EQ(
      DetachedAgentLine(agent, "/j/logs/my job"),
      "cd /j && exec ddprun __up-remote start --state-dir '/j/logs/my job' --node-rank 1 --job /j/job.toml "
      "-- --lr 'it'\\''s'");
  EXPECT_EQ(StatusLine("ddprun", "/j/logs/x", 3),
            "exec ddprun __up-remote status --state-dir /j/logs/x --node-rank 3");
  EXPECT_EQ(DownLine("ddprun", "/j/logs/x", 0, 35),
            "exec ddprun __up-remote down --state-dir /j/logs/x --node-rank 0 --wait 35");
}

TEST(RemoteAnswerTest, RoundTripsAndSkipsWhatElseTheSessionPrinted) {
  RemoteAnswer answer;
  answer.state = RemoteState::kRunning;
  answer.pid = 4242;
  answer.log = {"round 0: starting", "\x1b[2Jbad \xff byte"};
  const std::string out = "Welcome to gpu-02\n" + FormatRemoteAnswer(answer) + "bye\n";
  const auto parsed = ParseRemoteAnswer(out);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->state, RemoteState::kRunning);
  EXPECT_EQ(parsed->pid, 4242);
  ASSERT_EQ(parsed->log.size(), 2u);
  EXPECT_EQ(parsed->log[1].substr(0, 7), "\x1b[2Jbad");    // escaped where printed, not here
  EXPECT_FALSE(ParseRemoteAnswer("state: running 12\n"));  // an older ddprun's shell line
  EXPECT_FALSE(ParseRemoteAnswer("{\"ddprun_up\": not json\n"));
}

TEST(RemoteAnswerTest, EveryStateGoesAcrossAsItselfAndANewOneIsUnknown) {
  for (int k = 0; k < static_cast<int>(RemoteState::kUnknown); ++k) {
    RemoteAnswer answer;
    answer.state = static_cast<RemoteState>(k);
    const auto parsed = ParseRemoteAnswer(FormatRemoteAnswer(answer));
    ASSERT_TRUE(parsed) << k;
    EXPECT_EQ(parsed->state, answer.state) << RemoteStateName(answer.state);
    EXPECT_EQ(parsed->why, "");
  }
  EXPECT_EQ(RemoteStateName(RemoteState::kStillRunning), "still-running");
  const auto newer = ParseRemoteAnswer("{\"ddprun_up\": 1, \"state\": \"hibernating\", \"why\": \"zzz\"}\n");
  ASSERT_TRUE(newer);
  EXPECT_EQ(newer->state, RemoteState::kUnknown);
  EXPECT_EQ(newer->why,
            "the host's ddprun answered \"hibernating\", a state this ddprun does not know (zzz)");
  // "unknown" is this side's word, never a state a host can send to be taken as one.
  EXPECT_EQ(ParseRemoteAnswer("{\"ddprun_up\": 1, \"state\": \"unknown\"}\n")->why,
            "the host's ddprun answered \"unknown\", a state this ddprun does not know");
}

TEST(ControllerLinkTest, StopLineCarriesTheSignal) {
  EXPECT_EQ(StopRequestLine(SIGINT), "stop 2\n");
  EXPECT_EQ(ParseStopRequest(""), 0);
  EXPECT_EQ(ParseStopRequest("stop 1"), 0);  // incomplete
  EXPECT_EQ(ParseStopRequest("hello\nstop 15\n"), 15);
  EXPECT_EQ(ParseStopRequest("stop 0\nstop x\n"), 0);
}

}  // namespace
}  // namespace ddprun::io
