// Job file rules for what keeps a job going: min_nodes and shrinking, spares, quarantine, and
// the rendezvous backend (agent or etcd) with its settings and fingerprint; every check with
// its exact message, location and hint. The other rules are in loader_test.cc.
#include <gtest/gtest.h>

#include "schema/canonical.h"
#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

using testing::Diags;
using testing::Parse;
using testing::WithBase;

constexpr std::string_view kMinNodesBase =
    "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nnodes = [\"a\", \"b\", \"c\"]\n";

TEST(Loader, MinNodesIsBetweenOneAndNnodesAndDefaultsToNnodes) {
  auto none = Parse(std::string(kMinNodesBase));
  ASSERT_TRUE(none.spec) << Diags(none);
  EXPECT_EQ(none.spec->cluster.min_nodes, 3);
  EXPECT_FALSE(none.spec->cluster.CanReplace());
  auto two = Parse(std::string(kMinNodesBase) + "min_nodes = 2\n");
  ASSERT_TRUE(two.spec) << Diags(two);
  EXPECT_EQ(two.spec->cluster.min_nodes, 2);
  EXPECT_TRUE(two.spec->cluster.CanReplace());
  EXPECT_EQ(Diags(Parse(std::string(kMinNodesBase) + "min_nodes = 4\n")),
            "7:13: error: cluster.min_nodes = 4 is more than the job's 3 nodes\n"
            "  hint: min_nodes is the fewest nodes a round may run with: at most 3; remove it to "
            "need every node in every round\n");
  EXPECT_NE(Diags(Parse(std::string(kMinNodesBase) + "min_nodes = 0\n")).find("out of range"),
            std::string::npos);
}

TEST(Loader, MinNodesNeedsTrainerNumNodesSoThatASmallerRoundCanTellLightning) {
  EXPECT_EQ(Diags(Parse(std::string(kMinNodesBase) +
                        "min_nodes = 2\n[trainer]\ndevices = 1\n[restart]\nmax_restarts = 1\n")),
            "7:13: error: cluster.min_nodes = 2 lets rounds run with fewer nodes, but [trainer] does "
            "not set num_nodes: Lightning's Trainer() would use 1 and reject the round's WORLD_SIZE\n"
            "  hint: add num_nodes = 3 under [trainer]; a smaller round gets PL_TRAINER_NUM_NODES = "
            "its own node count\n");
  auto ok = Parse(std::string(kMinNodesBase) +
                  "min_nodes = 2\n[trainer]\ndevices = 1\nnum_nodes = 3\n[restart]\nmax_restarts = 1\n");
  EXPECT_EQ(Diags(ok), "");
}

TEST(Loader, SparesAndShrinkingNeedARestartAndAReplaceTimeoutBelowTheRendezvous) {
  EXPECT_EQ(Diags(Parse(std::string(kMinNodesBase) + "min_nodes = 2\n[restart]\nmax_restarts = 0\n")),
            "7:13: warning: cluster.min_nodes can only act at a restart, and restart.max_restarts = 0\n"
            "  hint: a lost node's rank goes to a spare (or the job shrinks) in the next round: set "
            "restart.max_restarts to at least 1\n");
  EXPECT_NE(Diags(Parse(std::string(kMinNodesBase) +
                        "min_nodes = 2\n[restart]\nmax_restarts = 1\n[timeouts]\nrendezvous = \"1m\"\n"
                        "replace = \"2m\"\n"))
                .find("warning: timeouts.replace = 2m is not shorter than timeouts.rendezvous = 1m"),
            std::string::npos);
  EXPECT_EQ(Diags(Parse(std::string(kMinNodesBase) + "min_nodes = 2\n[restart]\nmax_restarts = 1\n")), "");
}

