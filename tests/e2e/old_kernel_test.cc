// The kernels users have (Ubuntu 20.04: 5.4, Debian 11: 5.10, Rocky 8: 4.18) on this one:
// the real ddprun runs under strace, which makes the system calls those kernels lack fail as
// they fail there (close_range: ENOSYS before 5.9, EINVAL for CLOSE_RANGE_CLOEXEC before 5.11;
// pidfd_open: ENOSYS before 5.3). Before runner/io/kernel_compat.h, workers inherited the
// agent's sockets on all three, a hung warm template was waited for forever, and `ddprun down`
// called a running agent "not running".

#include <sys/stat.h>

#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// strace, following every process ddprun starts, failing `syscall` with `error`; only that call
// is stopped for (seccomp-bpf), so the rest runs at full speed.
std::vector<std::string> Kernel(const std::string& syscall, const std::string& error) {
  return {"strace",    "-f", "--seccomp-bpf",    "-qq", "-o",
          "/dev/null", "-e", "trace=" + syscall, "-e",  "inject=" + syscall + ":error=" + error};
}

/// A one-node job of `devices` ranks running `command` (a TOML array), on a free port.
TestJob OneNodeJob(const std::string& name, int devices, const std::string& command) {
  TestJob job;
  job.name = name;
  job.nnodes = 1;
  job.devices = devices;
  job.master_port = FreePort();
  job.command = command;
  job.rendezvous = "60s";
  return job;
}

struct OldKernel {
  std::string name;
  std::string syscall;
  std::string error;
  std::string preload;  // "" : cold workers
};

class OldKernelTest : public ::testing::TestWithParam<OldKernel> {
 protected:
  ScratchDir dir_;
};

// Every worker starts with stdin, stdout and stderr and nothing of the agent's (its listener,
// its connections, its pipes), cold (marked close-on-exec in the vfork child) or warm (in the
// template's child before exec, then the template's fork).
TEST_P(OldKernelTest, WorkersInheritNothingButStdio) {
  const OldKernel& kernel = GetParam();
  dir_.Write(
      "fds.py",
      "import os\n"
      "fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
      "print('rank', os.environ['RANK'], 'fds', fds[:-1], flush=True)\n");  // the last: the listing's own
  TestJob job = OneNodeJob("old-kernel", 2, "[\"/usr/bin/python3\", \"fds.py\"]");
  if (!kernel.preload.empty()) job.job_extra = "preload = [\"" + kernel.preload + "\"]\n";
  dir_.Write("job.toml", job.Toml());
  AgentProcess agent({dir_.path() + "/job.toml"}, dir_.path() + "/out", {},
                     Kernel(kernel.syscall, kernel.error));
  ASSERT_EQ(agent.Wait(90s), 0) << agent.Output();
  const std::string out = agent.Output();
  EXPECT_THAT(out, HasSubstr("[n0 r0] rank 0 fds [0, 1, 2]")) << out;
  EXPECT_THAT(out, HasSubstr("[n0 r1] rank 1 fds [0, 1, 2]")) << out;
  if (!kernel.preload.empty()) {
    EXPECT_THAT(out, HasSubstr("workers start warm")) << out;
  }
}

class OldKernelNoPidfdTest : public ::testing::TestWithParam<std::string> {
 protected:
  ScratchDir dir_;
};

INSTANTIATE_TEST_SUITE_P(Kernels, OldKernelTest,
                         ::testing::Values(OldKernel{"NoCloseRangeCold", "close_range", "ENOSYS", ""},
                                           OldKernel{"NoCloseRangeCloexecCold", "close_range", "EINVAL", ""},
                                           OldKernel{"NoCloseRangeWarm", "close_range", "ENOSYS", "json"},
                                           OldKernel{"NoCloseRangeCloexecWarm", "close_range", "EINVAL",
                                                     "json"}),
                         [](const ::testing::TestParamInfo<OldKernel>& param) { return param.param.name; });

