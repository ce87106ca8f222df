// A rack of real agents on the namespace bed (issue 39.4): RACK_HOSTS hosts (16 by default;
// bench/rack.sh runs 64), each with its own name, a stock Debian /etc/hosts, a management NIC
// listed first and a data NIC, and its own ddprun agent with one worker. The job file lists the
// hosts by name and nothing else. Measured, as test properties (bench/rack.sh collects them):
// launch of the first agent -> every worker started, node 0's agent's peak memory and open
// descriptors while every worker runs, and console lines per node. With RACK_TORCHRUN=N, the
// same for torchrun's c10d rendezvous on the first N hosts of the same bed, side by side.
// Needs root (else skipped, or failed when DDPRUN_REQUIRE names testbed).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"
#include "tests/e2e/testbed.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kMasterPort = 29500;

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::atoi(value) : fallback;
}

/// A field of /proc/PID/status in kB ("VmHWM"); -1 when unreadable.
long StatusKb(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with(field + ":")) return std::atol(line.c_str() + field.size() + 1);
  }
  return -1;
}

long OpenDescriptors(pid_t pid) {
  std::error_code ec;
  long count = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++count;
  }
  return ec ? -1 : count;
}

size_t Lines(const std::string& text) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

class RackTest : public ::testing::Test {
 protected:
  void MakeBed(int hosts) {
    TestbedOptions options;
    options.hosts = hosts;
    options.tag = "rack";
    options.shared_home = true;
    std::string why;
    const auto made = Clock::now();
    bed_ = Testbed::Create(options, &why);
    DDPRUN_REQUIRE_OR_SKIP("testbed", bed_ != nullptr, why);
    bed_made_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - made).count();
  }
  void TearDown() override {
    agents_.clear();
    bed_.reset();
  }
  std::string NodesByName(int count) const {
    std::string list;
    for (int i = 0; i < count; ++i) list += (list.empty() ? "\"" : ", \"") + bed_->host(i).name + "\"";
    return "[" + list + "]";
  }
  /// Every worker marks its start (seconds since the epoch, from bash's clock) and waits for the
  /// file `go`, so that node 0 is measured while every worker runs.
  static std::string WorkerScript(const std::string& tag) {
    return "echo $EPOCHREALTIME > " + tag + "-started-$RANK; while [ ! -e " + tag +
           "-go ]; do sleep 0.1; done";
  }
  /// The latest of the `count` ranks' marks `<prefix><rank>`, in seconds since the epoch; 0
  /// until every rank wrote its own.
  double LastMark(const std::string& prefix, int count) const {
    double last = 0;
    for (int rank = 0; rank < count; ++rank) {
      const std::string text = bed_->Read(0, prefix + std::to_string(rank));
      if (text.empty()) return 0;
      last = std::max(last, std::atof(text.c_str()));
    }
    return last;
  }
  static double EpochNow() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  ScratchDir dir_;  // the agents' console output
  std::unique_ptr<Testbed> bed_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
  long bed_made_ms_ = 0;
};