TEST(Loader, QuarantineKeysAndTheirDefaults) {
  auto defaults = Parse(std::string(kMinNodesBase));
  ASSERT_TRUE(defaults.spec);
  EXPECT_EQ(defaults.spec->quarantine.failures, 3);
  EXPECT_EQ(defaults.spec->quarantine.window, Hours(1));
  EXPECT_EQ(defaults.spec->quarantine.cooldown, Minutes(30));
  auto set =
      Parse(std::string(kMinNodesBase) + "[quarantine]\nfailures = 0\nwindow = \"2h\"\ncooldown = \"5m\"\n");
  ASSERT_TRUE(set.spec) << Diags(set);
  EXPECT_EQ(set.spec->quarantine.failures, 0);
  EXPECT_EQ(set.spec->quarantine.window, Hours(2));
  EXPECT_EQ(set.spec->quarantine.cooldown, Minutes(5));
  EXPECT_NE(Diags(Parse(std::string(kMinNodesBase) + "[quarantine]\ncooldown = \"0s\"\n")).find("cooldown"),
            std::string::npos);
  EXPECT_NE(Diags(Parse(std::string(kMinNodesBase) + "[quarantine]\nfailres = 2\n"))
                .find("did you mean `failures`"),
            std::string::npos);
}

// [rendezvous]: the etcd backend's settings and every check on them.
TEST(Loader, RendezvousDefaultsToTheAgentAndReadsEtcdSettings) {
  auto plain = Parse(testing::kBaseJob);
  ASSERT_TRUE(plain.spec);
  EXPECT_FALSE(plain.spec->rendezvous.Etcd());

  auto r =
      Parse(WithBase("[rendezvous]\nbackend = \"etcd\"\n"
                     "endpoints = [\"http://10.0.0.1:2379\", \"https://[fd00::2]:2379/\"]\n"
                     "prefix = \"/team/ddprun\"\nlease = \"5s\"\nuser = \"trainer\"\n"));
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(Diags(r), "");
  const auto& rv = r.spec->rendezvous;
  EXPECT_TRUE(rv.Etcd());
  EXPECT_EQ(rv.endpoints, (std::vector<std::string>{"http://10.0.0.1:2379", "https://[fd00::2]:2379/"}));
  EXPECT_EQ(rv.prefix, "/team/ddprun");
  EXPECT_EQ(rv.lease, Seconds(5));
  EXPECT_EQ(rv.user, "trainer");
}

TEST(Loader, RendezvousErrorsPointAtTheValueAndSayWhatToWrite) {
  EXPECT_EQ(Diags(Parse(WithBase("[rendezvous]\nbackend = \"etcd\"\n"))),
            "13:11: error: rendezvous.backend = \"etcd\" needs rendezvous.endpoints\n"
            "  hint: e.g. endpoints = [\"http://10.0.0.1:2379\", \"http://10.0.0.2:2379\", "
            "\"http://10.0.0.3:2379\"]\n");
  EXPECT_EQ(Diags(Parse(WithBase("[rendezvous]\nbackend = \"zookeeper\"\n"))),
            "13:11: error: rendezvous.backend = \"zookeeper\" is not a backend\n"
            "  hint: write \"agent\" (node 0's agent keeps the state; the default) or \"etcd\"\n");
  const auto urls = Diags(Parse(
      WithBase("[rendezvous]\nbackend = \"etcd\"\nendpoints = [\"10.0.0.1:2379\", \"http://a:2379/v3\", "
               "\"http://a\", \"http://a:0\", \"http://b:2379\", \"http://b:2379\"]\n")));
  EXPECT_NE(urls.find("\"10.0.0.1:2379\" is not an etcd URL: it must begin with http:// or https://"),
            std::string::npos)
      << urls;
  EXPECT_NE(urls.find("\"http://a:2379/v3\" is not an etcd URL: it must not have a path"), std::string::npos)
      << urls;
  EXPECT_NE(urls.find("\"http://a\" is not an etcd URL: it needs a host and a port"), std::string::npos)
      << urls;
  EXPECT_NE(urls.find("\"http://a:0\" is not an etcd URL: \"0\" is not a port (1..65535)"), std::string::npos)
      << urls;
  EXPECT_NE(urls.find("rendezvous.endpoints lists \"http://b:2379\" twice"), std::string::npos) << urls;
  EXPECT_NE(Diags(Parse(WithBase("[rendezvous]\nbackend = \"etcd\"\nendpoints = []\n")))
                .find("rendezvous.endpoints must list at least one etcd member"),
            std::string::npos);

  const std::string etcd = "[rendezvous]\nbackend = \"etcd\"\nendpoints = [\"http://e:2379\"]\n";
  EXPECT_EQ(Diags(Parse(WithBase(etcd + "lease = \"4s\"\n"))),
            "15:9: error: rendezvous.lease = \"4s\" is too short\n"
            "  hint: the coordinator renews it every third of it and steps down a fifth of it before "
            "it ends; a renewal must outlast an etcd leader election and a call's 3s bound: give at "
            "least 5s (\"10s\" is the default)\n");
  EXPECT_NE(Diags(Parse(WithBase(etcd + "lease = \"20m\"\n")))
                .find("rendezvous.lease = \"20m\" is not shorter than timeouts.rendezvous = \"15m\""),
            std::string::npos);
  EXPECT_NE(Diags(Parse(WithBase(etcd + "prefix = \"ddprun\"\n")))
                .find("rendezvous.prefix = \"ddprun\" is not a key prefix"),
            std::string::npos);
  EXPECT_NE(Diags(Parse(WithBase(etcd + "cert_file = \"c.pem\"\n")))
                .find("rendezvous.cert_file and rendezvous.key_file go together"),
            std::string::npos);
  EXPECT_NE(Diags(Parse(WithBase(etcd + "ca_file = \"ca.pem\"\n")))
                .find("warning: TLS files are unused: no endpoint is https://"),
            std::string::npos);
  EXPECT_NE(Diags(Parse(WithBase("[rendezvous]\nendpoints = [\"http://e:2379\"]\n")))
                .find("warning: rendezvous.endpoints is unused: rendezvous.backend is \"agent\""),
            std::string::npos);
}

