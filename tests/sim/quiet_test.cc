// Quiet stretches computed instead of run (sim/quiet.cc) are the same run: every seed prints the
// same lines, ends the same way and sends the same messages whether its heartbeats are computed
// or run one by one (--beat-by-beat), only faster. bench/quiet-equivalence.sh runs the long
// version against the swarm's seeds.
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schema/faults.h"
#include "schema/loader.h"
#include "sim/swarm.h"
#include "tests/sim/sim_test_util.h"

namespace ddprun::testing {
namespace {

JobSpec LoadJob(const std::string& path) {
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/" + path);
  std::stringstream text;
  text << in.rdbuf();
  LoadResult loaded = ParseJobText(text.str(), path);
  EXPECT_TRUE(loaded.spec) << path;
  return loaded.spec ? *loaded.spec : JobSpec{};
}

struct Both {
  sim::SimResult lazy;
  sim::SimResult beat_by_beat;
  std::string lazy_output;
  std::string beat_output;
};

Both RunBothWays(JobSpec spec, uint64_t seed, const sim::NetworkOptions& network = {},
                 bool swarm_faults = true) {
  if (swarm_faults) {
    for (const FaultSpec& fault : sim::DrawSwarmFaults(spec, seed)) spec.simulate.faults.push_back(fault);
  }
  Both both;
  for (bool lazy : {true, false}) {
    sim::SimOptions options;
    options.seed = seed;
    options.network = network;
    options.lazy_heartbeats = lazy;
    std::ostringstream out;
    (lazy ? both.lazy : both.beat_by_beat) = sim::RunSimulation(spec, options, &out);
    (lazy ? both.lazy_output : both.beat_output) = out.str();
  }
  return both;
}

void ExpectAlike(const Both& both, uint64_t seed) {
  EXPECT_EQ(sim::WithoutEventCount(both.lazy_output), sim::WithoutEventCount(both.beat_output))
      << "seed " << seed;
  EXPECT_EQ(both.lazy.exit_code, both.beat_by_beat.exit_code) << "seed " << seed;
  EXPECT_EQ(both.lazy.stats.end_ns, both.beat_by_beat.stats.end_ns) << "seed " << seed;
  EXPECT_EQ(both.lazy.stats.messages, both.beat_by_beat.stats.messages) << "seed " << seed;
  EXPECT_EQ(both.lazy.stats.bytes, both.beat_by_beat.stats.bytes) << "seed " << seed;
  EXPECT_EQ(both.lazy.stats.messages_by_node, both.beat_by_beat.stats.messages_by_node) << "seed " << seed;
  EXPECT_EQ(both.beat_by_beat.stats.quiet_stretches, 0u);
}

class QuietTest : public ::testing::TestWithParam<const char*> {};

// Each job with the swarm's random faults (crashes, partitions, hangs, blocked ports...).
TEST_P(QuietTest, EverySeedRunsAlikeComputedOrBeatByBeat) {
  const JobSpec spec = LoadJob(GetParam());
  uint64_t stretches = 0;
  uint64_t beats = 0;
  uint64_t events_saved = 0;
  for (uint64_t seed = 1000; seed < 1030; ++seed) {
    const Both both = RunBothWays(spec, seed);
    ExpectAlike(both, seed);
    stretches += both.lazy.stats.quiet_stretches;
    beats += both.lazy.stats.quiet_beats;
    events_saved +=
        both.beat_by_beat.stats.events - std::min(both.beat_by_beat.stats.events, both.lazy.stats.events);
  }
  // The fast path ran, and saved events.
  EXPECT_GT(stretches, 0u);
  EXPECT_GT(beats, 0u);
  EXPECT_GT(events_saved, beats);
}

INSTANTIATE_TEST_SUITE_P(Jobs, QuietTest,
                         ::testing::Values("examples/laptop.toml", "examples/lightning-2x8.toml",
                                           "examples/lightning-4x8.toml", "bench/swarm64.toml",
                                           "bench/swarm-shrink.toml", "bench/swarm-spares.toml",
                                           "bench/sim_scale.toml", "bench/swarm-etcd-30s.toml"));

// A network that loses 30% of its packets and retransmits after 7 s, longer than the loss
// bound (3 heartbeats of 2 s): links go silent inside would-be quiet stretches, the cores
// declare their peers lost, and a stretch must not be computed across that.
TEST(QuietLossyTest, LinksThatGoSilentInsideAStretchRunAlike) {
  const JobSpec spec = LoadJob("examples/lightning-2x8.toml");
  sim::NetworkOptions lossy;
  lossy.loss = 0.3;
  lossy.retransmit = std::chrono::seconds(7);
  int lost = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const Both both = RunBothWays(spec, seed, lossy);
    ExpectAlike(both, seed);
    if (both.beat_output.find("lost the coordinator") != std::string::npos) ++lost;
  }
  EXPECT_GT(lost, 0) << "the lossy network never cut a link: the test tests nothing";
}

// A run cut off by simulate.max_time in the middle of a computed stretch ends at the stretch's
// last beat, as it would have beat by beat (the summary's wall time, the hang verdict's time).
TEST(QuietLimitTest, ARunCutOffByMaxTimeInsideAStretchEndsAlike) {
  JobSpec spec = LoadJob("examples/lightning-2x8.toml");
  spec.simulate.max_time = std::chrono::minutes(7);
  spec.simulate.faults.clear();
  const Both both = RunBothWays(spec, 1);
  ExpectAlike(both, 1);
  EXPECT_GT(both.lazy.stats.quiet_beats, 0u);
  EXPECT_THAT(both.lazy_output, ::testing::HasSubstr("when simulate.max_time = 7m was reached (at 7m00s)"));
}

// A Llama-3-like job at 16 nodes: workers take 4 minutes to start, then connect to rank 0's
// store and retry every 2 s until it is up. Those worker events run inside computed stretches
// (no core sees them), but for the last readiness, which starts training.
TEST(QuietWorkersTest, WorkersGettingReadyAndStoreClientsRunInsideAStretch) {
  JobSpec spec = LoadJob("bench/llama3-54d-2s.toml");
  ResizeCluster(spec, 16);
  spec.simulate.max_time = std::chrono::hours(2);
  ASSERT_FALSE(spec.timeouts.DetectsHangs()) << "with beacons, readiness reaches the agent";
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    spec.simulate.seed = seed;
    const Both both = RunBothWays(spec, seed);
    ExpectAlike(both, seed);
    EXPECT_GT(both.lazy.stats.events_inside_stretches, 16u) << "seed " << seed;
    EXPECT_EQ(both.beat_by_beat.stats.events_inside_stretches, 0u);
  }
}