TEST_F(RackTest, EveryHostsAgentJoinsAndEveryWorkerStarts) {
  const int hosts = EnvInt("RACK_HOSTS", 16);
  MakeBed(hosts);
  if (!bed_) return;
  RecordProperty("hosts", hosts);
  RecordProperty("bed_made_ms", static_cast<int>(bed_made_ms_));
  std::ostringstream t;
  t << "version = 1\n[job]\nname = \"rack\"\ncommand = [\"bash\", \"-c\", \"" << WorkerScript("dd") << "\"]\n"
    << "[cluster]\nnodes = " << NodesByName(hosts) << "\nmaster_port = " << kMasterPort << "\n"
    << "[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = " << hosts << "\n"
    << "[timeouts]\nrendezvous = \"120s\"\nheartbeat = \""
    << (std::getenv("RACK_HEARTBEAT") ? std::getenv("RACK_HEARTBEAT") : "1s") << "\"\nstop_grace = \"5s\"\n";
  const std::string job = bed_->Write("job.toml", t.str());

  const double launched = EpochNow();
  for (int i = 0; i < hosts; ++i) {
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{job}, dir_.path() + "/" + bed_->host(i).name + ".out",
        std::map<std::string, std::string>{{"DDPRUN_NODE_RANK", ""}}, bed_->Prefix(i)));
  }
  double last = 0;
  const bool started_all = WaitFor([&] { return (last = LastMark("dd-started-", hosts)) > 0; }, 120s);
  if (!started_all && std::getenv("RACK_DIAG")) {
    for (int i : {1, 40}) {
      std::string out;
      bed_->Run(i,
                "ip -s neigh show | grep -c . ; ip neigh show | awk '{print $NF}' | sort | uniq -c; nstat "
                "-az | grep -E "
                "'ListenOverflows|ListenDrops|TCPSynRetrans|TCPReqQFull|TcpActiveOpens|TcpPassiveOpens|"
                "TcpAttemptFails|TcpExtTCPTimeouts|IpInDiscards|IpOutNoRoutes'",
                &out);
      std::fprintf(stderr, "DIAG host %d\n%s\n", i, out.c_str());
    }
  }
  ASSERT_TRUE(started_all) << agents_[0]->Output().substr(0, 4000);
  const pid_t node0 = agents_[0]->pid();
  const long rss_kb = StatusKb(node0, "VmRSS");
  const long hwm_kb = StatusKb(node0, "VmHWM");
  const long fds = OpenDescriptors(node0);
  bed_->Write("dd-go", "");
  for (auto& agent : agents_) ASSERT_EQ(agent->Wait(60s), 0) << DescribeAgents(agents_);

  size_t most_lines = 0;
  for (auto& agent : agents_) most_lines = std::max(most_lines, Lines(agent->Output()));
  size_t other_lines = 0;
  for (size_t i = 1; i < agents_.size(); ++i)
    other_lines = std::max(other_lines, Lines(agents_[i]->Output()));
  const int all_started_ms = static_cast<int>((last - launched) * 1000);
  RecordProperty("ddprun_all_started_ms", all_started_ms);
  RecordProperty("ddprun_node0_rss_kb", static_cast<int>(rss_kb));
  RecordProperty("ddprun_node0_peak_kb", static_cast<int>(hwm_kb));
  RecordProperty("ddprun_node0_fds", static_cast<int>(fds));
  RecordProperty("ddprun_node0_console_lines", static_cast<int>(Lines(agents_[0]->Output())));
  RecordProperty("ddprun_most_console_lines", static_cast<int>(most_lines));
  RecordProperty("ddprun_other_node_most_console_lines", static_cast<int>(other_lines));
  // Node 0 listens where the others reach it (its own name is 127.0.1.1 on its host).
  EXPECT_THAT(agents_[0]->Output(), HasSubstr("node 0 listens on " + bed_->host(0).data_addr + " instead"));
  // Bounds a rack must keep: descriptors grow with the hosts (one connection each), not more.
  EXPECT_LT(fds, 64 + 2 * hosts);
  EXPECT_LT(hwm_kb, 64 * 1024);
  // Each node's console: its start, the rendezvous, its worker, its end; no per-second chatter.
  // Node 0's coordinator says each join once.
  EXPECT_LT(other_lines, 30u) << agents_[1]->Output();
  EXPECT_LT(Lines(agents_[0]->Output()), 30u + static_cast<size_t>(hosts)) << agents_[0]->Output();

  const int torchrun_hosts = std::min(hosts, EnvInt("RACK_TORCHRUN", 0));
  if (torchrun_hosts < 2) return;
  DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing);
  agents_.clear();
  RecordProperty("torchrun_hosts", torchrun_hosts);
  std::vector<std::unique_ptr<AgentProcess>> torchruns;
  const double tr_launched = EpochNow();
  for (int i = 0; i < torchrun_hosts; ++i) {
    std::vector<std::string> argv = bed_->Prefix(i);
    for (const std::string& part :
         // torchrun 1.13 on Python 3.11 dies in Std.from_str("0") unless --redirects and --tee get
         // a value it can parse; 9:1 names a local rank that does not exist (bench/common.sh).
         {std::string("torchrun"), std::string("--redirects"), std::string("9:1"), std::string("--tee"),
          std::string("9:1"), "--nnodes=" + std::to_string(torchrun_hosts), std::string("--nproc_per_node=1"),
          std::string("--rdzv_backend=c10d"),
          "--rdzv_endpoint=" + bed_->host(0).name + ":" + std::to_string(kMasterPort),
          std::string("--rdzv_id=rack"), std::string("--max_restarts=0"), std::string("--no_python"),
          std::string("bash"), std::string("-c"), WorkerScript("tr")}) {
      argv.push_back(part);
    }
    torchruns.push_back(std::make_unique<AgentProcess>(AgentProcess::OtherProgram{}, argv,
                                                       dir_.path() + "/tr-" + bed_->host(i).name + ".out"));
  }
  double tr_last = 0;
  const bool all = WaitFor(
                       [&] {
                         if ((tr_last = LastMark("tr-started-", torchrun_hosts)) > 0) return true;
                         return std::none_of(torchruns.begin(), torchruns.end(),
                                             [](const auto& tr) { return ProcessAlive(tr->pid()); });
                       },
                       300s) &&
                   tr_last > 0;
  long tr_hwm_kb = -1;
  if (all) {
    // The torchrun that hosts the c10d store: host 0's, the child python of its launcher.
    const pid_t tr0 = torchruns[0]->pid();
    tr_hwm_kb = StatusKb(tr0, "VmHWM");
  }
  bed_->Write("tr-go", "");
  for (auto& tr : torchruns) tr->Wait(60s);
  ASSERT_TRUE(all) << DescribeAgents(torchruns);
  size_t tr_most_lines = 0;
  for (auto& tr : torchruns) tr_most_lines = std::max(tr_most_lines, Lines(tr->Output()));
  RecordProperty("torchrun_all_started_ms", static_cast<int>((tr_last - tr_launched) * 1000));
  RecordProperty("torchrun_node0_peak_kb", static_cast<int>(tr_hwm_kb));
  RecordProperty("torchrun_most_console_lines", static_cast<int>(tr_most_lines));
}

