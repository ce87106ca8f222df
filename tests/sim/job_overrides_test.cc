// Job file changes for --set, --sweep and the shape swarm: text edits the real loader accepts,
// and the shape swarm's shapes (every one a valid job, a pure function of the seed).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schema/loader.h"
#include "sim/job_overrides.h"
#include "sim/swarm.h"

namespace ddprun::sim {
namespace {

using ::testing::HasSubstr;

const char* kJob =
    "version = 1\n"
    "[job]\nname = \"t\"\ncommand = [\"python\", \"train.py\"]\n"
    "[cluster]\n"
    "nodes = [\"a\",\n"
    "         \"b\"]   # two hosts\n"
    "nproc_per_node = 2\n"
    "[timeouts]\nheartbeat = \"2s\"\n"
    "[[simulate.faults]]\nat = \"1m\"\nkind = \"node-crash\"\nnode = 1\n";

TEST(JobOverridesTest, ReplacesAddsAndRemovesKeysInTheirSections) {
  const std::string text = ApplyJobOverrides(kJob, {{"timeouts.heartbeat", "5s", false},
                                                    {"timeouts.stop_grace", "10s", false},
                                                    {"cluster.nodes", "", true},
                                                    {"cluster.nnodes", "3", false},
                                                    {"cluster.master_addr", "10.0.0.1", false},
                                                    {"restart.max_restarts", "2", false}});
  EXPECT_EQ(text,
            "version = 1\n"
            "[job]\nname = \"t\"\ncommand = [\"python\", \"train.py\"]\n"
            "[cluster]\n"
            "master_addr = \"10.0.0.1\"\n"
            "nnodes = 3\n"
            "nproc_per_node = 2\n"
            "[timeouts]\nstop_grace = \"10s\"\nheartbeat = \"5s\"\n"
            "[[simulate.faults]]\nat = \"1m\"\nkind = \"node-crash\"\nnode = 1\n"
            "\n[restart]\nmax_restarts = 2\n");
  const LoadResult loaded = ParseJobText(text, "t.toml");
  ASSERT_TRUE(loaded.spec);
  EXPECT_EQ(loaded.spec->cluster.nnodes, 3);
  EXPECT_EQ(loaded.spec->timeouts.heartbeat, Seconds(5));
  EXPECT_EQ(loaded.spec->restart.max_restarts, 2);
  ASSERT_EQ(loaded.spec->simulate.faults.size(), 1u);  // the array of tables after the headers is intact
}

TEST(JobOverridesTest, KeysAreResolvedAndCheckedAgainstTheKeyTable) {
  EXPECT_EQ(*ResolveJobKey("spares"), "cluster.spares");
  EXPECT_EQ(*ResolveJobKey("simulate.checkpoint_every"), "simulate.checkpoint_every");
  EXPECT_THAT(ResolveJobKey("window").error(), HasSubstr("a key of several sections"));
  EXPECT_THAT(ResolveJobKey("cluster.sparse").error(), HasSubstr("[cluster] has no key \"sparse\""));
  EXPECT_THAT(ResolveJobKey("nosection.x").error(), HasSubstr("no section [nosection]"));
  auto removal = ParseJobOverride("cluster.nodes=");
  ASSERT_TRUE(removal);
  EXPECT_TRUE(removal->remove);
  EXPECT_EQ(FormatJobOverride(*ParseJobOverride("backoff = 1m")), "restart.backoff=1m");
}

TEST(JobOverridesTest, EveryDrawnShapeIsAValidJobAndAFunctionOfTheSeed) {
  const LoadResult base = LoadJobFile(std::string(DDPRUN_SOURCE_DIR) + "/bench/swarm-shapes.toml");
  ASSERT_TRUE(base.spec);
  int etcd = 0, spares = 0, shrinking = 0, big = 0;
  for (uint64_t seed = 1; seed <= 2000; ++seed) {
    const std::vector<JobOverride> shape = DrawSwarmShape(seed);
    const LoadResult loaded = ParseJobText(ApplyJobOverrides(base.source_text, shape), "swarm-shapes.toml");
    ASSERT_TRUE(loaded.spec) << "seed " << seed << ": "
                             << RenderDiagnostics(loaded.diagnostics, "swarm-shapes.toml", loaded.source_text,
                                                  false);
    const JobSpec& s = *loaded.spec;
    EXPECT_GE(s.cluster.nnodes, 1);
    EXPECT_LE(s.cluster.nnodes, 64);
    etcd += s.rendezvous.Etcd();
    spares += s.cluster.Agents() > s.cluster.nnodes;
    shrinking += s.cluster.min_nodes < s.cluster.nnodes;
    big += s.cluster.nnodes > 16;
    const std::vector<JobOverride> again = DrawSwarmShape(seed);
    ASSERT_EQ(again.size(), shape.size());
    for (size_t i = 0; i < shape.size(); ++i)
      EXPECT_EQ(FormatJobOverride(again[i]), FormatJobOverride(shape[i]));
  }
  // Each dimension is exercised.
  EXPECT_GT(etcd, 200);
  EXPECT_GT(spares, 400);
  EXPECT_GT(shrinking, 300);
  EXPECT_GT(big, 200);
}

}  // namespace
}  // namespace ddprun::sim
