// Jobs on the multi-host test bed (testbed.h): three hosts with their own names, stock Debian
// /etc/hosts, a management NIC the others cannot reach, firewalls and a shared home; a real
// torch gloo job across them, the job files the README and docs/running.md describe, and
// `ddprun preflight`. Needs root (else each test is skipped, or fails when DDPRUN_REQUIRE names
// testbed, with the reason).

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/harness.h"
#include "tests/e2e/testbed.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

/// The master port: every bed has its own network namespaces, so any port is free there.
constexpr int kMasterPort = 29500;

class MultiHostTest : public ::testing::Test {
 protected:
  void MakeBed(int hosts = 3, bool shared_home = false) {
    TestbedOptions options;
    options.hosts = hosts;
    options.tag = "mh";
    options.shared_home = shared_home;
    std::string why;
    bed_ = Testbed::Create(options, &why);
    DDPRUN_REQUIRE_OR_SKIP("testbed", bed_ != nullptr, why);
  }
  void TearDown() override {
    agents_.clear();  // kills what still runs, before the bed goes
    bed_.reset();
  }
  /// `ddprun args...` on host `i`, as a user would start it there (no node rank given).
  AgentProcess& StartOn(int i, const std::vector<std::string>& args,
                        std::map<std::string, std::string> env = {}) {
    env.emplace("DDPRUN_NODE_RANK", "");  // empty counts as unset
    agents_.push_back(std::make_unique<AgentProcess>(
        args, dir_.path() + "/" + bed_->host(i).name + "-" + std::to_string(agents_.size()) + ".out", env,
        bed_->Prefix(i)));
    return *agents_.back();
  }
  /// cluster.nodes as the README writes it: the hosts' addresses.
  std::string NodesByAddress() const {
    std::string list;
    for (const TestHost& h : bed_->hosts()) list += (list.empty() ? "\"" : ", \"") + h.data_addr + "\"";
    return "[" + list + "]";
  }
  std::string NodesByName() const {
    std::string list;
    for (const TestHost& h : bed_->hosts()) list += (list.empty() ? "\"" : ", \"") + h.name + "\"";
    return "[" + list + "]";
  }
  /// A job file with `cluster` (the [cluster] lines but master_port) and `command`.
  std::string WriteJob(const std::string& cluster, const std::string& command, int nproc = 2,
                       const std::string& extra = "", const std::string& timeouts = "") {
    std::ostringstream t;
    t << "version = 1\n[job]\nname = \"mh\"\ncommand = " << command << "\n"
      << "[cluster]\n"
      << cluster << "master_port = " << kMasterPort << "\n"
      << "[trainer]\naccelerator = \"cpu\"\ndevices = " << nproc << "\nnum_nodes = " << bed_->hosts().size()
      << "\n"
      << "[timeouts]\n"
      << (timeouts.empty() ? "rendezvous = \"30s\"\nheartbeat = \"500ms\"\nstop_grace = \"5s\"\n" : timeouts)
      << extra;
    return bed_->Write("job.toml", t.str());
  }
  std::string Describe() const { return DescribeAgents(agents_); }

