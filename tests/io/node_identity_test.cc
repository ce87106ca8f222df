// This node's rank from the flag, DDPRUN_NODE_RANK or its own addresses, the hosts file reader
// and the loopback master check's early answers (runner/io/node_identity.h), word for word.
#include "runner/io/node_identity.h"

#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/host_name.h"
#include "tests/support/scoped_env.h"

namespace ddprun::io {
namespace {

using test::ScopedEnv;

JobSpec Nodes(std::vector<std::string> nodes) {
  JobSpec spec;
  spec.cluster.nnodes = static_cast<int>(nodes.size());
  spec.cluster.nodes = std::move(nodes);
  return spec;
}

TEST(DetectNodeRankTest, TheFlagWinsAndIsChecked) {
  ScopedEnv rank("DDPRUN_NODE_RANK", "0");
  const JobSpec spec = Nodes({"203.0.113.1", "203.0.113.2"});
  auto detected = DetectNodeRank(spec, 1);
  ASSERT_TRUE(detected);
  EXPECT_EQ(detected->rank, 1);
  EXPECT_EQ(detected->how, "--node-rank");
  EXPECT_EQ(detected->warning, "");
  EXPECT_EQ(DetectNodeRank(spec, 2).error(),
            "node rank 2 from --node-rank is out of range: the job has 2 nodes (ranks 0..1)");
  JobSpec with_spare = spec;
  with_spare.cluster.spares = 1;
  EXPECT_TRUE(DetectNodeRank(with_spare, 2));
  EXPECT_EQ(DetectNodeRank(with_spare, 3).error(),
            "node rank 3 from --node-rank is out of range: the job has 2 nodes (ranks 0..1) and 1 spare "
            "(ranks 2..2)");
}

TEST(DetectNodeRankTest, TheVariableComesNextAndABadOneIsAnError) {
  ScopedEnv slurm("SLURM_NODEID", "0");
  const JobSpec spec = Nodes({"203.0.113.1", "203.0.113.2"});
  {
    ScopedEnv rank("DDPRUN_NODE_RANK", "1");
    auto detected = DetectNodeRank(spec, std::nullopt);
    ASSERT_TRUE(detected);
    EXPECT_EQ(detected->rank, 1);
    EXPECT_EQ(detected->how, "DDPRUN_NODE_RANK");
  }
  {
    ScopedEnv rank("DDPRUN_NODE_RANK", "one");
    EXPECT_EQ(DetectNodeRank(spec, std::nullopt).error(),
              "DDPRUN_NODE_RANK=\"one\" is not a node rank (a non-negative integer)");
  }
  {
    ScopedEnv rank("DDPRUN_NODE_RANK", "7");
    EXPECT_EQ(DetectNodeRank(spec, std::nullopt).error(),
              "node rank 7 from DDPRUN_NODE_RANK is out of range: the job has 2 nodes (ranks 0..1)");
  }
}

TEST(DetectNodeRankTest, EmptyVariablesCountAsUnsetAndUnlistedNodesNeedARank) {
  ScopedEnv rank("DDPRUN_NODE_RANK", "");
  ScopedEnv slurm("SLURM_NODEID", "");
  JobSpec spec;
  spec.cluster.nnodes = 2;
  EXPECT_EQ(DetectNodeRank(spec, std::nullopt).error(),
            "cannot tell this node's rank: cluster.nodes is not listed (only nnodes); pass --node-rank N or "
            "set DDPRUN_NODE_RANK on each node");
}

// 127.0.0.1 is an address of every host (loopback); 203.0.113.0/24 (TEST-NET-3, documentation only) is of
// none.
TEST(DetectNodeRankByHostTest, ThisHostsAddressFindsItsEntry) {
  auto detected = DetectNodeRankByHost(Nodes({"203.0.113.1", "127.0.0.1"}));
  ASSERT_TRUE(detected) << detected.error();
  EXPECT_EQ(detected->rank, 1);
  EXPECT_EQ(detected->how, fmt::format("this host ({}) is cluster.nodes[1]", LocalHostName()));
}

TEST(DetectNodeRankByHostTest, ASpareIsRankedAfterTheNodes) {
  JobSpec spec = Nodes({"203.0.113.1", "203.0.113.2"});
  spec.cluster.spares = 2;
  spec.cluster.spare_hosts = {"203.0.113.3", "127.0.0.1"};
  auto detected = DetectNodeRankByHost(spec);
  ASSERT_TRUE(detected) << detected.error();
  EXPECT_EQ(detected->rank, 3);
  EXPECT_EQ(detected->how, fmt::format("this host ({}) is cluster.spares[1]", LocalHostName()));
}

TEST(DetectNodeRankByHostTest, TheShortNameMatchesAnotherDomain) {
  const std::string host = LocalHostName();
  ASSERT_FALSE(host.empty());
  const std::string short_host = host.substr(0, host.find('.'));
  auto detected = DetectNodeRankByHost(Nodes({"203.0.113.1", short_host + ".cluster.invalid"}));
  ASSERT_TRUE(detected) << detected.error();
  EXPECT_EQ(detected->rank, 1);
}

TEST(DetectNodeRankByHostTest, NoMatchOrSeveralMatchesAreErrors) {
  EXPECT_EQ(
      DetectNodeRankByHost(Nodes({"127.0.0.1", "203.0.113.2", "127.0.0.1"})).error(),
      "cannot tell this node's rank: this host matches several entries of cluster.nodes (positions 0, 2); "
      "pass --node-rank N");
  const std::string unlisted = DetectNodeRankByHost(Nodes({"203.0.113.1", "203.0.113.2"})).error();
  EXPECT_EQ(unlisted.rfind(
                fmt::format("cannot tell this node's rank: this host ({}, addresses ", LocalHostName()), 0),
            0u)
      << unlisted;
  EXPECT_NE(unlisted.find("127.0.0.1"), std::string::npos) << unlisted;
  EXPECT_NE(unlisted.find(") is not in cluster.nodes [203.0.113.1, 203.0.113.2]; pass --node-rank N or set "
                          "DDPRUN_NODE_RANK"),
            std::string::npos)
      << unlisted;
}

TEST(IsAddressLikeTest, AddressesAreNotNames) {
  EXPECT_TRUE(IsAddressLike("10.0.0.1"));
  EXPECT_TRUE(IsAddressLike("::1"));
  EXPECT_TRUE(IsAddressLike("fe80::2"));
  EXPECT_FALSE(IsAddressLike("gpu-01"));
  EXPECT_FALSE(IsAddressLike("gpu-01.example.com"));
  EXPECT_FALSE(IsAddressLike("1e100.net"));
}

TEST(HostsFileEntryTest, FindsANameOrAliasWithoutCaseAndSkipsComments) {
  const std::string hosts =
      "127.0.0.1\tlocalhost\n"
      "# 10.0.0.9 gpu-03\n"
      "127.0.1.1 Gpu-02.example.com gpu-02   # the host's own name, as Debian writes it\n"
      "\n"
      "10.0.0.1 gpu-01 # gpu-04\n";
  auto entry = [&](const std::string& name) {
    std::istringstream in(hosts);
    return HostsFileEntry(in, name);
  };
  EXPECT_EQ(entry("gpu-02"), "127.0.1.1");
  EXPECT_EQ(entry("GPU-02.EXAMPLE.COM"), "127.0.1.1");
  EXPECT_EQ(entry("localhost"), "127.0.0.1");
  EXPECT_EQ(entry("gpu-01"), "10.0.0.1");
  EXPECT_EQ(entry("gpu-03"), "");
  EXPECT_EQ(entry("gpu-04"), "");
  EXPECT_EQ(entry("127.0.1.1"), "");
}

TEST(LoopbackMasterProblemTest, AddressesLocalhostAndOneNodeJobsAreFine) {
  JobSpec spec = Nodes({"gpu-01", "gpu-02"});
  spec.cluster.master_addr = "127.0.0.1";
  EXPECT_EQ(LoopbackMasterProblem(spec), "");
  for (const char* name :
       {"localhost", "LocalHost.localdomain", "ip6-localhost", "ip6-loopback", "job.localhost"}) {
    spec.cluster.master_addr = name;
    EXPECT_EQ(LoopbackMasterProblem(spec), "") << name;
  }
  JobSpec one = Nodes({"gpu-01"});
  one.cluster.master_addr = "gpu-01";
  EXPECT_EQ(LoopbackMasterProblem(one), "");
}

TEST(NewAgentInstanceTest, EachRunGetsItsOwn) { EXPECT_NE(NewAgentInstance(), NewAgentInstance()); }

}  // namespace
}  // namespace ddprun::io
