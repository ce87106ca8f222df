// `srun ddprun job.toml` under a real SLURM (slurmctld, one slurmd per host of the namespace
// test bed, munge): node ranks from the host names when SLURM numbers the hosts otherwise,
// workers without srun's task layout, and scancel stopping every node's workers within
// stop_grace. Needs root and the Debian packages slurmctld, slurmd, slurm-client and munge
// (else skipped, or failed under DDPRUN_REQUIRE_TESTBED=1, with the reason).

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <iostream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"
#include "tests/e2e/testbed.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

constexpr int kMasterPort = 29500;

class SlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* program : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun",
                                "/usr/bin/scontrol", "/usr/bin/scancel", "/usr/sbin/mungekey"}) {
      if (::access(program, X_OK) != 0) {
        DDPRUN_TESTBED_UNAVAILABLE(std::string(program) +
                                   " is not installed (slurmctld slurmd slurm-client munge, scripts/install-deps.sh)");
        return;
      }
    }
    TestbedOptions options;
    options.hosts = 3;
    options.tag = "slurm";
    options.shared_home = true;
    std::string why;
    bed_ = Testbed::Create(options, &why);
    if (!bed_) {
      DDPRUN_TESTBED_UNAVAILABLE(why);
      return;
    }
    const std::string d = dir_.path();
    // munge with a key and socket of this test's own; every host reaches the socket (a file).
    ASSERT_EQ(Shell("mungekey -c -k " + d + "/munge.key && chmod 600 " + d + "/munge.key"), 0);
    ASSERT_EQ(Shell("/usr/sbin/munged --force --socket=" + d + "/munge.sock --key-file=" + d +
                    "/munge.key --log-file=" + d + "/munged.log --pid-file=" + d + "/munged.pid --seed-file=" + d +
                    "/munged.seed"),
              0);
    ASSERT_TRUE(WaitFor([&] { return dir_.Exists("munged.pid"); }, 5s));
    daemon_pids_.push_back(std::stoi(dir_.Read("munged.pid")));
    std::ostringstream conf;
    conf << "ClusterName=ddprunbed\nSlurmctldHost=" << bed_->host(0).name << "(" << bed_->host(0).data_addr << ")\n"
         << "SlurmctldPort=6817\nSlurmdPort=6818\nSlurmUser=root\nSlurmdUser=root\n"
         << "AuthType=auth/munge\nAuthInfo=socket=" << d << "/munge.sock\nCredType=cred/munge\n"
         << "StateSaveLocation=" << d << "/state\nSlurmdSpoolDir=" << d << "/spool/%n\n"
         << "SlurmctldPidFile=" << d << "/slurmctld.pid\nSlurmdPidFile=" << d << "/slurmd-%n.pid\n"
         << "SlurmctldLogFile=" << d << "/slurmctld.log\nSlurmdLogFile=" << d << "/slurmd-%n.log\n"
         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n"
         << "SelectTypeParameters=CR_CPU\nJobAcctGatherType=jobacct_gather/none\n"
         << "AccountingStorageType=accounting_storage/none\nReturnToService=2\nMpiDefault=none\n"
         << "KillWait=10\nSlurmctldTimeout=30\nSlurmdTimeout=30\n";
    for (const TestHost& h : bed_->hosts()) {
      conf << "NodeName=" << h.name << " NodeAddr=" << h.data_addr << " CPUs=2 State=UNKNOWN\n";
    }
    conf << "PartitionName=bed Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
    conf_ = dir_.Write("slurm.conf", conf.str());
    std::filesystem::create_directories(d + "/state");
    std::string output;
    ASSERT_EQ(RunOn(0, "/usr/sbin/slurmctld -f " + conf_, &output), 0) << output;
    ASSERT_TRUE(WaitFor([&] { return dir_.Exists("slurmctld.pid"); }, 10s)) << dir_.Read("slurmctld.log");
    daemon_pids_.push_back(std::stoi(dir_.Read("slurmctld.pid")));
    for (int i = 0; i < 3; ++i) {
      const std::string name = bed_->host(i).name;
      std::filesystem::create_directories(d + "/spool/" + name);
      ASSERT_EQ(RunOn(i, "/usr/sbin/slurmd -f " + conf_, &output), 0) << output;
      ASSERT_TRUE(WaitFor([&] { return dir_.Exists("slurmd-" + name + ".pid"); }, 10s))
          << dir_.Read("slurmd-" + name + ".log");
      daemon_pids_.push_back(std::stoi(dir_.Read("slurmd-" + name + ".pid")));
    }
    ASSERT_TRUE(WaitFor([&] {
      std::string states;
      RunOn(0, "sinfo -h -o %t", &states);
      return states.find("idle") != std::string::npos && states.find("idle*") == std::string::npos &&
             states.find("unk") == std::string::npos && states.find("down") == std::string::npos;
    }, 30s)) << dir_.Read("slurmctld.log");
  }
  void TearDown() override {
    agents_.clear();
    for (pid_t pid : daemon_pids_) ::kill(pid, SIGTERM);
    for (pid_t pid : daemon_pids_) WaitFor([&] { return !ProcessAlive(pid); }, 10s);
    bed_.reset();
  }
  /// The bed's prefix for host `i`, entered with nsenter rather than `ip netns exec`: slurmd
  /// needs the machine's /sys (its cgroup tree), which `ip netns exec` replaces.
  std::vector<std::string> NsenterPrefix(int i) const {
    std::vector<std::string> prefix = bed_->Prefix(i);
    prefix.erase(prefix.begin(), prefix.begin() + 4);
    prefix.insert(prefix.begin(), {"nsenter", "--net=/var/run/netns/" + bed_->host(i).netns});
    return prefix;
  }
  int RunOn(int i, const std::string& command, std::string* output) const {
    std::string line = "SLURM_CONF=" + ShellQuote(conf_) + " ";
    for (const std::string& part : NsenterPrefix(i)) line += ShellQuote(part) + " ";
    return ShellOutput(line + "sh -c " + ShellQuote(command) + " 2>&1", output);
  }
  /// `srun ... ddprun job.toml` on host 0, in the background; its output in srun-<n>.out.
  AgentProcess& Srun(const std::string& job) {
    std::vector<std::string> prefix = NsenterPrefix(0);
    for (const char* word : {"srun", "-N3", "--ntasks-per-node=1", "--job-name=ddprun-e2e"}) prefix.push_back(word);
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{job}, dir_.path() + "/srun-" + std::to_string(agents_.size()) + ".out",
        std::map<std::string, std::string>{{"SLURM_CONF", conf_}, {"DDPRUN_NODE_RANK", ""}}, prefix));
    return *agents_.back();
  }
  std::string JobText(const std::string& script) const {
    // cluster.nodes in the reverse of SLURM's order: SLURM_NODEID 0 is gpu-01, which the job
    // file makes node 2 (and gpu-03, node 0, is where the coordinator listens).
    std::ostringstream t;
    t << "version = 1\n[job]\nname = \"slurm\"\ncommand = [\"/bin/sh\", \"-c\", " << TomlString(script) << "]\n"
      << "[cluster]\nnodes = [\"" << bed_->host(2).data_addr << "\", \"" << bed_->host(1).data_addr << "\", \""
      << bed_->host(0).data_addr << "\"]\nmaster_port = " << kMasterPort << "\n"
      << "[trainer]\naccelerator = \"cpu\"\ndevices = 2\nnum_nodes = 3\n"
      << "[timeouts]\nrendezvous = \"30s\"\nheartbeat = \"500ms\"\nstop_grace = \"3s\"\n";
    return t.str();
  }

  ScratchDir dir_;
  std::unique_ptr<Testbed> bed_;
  std::string conf_;
  std::vector<pid_t> daemon_pids_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