TEST(Loader, EtcdNeedsEveryAgentsHost) {
  const std::string etcd = "[rendezvous]\nbackend = \"etcd\"\nendpoints = [\"http://e:2379\"]\n";
  const std::string head = "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n";
  EXPECT_NE(Diags(Parse(head + "[cluster]\nnnodes = 2\nmaster_addr = \"a\"\n" + etcd))
                .find("rendezvous.backend = \"etcd\" needs every agent's host: cluster.nodes is not listed"),
            std::string::npos);
  EXPECT_NE(Diags(Parse(head + "[cluster]\nnodes = [\"a\", \"b\"]\nspares = 1\n" + etcd))
                .find("cluster.spares is a count only with cluster.nnodes"),
            std::string::npos);
  auto listed = Parse(head + "[cluster]\nnodes = [\"a\", \"b\"]\nspares = [\"c\"]\n" + etcd);
  EXPECT_TRUE(listed.spec) << Diags(listed);
}

TEST(Loader, WhereTheStateLivesIsPartOfTheFingerprintButTheTlsFilesAreNot) {
  const std::string etcd = "[rendezvous]\nbackend = \"etcd\"\nendpoints = [\"https://e:2379\"]\n";
  auto agent = Parse(WithBase(""));
  auto explicit_agent = Parse(WithBase("[rendezvous]\nbackend = \"agent\"\n"));
  auto a = Parse(WithBase(etcd + "cert_file = \"a.pem\"\nkey_file = \"a.key\"\n"));
  auto b = Parse(WithBase(etcd + "cert_file = \"b.pem\"\nkey_file = \"b.key\"\nuser = \"x\"\n"));
  auto other_lease = Parse(WithBase(etcd + "lease = \"5s\"\n"));
  ASSERT_TRUE(agent.spec && explicit_agent.spec && a.spec && b.spec && other_lease.spec);
  EXPECT_EQ(CanonicalForm(*agent.spec), CanonicalForm(*explicit_agent.spec));
  EXPECT_NE(CanonicalForm(*agent.spec), CanonicalForm(*a.spec));
  EXPECT_EQ(CanonicalForm(*a.spec), CanonicalForm(*b.spec));
  EXPECT_NE(CanonicalForm(*a.spec), CanonicalForm(*other_lease.spec));
}

}  // namespace
}  // namespace ddprun
