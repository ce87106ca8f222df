// `ddprun up` through the real OpenSSH client and server on the multi-host test bed: jobs of 2
// and 3 hosts to the end, Ctrl-C and a killed `up` leaving no process on any host, and every
// kind of unready host (no ddprun, another version, refused, timeout, refused key, DNS) named
// before any agent starts. Keys and sshd configs live in the test's own folder. Needs root and
// /usr/sbin/sshd (else skipped, or failed under DDPRUN_REQUIRE_TESTBED=1, with the reason).

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"
#include "tests/e2e/testbed.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

constexpr int kMasterPort = 29500;

/// How one host's sshd is set up.
struct SshHost {
  bool started = true;         // false: nothing listens on port 22 (connection refused)
  bool ddprun_on_path = true;  // false: the session's PATH lacks ddprun
  std::string fake_version;    // not "": a `ddprun` on the PATH that says this version
  bool key_accepted = true;    // false: the client's key is not authorized
  bool drop_ssh = false;       // a firewall drops port 22 (connection timed out)
};

size_t Count(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++count;
  return count;
}

class UpTest : public ::testing::Test {
 protected:
  void MakeBed(std::vector<SshHost> hosts, bool shared_home = true) {
    if (::access("/usr/sbin/sshd", X_OK) != 0) {
      DDPRUN_REQUIRE_OR_SKIP("sshd", false,
                             "/usr/sbin/sshd is not installed (openssh-server, scripts/install-deps.sh)");
      return;
    }
    TestbedOptions options;
    options.hosts = static_cast<int>(hosts.size());
    options.tag = "up";
    options.shared_home = shared_home;
    std::string why;
    bed_ = Testbed::Create(options, &why);
    if (!bed_) {
      DDPRUN_REQUIRE_OR_SKIP("testbed", false, why);
      return;
    }
    std::filesystem::create_directories("/run/sshd");  // sshd's privilege separation folder
    const std::string keys = dir_.path();
    ASSERT_EQ(Shell("ssh-keygen -q -t ed25519 -N '' -f " + keys + "/host_key"), 0);
    ASSERT_EQ(Shell("ssh-keygen -q -t ed25519 -N '' -f " + keys + "/client_key"), 0);
    dir_.Write("authorized_keys", dir_.Read("client_key.pub"));
    dir_.Write("nobody_keys", "");
    dir_.Write(
        "ssh_config",
        "Host *\n  Port 22\n  User root\n  IdentityFile " + keys +
            "/client_key\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n");
    const std::string ddprun_dir = std::filesystem::path(DDPRUN_BINARY).parent_path().string();
    for (size_t i = 0; i < hosts.size(); ++i) {
      const SshHost& h = hosts[i];
      const std::string n = std::to_string(i);
      std::string path = "/usr/bin:/bin";
      if (!h.fake_version.empty()) {
        dir_.Write("fake" + n + "/ddprun", "#!/bin/sh\necho 'ddprun " + h.fake_version + "'\n");
        ::chmod((keys + "/fake" + n + "/ddprun").c_str(), 0755);
        path = keys + "/fake" + n + ":" + path;
      } else if (h.ddprun_on_path) {
        path = ddprun_dir + ":" + path;
      }
      dir_.Write("sshd_config" + n,
                 "Port 22\nListenAddress 0.0.0.0\nHostKey " + keys + "/host_key\nAuthorizedKeysFile " + keys +
                     (h.key_accepted ? "/authorized_keys" : "/nobody_keys") +
                     "\nPermitRootLogin yes\nStrictModes no\nUsePAM no\nPidFile " + keys + "/sshd" + n +
                     ".pid\nSetEnv PATH=" + path + " HOME=" + bed_->home() + "\n");
      if (h.drop_ssh) {
        ASSERT_TRUE(bed_->AddInputRule(static_cast<int>(i), "-p tcp --dport 22 -j DROP"));
      }
      if (!h.started) continue;
      std::string output;
      ASSERT_EQ(
          bed_->Run(static_cast<int>(i),
                    "/usr/sbin/sshd -f " + keys + "/sshd_config" + n + " -E " + keys + "/sshd" + n + ".log",
                    &output),
          0)
          << output;
      const pid_t sshd = WaitForPidFile(dir_, "sshd" + n + ".pid", 5s);
      ASSERT_GT(sshd, 0) << dir_.Read("sshd" + n + ".log");
      sshd_pids_.push_back(sshd);
    }
  }
  void TearDown() override {
    up_.reset();
    for (pid_t pid : sshd_pids_) ::kill(pid, SIGTERM);
    for (pid_t pid : sshd_pids_) WaitFor([&] { return !ProcessAlive(pid); }, 5s);
    bed_.reset();
  }
  std::string NodesByAddress(int count) const {
    std::string list;
    for (int i = 0; i < count; ++i) list += (list.empty() ? "\"" : ", \"") + bed_->host(i).data_addr + "\"";
    return list;
  }
  std::string JobText(const std::string& nodes, int num_nodes, const std::string& script) const {
    std::ostringstream t;
    t << "version = 1\n[job]\nname = \"up\"\ncommand = [\"/bin/sh\", \"-c\", " << TomlString(script) << "]\n"
      << "[cluster]\nnodes = [" << nodes << "]\nmaster_addr = \"" << bed_->host(0).data_addr << "\"\n"
      << "master_port = " << kMasterPort
      << "\n[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = " << num_nodes
      << "\n[timeouts]\nrendezvous = \"30s\"\nheartbeat = \"500ms\"\nstop_grace = \"3s\"\n";
    return t.str();
  }
  /// `ddprun up args...` on host 0, as a user there would type it, with the test's ssh config.
  AgentProcess& Up(const std::vector<std::string>& args) {
    up_ = std::make_unique<AgentProcess>(
        args, dir_.path() + "/up.out",
        std::map<std::string, std::string>{{"DDPRUN_SSH_COMMAND", "ssh -F " + dir_.path() + "/ssh_config"},
                                           {"DDPRUN_NODE_RANK", ""}},
        bed_->Prefix(0));
    return *up_;
  }
  /// Every process in host `i`'s network namespace but its sshd: what a job left behind.
  std::vector<pid_t> ProcessesOn(int i) const {
    std::string text;
    ShellOutput("ip netns pids " + bed_->host(i).netns, &text);
    std::vector<pid_t> pids;
    std::istringstream in(text);
    for (pid_t pid = 0; in >> pid;) {
      if (std::find(sshd_pids_.begin(), sshd_pids_.end(), pid) == sshd_pids_.end() && ProcessAlive(pid)) {
        pids.push_back(pid);
      }
    }
    return pids;
  }
  bool NothingLeftOnAnyHost() const {
    for (int i = 0; i < static_cast<int>(bed_->hosts().size()); ++i) {
      if (!ProcessesOn(i).empty()) return false;
    }
    return true;
  }
  std::string Leftovers() const {
    std::string out;
    for (int i = 0; i < static_cast<int>(bed_->hosts().size()); ++i) {
      for (pid_t pid : ProcessesOn(i)) {
        std::ifstream cmdline("/proc/" + std::to_string(pid) + "/cmdline");
        std::string text((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
        std::replace(text.begin(), text.end(), '\0', ' ');
        out += bed_->host(i).name + ": " + std::to_string(pid) + " " + text + "\n";
      }
    }
    return out;
  }
  /// Runs a job of `hosts` hosts to the end and checks that each rank ran on its own host.
  void RunToTheEnd(int hosts) {
    MakeBed(std::vector<SshHost>(static_cast<size_t>(hosts)));
    if (!bed_) return;
    const std::string job = bed_->Write(
        "job.toml", JobText(NodesByAddress(hosts), hosts,
                            "echo \"rank $RANK on $(hostname)\"; touch ran-$RANK-on-$(hostname)"));
    AgentProcess& up = Up({"up", job});
    ASSERT_EQ(up.Wait(120s), 0) << up.Output();
    const std::string out = up.Output();
    for (int i = 0; i < hosts; ++i) {
      const TestHost& h = bed_->host(i);
      SCOPED_TRACE(h.name);
      // Each line carries its host's prefix; the rank ran on the host of its node rank.
      EXPECT_THAT(out, HasSubstr(h.data_addr + " | [n" + std::to_string(i) + " r" + std::to_string(i) +
                                 "] rank " + std::to_string(i) + " on " + h.name));
      EXPECT_TRUE(std::filesystem::exists(bed_->HomeOf(0) + "/ran-" + std::to_string(i) + "-on-" + h.name));
    }
    // The coordinator's word to `up` that the job started is not shown (up_local_test.cc).
    EXPECT_THAT(out, Not(HasSubstr("job-started")));
    // The job's summary once, from node 0; every other node adds only its log folder.
    EXPECT_EQ(Count(out, "job \"up\" succeeded"), 1u) << out;
    EXPECT_EQ(Count(out, " | " + std::string(72, '=') + "\n"), 2u) << out;
    EXPECT_TRUE(WaitFor([&] { return NothingLeftOnAnyHost(); }, 10s)) << Leftovers();
  }

  ScratchDir dir_;  // keys, ssh configs, sshd logs, up's output
  std::unique_ptr<Testbed> bed_;
  std::vector<pid_t> sshd_pids_;
  std::unique_ptr<AgentProcess> up_;
};

TEST_F(UpTest, TwoHostJobRunsToTheEndFromOneMachine) { RunToTheEnd(2); }

TEST_F(UpTest, ThreeHostJobRunsToTheEndFromOneMachine) { RunToTheEnd(3); }

// Ctrl-C at `up` mid-round: every agent is asked to stop as if it had got SIGINT itself, the
// job's summary says so, `up` exits 130, and no process (agent, worker, ssh session) is left on
// any host.
TEST_F(UpTest, CtrlCMidRoundLeavesNoProcessOnAnyHost) {
  MakeBed(std::vector<SshHost>(3));
  if (!bed_) return;
  const std::string job = bed_->Write(
      "job.toml",
      JobText(NodesByAddress(3), 3, "echo $$ > worker-$RANK.pid; echo started $RANK; exec sleep 300"));
  AgentProcess& up = Up({"up", job});
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int r = 0; r < 3; ++r) {
          if (bed_->Read(0, "worker-" + std::to_string(r) + ".pid").empty()) return false;
        }
        return true;
      },
      60s))
      << up.Output();
  std::vector<pid_t> workers;
  for (int r = 0; r < 3; ++r)
    workers.push_back(std::stoi(bed_->Read(0, "worker-" + std::to_string(r) + ".pid")));
  for (pid_t pid : workers) ASSERT_TRUE(ProcessAlive(pid));
  ASSERT_FALSE(NothingLeftOnAnyHost());  // the check below can see a process that runs
  up.Signal(SIGINT);
  ASSERT_EQ(up.Wait(30s), 130) << up.Output();
  for (pid_t pid : workers) EXPECT_FALSE(ProcessAlive(pid)) << pid;
  EXPECT_TRUE(WaitFor([&] { return NothingLeftOnAnyHost(); }, 10s)) << Leftovers();
  EXPECT_THAT(up.Output(), HasSubstr("received SIGINT; stopping the job on every node"));
  EXPECT_EQ(Count(up.Output(), "job \"up\" interrupted"), 1u) << up.Output();
}

