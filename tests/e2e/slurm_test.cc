// `srun ddprun job.toml` under a real SLURM (slurmctld, one slurmd per host of the namespace
// test bed, munge): node ranks from the host names when SLURM numbers the hosts otherwise,
// workers without srun's task layout, and scancel stopping every node's workers within
// stop_grace. Needs root and the Debian packages slurmctld, slurmd, slurm-client and munge
// (else skipped, or failed under DDPRUN_REQUIRE_TESTBED=1, with the reason).

#include <signal.h>
#include <unistd.h>
#include <cstdio>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
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

class SlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* program :
         {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun", "/usr/bin/scontrol",
          "/usr/bin/scancel", "/usr/sbin/mungekey"}) {
      if (::access(program, X_OK) != 0) {
        DDPRUN_REQUIRE_OR_SKIP(
            "slurm", false,
            std::string(program) +
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
      DDPRUN_REQUIRE_OR_SKIP("testbed", false, why);
      return;
    }
    const std::string d = dir_.path();
    // munge with a key and socket of this test's own; every host reaches the socket (a file).
    ASSERT_EQ(Shell("mungekey -c -k " + d + "/munge.key && chmod 600 " + d + "/munge.key"), 0);
    ASSERT_EQ(Shell("/usr/sbin/munged --force --socket=" + d + "/munge.sock --key-file=" + d +
                    "/munge.key --log-file=" + d + "/munged.log --pid-file=" + d +
                    "/munged.pid --seed-file=" + d + "/munged.seed"),
              0);
    const pid_t munged = WaitForPid("munged.pid", 5s);
    ASSERT_GT(munged, 0) << dir_.Read("munged.log");
    daemon_pids_.push_back(munged);
    std::ostringstream conf;
    conf << "ClusterName=ddprunbed\nSlurmctldHost=" << bed_->host(0).name << "(" << bed_->host(0).data_addr
         << ")\n"
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
    const pid_t slurmctld = WaitForPid("slurmctld.pid", 10s);
    ASSERT_GT(slurmctld, 0) << dir_.Read("slurmctld.log");
    daemon_pids_.push_back(slurmctld);
    for (int i = 0; i < 3; ++i) {
      const std::string name = bed_->host(i).name;
      std::filesystem::create_directories(d + "/spool/" + name);
      ASSERT_EQ(RunOn(i, "/usr/sbin/slurmd -f " + conf_, &output), 0) << output;
      const pid_t slurmd = WaitForPid("slurmd-" + name + ".pid", 10s);
      ASSERT_GT(slurmd, 0) << dir_.Read("slurmd-" + name + ".log");
      daemon_pids_.push_back(slurmd);
    }
    ASSERT_TRUE(WaitFor(
        [&] {
          std::string states;
          RunOn(0, "sinfo -h -o %t", &states);
          return states.find("idle") != std::string::npos && states.find("idle*") == std::string::npos &&
                 states.find("unk") == std::string::npos && states.find("down") == std::string::npos;
        },
        30s))
        << dir_.Read("slurmctld.log");
  }
  // A daemon creates its pid file before it writes the number in it: wait for the number.
  // 0 when none came within `within`.
  pid_t WaitForPid(const std::string& name, std::chrono::milliseconds within) {
    return WaitForPidFile(dir_, name, within);
  }
  void TearDown() override {
    if (holder_pid_ > 0) ::kill(holder_pid_, SIGKILL);
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
  /// `srun ... ddprun args` (or `launcher ... ddprun args`) on host 0, in the background; its
  /// output in srun-<n>.out.
  AgentProcess& Srun(const std::string& job,
                     std::vector<std::string> launcher = {"srun", "-N3", "--ntasks-per-node=1",
                                                          "--job-name=ddprun-e2e"},
                     std::vector<std::string> args = {}) {
    std::vector<std::string> prefix = NsenterPrefix(0);
    prefix.insert(prefix.end(), launcher.begin(), launcher.end());
    args.push_back(job);
    agents_.push_back(std::make_unique<AgentProcess>(
        args, dir_.path() + "/srun-" + std::to_string(agents_.size()) + ".out",
        std::map<std::string, std::string>{{"SLURM_CONF", conf_}, {"DDPRUN_NODE_RANK", ""}}, prefix));
    return *agents_.back();
  }
  std::string JobText(const std::string& script) const {
    // cluster.nodes in the reverse of SLURM's order: SLURM_NODEID 0 is gpu-01, which the job
    // file makes node 2 (and gpu-03, node 0, is where the coordinator listens).
    std::ostringstream t;
    t << "version = 1\n[job]\nname = \"slurm\"\ncommand = [\"/bin/sh\", \"-c\", " << TomlString(script)
      << "]\n"
      << "[cluster]\nnodes = [\"" << bed_->host(2).data_addr << "\", \"" << bed_->host(1).data_addr
      << "\", \"" << bed_->host(0).data_addr << "\"]\nmaster_port = " << kMasterPort << "\n"
      << "[trainer]\naccelerator = \"cpu\"\ndevices = 2\nnum_nodes = 3\n"
      << "[timeouts]\nrendezvous = \"30s\"\nheartbeat = \"500ms\"\nstop_grace = \"3s\"\n";
    return t.str();
  }

  ScratchDir dir_;
  std::unique_ptr<Testbed> bed_;
  std::string conf_;
  std::vector<pid_t> daemon_pids_;
  pid_t holder_pid_ = -1;  // a process this test started that holds a port
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
  EXPECT_THAT(
      out,
      HasSubstr("SLURM_NODEID=0 is not used: this host (gpu-01) is cluster.nodes[2], so this is node 2"));
  EXPECT_THAT(
      out,
      HasSubstr("SLURM_NODEID=2 is not used: this host (gpu-03) is cluster.nodes[0], so this is node 0"));
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
// A real PyTorch DDP job (gloo, 3 hosts x 2 ranks, an all_reduce per step) started by srun: the
// ranks find each other with the environment ddprun gives them, not srun's task layout.
TEST_F(SlurmTest, SrunRunsARealTorchGlooJobAcrossTheAllocation) {
  if (!bed_) return;
  DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing);
  const std::string job =
      bed_->Write("job.toml", JobText("exec /usr/bin/python3 " + std::string(DDPRUN_SOURCE_DIR) +
                                      "/examples/ddp_train.py --steps 3"));
  AgentProcess& srun = Srun(job);
  ASSERT_EQ(srun.Wait(180s), 0) << srun.Output() << dir_.Read("slurmctld.log");
  const std::string out = srun.Output();
  EXPECT_THAT(out, HasSubstr("done: 6 ranks, all_reduce ok")) << out;
  EXPECT_THAT(out, HasSubstr("rank 5/6")) << out;
  EXPECT_THAT(out, HasSubstr("succeeded")) << out;
}

TEST_F(SlurmTest, ScancelStopsEveryNodesWorkersWithinStopGrace) {
  if (!bed_) return;
  const std::string job = bed_->Write(
      "job.toml", JobText("trap '' TERM; echo $$ > worker-$RANK.pid; while true; do sleep 0.2; done"));
  AgentProcess& srun = Srun(job);
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int r = 0; r < 6; ++r) {
          if (bed_->Read(0, "worker-" + std::to_string(r) + ".pid").empty()) return false;
        }
        return true;
      },
      60s))
      << srun.Output();
  std::vector<pid_t> workers;
  for (int r = 0; r < 6; ++r)
    workers.push_back(std::stoi(bed_->Read(0, "worker-" + std::to_string(r) + ".pid")));
  for (pid_t pid : workers) ASSERT_TRUE(ProcessAlive(pid));
  std::string output;
  const auto cancelled = std::chrono::steady_clock::now();
  ASSERT_EQ(RunOn(0, "scancel --name=ddprun-e2e", &output), 0) << output;
  // Workers that ignore SIGTERM: the agents SIGKILL them at stop_grace (3 s); SLURM's own
  // SIGKILL would come only after KillWait (10 s).
  EXPECT_TRUE(WaitFor(
      [&] {
        for (pid_t pid : workers) {
          if (ProcessAlive(pid)) return false;
        }
        return true;
      },
      8s))
      << srun.Output();
  const auto stopped_in =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - cancelled);
  EXPECT_LT(stopped_in, 8s);
  RecordProperty("workers_gone_after_scancel_ms", static_cast<int>(stopped_in.count()));
  ASSERT_TRUE(srun.Wait(30s).has_value());
  if (std::getenv("UP_DEBUG")) {
    std::cout << "workers gone " << stopped_in.count() << " ms after scancel; srun exited after "
              << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                       cancelled)
                     .count()
              << " ms\n"
              << srun.Output();
  }
  EXPECT_THAT(srun.Output(), HasSubstr("received SIGTERM"));
}

