// rendezvous.backend = "etcd" end to end (issue 16): a real 3-member etcd cluster on
// 127.0.0.1 from the Debian binaries, and real agents on 127.0.0.1, .2 and .3. The coordinator's
// agent and its workers are killed with SIGKILL, then the etcd leader: the job goes on under
// another coordinator, on another host, with its restart budget counted once.

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

class EtcdJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    etcdtest::EtcdCluster::Options options;
    options.free_port = [] { return FreePort(); };
    std::string error;
    etcd_ = etcdtest::EtcdCluster::Start(options, &error);
    ASSERT_TRUE(etcd_) << "a 3-member etcd cluster did not start (scripts/install-deps.sh installs "
                          "etcd-server): "
                       << error;
  }

  /// Two nodes and a spare on three loopback addresses, in etcd; each worker records its
  /// MASTER_ADDR and pid per restart, then waits for the file `finish`.
  std::string WriteJob(const std::string& lease) {
    TestJob job;
    job.name = "etcd";
    job.nodes = {"127.0.0.1", "127.0.0.2"};
    job.devices = 1;
    job.master_port = FreePort();
    job.max_restarts = 2;
    job.backoff = "0s";
    job.rendezvous = "60s";
    job.script =
        "echo $MASTER_ADDR > addr-$RANK-$TORCHELASTIC_RESTART_COUNT; "
        "echo $$ > pid-$RANK-$TORCHELASTIC_RESTART_COUNT; "
        "while [ ! -e finish ]; do sleep 0.1; done";
    std::string endpoints;
    for (const std::string& url : etcd_->ClientUrls()) {
      endpoints += (endpoints.empty() ? "" : ", ") + TomlString(url);
    }
    job.extra = "replace = \"1s\"\n[rendezvous]\nbackend = \"etcd\"\nendpoints = [" + endpoints +
                "]\nlease = \"" + lease + "\"\n";
    std::string toml = job.Toml();
    toml.insert(toml.find("master_addr"), "spares = [\"127.0.0.3\"]\n");
    return dir_.Write("job.toml", toml);
  }

  AgentProcess& Start(int agent, const std::string& file = "job.toml") {
    const std::string out = dir_.path() + "/agent-" + std::to_string(agents_.size()) + ".out";
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{dir_.path() + "/" + file, "--node-rank", std::to_string(agent)}, out));
    return *agents_.back();
  }
  AgentProcess& agent(int i) { return *agents_.at(static_cast<size_t>(i)); }
  bool OutputHas(const AgentProcess& a, const std::string& text, std::chrono::milliseconds limit) {
    return WaitFor([&] { return a.Output().find(text) != std::string::npos; }, limit);
  }
  std::string Describe() const { return DescribeAgents(agents_) + "\n---- etcd ----\n" + etcd_->Logs(); }

  ScratchDir dir_;
  std::unique_ptr<etcdtest::EtcdCluster> etcd_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