// `up` killed outright (its terminal or its machine gone): the ssh clients lose their input,
// each agent reads end of file on its link and stops the job; nothing is left anywhere.
TEST_F(UpTest, KilledUpStopsEveryNode) {
  MakeBed(std::vector<SshHost>(2));
  if (!bed_) return;
  const std::string job =
      bed_->Write("job.toml", JobText(NodesByAddress(2), 2, "echo $$ > worker-$RANK.pid; exec sleep 300"));
  AgentProcess& up = Up({"up", job});
  ASSERT_TRUE(WaitFor(
      [&] { return !bed_->Read(0, "worker-1.pid").empty() && !bed_->Read(0, "worker-0.pid").empty(); }, 60s))
      << up.Output();
  up.Signal(SIGKILL);
  ASSERT_EQ(up.Wait(5s), 128 + SIGKILL);
  // stop_grace is 3 s; the agents notice at once.
  EXPECT_TRUE(WaitFor([&] { return NothingLeftOnAnyHost(); }, 15s)) << Leftovers();
}

// Every way a host can be unready, named with its fix within seconds, and no agent started.
TEST_F(UpTest, UnreadyHostsAreNamedBeforeAnyAgentStarts) {
  std::vector<SshHost> hosts(6);
  hosts[1].ddprun_on_path = false;
  hosts[2].fake_version = "0.0.9";
  hosts[3].started = false;
  hosts[4].drop_ssh = true;
  hosts[5].key_accepted = false;
  MakeBed(hosts);
  if (!bed_) return;
  const std::string job = bed_->Write(
      "job.toml", JobText(NodesByAddress(6) + ", \"no-such-host.invalid\"", 7, "echo should-not-run"));
  const auto started = std::chrono::steady_clock::now();
  AgentProcess& up = Up({"up", job, "--connect-timeout", "2"});
  ASSERT_EQ(up.Wait(30s), 3) << up.Output();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 15s);
  const std::string out = up.Output();
  auto addr = [&](int i) { return bed_->host(i).data_addr; };
  EXPECT_THAT(out, HasSubstr(addr(1) + " (node 1): no `ddprun` on the remote PATH"));
  EXPECT_THAT(out, HasSubstr("pass `--remote-ddprun /path/to/ddprun`"));
  EXPECT_THAT(out, HasSubstr(addr(2) + " (node 2): it runs ddprun 0.0.9, this machine runs ddprun "));
  EXPECT_THAT(out, HasSubstr(addr(3) + " (node 3): connection refused: no ssh server listens on port 22"));
  EXPECT_THAT(out, HasSubstr(addr(4) + " (node 4): connection timed out (2 s)"));
  EXPECT_THAT(out, HasSubstr(addr(5) + " (node 5): authentication failed"));
  EXPECT_THAT(out, HasSubstr("hint: `ssh-copy-id " + addr(5) + "`"));
  EXPECT_THAT(out, HasSubstr("no-such-host.invalid (node 6): ssh cannot resolve the host name (DNS)"));
  EXPECT_THAT(out, HasSubstr("6 of 7 hosts are not ready; no agent was started"));
  EXPECT_THAT(out, Not(HasSubstr(addr(0) + " (node 0)")));
  EXPECT_THAT(out, Not(HasSubstr("should-not-run")));
  EXPECT_TRUE(NothingLeftOnAnyHost()) << Leftovers();
}

