// Which interface a node's workers bind their sockets to (runner/io/net_interfaces.h), from
// the host's interfaces, its cluster.nodes entry and its route to master_addr, and the agent's
// line that names it.

#include "runner/io/net_interfaces.h"

#include <gtest/gtest.h>

namespace ddprun::io {
namespace {

// A stock server: loopback, a management NIC listed first, the data NIC, IPv6 link-local.
const std::vector<LocalInterface> kHost = {
    {"lo", "127.0.0.1"}, {"eno1", "192.168.7.11"}, {"ens3", "10.77.0.2"}, {"lo", "::1"}, {"ens3", "fe80::2"}};

TEST(ChooseSocketInterface, TheInterfaceThatHoldsThisNodesListedAddress) {
  const auto chosen =
      ChooseSocketInterface(kHost, {"10.77.0.2"}, "cluster.nodes[1]", "10.77.0.2", "master_addr 10.77.0.1");
  ASSERT_TRUE(chosen);
  EXPECT_EQ(chosen->name, "ens3");
  EXPECT_EQ(chosen->address, "10.77.0.2");
  EXPECT_EQ(chosen->reason, "it holds 10.77.0.2, cluster.nodes[1]");
}

TEST(ChooseSocketInterface, TheListedAddressWinsOverTheRouteToTheMaster) {
  // The master is reached over the management network, the peers list the data address.
  const auto chosen =
      ChooseSocketInterface(kHost, {"10.77.0.2"}, "cluster.nodes[1]", "192.168.7.11", "master_addr m");
  ASSERT_TRUE(chosen);
  EXPECT_EQ(chosen->name, "ens3");
}

TEST(ChooseSocketInterface, AHostNameOnLoopbackFallsBackToTheRouteToTheMaster) {
  // nodes = ["gpu-01", "gpu-02"] on stock hosts: gpu-02 is 127.0.1.1 on gpu-02 itself.
  const auto chosen =
      ChooseSocketInterface(kHost, {"127.0.1.1"}, "cluster.nodes[1]", "10.77.0.2", "master_addr 10.77.0.1");
  ASSERT_TRUE(chosen);
  EXPECT_EQ(chosen->name, "ens3");
  EXPECT_EQ(chosen->reason, "it holds 10.77.0.2, this host's address towards master_addr 10.77.0.1");
}

TEST(ChooseSocketInterface, AListedAddressOfAnotherHostFallsBackToTheRoute) {
  const auto chosen =
      ChooseSocketInterface(kHost, {"10.77.0.9"}, "cluster.nodes[1]", "10.77.0.2", "master_addr x");
  ASSERT_TRUE(chosen);
  EXPECT_EQ(chosen->name, "ens3");
}

TEST(ChooseSocketInterface, TheFirstListedAddressThatThisHostHolds) {
  const auto chosen =
      ChooseSocketInterface(kHost, {"127.0.1.1", "10.1.1.1", "192.168.7.11"}, "cluster.nodes[0]", "", "");
  ASSERT_TRUE(chosen);
  EXPECT_EQ(chosen->name, "eno1");
}

TEST(ChooseSocketInterface, LoopbackOnlyThroughTheRouteToAMasterOnThisMachine) {
  // Agents of one machine (tests, a laptop): master_addr 127.0.0.1.
  const auto chosen =
      ChooseSocketInterface(kHost, {"127.0.0.1"}, "cluster.nodes[0]", "127.0.0.1", "master_addr 127.0.0.1");
  ASSERT_TRUE(chosen);
  EXPECT_EQ(chosen->name, "lo");
}

TEST(ChooseSocketInterface, NothingWhenNoInterfaceHoldsEitherAddress) {
  EXPECT_FALSE(ChooseSocketInterface(kHost, {"10.9.9.9"}, "cluster.nodes[0]", "", "master_addr x"));
  EXPECT_FALSE(ChooseSocketInterface(kHost, {}, "", "10.9.9.9", "master_addr x"));
  EXPECT_FALSE(ChooseSocketInterface({}, {"10.77.0.2"}, "cluster.nodes[0]", "10.77.0.2", "master_addr x"));
}

TEST(RouteSourceAddress, LoopbackIsReachedFromLoopback) {
  EXPECT_EQ(RouteSourceAddress("127.0.0.1", 9), "127.0.0.1");
  EXPECT_EQ(RouteSourceAddress("not an address", 9), "");
}

JobSpec TwoNodes() {
  JobSpec spec;
  spec.cluster.nnodes = 2;
  spec.cluster.master_addr = "10.77.0.1";
  return spec;
}

TEST(DescribeSocketInterface, NamesTheInterfaceWhatIsSetAndWhatIsKept) {
  JobSpec spec = TwoNodes();
  const SocketInterface ens3{"ens3", "10.77.0.2", "it holds 10.77.0.2, cluster.nodes[1]"};
  SocketInterfaceNote note = DescribeSocketInterface(spec, {}, ens3);
  EXPECT_FALSE(note.warning);
  EXPECT_EQ(note.text,
            "workers' sockets use interface ens3 (it holds 10.77.0.2, cluster.nodes[1]): "
            "GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME set");
  spec.job.env["TP_SOCKET_IFNAME"] = "ib0";
  note = DescribeSocketInterface(spec, {{"NCCL_SOCKET_IFNAME", "=ib0"}}, ens3);
  EXPECT_EQ(note.text,
            "workers' sockets use interface ens3 (it holds 10.77.0.2, cluster.nodes[1]): "
            "GLOO_SOCKET_IFNAME set; NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME kept as set");
}

TEST(DescribeSocketInterface, WarnsWhenNoInterfaceIsKnown) {
  const SocketInterfaceNote note =
      DescribeSocketInterface(TwoNodes(), {{"GLOO_SOCKET_IFNAME", "eth0"}}, std::nullopt);
  EXPECT_TRUE(note.warning);
  EXPECT_EQ(
      note.text,
      "cannot tell which interface the other nodes reach this node at (no interface holds this node's "
      "cluster.nodes address or routes to master_addr 10.77.0.1); gloo and NCCL pick their own: if ranks "
      "cannot connect, set NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME to that interface in this agent's "
      "environment");
}

TEST(DescribeSocketInterface, SaysNothingForOneAgentOrWhenTheUserSetEveryName) {
  JobSpec one;
  one.cluster.nnodes = 1;
  EXPECT_EQ(DescribeSocketInterface(one, {}, std::nullopt).text, "");
  const std::map<std::string, std::string> all = {
      {"GLOO_SOCKET_IFNAME", "eth0"}, {"NCCL_SOCKET_IFNAME", "=eth0"}, {"TP_SOCKET_IFNAME", "eth0"}};
  EXPECT_EQ(DescribeSocketInterface(TwoNodes(), all, std::nullopt).text, "");
}

}  // namespace
}  // namespace ddprun::io