  ScratchDir dir_;  // the agents' console output
  std::unique_ptr<Testbed> bed_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

// Issue 27.1: on stock hosts gloo binds what the host's own name resolves to (127.0.1.1), and
// every rank died in init_process_group with "connect [127.0.1.1]:...: Connection refused".
// Each agent now gives its workers the interface its peers reach it at, named differently on
// each host (ens3, eth1, enp2s0), past a management NIC listed first. Issue 39.1: with the
// hosts by name and nothing else, as `ddprun init --nodes` writes them (node 0's own name is
// 127.0.1.1 on its host).
TEST_F(MultiHostTest, TorchGlooJobAcrossThreeStockHostsEndsWithIdenticalWeights) {
  DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing);
  MakeBed();
  if (!bed_) return;
  const std::string job =
      WriteJob("nodes = " + NodesByName() + "\n",
               "[\"/usr/bin/python3\", \"" + std::string(DDPRUN_SOURCE_DIR) +
                   "/examples/ddp_train.py\", \"--steps\", \"4\", \"--result-dir\", \"results\"]",
               2, "", "rendezvous = \"60s\"\nheartbeat = \"1s\"\nstop_grace = \"10s\"\n");
  for (int i = 0; i < 3; ++i) bed_->Write("results/.keep", "");
  for (int i = 2; i >= 0; --i) StartOn(i, {job});
  for (int i = 0; i < 3; ++i) ASSERT_EQ(agents_[static_cast<size_t>(i)]->Wait(240s), 0) << Describe();
  for (int i = 0; i < 3; ++i) {
    const TestHost& h = bed_->host(i);
    // Each host's own name is 127.0.1.1 there: the interface is the one it sends from towards
    // node 0, and node 0's the one it sends from towards the others.
    EXPECT_THAT(agents_[static_cast<size_t>(2 - i)]->Output(),
                HasSubstr("workers' sockets use interface " + h.data_if + " (it holds " + h.data_addr +
                          ", this host's address towards " +
                          (i == 0 ? "gpu-02 (cluster.nodes[1])" : "master_addr gpu-01") +
                          "): GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME set"));
  }
  nlohmann::json reference;
  for (int rank = 0; rank < 6; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::string text = bed_->Read(rank / 2, "results/rank-" + std::to_string(rank) + "-attempt-0.json");
    ASSERT_FALSE(text.empty()) << Describe();
    const auto result = nlohmann::json::parse(text);
    EXPECT_EQ(result["world"], 6);
    EXPECT_EQ(result["all_reduce"], 21.0);
    if (rank == 0) {
      reference = result["weights"];
    } else {
      EXPECT_EQ(result["weights"], reference) << "DDP replicas diverged";
    }
  }
}

// What each rank writes in the shell jobs below: where it ran and what it was given.
constexpr const char* kWhereAmI =
    "[\"sh\", \"-c\", \"echo $RANK $(hostname) $MASTER_ADDR $GLOO_SOCKET_IFNAME > out-$RANK\"]";

// Issue 39.1: nodes = ["gpu-01", ...] and nothing else, on stock hosts. Node 0 used to exit 3 in
// a second ("cluster.master_addr "gpu-01" ... is a loopback address on this host") and the
// others retried until their rendezvous timeout. Now node 0 listens at its address towards the
// other hosts (the data NIC, not the management NIC listed first), and that address is every
// worker's MASTER_ADDR; `check` on node 0 says so ahead.
TEST_F(MultiHostTest, HostNamesOnStockHostsJustWork) {
  MakeBed();
  if (!bed_) return;
  const std::string job = WriteJob("nodes = " + NodesByName() + "\n", kWhereAmI, 1);
  const std::string master = bed_->host(0).data_addr;
  const std::string what =
      "cluster.master_addr \"gpu-01\" (cluster.nodes[0]) is a loopback address on this host: /etc/hosts "
      "maps gpu-01 to 127.0.1.1 (Debian and Ubuntu do that for the host's own name); node 0 ";
  AgentProcess& check = StartOn(0, {"check", job});
  ASSERT_EQ(check.Wait(15s), 0) << check.Output();
  EXPECT_THAT(check.Output(),
              HasSubstr("note: " + what + "will listen on " + master +
                        " instead, this host's address towards gpu-02 (cluster.nodes[1]), and "
                        "will give every worker MASTER_ADDR=" +
                        master + "\n"));
  agents_.clear();

  for (int i = 2; i >= 0; --i) StartOn(i, {job});
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(30s), 0) << Describe();
  EXPECT_THAT(agents_[2]->Output(), HasSubstr(what + "listens on " + master +
                                              " instead, this host's address "
                                              "towards gpu-02 (cluster.nodes[1]), and gives every worker "
                                              "MASTER_ADDR=" +
                                              master));
  EXPECT_THAT(agents_[2]->Output(),
              HasSubstr("workers' sockets use interface " + bed_->host(0).data_if + " (it holds " + master +
                        ", this host's address towards gpu-02 "
                        "(cluster.nodes[1]))"));
  for (int rank = 0; rank < 3; ++rank) {
    const TestHost& h = bed_->host(rank);
    EXPECT_EQ(bed_->Read(rank, "out-" + std::to_string(rank)),
              std::to_string(rank) + " " + h.name + " " + master + " " + h.data_if + "\n")
        << Describe();
  }
}