// Hosts with folders of their own: the job file only here is named as missing there; with
// --copy it is copied to the same path and the job runs; --remote-ddprun finds a ddprun that
// is not on the remote PATH.
TEST_F(UpTest, CopyPutsTheJobFileOnHostsWithoutASharedFolder) {
  std::vector<SshHost> hosts(2);
  for (SshHost& h : hosts) h.ddprun_on_path = false;
  MakeBed(hosts, /*shared_home=*/false);
  if (!bed_) return;
  const std::string name = "job.toml";
  { std::ofstream(bed_->HomeOf(0) + "/" + name) << JobText(NodesByAddress(2), 2, "echo copied-job $RANK"); }
  const std::string job = bed_->home() + "/" + name;
  AgentProcess& missing = Up({"up", job, "--remote-ddprun", DDPRUN_BINARY});
  ASSERT_EQ(missing.Wait(30s), 3) << missing.Output();
  EXPECT_THAT(missing.Output(),
              HasSubstr(bed_->host(1).data_addr + " (node 1): the job file is not at " + job + " there"));
  EXPECT_THAT(missing.Output(), HasSubstr("or pass --copy to copy it there"));
  EXPECT_THAT(missing.Output(), Not(HasSubstr("(node 0)")));

  AgentProcess& copied = Up({"up", job, "--copy", "--remote-ddprun", DDPRUN_BINARY});
  ASSERT_EQ(copied.Wait(60s), 0) << copied.Output();
  EXPECT_THAT(copied.Output(), HasSubstr(bed_->host(1).data_addr + " | [n1 r1] copied-job 1"));
  EXPECT_EQ(bed_->Read(1, name), bed_->Read(0, name));
}

