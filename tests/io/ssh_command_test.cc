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
  agent.remote_ddprun = "/opt/dd prun/ddprun";
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
            "command -v ddprun >/dev/null 2>&1 || exit 127; ddprun --version || exit 126; if test -r "
            "/j/job.toml; then echo job-file-found; else echo job-file-missing; fi");
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
  EXPECT_EQ(host_key.fix, "hint: `ssh gpu-02` once by hand and accept the key, or add it to known_hosts");
  EXPECT_EQ(Read(255, "", "ssh: connect to host gpu-02 port 22: No route to host\n").what,
            "no route to the host: ssh: connect to host gpu-02 port 22: No route to host");
  EXPECT_EQ(Read(-1, "", "").what, "no answer within 15 s");
  EXPECT_EQ(Read(255, "", "banner\nkex_exchange_identification: read: Connection reset by peer\n").what,
            "ssh failed: kex_exchange_identification: read: Connection reset by peer");
  EXPECT_EQ(Read(1, "", "Segmentation fault\n").what, "`ddprun --version` failed there (exit 1): Segmentation fault");
  EXPECT_EQ(Read(0, "ddprun 1.2.3\njob-file-missing\n", "").what, "the job file is not at /j/job.toml there");
}

TEST(CopyCommandTest, WritesATemporaryFileThenRenames) {
  EXPECT_EQ(CopyCommand("/j/job.toml", 3),
            "mkdir -p /j && cat > /j/job.toml.ddprun-up-3.tmp && mv -f /j/job.toml.ddprun-up-3.tmp /j/job.toml");
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
