// `ddprun up --detach`, `status` and `down` through a local stand-in for ssh
// (DDPRUN_SSH_COMMAND runs the remote line here), against what a hostile or stale logs folder
// holds: a pid file naming someone else's process, pid 1 or -1, links planted under the pid and
// console names, escape sequences in the console. Each was an attack on 56e208f (issue 36):
// `down` killed the named process, `-1` became `kill -TERM -1`, the links' targets were
// overwritten. The real-sshd versions are in up_test.cc.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runner/io/detached_agent.h"
#include "runner/io/process_tree.h"
#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

class UpLocalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The stand-in: whatever options and host it is given, it runs the remote line here.
    const std::string ssh =
        dir_.Write("fake-ssh", "#!/bin/sh\nfor last; do :; done\nexec /bin/sh -c \"$last\"\n");
    ::chmod(ssh.c_str(), 0755);
    env_ = {{"DDPRUN_SSH_COMMAND", ssh}, {"DDPRUN_NODE_RANK", ""}};
    job_ = dir_.Write("job.toml",
                      "version = 1\n[job]\nname = \"loc\"\ncommand = [\"/bin/sh\", \"-c\", "
                      "\"echo worker $RANK; exec sleep 300\"]\n"
                      "[cluster]\nnodes = [\"127.0.0.1\"]\nmaster_addr = \"127.0.0.1\"\nmaster_port = " +
                          std::to_string(FreePort()) +
                          "\n[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = 1\n"
                          "[timeouts]\nstop_grace = \"2s\"\nheartbeat = \"500ms\"\n");
    state_ = dir_.path() + "/logs/loc";
  }
  void TearDown() override {
    for (pid_t pid : victims_) ::kill(pid, SIGKILL);
  }
  /// `ddprun args...` with the stand-in, to its end.
  std::pair<int, std::string> Run(std::vector<std::string> args,
                                  const std::vector<std::string>& prefix = {}) {
    args.push_back("--remote-ddprun");
    args.push_back(DDPRUN_BINARY);
    AgentProcess process(args, dir_.path() + "/out-" + std::to_string(++runs_), env_, prefix);
    const auto code = process.Wait(60s);
    return {code.value_or(-1), process.Output()};
  }
  /// An unrelated process of this user, as `sleep 300` started by hand would be.
  pid_t Victim() {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setsid();
      ::execl("/bin/sleep", "sleep", "300", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    victims_.push_back(pid);
    EXPECT_TRUE(WaitFor(
        [&] { return fs::read_symlink("/proc/" + std::to_string(pid) + "/exe").filename() == "sleep"; }, 5s));
    return pid;
  }
  /// A pid file as an attacker who read /proc would write it: the victim's true start time and
  /// boot, a token of their choosing.
  void PlantPidFile(const std::string& text) {
    fs::create_directories(state_);
    std::ofstream(state_ + "/up-n0.pid") << text;
  }
  std::string Forged(pid_t pid) {
    io::ProcessEntry entry;
    EXPECT_TRUE(io::ReadProcessEntry(pid, entry));
    io::AgentIdentity identity{pid, entry.start_time, io::BootId(), std::string(32, '7')};
    return io::FormatIdentity(identity);
  }

  ScratchDir dir_;
  std::map<std::string, std::string> env_;
  std::string job_, state_;
  std::vector<pid_t> victims_;
  int runs_ = 0;
};

