// Two hosts on one machine: a 2-node job across two network namespaces with their own
// addresses, and the master port blocked by a firewall rule (REJECT and DROP) in one of them.
// Needs root, iproute2 and iptables; otherwise each test says it was skipped and why. All
// traffic stays inside the namespaces the test creates.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    hosts_ = NetnsPair::Create("", 213, &why);
    DDPRUN_REQUIRE_OR_SKIP("testbed", hosts_ != nullptr, why);
    DDPRUN_REQUIRE_OR_SKIP("testbed", test::CommandExists("iptables"), "iptables is not installed");
    a_ = hosts_->a();
    b_ = hosts_->b();
    addr_a_ = hosts_->addr_a();
    addr_b_ = hosts_->addr_b();
  }
  void TearDown() override {
    agents_.clear();  // kills what still runs, inside the namespaces
    hosts_.reset();
    for (const auto& ns : hosts_files_) {
      std::error_code ec;
      std::filesystem::remove_all("/etc/netns/" + ns, ec);
    }
  }
  /// Gives namespace `ns` its own /etc/hosts: `ip netns exec` bind-mounts /etc/netns/NS/hosts
  /// over /etc/hosts for the commands it runs.
  void WriteHostsFile(const std::string& ns, const std::string& text) {
    std::filesystem::create_directories("/etc/netns/" + ns);
    std::ofstream("/etc/netns/" + ns + "/hosts") << text;
    hosts_files_.push_back(ns);
  }
  std::string WriteJob(const std::string& script, const std::string& rendezvous) {
    std::ostringstream t;
    t << "version = 1\n[job]\nname = \"netns\"\ncommand = [\"sh\", \"-c\", \"" << script << "\"]\n"
      << "[cluster]\nnodes = [\"" << addr_a_ << "\", \"" << addr_b_ << "\"]\nmaster_port = " << kPort << "\n"
      << "[trainer]\naccelerator = \"cpu\"\ndevices = 2\nnum_nodes = 2\n"
      << "[timeouts]\nrendezvous = \"" << rendezvous << "\"\nheartbeat = \"250ms\"\nstop_grace = \"2s\"\n";
    return dir_.Write("job.toml", t.str());
  }
  /// An agent inside namespace `ns`, finding its node rank from its own address.
  AgentProcess& StartIn(const std::string& ns, const std::string& job) { return RunIn(ns, {job}); }
  /// `ddprun args...` inside namespace `ns`.
  AgentProcess& RunIn(const std::string& ns, const std::vector<std::string>& args) {
    agents_.push_back(std::make_unique<AgentProcess>(
        args, dir_.path() + "/" + ns + "-" + std::to_string(agents_.size()) + ".out",
        std::map<std::string, std::string>{{"DDPRUN_NODE_RANK", ""}},
        std::vector<std::string>{"ip", "netns", "exec", ns}));
    return *agents_.back();
  }

  static constexpr int kPort = 29517;
  ScratchDir dir_;
  std::unique_ptr<NetnsPair> hosts_;
  std::string a_, b_, addr_a_, addr_b_;
  std::vector<std::string> hosts_files_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

TEST_F(NetnsTest, TwoHostsRunTheJobAndFindTheirRanksFromTheirAddresses) {
  const std::string job = WriteJob("echo $RANK $GROUP_RANK $MASTER_ADDR > out-$RANK", "20s");
  AgentProcess& node0 = StartIn(a_, job);
  AgentProcess& node1 = StartIn(b_, job);
  EXPECT_EQ(node1.Wait(30s), 0) << node0.Output() << node1.Output();
  EXPECT_EQ(node0.Wait(30s), 0) << node0.Output();
  EXPECT_EQ(dir_.Read("out-0"), "0 0 " + addr_a_ + "\n");
  EXPECT_EQ(dir_.Read("out-3"), "3 1 " + addr_a_ + "\n");
  EXPECT_THAT(node1.Output(), HasSubstr("node 1 of 2 (" + addr_b_ + ")"));
  EXPECT_THAT(node0.Output(), HasSubstr("node 1 (" + addr_b_ + ") joined from " + addr_b_));
}

TEST_F(NetnsTest, AMasterPortRejectedByAFirewallIsNamedAndTheJobExits3) {
  ASSERT_EQ(Shell("ip netns exec " + a_ + " iptables -A INPUT -p tcp -s " + addr_b_ + " --dport " +
                  std::to_string(kPort) + " -j REJECT --reject-with tcp-reset"),
            0);
  const std::string job = WriteJob("true", "3s");
  AgentProcess& node0 = StartIn(a_, job);
  AgentProcess& node1 = StartIn(b_, job);
  EXPECT_EQ(node1.Wait(20s), 3) << node1.Output();
  EXPECT_EQ(node0.Wait(20s), 3) << node0.Output();
  EXPECT_THAT(node1.Output(),
              HasSubstr("connection to " + addr_a_ + ":" + std::to_string(kPort) + " refused"));
  EXPECT_THAT(node1.Output(), HasSubstr("a firewall rejects TCP port " + std::to_string(kPort)));
  EXPECT_THAT(node0.Output(), HasSubstr("never joined: node 1 (" + addr_b_ + ")"));
}