// Issue 39.5: a real Lightning job (lightning 2.2.5, 3 hosts x 2 ranks, gloo on the CPU) on stock
// hosts by name, under ddprun and under torchrun's c10d rendezvous, in one run: first agent
// launched -> every rank at its first training batch (bench/w_lightning.py marks it). torchrun
// gets GLOO_SOCKET_IFNAME by hand on each host, as its users must set it there (without it gloo
// binds 127.0.1.1). Runs only where LIGHTNING_PATH names the sources' src/ folders
// (bench/lightning-bed.sh); skipped otherwise, CI included.
TEST_F(RackTest, LightningAcrossThreeStockHostsUnderDdprunAndTorchrun) {
  const char* lightning = std::getenv("LIGHTNING_PATH");
  if (!lightning || !*lightning) GTEST_SKIP() << "LIGHTNING_PATH is not set (bench/lightning-bed.sh sets it)";
  DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing);
  const int hosts = 3;
  MakeBed(hosts);
  if (!bed_) return;
  const std::string script = std::string(DDPRUN_SOURCE_DIR) + "/bench/w_lightning.py";
  bed_->Write("dd/.keep", "");
  bed_->Write("tr/.keep", "");
  std::ostringstream t;
  t << "version = 1\n[job]\nname = \"lt\"\ncommand = [\"/usr/bin/python3\", \"" << script << "\"]\n"
    << "env = { PYTHONPATH = \"" << lightning << "\", MARKS = \"" << bed_->home()
    << "/dd\", STEPS = \"20\" }\n"
    << "[cluster]\nnodes = " << NodesByName(hosts) << "\nmaster_port = " << kMasterPort << "\n"
    << "[trainer]\naccelerator = \"cpu\"\ndevices = 2\nnum_nodes = " << hosts << "\nstrategy = \"ddp\"\n"
    << "[timeouts]\nrendezvous = \"120s\"\nheartbeat = \"2s\"\nstop_grace = \"10s\"\n";
  const std::string job = bed_->Write("job.toml", t.str());
  const double launched = EpochNow();
  for (int i = 0; i < hosts; ++i) {
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{job}, dir_.path() + "/lt-" + bed_->host(i).name + ".out",
        std::map<std::string, std::string>{{"DDPRUN_NODE_RANK", ""}}, bed_->Prefix(i)));
  }
  for (auto& agent : agents_) ASSERT_EQ(agent->Wait(300s), 0) << DescribeAgents(agents_);
  const double last = LastMark("dd/first-batch-", hosts * 2);
  ASSERT_GT(last, 0) << DescribeAgents(agents_);
  RecordProperty("ddprun_first_batch_ms", static_cast<int>((last - launched) * 1000));
  RecordProperty("ddprun_workers_started_ms",
                 static_cast<int>((LastMark("dd/started-", hosts * 2) - launched) * 1000));

  std::vector<std::unique_ptr<AgentProcess>> torchruns;
  const double tr_launched = EpochNow();
  for (int i = 0; i < hosts; ++i) {
    std::vector<std::string> argv = bed_->Prefix(i);
    for (const std::string& part :
         {std::string("torchrun"), std::string("--redirects"), std::string("9:1"), std::string("--tee"),
          std::string("9:1"), "--nnodes=" + std::to_string(hosts), std::string("--nproc_per_node=2"),
          std::string("--rdzv_backend=c10d"),
          "--rdzv_endpoint=" + bed_->host(0).name + ":" + std::to_string(kMasterPort),
          std::string("--rdzv_id=lt"), std::string("--max_restarts=0"), script}) {
      argv.push_back(part);
    }
    torchruns.push_back(std::make_unique<AgentProcess>(
        AgentProcess::OtherProgram{}, argv, dir_.path() + "/lt-tr-" + bed_->host(i).name + ".out",
        std::map<std::string, std::string>{{"PYTHONPATH", lightning},
                                           {"MARKS", bed_->home() + "/tr"},
                                           {"STEPS", "20"},
                                           {"GLOO_SOCKET_IFNAME", bed_->host(i).data_if}}));
  }
  for (auto& tr : torchruns) ASSERT_EQ(tr->Wait(300s), 0) << DescribeAgents(torchruns);
  const double tr_last = LastMark("tr/first-batch-", hosts * 2);
  ASSERT_GT(tr_last, 0) << DescribeAgents(torchruns);
  RecordProperty("torchrun_first_batch_ms", static_cast<int>((tr_last - tr_launched) * 1000));
  RecordProperty("torchrun_workers_started_ms",
                 static_cast<int>((LastMark("tr/started-", hosts * 2) - tr_launched) * 1000));
}

}  // namespace
}  // namespace ddprun::e2e