TEST_F(EtcdJobTest, TheJobOutlivesItsCoordinatorsHostAndTheEtcdLeader) {
  WriteJob("6s");
  Start(0);
  ASSERT_TRUE(OutputHas(agent(0), "this agent holds the coordinator role now", 20s)) << Describe();
  Start(1);
  Start(2);
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("pid-0-0") && dir_.Exists("pid-1-0"); }, 30s)) << Describe();
  EXPECT_EQ(dir_.Read("addr-0-0"), "127.0.0.1\n");
  EXPECT_EQ(dir_.Read("addr-1-0"), "127.0.0.1\n");

  // The coordinator's host dies: its agent and its worker (rank 0), with SIGKILL.
  const pid_t rank0 = WaitForPidFile(dir_, "pid-0-0", 5s);
  ASSERT_GT(rank0, 0) << Describe();
  const auto killed_at = std::chrono::steady_clock::now();
  agent(0).Signal(SIGKILL);
  ::kill(rank0, SIGKILL);
  ASSERT_EQ(agent(0).Wait(5s), 128 + SIGKILL);

  // Within the lease (and a few seconds), another agent takes over and round 1 starts with the
  // spare in the dead node's place, rank 0 and MASTER_ADDR on the new coordinator's host.
  int holder = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int i : {1, 2}) {
          if (agent(i).Output().find("this agent holds the coordinator role now") != std::string::npos)
            holder = i;
        }
        return holder > 0;
      },
      20s))
      << Describe();
  const auto took_over = std::chrono::steady_clock::now() - killed_at;
  const std::string holder_host = "127.0.0." + std::to_string(holder + 1);
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("addr-0-1") && dir_.Exists("addr-1-1"); }, 30s)) << Describe();
  const auto restarted = std::chrono::steady_clock::now() - killed_at;
  // For docs/running.md: lease 6s, heartbeat 250ms, stop_grace 2s.
  std::printf("failover: new holder %.1f s after the kill, round 1 running %.1f s after it\n",
              std::chrono::duration<double>(took_over).count(),
              std::chrono::duration<double>(restarted).count());
  EXPECT_LT(took_over, 6s + 3s);  // the lease, a lookup, a campaign
  EXPECT_EQ(dir_.Read("addr-0-1"), holder_host + "\n");
  EXPECT_EQ(dir_.Read("addr-1-1"), holder_host + "\n");

  // The dead host comes back: its agent finds the new holder in etcd and waits to take part
  // from the next restart (its rank is the spare's now).
  Start(0);
  ASSERT_TRUE(OutputHas(agent(holder), "node 0 (127.0.0.1) joined", 20s)) << Describe();

  // The etcd leader dies while round 1 runs: the coordinator renews its lease through another
  // member, after the election, without stepping down.
  const auto leader = etcd_->Leader(10s);
  ASSERT_TRUE(leader) << etcd_->Logs();
  etcd_->Kill(*leader);
  ASSERT_TRUE(etcd_->WaitHealthy(15s)) << etcd_->Logs();
  WaitFor([] { return false; }, 6s);  // more than a lease: a renewal that failed would show
  dir_.Write("finish", "");

  // Every agent that runs ends with the job's code.
  EXPECT_EQ(agent(1).Wait(60s), 0) << Describe();
  EXPECT_EQ(agent(2).Wait(10s), 0) << Describe();
  EXPECT_EQ(agent(3).Wait(10s), 0) << Describe();
  const std::string coordinator = agent(holder).Output();
  EXPECT_THAT(coordinator, HasSubstr("taking over the job from node 0 (127.0.0.1): round 1 next, 0 of 2 "
                                     "restarts used"))
      << Describe();
  EXPECT_THAT(coordinator, HasSubstr("round 0 failed: the coordinator (node 0 (127.0.0.1)) was lost while "
                                     "round 0 ran; restart 1 of 2"))
      << Describe();
  // The budget is counted once: one restart for the lost host, none for the etcd leader.
  EXPECT_THAT(coordinator, HasSubstr("exited 0 in round 1 (1 restart used)")) << Describe();
  for (int i : {1, 2, 3}) {
    EXPECT_THAT(agent(i).Output(), Not(HasSubstr("no longer holds the coordinator role"))) << Describe();
  }
  EXPECT_FALSE(dir_.Exists("addr-0-2")) << Describe();

  // The event logs tell the takeover as it happened: the coordinators' typed observations are
  // in the files of the nodes that held the role, and the replay reads them all.
  AgentProcess replay(
      {"--simulate", dir_.path() + "/job.toml", "--replay", dir_.path() + "/logs/etcd", "--quiet"},
      dir_.path() + "/replay.out");
  replay.Wait(60s);
  const std::string replayed = replay.Output();
  EXPECT_THAT(replayed, Not(HasSubstr("the run had no failure"))) << replayed;
  EXPECT_THAT(replayed, HasSubstr("fault: --fault node-crash@")) << replayed;
  EXPECT_THAT(replayed, HasSubstr("round 0 fails: node 0, lost-node")) << replayed;
  EXPECT_THAT(replayed, HasSubstr("restart 1 of 2")) << replayed;
  EXPECT_THAT(replayed, HasSubstr("the job ends with exit code 0")) << replayed;
}

