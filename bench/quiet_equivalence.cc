// The long version of tests/sim/quiet_test.cc: runs seeds of a job with the swarm's random
// faults twice, once with quiet stretches computed (sim/quiet.cc) and once beat by beat, and
// compares everything each run prints (the event lines and the summary, but the count of
// events run), its exit code, end time and messages. Prints each seed that differs, then one
// line: seeds, differing seeds, stretches and beats computed, events run both ways.
// With --vary-shape each seed first gives the job its shape, as the shape swarm does.
// Usage: ddprun_quiet_equivalence JOB.toml FIRST_SEED COUNT [--vary-shape]
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "schema/diagnostics.h"
#include "schema/loader.h"
#include "sim/job_overrides.h"
#include "sim/simulation.h"
#include "sim/swarm.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fputs("usage: ddprun_quiet_equivalence JOB.toml FIRST_SEED COUNT [--vary-shape]\n", stderr);
    return 2;
  }
  ddprun::LoadResult loaded = ddprun::LoadJobFile(argv[1]);
  if (!loaded.spec) {
    std::fputs(ddprun::RenderDiagnostics(loaded.diagnostics, argv[1], loaded.source_text, false).c_str(),
               stderr);
    return 2;
  }
  const uint64_t first = std::strtoull(argv[2], nullptr, 10);
  const uint64_t count = std::strtoull(argv[3], nullptr, 10);
  const bool vary_shape = argc > 4 && std::string(argv[4]) == "--vary-shape";
  uint64_t differing = 0;
  uint64_t stretches = 0;
  uint64_t beats = 0;
  uint64_t events_lazy = 0;
  uint64_t events_beat = 0;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    ddprun::JobSpec spec = *loaded.spec;
    if (vary_shape) {
      ddprun::LoadResult shaped = ddprun::ParseJobText(
          ddprun::sim::ApplyJobOverrides(loaded.source_text, ddprun::sim::DrawSwarmShape(seed)), argv[1]);
      if (!shaped.spec) continue;  // the shape swarm reports those
      spec = *shaped.spec;
    }
    for (const ddprun::FaultSpec& fault : ddprun::sim::DrawSwarmFaults(spec, seed))
      spec.simulate.faults.push_back(fault);
    ddprun::sim::SimResult results[2];
    std::string outputs[2];
    for (int way = 0; way < 2; ++way) {
      ddprun::sim::SimOptions options;
      options.seed = seed;
      options.lazy_heartbeats = way == 0;
      std::ostringstream out;
      results[way] = ddprun::sim::RunSimulation(spec, options, &out);
      outputs[way] = ddprun::sim::WithoutEventCount(out.str());
    }
    stretches += results[0].stats.quiet_stretches;
    beats += results[0].stats.quiet_beats;
    events_lazy += results[0].stats.events;
    events_beat += results[1].stats.events;
    if (outputs[0] != outputs[1] || results[0].exit_code != results[1].exit_code ||
        results[0].stats.end_ns != results[1].stats.end_ns ||
        results[0].stats.messages != results[1].stats.messages) {
      ++differing;
      fmt::print("seed {}: the computed and the beat-by-beat run differ\n", seed);
    }
  }
  fmt::print(
      "quiet equivalence: {} seeds ({}..{}) of {}, {} differ; {} stretches, {} beats computed; "
      "events run {} computed, {} beat by beat\n",
      count, first, first + count - 1, argv[1], differing, stretches, beats, events_lazy, events_beat);
  return differing == 0 ? 0 : 1;
}