// cluster.hosts_from = "slurm": the hosts, their count and master_addr come from the allocation
// through the real `scontrol show hostnames`; `check` shows them inside an allocation and says
// what it cannot know outside one.
TEST_F(SlurmTest, HostsFromSlurmTakesTheAllocationsHosts) {
  if (!bed_) return;
  // Host names that resolve to the data addresses on every host, as a cluster's DNS would.
  std::string hosts = "127.0.0.1 localhost\n";
  for (const TestHost& h : bed_->hosts()) hosts += h.data_addr + " " + h.name + "\n";
  for (int i = 0; i < 3; ++i) bed_->SetHostsFile(i, hosts);
  const std::string job = bed_->Write(
      "job.toml",
      "version = 1\n[job]\nname = \"alloc\"\ncommand = [\"/bin/sh\", \"-c\", \"echo rank $RANK of "
      "$WORLD_SIZE on "
      "$(hostname) master $MASTER_ADDR\"]\n[cluster]\nhosts_from = \"slurm\"\nmaster_port = 29500\n"
      "[trainer]\naccelerator = \"cpu\"\ndevices = 2\nnum_nodes = 3\n"
      "[timeouts]\nrendezvous = \"30s\"\nheartbeat = \"500ms\"\nstop_grace = \"3s\"\n");
  std::string outside;
  EXPECT_EQ(RunOn(0, std::string(DDPRUN_BINARY) + " check " + job, &outside), 0) << outside;
  EXPECT_THAT(outside,
              HasSubstr("not in a SLURM allocation (SLURM_JOB_NODELIST is not set): the hosts are known "
                        "only under srun or sbatch; shown here as 3 nodes without names"));

  AgentProcess& check = Srun(job, {"salloc", "-N3", "--job-name=ddprun-e2e"}, {"check"});
  ASSERT_EQ(check.Wait(60s), 0) << check.Output();
  EXPECT_THAT(check.Output(), Not(HasSubstr("not in a SLURM allocation")));
  for (const TestHost& h : bed_->hosts()) EXPECT_THAT(check.Output(), HasSubstr(h.name));

  AgentProcess& srun = Srun(job);
  ASSERT_EQ(srun.Wait(120s), 0) << srun.Output();
  EXPECT_THAT(srun.Output(), HasSubstr("rank 0 of 6 on gpu-01 master gpu-01"));
  EXPECT_THAT(srun.Output(), HasSubstr("rank 5 of 6 on gpu-03 master gpu-01"));
  EXPECT_THAT(srun.Output(), HasSubstr("node 1 of 3 (gpu-02), 2 workers here, master gpu-01:29500"));
}