// Every agent must hold a lease of the role to coordinate; with etcd down at the start, none
// can, and each says why instead of hanging.
// The keys belong to the job name: an agent started with another version of the file finds
// the one coordinator and is refused at its join, instead of holding a role of its own and
// running its own round beside the job (the shape swarm's seed 50).
TEST_F(EtcdJobTest, AnAgentWithAnotherJobFileIsRefusedByTheOneCoordinator) {
  WriteJob("6s");
  std::string other = dir_.Read("job.toml");
  other.replace(other.find("max_restarts = 2"), 16, "max_restarts = 5");
  dir_.Write("other.toml", other);
  AgentProcess& first = Start(0);
  ASSERT_TRUE(OutputHas(first, "holds the coordinator role now", 20s)) << Describe();
  AgentProcess& second = Start(1, "other.toml");
  // One node with each file is a tie (issue 37): neither is known to be the job's, so the
  // refused agent tries again (a holder whose file is outnumbered gives the role up) until its
  // rendezvous timeout, rather than giving up on a job it may belong to.
  ASSERT_TRUE(OutputHas(second,
                        "the coordinator refused this node: node 1 (host 127.0.0.2) runs a different job "
                        "file than the coordinator (host 127.0.0.1):",
                        30s))
      << Describe();
  EXPECT_THAT(second.Output(),
              HasSubstr("restart.max_restarts: node 1 has 5, the coordinator (host 127.0.0.1) has 2"))
      << Describe();
  EXPECT_THAT(second.Output(),
              HasSubstr("(it tries again: as many nodes have come with its job file as with the "
                        "coordinator's"))
      << Describe();
  EXPECT_THAT(second.Output(), Not(HasSubstr("holds the coordinator role now"))) << Describe();
  EXPECT_THAT(first.Output(), Not(HasSubstr("starting"))) << Describe();
  EXPECT_THAT(first.Output(), Not(HasSubstr("it gives the role up so that"))) << Describe();
}

TEST_F(EtcdJobTest, WithEveryEtcdMemberDownTheAgentsSayWhyAndExit3) {
  WriteJob("6s");
  for (int m = 0; m < etcd_->size(); ++m) etcd_->Kill(m);
  std::string toml = dir_.Read("job.toml");
  toml.replace(toml.find("rendezvous = \"60s\""), 18, "rendezvous = \"8s\"");
  dir_.Write("job.toml", toml);
  Start(0);
  Start(1);
  EXPECT_EQ(agent(0).Wait(30s), 3) << Describe();
  EXPECT_EQ(agent(1).Wait(10s), 3) << Describe();
  EXPECT_THAT(agent(1).Output(), HasSubstr(etcd_->ClientUrl(0))) << Describe();
}

// A partition in network namespaces: host A (the coordinator's) is cut off from etcd, which
// runs on host B, but not from B's agent. A must step down before its lease can end and its
// workers must stop; B takes over and finishes the job alone (cluster.min_nodes = 1). The test
// process itself moves into B's namespace, so that etcd and B's agent run there and the
// cluster's health checks reach them. Needs root, iproute2 and iptables; skipped otherwise.
class EtcdPartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    hosts_ = NetnsPair::Create("e", 214, &why);
    DDPRUN_REQUIRE_OR_SKIP("testbed", hosts_ != nullptr, why);
    DDPRUN_REQUIRE_OR_SKIP("testbed", test::CommandExists("iptables"), "iptables is not installed");
    a_ = hosts_->a();
    b_ = hosts_->b();
    addr_a_ = hosts_->addr_a();
    addr_b_ = hosts_->addr_b();
    own_ns_ = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    const int b_ns = ::open(("/var/run/netns/" + b_).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(own_ns_, 0);
    ASSERT_GE(b_ns, 0);
    ASSERT_EQ(::setns(b_ns, CLONE_NEWNET), 0) << std::strerror(errno);
    ::close(b_ns);
    in_b_ = true;

    etcdtest::EtcdCluster::Options options;
    options.host = addr_b_;
    uint16_t next = 23790;
    options.free_port = [&next] { return next++; };  // a namespace of our own: all free
    std::string error;
    etcd_ = etcdtest::EtcdCluster::Start(options, &error);
    ASSERT_TRUE(etcd_) << error;
  }
  void TearDown() override {
    agents_.clear();
    etcd_.reset();
    for (const std::string& ns : hosts_files_) {
      std::error_code ec;
      std::filesystem::remove_all("/etc/netns/" + ns, ec);
    }
    if (in_b_) {
      ::setns(own_ns_, CLONE_NEWNET);
      ::close(own_ns_);
    }
    hosts_.reset();
  }
  std::string Describe() const { return DescribeAgents(agents_) + "\n---- etcd ----\n" + etcd_->Logs(); }

  ScratchDir dir_;
  std::unique_ptr<NetnsPair> hosts_;
  std::string a_, b_, addr_a_, addr_b_;
  std::vector<std::string> hosts_files_;  // namespaces given their own /etc/hosts
  bool in_b_ = false;
  int own_ns_ = -1;
  std::unique_ptr<etcdtest::EtcdCluster> etcd_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