// The report: SLURM_NODEID silently overrode the host name's rank, and node 0's agent
// then failed to listen on another host's address, blaming --node-rank. Now each agent is the
// node its host name says, says so, and the job ends well; workers see no srun task layout.
TEST_F(SlurmTest, SrunJobTakesNodeRanksFromHostNamesAndHidesTheTaskLayout) {
  if (!bed_) return;
  const std::string job = bed_->Write(
      "job.toml", JobText("env | grep ^SLURM_ | sort > slurm-env-$RANK; echo rank $RANK group $GROUP_RANK on "
                          "$(hostname)"));
  AgentProcess& srun = Srun(job);
  ASSERT_EQ(srun.Wait(120s), 0) << srun.Output() << dir_.Read("slurmctld.log");
  const std::string out = srun.Output();
  EXPECT_THAT(out, HasSubstr("SLURM_NODEID=0 is not used: this host (gpu-01) is cluster.nodes[2], so this is node 2"));
  EXPECT_THAT(out, HasSubstr("SLURM_NODEID=2 is not used: this host (gpu-03) is cluster.nodes[0], so this is node 0"));
  EXPECT_THAT(out, HasSubstr("rank 0 group 0 on gpu-03"));
  EXPECT_THAT(out, HasSubstr("rank 5 group 2 on gpu-01"));
  EXPECT_THAT(out, Not(HasSubstr("cannot listen")));
  if (std::getenv("UP_DEBUG")) std::cout << out << bed_->Read(0, "slurm-env-3");
  for (int rank = 0; rank < 6; ++rank) {
    SCOPED_TRACE(rank);
    const std::string env = bed_->Read(0, "slurm-env-" + std::to_string(rank));
    EXPECT_THAT(env, HasSubstr("SLURM_JOB_ID="));
    EXPECT_THAT(env, HasSubstr("SLURM_JOB_NODELIST=gpu-[01-03]"));
    for (const char* hidden : {"SLURM_NTASKS=", "SLURM_PROCID=", "SLURM_LOCALID=", "SLURM_NODEID="}) {
      EXPECT_THAT(env, Not(HasSubstr(hidden)));
    }
  }
}