// Issue 39.1 under SLURM: hosts_from = "slurm" on stock hosts, where each host's own name is
// 127.0.1.1 (the bed's /etc/hosts as Debian writes it). Node 0 (gpu-01) used to exit 3 because
// master_addr, which cannot be written in the file here, was loopback on its host; now it listens
// at its address towards gpu-02 and every worker gets that as MASTER_ADDR.
TEST_F(SlurmTest, HostsFromSlurmWorksOnStockHosts) {
  if (!bed_) return;
  const std::string job =
      bed_->Write("job.toml",
                  "version = 1\n[job]\nname = \"stock\"\ncommand = [\"/bin/sh\", \"-c\", \"echo rank $RANK "
                  "on $(hostname) "
                  "master $MASTER_ADDR\"]\n[cluster]\nhosts_from = \"slurm\"\nmaster_port = 29500\n"
                  "[trainer]\naccelerator = \"cpu\"\ndevices = 2\nnum_nodes = 3\n"
                  "[timeouts]\nrendezvous = \"30s\"\nheartbeat = \"500ms\"\nstop_grace = \"3s\"\n");
  AgentProcess& srun = Srun(job);
  ASSERT_EQ(srun.Wait(120s), 0) << srun.Output();
  const std::string master = bed_->host(0).data_addr;
  EXPECT_THAT(srun.Output(), HasSubstr("rank 0 on gpu-01 master " + master));
  EXPECT_THAT(srun.Output(), HasSubstr("rank 5 on gpu-03 master " + master));
  EXPECT_THAT(srun.Output(), HasSubstr("node 0 listens on " + master +
                                       " instead, this host's address towards gpu-02 "
                                       "(cluster.nodes[1])"));
}