TEST_F(EtcdPartitionTest, ACoordinatorCutOffFromEtcdStepsDownAndItsWorkersStop) {
  std::string endpoints;
  for (const std::string& url : etcd_->ClientUrls())
    endpoints += (endpoints.empty() ? "" : ", ") + TomlString(url);
  std::ostringstream t;
  t << "version = 1\n[job]\nname = \"cut\"\ncommand = [\"sh\", \"-c\", "
    << TomlString(
           "echo $MASTER_ADDR > addr-$RANK-$TORCHELASTIC_RESTART_COUNT; "
           "echo $$ > pid-$RANK-$TORCHELASTIC_RESTART_COUNT; "
           "while [ ! -e finish ]; do sleep 0.1; done")
    << "]\n[cluster]\nnodes = [\"" << addr_a_ << "\", \"" << addr_b_
    << "\"]\nmin_nodes = 1\nmaster_port = 29518\n"
    << "[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = 2\n"
    << "[restart]\nmax_restarts = 2\nbackoff = \"0s\"\n"
    << "[rendezvous]\nbackend = \"etcd\"\nendpoints = [" << endpoints << "]\nlease = \"5s\"\n"
    << "[timeouts]\nrendezvous = \"60s\"\nheartbeat = \"250ms\"\nstop_grace = \"2s\"\nreplace = \"1s\"\n";
  const std::string job = dir_.Write("job.toml", t.str());

  // A first, so that it holds the role; then B (in this namespace).
  agents_.push_back(
      std::make_unique<AgentProcess>(std::vector<std::string>{job}, dir_.path() + "/a.out",
                                     std::map<std::string, std::string>{{"DDPRUN_NODE_RANK", ""}},
                                     std::vector<std::string>{"ip", "netns", "exec", a_}));
  AgentProcess& a = *agents_.back();
  ASSERT_TRUE(
      WaitFor([&] { return a.Output().find("holds the coordinator role now") != std::string::npos; }, 20s))
      << Describe();
  agents_.push_back(
      std::make_unique<AgentProcess>(std::vector<std::string>{job}, dir_.path() + "/b.out",
                                     std::map<std::string, std::string>{{"DDPRUN_NODE_RANK", ""}}));
  AgentProcess& b = *agents_.back();
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("pid-0-0") && dir_.Exists("pid-1-0"); }, 30s)) << Describe();
  EXPECT_EQ(dir_.Read("addr-1-0"), addr_a_ + "\n");
  const pid_t a_worker = WaitForPidFile(dir_, "pid-0-0", 5s);
  ASSERT_GT(a_worker, 0) << Describe();

  // Cut A off from etcd (its packets to etcd's client ports are dropped), not from B.
  const auto cut_at = std::chrono::steady_clock::now();
  for (const std::string& url : etcd_->ClientUrls()) {
    ASSERT_EQ(Shell("ip netns exec " + a_ + " iptables -A OUTPUT -p tcp -d " + addr_b_ + " --dport " +
                    url.substr(url.rfind(':') + 1) + " -j DROP"),
              0);
  }
  ASSERT_TRUE(WaitFor(
      [&] { return a.Output().find("no longer holds the coordinator role") != std::string::npos; }, 10s))
      << Describe();
  const auto stepped_after = std::chrono::steady_clock::now() - cut_at;
  EXPECT_LT(stepped_after, 5s) << "it must let the role go before its 5s lease can end in etcd";
  EXPECT_THAT(a.Output(),
              HasSubstr("this agent no longer holds the coordinator role: it could not renew its etcd "
                        "lease (rendezvous.lease = 5s) in time"))
      << Describe();
  // Its worker stops (its agent lost its coordinator), before B's round starts.
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("addr-0-1"); }, 30s)) << Describe();
  EXPECT_FALSE(ProcessAlive(a_worker)) << Describe();
  EXPECT_EQ(dir_.Read("addr-0-1"), addr_b_ + "\n");  // rank 0 on B, the new coordinator's host
  EXPECT_THAT(b.Output(), HasSubstr("taking over the job from node 0 (" + addr_a_ + ")")) << Describe();

  // Heal, and let the job finish: both agents end with its code.
  Shell("ip netns exec " + a_ + " iptables -F OUTPUT");
  dir_.Write("finish", "");
  EXPECT_EQ(b.Wait(60s), 0) << Describe();
  EXPECT_EQ(a.Wait(60s), 0) << Describe();
  EXPECT_THAT(b.Output(), HasSubstr("exited 0 in round 1 (1 restart used)")) << Describe();
}