// A host that crashes and reboots 20 minutes later: the other agents wait in the rendezvous
// (the coordinator sends a progress line every 5 s), then the round backs off before it
// starts again. Both waits are computed, between the progress lines.
TEST(QuietWaitTest, ARendezvousWaitingForARebootAndABackoffAreComputed) {
  JobSpec spec = LoadJob("examples/lightning-2x8.toml");
  ResizeCluster(spec, 16);
  spec.simulate.faults.clear();
  spec.simulate.max_time = std::chrono::minutes(40);
  spec.restart.backoff = std::chrono::minutes(2);
  spec.timeouts.rendezvous = std::chrono::hours(1);
  auto crash = ParseFaultFlag("node-crash@2m:node=3,reboot_after=20m");
  ASSERT_TRUE(crash) << crash.error();
  spec.simulate.faults.push_back(*crash);
  const Both both = RunBothWays(spec, 1, {}, /*swarm_faults=*/false);
  ExpectAlike(both, 1);
  EXPECT_THAT(both.lazy_output, ::testing::HasSubstr("waiting for node 3"));
  // Beat by beat, 15 agents beat through 20 minutes of rendezvous (three events per beat).
  EXPECT_GT(both.beat_by_beat.stats.events, 15u * 3 * 600);
  EXPECT_LT(both.lazy.stats.events * 3, both.beat_by_beat.stats.events);
}

// 256 agents connect in the same few instants, so many beat at the same nanosecond; each
// heartbeat's latency is its own (Network::BeatLatency), whatever order they run in.
TEST(QuietScaleTest, AgentsThatBeatAtTheSameInstantRunAlike) {
  JobSpec spec = LoadJob("bench/sim_scale.toml");
  ResizeCluster(spec, 256);
  const Both both = RunBothWays(spec, spec.simulate.seed);
  ExpectAlike(both, spec.simulate.seed);
  EXPECT_GT(both.lazy.stats.quiet_beats, 256u * 50);
  EXPECT_LT(both.lazy.stats.events * 2, both.beat_by_beat.stats.events);
}

}  // namespace
}  // namespace ddprun::testing