// Without pidfd_open (kernels before 5.3) the agent waits for its workers by polling waitpid
// (Boost.Process needs a pidfd: the agent died with "assign: Bad file descriptor" at the first
// worker): a rank's exit code is read, the round fails, the others are stopped, the job
// restarts (warm too: the template is killed by pid) and succeeds.
TEST_P(OldKernelNoPidfdTest, ARoundFailsAndTheJobRestarts) {
  const std::string preload = GetParam();
  dir_.Write(
      "ex.py",
      "import os, sys, time\n"
      "print('rank', os.environ['RANK'], 'round', os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\n"
      "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
      "    if os.environ['RANK'] == '1':\n"
      "        sys.exit(3)\n"
      "    time.sleep(60)  # stopped by the agent\n");
  TestJob job = OneNodeJob("no-pidfd", 2, "[\"/usr/bin/python3\", \"ex.py\"]");
  if (!preload.empty()) job.job_extra = "preload = [\"" + preload + "\"]\n";
  job.max_restarts = 1;
  job.backoff = "0s";
  dir_.Write("job.toml", job.Toml());
  AgentProcess agent({dir_.path() + "/job.toml"}, dir_.path() + "/out", {}, Kernel("pidfd_open", "ENOSYS"));
  ASSERT_EQ(agent.Wait(90s), 0) << agent.Output();
  const std::string out = agent.Output();
  EXPECT_THAT(out, HasSubstr("rank 1 (node 0 (")) << out;
  EXPECT_THAT(out, HasSubstr("local rank 1) exited with code 3")) << out;
  EXPECT_THAT(out, HasSubstr("[n0 r0] rank 0 round 1")) << out;
  EXPECT_THAT(out, HasSubstr("job \"no-pidfd\" succeeded")) << out;
  if (!preload.empty()) {
    EXPECT_THAT(out, HasSubstr("round 1: 2 warm")) << out;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, OldKernelNoPidfdTest, ::testing::Values("", "json"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           return param.param.empty() ? std::string("Cold") : std::string("Warm");
                         });

// Without a pidfd the guardian's death is looked for at each lease renewal: a killed guardian
// is replaced and said, as with one (RunnerTest.AKilledGuardianIsReplaced...).
TEST(OldKernelGuardianTest, AKilledGuardianIsReplacedWithoutPidfd) {
  ScratchDir dir;
  TestJob job = OneNodeJob("no-pidfd-guardian", 1, "[\"/bin/sh\", \"-c\", \"echo started; exec sleep 60\"]");
  job.heartbeat = "500ms";
  dir.Write("job.toml", job.Toml());
  AgentProcess traced({dir.path() + "/job.toml"}, dir.path() + "/out", {}, Kernel("pidfd_open", "ENOSYS"));
  ASSERT_TRUE(WaitFor([&] { return traced.Output().find("[n0 r0] started") != std::string::npos; }, 30s))
      << traced.Output();
  const std::vector<pid_t> agents = ChildrenNamed(traced.pid(), "ddprun");  // strace's child
  ASSERT_EQ(agents.size(), 1u) << traced.Output();
  const std::vector<pid_t> guardians = ChildrenNamed(agents[0], "ddprun-guardian");
  ASSERT_EQ(guardians.size(), 1u) << traced.Output();
  ASSERT_EQ(::kill(guardians[0], SIGKILL), 0);
  const std::string said = "the guardian process (pid " + std::to_string(guardians[0]) +
                           ") killed by SIGKILL; started a new one (pid ";
  EXPECT_TRUE(WaitFor([&] { return traced.Output().find(said) != std::string::npos; }, 10s))
      << traced.Output();
  ::kill(agents[0], SIGTERM);
  EXPECT_TRUE(traced.Wait(30s).has_value());
}

// `ddprun down` on a host whose kernel has no pidfd stops the agent it recognised (by pid,
// right after recognising it again), instead of calling it "not running".
TEST(OldKernelDownTest, DownStopsARunningAgentWithoutPidfd) {
  ScratchDir dir;
  const std::string ssh =
      dir.Write("fake-ssh", "#!/bin/sh\nfor last; do :; done\nexec /bin/sh -c \"$last\"\n");
  ::chmod(ssh.c_str(), 0755);
  // The remote ddprun, as a host without pidfd runs it.
  std::string remote = "#!/bin/sh\nexec";
  for (const std::string& word : Kernel("pidfd_open", "ENOSYS")) remote += " '" + word + "'";
  remote += " '" + std::string(DDPRUN_BINARY) + "' \"$@\"\n";
  const std::string old_ddprun = dir.Write("old-kernel-ddprun", remote);
  ::chmod(old_ddprun.c_str(), 0755);
  const std::string job = dir.Write(
      "job.toml",
      "version = 1\n[job]\nname = \"oldk\"\ncommand = [\"/bin/sh\", \"-c\", \"echo worker $RANK; exec sleep "
      "300\"]\n[cluster]\nnodes = [\"127.0.0.1\"]\nmaster_addr = \"127.0.0.1\"\nmaster_port = " +
          std::to_string(FreePort()) +
          "\n[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = 1\n[timeouts]\nstop_grace = "
          "\"2s\"\n");
  const std::map<std::string, std::string> env = {{"DDPRUN_SSH_COMMAND", ssh}, {"DDPRUN_NODE_RANK", ""}};
  // `up` starts the agent with the plain binary (strace -f would wait for the detached agent);
  // `down` is the one that runs without pidfd.
  auto run = [&](const std::vector<std::string>& args, const std::string& name) {
    std::vector<std::string> full = args;
    full.insert(full.end(), {"--remote-ddprun", args[0] == "down" ? old_ddprun : std::string(DDPRUN_BINARY)});
    AgentProcess process(full, dir.path() + "/" + name, env);
    const auto code = process.Wait(60s);
    return std::make_pair(code.value_or(-1), process.Output());
  };
  auto [up_code, up] = run({"up", job, "--detach"}, "up");
  ASSERT_EQ(up_code, 0) << up;
  ASSERT_TRUE(
      WaitFor([&] { return dir.Read("logs/oldk/up-n0.console").find("worker 0") != std::string::npos; }, 30s))
      << dir.Read("logs/oldk/up-n0.console");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(up, m, std::regex("agent started, pid ([0-9]+)"))) << up;
  const pid_t agent = std::stoi(m[1]);
  auto [down_code, down] = run({"down", job}, "down");
  EXPECT_EQ(down_code, 0) << down;
  EXPECT_THAT(down, HasSubstr("127.0.0.1 (node 0): stopped (pid ")) << down;
  EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(agent); }, 10s));
  if (ProcessAlive(agent)) ::kill(agent, SIGKILL);
}

}  // namespace
}  // namespace ddprun::e2e