TEST_F(NetnsTest, AMasterPortDroppedByAFirewallTimesOutWithAdviceAndTheJobExits3) {
  ASSERT_EQ(Shell("ip netns exec " + a_ + " iptables -A INPUT -p tcp -s " + addr_b_ + " --dport " +
                  std::to_string(kPort) + " -j DROP"),
            0);
  const std::string job = WriteJob("true", "4s");
  AgentProcess& node0 = StartIn(a_, job);
  AgentProcess& node1 = StartIn(b_, job);
  EXPECT_EQ(node1.Wait(20s), 3) << node1.Output();
  EXPECT_EQ(node0.Wait(20s), 3) << node0.Output();
  EXPECT_THAT(node1.Output(), HasSubstr("connection to " + addr_a_ + ":" + std::to_string(kPort) +
                                        " timed out: a firewall drops TCP port " + std::to_string(kPort)));
  EXPECT_THAT(node1.Output(), HasSubstr("open TCP port " + std::to_string(kPort) + " on " + addr_a_));
}

// Issue 12.2: Debian and Ubuntu map the host's own name to 127.0.1.1 in /etc/hosts. With that
// name as master_addr, node 0 used to listen on 127.0.1.1 and every other node got "connection
// refused" until the rendezvous timeout. Node 0 now listens at its address towards the listed
// hosts (issue 39.1, multihost_test.cc); with no host listed (only nnodes) it has none, and node
// 0 (and `check`, and `preflight`) say why at once.
TEST_F(NetnsTest, AMasterNameThatResolvesToLoopbackWithNoListedHostsFailsAtOnceWithTheCauseAndTheFix) {
  WriteHostsFile(a_, "127.0.0.1 localhost\n127.0.1.1 ddprun-node-a\n" + addr_b_ + " ddprun-node-b\n");
  WriteHostsFile(b_, "127.0.0.1 localhost\n" + addr_a_ + " ddprun-node-a\n127.0.1.1 ddprun-node-b\n");
  std::ostringstream t;
  t << "version = 1\n[job]\nname = \"netns\"\ncommand = [\"true\"]\n"
    << "[cluster]\nnnodes = 2\nmaster_addr = \"ddprun-node-a\"\nmaster_port = " << kPort << "\n"
    << "[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = 2\n"
    << "[timeouts]\nrendezvous = \"20s\"\nheartbeat = \"250ms\"\nstop_grace = \"2s\"\n";
  const std::string job = dir_.Write("job.toml", t.str());
  const std::string problem =
      "cluster.master_addr \"ddprun-node-a\" is a loopback address on this host: "
      "/etc/hosts maps ddprun-node-a to 127.0.1.1 (Debian and Ubuntu do that for the host's own name); "
      "node 0 would listen on 127.0.1.1, where no other node can reach it, and another node would "
      "connect to itself\nhint: set cluster.master_addr to an address of node 0 that the other nodes "
      "reach (this host has " +
      addr_a_ +
      "), or map ddprun-node-a to that address in /etc/hosts on every node "
      "(on this host in place of 127.0.1.1)";
  AgentProcess& node1 = RunIn(b_, {job, "--node-rank", "1"});
  AgentProcess& node0 = RunIn(a_, {job, "--node-rank", "0"});
  // At once: well before the 20 s rendezvous timeout that the old behaviour ran into.
  EXPECT_EQ(node0.Wait(10s), 3) << node0.Output();
  EXPECT_THAT(node0.Output(), HasSubstr("ddprun cannot start node 0's coordinator: " + problem));
  EXPECT_THAT(node1.Output(), Not(HasSubstr("loopback")));  // from node 1, master_addr is fine

  AgentProcess& check = RunIn(a_, {"check", job});
  EXPECT_EQ(check.Wait(10s), 0) << check.Output();
  EXPECT_THAT(check.Output(), HasSubstr("warning: " + problem + "\n"));
  AgentProcess& preflight = RunIn(a_, {"preflight", job, "--node-rank", "0"});
  EXPECT_EQ(preflight.Wait(10s), 3) << preflight.Output();
  EXPECT_THAT(preflight.Output(), HasSubstr("ddprun cannot start node 0's coordinator: " + problem));
}

}  // namespace
}  // namespace ddprun::e2e