TEST_F(UpLocalTest, ADetachedJobIsStartedFoundAndStoppedByDdprunOnTheHost) {
  auto [up_code, up] = Run({"up", job_, "--detach"});
  ASSERT_EQ(up_code, 0) << up;
  EXPECT_THAT(up, HasSubstr("127.0.0.1 (node 0): agent started, pid "));
  ASSERT_TRUE(
      WaitFor([&] { return dir_.Read("logs/loc/up-n0.console").find("worker 0") != std::string::npos; }, 30s))
      << dir_.Read("logs/loc/up-n0.console");
  auto [status_code, status] = Run({"status", job_});
  EXPECT_EQ(status_code, 0) << status;
  EXPECT_THAT(status, HasSubstr("127.0.0.1 (node 0): running, pid "));

  auto [down_code, down] = Run({"down", job_});
  EXPECT_EQ(down_code, 0) << down;
  EXPECT_THAT(down, HasSubstr("127.0.0.1 (node 0): stopped (pid "));
  auto [after_code, after] = Run({"status", job_});
  EXPECT_EQ(after_code, 1) << after;
  EXPECT_THAT(after, HasSubstr("127.0.0.1 (node 0): not running (pid "));
  EXPECT_THAT(after, HasSubstr(" has exited)"));

  // Whatever the console holds (here raw escape sequences, as a worker or another user could
  // leave) reaches the terminal escaped: no raw ESC or BEL in what `status` prints.
  std::ofstream(state_ + "/up-n0.console", std::ios::app) << "\x1b]0;pwned\x07\x1b[2J\n";
  auto [escaped_code, escaped] = Run({"status", job_});
  EXPECT_EQ(escaped_code, 1) << escaped;
  EXPECT_THAT(escaped, HasSubstr("pwned"));
  EXPECT_THAT(escaped, Not(HasSubstr("\x1b")));
  EXPECT_THAT(escaped, Not(HasSubstr("\x07")));
}

// On 56e208f `down` sent SIGTERM to the planted pid while `status` called it "not running".
TEST_F(UpLocalTest, DownNeverSignalsAProcessThatAPlantedPidFileNames) {
  const pid_t victim = Victim();
  PlantPidFile(Forged(victim));
  auto [status_code, status] = Run({"status", job_});
  EXPECT_EQ(status_code, 1) << status;
  EXPECT_THAT(status, HasSubstr("its pid file names a process that is not the agent"));
  auto [down_code, down] = Run({"down", job_});
  EXPECT_EQ(down_code, 1) << down;
  EXPECT_THAT(down,
              HasSubstr("127.0.0.1 (node 0): not stopped: its pid file names a process that is not the agent "
                        "`ddprun up --detach` started (pid " +
                        std::to_string(victim) +
                        " does not carry the launch token of the agent that was started); nothing was "
                        "signalled"));
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(ProcessAlive(victim));

  // The old format, a bare pid, proves nothing either.
  PlantPidFile(std::to_string(victim) + "\n");
  auto [old_code, old] = Run({"down", job_});
  EXPECT_EQ(old_code, 1) << old;
  EXPECT_THAT(old, HasSubstr("not a pid file written by `ddprun up --detach`; nothing was signalled"));
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(ProcessAlive(victim));
}

// A host whose ddprun is newer may answer with a state this one does not know. On f43d758
// `status` called it "never started" and `down` "still running after SIGTERM": each guessed.
TEST_F(UpLocalTest, AStateThisDdprunDoesNotKnowIsSaidToBeUnknownNotGuessed) {
  const std::string newer = dir_.Write(
      "newer-ssh",
      "#!/bin/sh\necho 'Welcome'\necho '{\"ddprun_up\": 1, \"state\": \"hibernating\", \"pid\": 77}'\n");
  ::chmod(newer.c_str(), 0755);
  env_["DDPRUN_SSH_COMMAND"] = newer;
  auto [status_code, status] = Run({"status", job_});
  EXPECT_EQ(status_code, 1) << status;
  EXPECT_THAT(status,
              HasSubstr("127.0.0.1 (node 0): unknown: the host's ddprun answered \"hibernating\", a state "
                        "this ddprun does not know"));
  EXPECT_THAT(status, Not(HasSubstr("never started")));
  auto [down_code, down] = Run({"down", job_});
  EXPECT_EQ(down_code, 1) << down;
  EXPECT_THAT(down, HasSubstr("127.0.0.1 (node 0): unknown: the host's ddprun answered \"hibernating\""));
  EXPECT_THAT(down, Not(HasSubstr("still running")));
}