// Issue 27.3: the earlier fix, master_addr set to node 0's address beside host names, used to
// leave node 0 unable to join its own job ("refused a connection from <its own address>: not
// one of cluster.nodes") until the rendezvous timeout.
TEST_F(MultiHostTest, HostNamesWithNodeZerosAddressAsMasterAddrWork) {
  MakeBed();
  if (!bed_) return;
  const std::string job = WriteJob(
      "nodes = " + NodesByName() + "\nmaster_addr = \"" + bed_->host(0).data_addr + "\"\n", kWhereAmI, 1);
  for (int i = 2; i >= 0; --i) StartOn(i, {job});
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(30s), 0) << Describe();
  EXPECT_THAT(agents_[2]->Output(), Not(HasSubstr("refused a connection")));
  EXPECT_THAT(agents_[2]->Output(), Not(HasSubstr("loopback")));
  for (int rank = 0; rank < 3; ++rank) {
    const TestHost& h = bed_->host(rank);
    EXPECT_EQ(bed_->Read(rank, "out-" + std::to_string(rank)),
              std::to_string(rank) + " " + h.name + " " + bed_->host(0).data_addr + " " + h.data_if + "\n")
        << Describe();
  }
  // The host name is 127.0.1.1 on its own host, so the interface comes from the route.
  EXPECT_THAT(agents_[0]->Output(),
              HasSubstr("workers' sockets use interface " + bed_->host(2).data_if + " (it holds " +
                        bed_->host(2).data_addr + ", this host's address towards master_addr " +
                        bed_->host(0).data_addr + ")"));
}

TEST_F(MultiHostTest, HostNamesWorkWhenNodeZerosNameMapsToItsAddressInEtcHosts) {
  MakeBed();
  if (!bed_) return;
  // The hint's other fix, as an administrator makes it: node 0's own line in place of 127.0.1.1.
  std::string hosts = bed_->StockHostsFile(0);
  const std::string own = "127.0.1.1\tgpu-01\n";
  ASSERT_NE(hosts.find(own), std::string::npos);
  hosts.replace(hosts.find(own), own.size(), bed_->host(0).data_addr + "\tgpu-01\n");
  bed_->SetHostsFile(0, hosts);
  const std::string job = WriteJob("nodes = " + NodesByName() + "\n", kWhereAmI, 1);
  for (int i = 2; i >= 0; --i) StartOn(i, {job});
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(30s), 0) << Describe();
  for (int rank = 0; rank < 3; ++rank) {
    const TestHost& h = bed_->host(rank);
    EXPECT_EQ(bed_->Read(rank, "out-" + std::to_string(rank)),
              std::to_string(rank) + " " + h.name + " gpu-01 " + h.data_if + "\n")
        << Describe();
  }
}