// `up --detach` returns with the agents running on under setsid + nohup; `status` finds them
// by their pid files and `down` stops the job, leaving nothing on any host.
TEST_F(UpTest, DetachStatusAndDownFindTheAgentsAgain) {
  MakeBed(std::vector<SshHost>(2));
  if (!bed_) return;
  const std::string job =
      bed_->Write("job.toml", JobText(NodesByAddress(2), 2, "echo $$ > worker-$RANK.pid; exec sleep 300"));
  AgentProcess& up = Up({"up", job, "--detach"});
  ASSERT_EQ(up.Wait(30s), 0) << up.Output();
  EXPECT_THAT(up.Output(), HasSubstr(bed_->host(1).data_addr + " (node 1): agent started, pid "));
  ASSERT_TRUE(WaitFor(
      [&] { return !bed_->Read(0, "worker-1.pid").empty() && !bed_->Read(0, "worker-0.pid").empty(); }, 60s))
      << bed_->Read(0, "logs/up/up-n0.console") << bed_->Read(0, "logs/up/up-n1.console");
  const pid_t worker = std::stoi(bed_->Read(0, "worker-1.pid"));
  EXPECT_TRUE(ProcessAlive(worker));

  AgentProcess& status = Up({"status", job});
  ASSERT_EQ(status.Wait(30s), 0) << status.Output();
  EXPECT_THAT(status.Output(), HasSubstr(bed_->host(0).data_addr + " (node 0): running, pid "));
  EXPECT_THAT(status.Output(), HasSubstr(bed_->host(1).data_addr + " (node 1): running, pid "));
  EXPECT_THAT(status.Output(), HasSubstr("round 0: starting 1 worker"));

  AgentProcess& down = Up({"down", job});
  ASSERT_EQ(down.Wait(30s), 0) << down.Output();
  EXPECT_THAT(down.Output(), HasSubstr(bed_->host(0).data_addr + " (node 0): "));
  EXPECT_THAT(down.Output(), HasSubstr(bed_->host(1).data_addr + " (node 1): "));
  EXPECT_THAT(down.Output(), Not(HasSubstr("still running")));
  EXPECT_FALSE(ProcessAlive(worker));
  EXPECT_TRUE(WaitFor([&] { return NothingLeftOnAnyHost(); }, 10s)) << Leftovers();

  AgentProcess& after = Up({"status", job});
  ASSERT_EQ(after.Wait(30s), 1) << after.Output();
  EXPECT_THAT(after.Output(), HasSubstr(bed_->host(0).data_addr + " (node 0): not running (pid "));
  EXPECT_THAT(bed_->Read(0, "logs/up/up-n0.console"), HasSubstr("received SIGTERM"));
}