// Issue 39.2 under SLURM: node 0 cannot start (its master port is taken on its host). With the
// docs' --kill-on-bad-exit=1 the step ends at once; the other agents used to wait for node 0
// until timeouts.rendezvous (30 s here).
TEST_F(SlurmTest, KillOnBadExitEndsTheStepWhenANodeCannotStart) {
  if (!bed_) return;
  std::string pid_text;
  ASSERT_EQ(
      RunOn(0,
            "python3 -c \"import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 29500)); s.listen(); "
            "time.sleep(120)\" >/dev/null 2>&1 & echo $!",
            &pid_text),
      0)
      << pid_text;
  const pid_t holder = std::stoi(pid_text);
  holder_pid_ = holder;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::string out;
        RunOn(0, "ss -ltn 'sport = :29500' | tail -n +2", &out);
        return !out.empty();
      },
      10s));
  const std::string job = bed_->Write(
      "job.toml",
      "version = 1\n[job]\nname = \"bad\"\ncommand = [\"true\"]\n[cluster]\nhosts_from = \"slurm\"\n"
      "master_port = 29500\n[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = 3\n"
      "[timeouts]\nrendezvous = \"30s\"\nheartbeat = \"500ms\"\nstop_grace = \"3s\"\n");
  const auto started = std::chrono::steady_clock::now();
  AgentProcess& srun =
      Srun(job, {"srun", "-N3", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--job-name=ddprun-e2e"});
  const auto code = srun.Wait(60s);
  const auto took = std::chrono::steady_clock::now() - started;
  ASSERT_TRUE(code.has_value()) << srun.Output();
  EXPECT_NE(*code, 0) << srun.Output();
  // Not the 30 s rendezvous: SLURM sends the step SIGTERM, or, to a task it launched only after
  // (a race in slurmstepd), SIGKILL at KillWait (10 s in this bed).
  EXPECT_LT(took, 20s) << srun.Output();
  EXPECT_THAT(srun.Output(), HasSubstr("ddprun cannot start node 0's coordinator: cannot listen on "));
  RecordProperty("step_ended_after_ms",
                 static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
}

// `ddprun init --slurm` writes a job file and an sbatch script that `sbatch` runs as written.
TEST_F(SlurmTest, InitSlurmWritesAnSbatchScriptThatRuns) {
  if (!bed_) return;
  std::string hosts = "127.0.0.1 localhost\n";
  for (const TestHost& h : bed_->hosts()) hosts += h.data_addr + " " + h.name + "\n";
  for (int i = 0; i < 3; ++i) bed_->SetHostsFile(i, hosts);
  bed_->Write("work.sh", "#!/bin/sh\necho \"rank $RANK of $WORLD_SIZE on $(hostname) args $*\"\n");
  ::chmod((bed_->HomeOf(0) + "/work.sh").c_str(), 0755);
  const std::string ddprun_dir = std::filesystem::path(DDPRUN_BINARY).parent_path().string();
  std::string output;
  ASSERT_EQ(
      RunOn(0, std::string(DDPRUN_BINARY) + " init --slurm --nnodes 3 --gpus 0 --script ./work.sh --name bed",
            &output),
      0)
      << output;
  EXPECT_THAT(
      output,
      HasSubstr("wrote job.toml and job.sbatch; next: ddprun check job.toml, then sbatch job.sbatch"));
  const std::string script = bed_->Read(0, "job.sbatch");
  EXPECT_THAT(script, HasSubstr("#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1"));
  EXPECT_THAT(bed_->Read(0, "job.toml"), HasSubstr("hosts_from = \"slurm\""));
  ASSERT_EQ(RunOn(0, "PATH=" + ddprun_dir + ":$PATH sbatch --wait job.sbatch --lr 0.1", &output), 0)
      << output << dir_.Read("slurmctld.log");
  std::string batch_output;
  for (const auto& entry : std::filesystem::directory_iterator(bed_->HomeOf(0))) {
    if (entry.path().filename().string().starts_with("bed-"))
      batch_output = bed_->Read(0, entry.path().filename());
  }
  EXPECT_THAT(batch_output, HasSubstr("rank 0 of 3 on gpu-01 args --lr 0.1"));
  EXPECT_THAT(batch_output, HasSubstr("rank 2 of 3 on gpu-03 args --lr 0.1"));
  EXPECT_THAT(batch_output, HasSubstr("job \"bed\" succeeded"));
}

// A job file that lists hosts other than the allocation's: every task says which, before any
// worker starts.
TEST_F(SlurmTest, ListedHostsThatAreNotTheAllocationsAreAnError) {
  if (!bed_) return;
  const std::string job = bed_->Write(
      "job.toml",
      "version = 1\n[job]\nname = \"other\"\ncommand = [\"/bin/sh\", \"-c\", \"echo worker-ran\"]\n"
      "[cluster]\nnodes = [\"" +
          bed_->host(0).data_addr + "\", \"" + bed_->host(1).data_addr +
          "\", \"192.0.2.50\"]\nmaster_port = 29500\n[trainer]\naccelerator = \"cpu\"\ndevices = 1\n"
          "num_nodes = 3\n");
  AgentProcess& srun = Srun(job);
  ASSERT_TRUE(srun.Wait(60s).has_value());
  EXPECT_THAT(srun.Output(),
              HasSubstr("ddprun: error: the SLURM allocation's hosts (gpu-01, gpu-02, gpu-03) are not "
                        "the job file's (cluster.nodes [" +
                        bed_->host(0).data_addr + ", " + bed_->host(1).data_addr +
                        ", 192.0.2.50]): gpu-03 is not in the job file"));
  EXPECT_THAT(srun.Output(), Not(HasSubstr("worker-ran")));
}

}  // namespace
}  // namespace ddprun::e2e