// Issue 27.2: a firewall on node 0 that lets only master_port through. Rendezvous succeeded,
// round 0 started and the ranks waited in init_process_group for gloo's 30 minutes, without a
// word. Now the agents probe each other before round 0, and the job ends at once naming the
// pairs, the port and the fix.
TEST_F(MultiHostTest, AFirewallThatOpensOnlyMasterPortStopsTheJobBeforeRoundZeroNamingThePairs) {
  MakeBed();
  if (!bed_) return;
  ASSERT_TRUE(bed_->AcceptTcpOnly(0, {kMasterPort}));
  const std::string job = WriteJob("nodes = " + NodesByAddress() + "\n", "[\"true\"]", 1);
  for (int i = 2; i >= 0; --i) StartOn(i, {job});
  const auto started = std::chrono::steady_clock::now();
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(30s), 3) << Describe();
  // One connect timeout (3 s) and the answers: well before the 30 s rendezvous timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - started, 15s);
  for (auto& agent : agents_) {
    const std::string out = agent->Output();
    EXPECT_THAT(out, HasSubstr("round 0 not started: pairs of nodes cannot connect on a port other than "
                               "master_port, as gloo and NCCL must (they would wait in init_process_group "
                               "until their timeout):\n  node 1 (10.215.0.2) cannot connect to node 0 "
                               "(10.215.0.1) at 10.215.0.1:"));
    EXPECT_THAT(out, HasSubstr(": timed out (a firewall drops it)\n  node 2 (10.215.0.3) cannot connect to "
                               "node 0 (10.215.0.1) at 10.215.0.1:"));
    EXPECT_THAT(out, HasSubstr("fix: gloo and NCCL connect between all nodes on ports they pick, not only "
                               "master_port: let TCP from the job's nodes through the firewall of each node "
                               "named above"));
    EXPECT_THAT(out, Not(HasSubstr("starting 1 worker")));
  }
  // Node 0 itself reaches the others: no pair from node 0, and none between nodes 1 and 2.
  EXPECT_THAT(agents_[2]->Output(), Not(HasSubstr("node 0 (10.215.0.1) cannot connect")));
  EXPECT_THAT(agents_[2]->Output(), Not(HasSubstr("cannot connect to node 2")));
}

// rendezvous.probe = "warn": the job starts, gloo hangs in init_process_group, and the hang
// verdict (the ranks never sent a first progress beacon) names the failed probe as the cause.
TEST_F(MultiHostTest, UnderWarnAHangAfterAFailedProbeNamesTheProbeAsTheLikelyCause) {
  DDPRUN_REQUIRE_OR_SKIP("torch", test::TorchAvailable(), test::kTorchMissing);
  MakeBed(2);
  if (!bed_) return;
  ASSERT_TRUE(bed_->AcceptTcpOnly(0, {kMasterPort}));
  const std::string job =
      WriteJob("nodes = " + NodesByAddress() + "\n",
               "[\"/usr/bin/python3\", \"" + std::string(DDPRUN_SOURCE_DIR) +
                   "/examples/ddp_train.py\", \"--steps\", \"2\", \"--result-dir\", \".\"]",
               1, "[rendezvous]\nprobe = \"warn\"\n",
               "rendezvous = \"60s\"\nheartbeat = \"500ms\"\nstop_grace = \"3s\"\nprogress = \"30s\"\n"
               "progress_start = \"10s\"\n");
  StartOn(1, {job});
  StartOn(0, {job});
  EXPECT_EQ(agents_[1]->Wait(120s), 1) << Describe();
  EXPECT_EQ(agents_[0]->Wait(30s), 1) << Describe();
  const std::string out = agents_[1]->Output();
  EXPECT_THAT(
      out, HasSubstr("some nodes cannot connect on a port other than master_port; gloo and NCCL will "
                     "likely hang in init_process_group (rendezvous.probe = \"warn\" starts round 0 "
                     "anyway):\n  node 1 (10.215.0.2) cannot connect to node 0 (10.215.0.1) at 10.215.0.1:"));
  EXPECT_THAT(out, HasSubstr("hung: no progress for"));
  EXPECT_THAT(agents_[0]->Output(),
              HasSubstr("  likely cause: before round 0 some nodes could not connect on a "
                        "port other than master_port (rendezvous.probe = \"warn\" started "
                        "the job anyway), so gloo and NCCL cannot connect either:\n"
                        "    node 1 (10.215.0.2) cannot connect to node 0 (10.215.0.1) at "
                        "10.215.0.1:"));
}