// On 56e208f a pid file holding -1 became `kill -TERM -1` (every process of the user; of the
// host as root) and 1 signalled init. Run inside a PID namespace where the test can make one,
// so that even a regression harms nothing outside it.
TEST_F(UpLocalTest, PidOneZeroAndMinusOneAreNeverSignalled) {
  std::vector<std::string> prefix;
  if (::geteuid() == 0 && ::access("/usr/bin/unshare", X_OK) == 0) {
    prefix = {"/usr/bin/unshare", "--pid", "--fork", "--mount-proc"};
  }
  const pid_t victim = Victim();
  for (const char* pid : {"-1", "0", "1"}) {
    SCOPED_TRACE(pid);
    PlantPidFile(std::string("{\"pid\": ") + pid + ", \"start_ticks\": 1, \"boot_id\": \"" + io::BootId() +
                 "\", \"token\": \"" + std::string(32, '7') + "\"}\n");
    auto [code, out] = Run({"down", job_}, prefix);
    EXPECT_EQ(code, 1) << out;
    EXPECT_THAT(out, HasSubstr("which no ddprun agent has"));
    EXPECT_THAT(out, HasSubstr("nothing was signalled"));
  }
  EXPECT_TRUE(ProcessAlive(victim));
}

// On 56e208f the shell's redirections wrote the pid into the planted pid link's target and the
// agent's whole console into the console link's.
TEST_F(UpLocalTest, LinksPlantedUnderThePidAndConsoleNamesAreReplacedNotWrittenThrough) {
  fs::create_directories(state_);
  const std::string pid_target = dir_.Write("victim-pid", "precious\n");
  const std::string console_target = dir_.Write("victim-console", "precious\n");
  fs::create_symlink(pid_target, state_ + "/up-n0.pid");
  fs::create_symlink(console_target, state_ + "/up-n0.console");
  auto [up_code, up] = Run({"up", job_, "--detach"});
  ASSERT_EQ(up_code, 0) << up;
  ASSERT_TRUE(WaitFor(
      [&] { return dir_.Read("logs/loc/up-n0.console").find("worker 0") != std::string::npos; }, 30s));
  EXPECT_EQ(dir_.Read("victim-pid"), "precious\n");
  EXPECT_EQ(dir_.Read("victim-console"), "precious\n");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(state_ + "/up-n0.pid")));
  auto [down_code, down] = Run({"down", job_});
  EXPECT_EQ(down_code, 0) << down;
  EXPECT_THAT(down, HasSubstr("stopped (pid "));
}

// Issue 39.2: an agent that exits before the job's first round (2 or 3) used to leave the
// others waiting for it until timeouts.rendezvous (here 60 s); `up` now stops them at once and
// ends with that agent's code and reason. Once a round started, an agent's exit is the job's to
// judge (a spare may take its place), and `up` lets the job go on.
class UpEarlyExitTest : public UpLocalTest {
 protected:
  /// Stands in for ddprun on the hosts: node ranks with a file `fail-after-start-K` say the job
  /// started (the line `up` reads) and exit 3; the others run ddprun, its stdout copied into
  /// agent-K.out.
  std::string WrapperPath() {
    const std::string path =
        dir_.Write("ddprun-wrapper",
                   "#!/bin/bash\nreal=" + std::string(DDPRUN_BINARY) + "\ndir=" + dir_.path() +
                       "\nif [ \"$1\" != run ]; then exec \"$real\" \"$@\"; fi\n"
                       "rank=; prev=; for a; do [ \"$prev\" = --node-rank ] && rank=$a; prev=$a; done\n"
                       "if [ -e \"$dir/fail-after-start-$rank\" ]; then printf '\\036ddprun-up: "
                       "job-started\\n'; sleep 1; "
                       "echo 'ddprun: error: made up for the test' >&2; exit 3; fi\n"
                       "exec > >(tee -a \"$dir/agent-$rank.out\")\nexec \"$real\" \"$@\"\n");
    ::chmod(path.c_str(), 0755);
    return path;
  }
  std::string TwoNodeJob(uint16_t port, const std::string& rendezvous) {
    return dir_.Write(
        "two.toml",
        "version = 1\n[job]\nname = \"two\"\ncommand = [\"/bin/sh\", \"-c\", \"exec sleep 300\"]\n"
        "[cluster]\nnodes = [\"127.0.0.1\", \"127.0.0.2\"]\nmaster_addr = \"127.0.0.1\"\n"
        "master_port = " +
            std::to_string(port) +
            "\n[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = 2\n"
            "[timeouts]\nrendezvous = \"" +
            rendezvous + "\"\nstop_grace = \"2s\"\nheartbeat = \"500ms\"\n");
  }
  std::pair<int, std::string> Up(const std::string& job) {
    AgentProcess process({"up", job, "--remote-ddprun", WrapperPath()},
                         dir_.path() + "/up-" + std::to_string(++runs_), env_);
    const auto code = process.Wait(60s);
    return {code.value_or(-1), process.Output()};
  }
};