// `up --install` (issue 41.4): a host without ddprun and one with an older ddprun get this one
// in ~/.ddprun/<version>-<hash> over the same ssh, the job runs there from the copies, and the
// next `up` finds them without copying. A home others can write is refused before anything is
// copied or run there.
TEST_F(UpTest, InstallBringsThisDdprunToHostsWithoutItOrWithAnOlderOne) {
  std::vector<SshHost> hosts(3);
  hosts[1].ddprun_on_path = false;
  hosts[2].fake_version = "0.0.9";
  MakeBed(hosts, /*shared_home=*/false);
  if (!bed_) return;
  const std::string job = bed_->home() + "/job.toml";
  {
    std::ofstream(bed_->HomeOf(0) + "/job.toml")
        << JobText(NodesByAddress(3), 3, "echo \"rank $RANK runs under $(readlink /proc/$PPID/exe)\"");
  }
  AgentProcess& without = Up({"up", job, "--copy"});
  ASSERT_EQ(without.Wait(30s), 3) << without.Output();
  std::smatch id;
  const std::string refused = without.Output();
  ASSERT_TRUE(
      std::regex_search(refused, id, std::regex("no copy of this one in ~/\\.ddprun/([0-9.]+-[0-9a-f]{12})")))
      << refused;
  EXPECT_THAT(refused, HasSubstr(bed_->host(1).data_addr + " (node 1): no `ddprun` on the remote PATH"));
  EXPECT_THAT(refused, HasSubstr("hint: `ddprun up --install` copies this one there"));
  EXPECT_THAT(refused, HasSubstr(bed_->host(2).data_addr + " (node 2): it runs ddprun 0.0.9"));
  const std::string copy_id = id[1];

  // Host 1's ~/.ddprun can be written by its group: refused there (host 2 gets its copy, as
  // installs run at once), and no agent starts.
  std::filesystem::create_directories(bed_->HomeOf(1) + "/.ddprun");
  ::chmod((bed_->HomeOf(1) + "/.ddprun").c_str(), 0775);
  const std::string copy = bed_->home() + "/.ddprun/" + copy_id;
  AgentProcess& shared = Up({"up", job, "--copy", "--install"});
  ASSERT_EQ(shared.Wait(120s), 3) << shared.Output();
  EXPECT_THAT(shared.Output(), HasSubstr("into ~/.ddprun/" + copy_id + " on 2 hosts"));
  EXPECT_THAT(shared.Output(), HasSubstr(bed_->host(1).data_addr + " (node 1): cannot install this ddprun: " +
                                         bed_->home() + "/.ddprun can be written by other users"));
  EXPECT_THAT(shared.Output(), HasSubstr(bed_->host(2).data_addr + " (node 2): installed in " + copy));
  EXPECT_THAT(shared.Output(), HasSubstr("no agent was started"));
  EXPECT_THAT(shared.Output(), Not(HasSubstr("rank 0 runs")));
  ::chmod((bed_->HomeOf(1) + "/.ddprun").c_str(), 0755);

  AgentProcess& install = Up({"up", job, "--copy", "--install"});
  ASSERT_EQ(install.Wait(120s), 0) << install.Output();
  const std::string out = install.Output();
  EXPECT_THAT(out, HasSubstr("into ~/.ddprun/" + copy_id + " on 1 host\n"));
  EXPECT_THAT(out, HasSubstr(bed_->host(1).data_addr + " (node 1): installed in " + copy));
  // Node 0 runs its own ddprun (on its PATH, this version); nodes 1 and 2 the copy.
  const std::string binary = std::filesystem::canonical(DDPRUN_BINARY).string();
  EXPECT_THAT(out, HasSubstr("rank 0 runs under " + binary));
  EXPECT_THAT(out, HasSubstr("rank 1 runs under " + copy + "/bin/ddprun"));
  EXPECT_THAT(out, HasSubstr("rank 2 runs under " + copy + "/bin/ddprun"));
  EXPECT_FALSE(std::filesystem::exists(bed_->HomeOf(0) + "/.ddprun/" + copy_id));
  for (int i : {1, 2}) {
    const std::string there = bed_->HomeOf(i) + "/.ddprun/" + copy_id + "/bin/ddprun";
    EXPECT_EQ(std::filesystem::file_size(there), std::filesystem::file_size(binary)) << there;
  }

  // The next `up`, with or without --install, runs the copies and copies nothing.
  AgentProcess& again = Up({"up", job, "--install"});
  ASSERT_EQ(again.Wait(120s), 0) << again.Output();
  EXPECT_THAT(again.Output(), Not(HasSubstr("installing")));
  EXPECT_THAT(again.Output(), HasSubstr("rank 2 runs under " + copy + "/bin/ddprun"));
  AgentProcess& plain = Up({"up", job});
  ASSERT_EQ(plain.Wait(120s), 0) << plain.Output();
  EXPECT_THAT(plain.Output(), HasSubstr("rank 1 runs under " + copy + "/bin/ddprun"));
  EXPECT_TRUE(WaitFor([&] { return NothingLeftOnAnyHost(); }, 10s)) << Leftovers();

  // Detached, `status` and `down` find the agents through the copies too.
  const std::string held =
      bed_->Write("held.toml", JobText(NodesByAddress(3), 3, "echo $$ > w-$RANK.pid; exec sleep 300"));
  AgentProcess& detached = Up({"up", held, "--detach"});
  ASSERT_EQ(detached.Wait(30s), 0) << detached.Output();
  ASSERT_TRUE(
      WaitFor([&] { return !bed_->Read(1, "w-1.pid").empty() && !bed_->Read(2, "w-2.pid").empty(); }, 60s));
  AgentProcess& status = Up({"status", held});
  ASSERT_EQ(status.Wait(30s), 0) << status.Output();
  EXPECT_THAT(status.Output(), HasSubstr(bed_->host(1).data_addr + " (node 1): running, pid "));
  AgentProcess& down = Up({"down", held});
  ASSERT_EQ(down.Wait(30s), 0) << down.Output();
  // Each agent answered (node 0's stop may end the others first): none unknown or left running.
  EXPECT_THAT(down.Output(), HasSubstr(bed_->host(2).data_addr + " (node 2): "));
  EXPECT_THAT(down.Output(), Not(HasSubstr("unknown")));
  EXPECT_THAT(down.Output(), Not(HasSubstr("still running")));
  EXPECT_TRUE(WaitFor([&] { return NothingLeftOnAnyHost(); }, 10s)) << Leftovers();
}

}  // namespace
}  // namespace ddprun::e2e