// Issue 27.4: a logs.dir on a folder every node shares (an NFS home). Each node writes its own
// run folder; `latest` named whichever agent started last, and the summary's `logs:` line (and a
// hang's stacks path) pointed into that node's folder. Now each node has its own link,
// latest-n<node>, and the summary names the root cause's node.
TEST_F(MultiHostTest, OnASharedLogsFolderTheSummaryPointsAtTheFailedRanksNode) {
  MakeBed(3, /*shared_home=*/true);
  if (!bed_) return;
  const std::string job = WriteJob("nodes = " + NodesByAddress() + "\n",
                                   "[\"sh\", \"-c\", \"echo rank $RANK here; [ $RANK != 3 ]\"]", 2);
  // Node 0 starts last, so a single `latest` would name node 0's folder.
  StartOn(1, {job});
  StartOn(2, {job});
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(
        WaitFor([&] { return agents_[i]->Output().find("logs of this run") != std::string::npos; }, 10s));
  }
  StartOn(0, {job});
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(30s), 1) << Describe();
  // The failed rank's file, on the node (and host) that ran it.
  for (auto& agent : agents_) {
    EXPECT_THAT(agent->Output(),
                ContainsRegex(R"(logs: logs/mh/latest-n1/attempt-0/rank-3\.log on node 1 \([^)]+\), )"
                              R"(in its job file's folder; each node keeps its own runs under )"
                              R"(logs/mh/latest-n<node>)"))
        << Describe();
  }
  // Every host sees the same folder; the line's folder holds the failed rank's log.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(bed_->Read(i, "logs/mh/latest-n1/attempt-0/rank-3.log"), "rank 3 here\n");
  }
  // The others were stopped, perhaps before they wrote a word; their logs are where their
  // node's link says.
  EXPECT_TRUE(std::filesystem::exists(bed_->HomeOf(0) + "/logs/mh/latest-n0/attempt-0/rank-0.log"));
  EXPECT_TRUE(std::filesystem::exists(bed_->HomeOf(0) + "/logs/mh/latest-n2/attempt-0/rank-5.log"));
  for (int node = 0; node < 3; ++node) {
    const std::string link =
        std::filesystem::read_symlink(bed_->HomeOf(0) + "/logs/mh/latest-n" + std::to_string(node)).string();
    EXPECT_THAT(link, HasSubstr("-n" + std::to_string(node) + "-")) << "relative, to this node's own run";
  }
  EXPECT_THAT(agents_[2]->Output(), HasSubstr("(also logs/mh/latest-n0)"));
}

// `ddprun preflight` on every host of the bed: all pairs reachable on stock hosts; with node 0's
// firewall open only for master_port, the pairs that cannot reach node 0 and the fix.
TEST_F(MultiHostTest, PreflightAcrossTheHostsFindsAFirewallThatOpensOnlyMasterPort) {
  MakeBed();
  if (!bed_) return;
  const std::string job = WriteJob("nodes = " + NodesByAddress() + "\n", "[\"false\"]", 1);
  for (int i = 2; i >= 0; --i) StartOn(i, {"preflight", job});
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(60s), 0) << Describe();
  const std::string ok = agents_[2]->Output();
  EXPECT_THAT(ok, HasSubstr("  n0       -            reachable    reachable   \n"));
  EXPECT_THAT(ok, HasSubstr("\npreflight: OK\n"));
  agents_.clear();

  ASSERT_TRUE(bed_->AcceptTcpOnly(0, {kMasterPort}));
  for (int i = 2; i >= 0; --i) StartOn(i, {"preflight", job});
  EXPECT_EQ(agents_[2]->Wait(90s), 1) << Describe();
  for (size_t i = 0; i < 2; ++i) agents_[i]->Wait(30s);
  const std::string out = agents_[2]->Output();
  EXPECT_THAT(out, HasSubstr("node 1 (10.215.0.2) cannot reach node 0 (10.215.0.1) over TCP"));
  EXPECT_THAT(out, HasSubstr("node 2 (10.215.0.3) cannot reach node 0 (10.215.0.1) over TCP"));
  EXPECT_THAT(out, HasSubstr("fix: open TCP ports on node 0 for node 1"));
}

}  // namespace
}  // namespace ddprun::e2e