// Issue 39.1 under etcd: host names in cluster.nodes on stock hosts, where each host's own name
// is 127.0.1.1. The role's holder used to listen on 127.0.1.1 and the other agent, told
// "ddprun-node-a:PORT" by etcd, could never reach it. Now it listens at its address towards the
// other host, publishes that, and gives it as MASTER_ADDR.
TEST_F(EtcdPartitionTest, HostNamesOnStockHostsWork) {
  for (const auto& [ns, own, other, other_addr] :
       {std::tuple{a_, "ddprun-node-a", "ddprun-node-b", addr_b_},
        std::tuple{b_, "ddprun-node-b", "ddprun-node-a", addr_a_}}) {
    std::filesystem::create_directories("/etc/netns/" + ns);
    hosts_files_.push_back(ns);
    std::ofstream("/etc/netns/" + ns + "/hosts") << "127.0.0.1 localhost\n127.0.1.1 " << own << "\n"
                                                 << other_addr << " " << other << "\n";
  }
  std::string endpoints;
  for (const std::string& url : etcd_->ClientUrls())
    endpoints += (endpoints.empty() ? "" : ", ") + TomlString(url);
  std::ostringstream t;
  t << "version = 1\n[job]\nname = \"names\"\ncommand = [\"sh\", \"-c\", "
    << TomlString("echo $MASTER_ADDR > addr-$RANK; while [ ! -e finish ]; do sleep 0.1; done")
    << "]\n[cluster]\nnodes = [\"ddprun-node-a\", \"ddprun-node-b\"]\nmaster_port = 29519\n"
    << "[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = 2\n"
    << "[rendezvous]\nbackend = \"etcd\"\nendpoints = [" << endpoints << "]\nlease = \"5s\"\n"
    << "[timeouts]\nrendezvous = \"30s\"\nheartbeat = \"250ms\"\nstop_grace = \"2s\"\n";
  const std::string job = dir_.Write("job.toml", t.str());
  auto start = [&](const std::string& ns, const std::string& rank) -> AgentProcess& {
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{job, "--node-rank", rank}, dir_.path() + "/" + rank + ".out",
        std::map<std::string, std::string>{}, std::vector<std::string>{"ip", "netns", "exec", ns}));
    return *agents_.back();
  };
  AgentProcess& a = start(a_, "0");
  ASSERT_TRUE(
      WaitFor([&] { return a.Output().find("holds the coordinator role now") != std::string::npos; }, 20s))
      << Describe();
  EXPECT_THAT(a.Output(),
              HasSubstr("this host's entry \"ddprun-node-a\" (cluster.nodes[0]) is a loopback address on "
                        "this host: /etc/hosts maps ddprun-node-a to 127.0.1.1 (Debian and Ubuntu do "
                        "that for the host's own name); while this agent holds the coordinator role it "
                        "listens on " +
                        addr_a_ +
                        " instead, this host's address towards ddprun-node-b "
                        "(cluster.nodes[1]), and gives every worker MASTER_ADDR=" +
                        addr_a_));
  AgentProcess& b = start(b_, "1");
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("addr-0") && dir_.Exists("addr-1"); }, 30s)) << Describe();
  EXPECT_EQ(dir_.Read("addr-0"), addr_a_ + "\n");
  EXPECT_EQ(dir_.Read("addr-1"), addr_a_ + "\n");
  dir_.Write("finish", "");
  EXPECT_EQ(a.Wait(30s), 0) << Describe();
  EXPECT_EQ(b.Wait(30s), 0) << Describe();
}

}  // namespace
}  // namespace ddprun::e2e