// scancel sends SIGTERM to every node's agent (the step's tasks), SIGKILL KillWait later: the
// agents stop their workers within stop_grace, long before SLURM's SIGKILL.
TEST_F(SlurmTest, ScancelStopsEveryNodesWorkersWithinStopGrace) {
  if (!bed_) return;
  const std::string job = bed_->Write(
      "job.toml", JobText("trap '' TERM; echo $$ > worker-$RANK.pid; while true; do sleep 0.2; done"));
  AgentProcess& srun = Srun(job);
  ASSERT_TRUE(WaitFor([&] {
    for (int r = 0; r < 6; ++r) {
      if (bed_->Read(0, "worker-" + std::to_string(r) + ".pid").empty()) return false;
    }
    return true;
  }, 60s)) << srun.Output();
  std::vector<pid_t> workers;
  for (int r = 0; r < 6; ++r) workers.push_back(std::stoi(bed_->Read(0, "worker-" + std::to_string(r) + ".pid")));
  for (pid_t pid : workers) ASSERT_TRUE(ProcessAlive(pid));
  std::string output;
  const auto cancelled = std::chrono::steady_clock::now();
  ASSERT_EQ(RunOn(0, "scancel --name=ddprun-e2e", &output), 0) << output;
  // Workers that ignore SIGTERM: the agents SIGKILL them at stop_grace (3 s); SLURM's own
  // SIGKILL would come only after KillWait (10 s).
  EXPECT_TRUE(WaitFor([&] {
    for (pid_t pid : workers) {
      if (ProcessAlive(pid)) return false;
    }
    return true;
  }, 8s)) << srun.Output();
  const auto stopped_in = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - cancelled);
  EXPECT_LT(stopped_in, 8s);
  RecordProperty("workers_gone_after_scancel_ms", static_cast<int>(stopped_in.count()));
  ASSERT_TRUE(srun.Wait(30s).has_value());
  if (std::getenv("UP_DEBUG")) {
    std::cout << "workers gone " << stopped_in.count() << " ms after scancel; srun exited after "
              << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - cancelled).count()
              << " ms\n" << srun.Output();
  }
  EXPECT_THAT(srun.Output(), HasSubstr("received SIGTERM"));
}

}  // namespace
}  // namespace ddprun::e2e