TEST_F(UpEarlyExitTest, AnAgentThatCannotStartEndsTheOthersAtOnceWithItsReason) {
  // Node 0's master port is taken on its host: its agent cannot listen and exits 3.
  const int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(holder, 1), 0);
  socklen_t length = sizeof address;
  ::getsockname(holder, reinterpret_cast<sockaddr*>(&address), &length);
  const std::string job = TwoNodeJob(ntohs(address.sin_port), "60s");
  const auto started = std::chrono::steady_clock::now();
  auto [code, out] = Up(job);
  const auto took = std::chrono::steady_clock::now() - started;
  ::close(holder);
  EXPECT_EQ(code, 3) << out;
  EXPECT_LT(took, 20s) << out;  // not the 60 s rendezvous timeout
  EXPECT_THAT(out,
              HasSubstr("ddprun up: 127.0.0.1 (node 0) exited 3 before the job started; stopping the other "
                        "agents\n"));
  EXPECT_THAT(out,
              HasSubstr("ddprun up: the job did not start: 127.0.0.1 (node 0) exited 3: ddprun cannot start "
                        "node 0's coordinator: "));
  // Node 1 had joined and waited; it was asked to stop.
  EXPECT_THAT(out, HasSubstr("127.0.0.2 | [ddprun "));
  EXPECT_THAT(out, HasSubstr("n1] warning: received SIGTERM; stopping the job on every node"));
}

TEST_F(UpEarlyExitTest, OnceTheJobStartedAnAgentsExitIsLeftToTheJob) {
  dir_.Write("fail-after-start-1", "");
  const std::string job = TwoNodeJob(FreePort(), "5s");
  auto [code, out] = Up(job);
  EXPECT_EQ(code, 3) << out;
  EXPECT_THAT(out, Not(HasSubstr("stopping the other agents")));
  EXPECT_THAT(out, Not(HasSubstr("job-started")));   // the line for `up` is not shown
  EXPECT_THAT(out, HasSubstr("rendezvous failed"));  // node 0 waited for node 1 as the job says
}

// A real agent that runs the coordinator says when the first round started, once, on stdout.
TEST_F(UpEarlyExitTest, TheCoordinatorsAgentSaysWhenTheFirstRoundStarted) {
  const std::string job = dir_.Write("one.toml",
                                     "version = 1\n[job]\nname = \"one\"\ncommand = [\"true\"]\n"
                                     "[cluster]\nnodes = [\"127.0.0.1\"]\nmaster_port = " +
                                         std::to_string(FreePort()) + "\n[restart]\nmax_restarts = 0\n");
  auto [code, out] = Up(job);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("job-started")));
  const std::string agent = dir_.Read("agent-0.out");
  EXPECT_EQ(std::count(agent.begin(), agent.end(), '\x1e'), 1) << agent;
  EXPECT_THAT(agent, HasSubstr("\x1e"
                               "ddprun-up: job-started\n"));
}

}  // namespace
}  // namespace ddprun::e2e
