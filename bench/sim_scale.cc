// The simulator's scale benchmark: runs one job file quietly at a given node count and prints
// events, wall time, events per second and peak RSS. Wall time is read here, in the benchmark,
// never inside a simulation. Usage: ddprun_sim_bench JOB.toml NODES [SEED [--verbose]]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "schema/diagnostics.h"
#include "schema/loader.h"
#include "sim/simulation.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fputs("usage: ddprun_sim_bench JOB.toml NODES [SEED]\n", stderr);
    return 2;
  }
  ddprun::LoadResult loaded = ddprun::LoadJobFile(argv[1]);
  if (!loaded.spec) {
    std::fputs(ddprun::RenderDiagnostics(loaded.diagnostics, argv[1], loaded.source_text, false).c_str(), stderr);
    return 2;
  }
  ddprun::JobSpec spec = *loaded.spec;
  const int nodes = std::atoi(argv[2]);
  spec.cluster.nnodes = nodes;
  spec.cluster.nodes.clear();
  spec.trainer.num_nodes = nodes;
  ddprun::sim::SimOptions options;
  options.seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : spec.simulate.seed;
  const bool verbose = argc > 4 && std::string(argv[4]) == "--verbose";
  options.quiet = !verbose;
  const auto start = std::chrono::steady_clock::now();
  const ddprun::sim::SimResult result = ddprun::sim::RunSimulation(spec, options, verbose ? &std::cout : nullptr);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double events = static_cast<double>(result.stats.events);
  fmt::print("nodes={} gpus={} exit={} virtual={} events={} messages={} per_node_messages={:.1f} "
             "peak_queue={} wall_s={:.3f} events_per_s={:.0f} max_rss_mib={:.0f}\n",
             nodes, spec.WorldSize(), result.exit_code, ddprun::HumanDuration(ddprun::Duration(result.stats.end_ns)),
             result.stats.events, result.stats.messages,
             static_cast<double>(result.stats.messages) / nodes, result.stats.peak_queue, wall, events / wall,
             static_cast<double>(usage.ru_maxrss) / 1024.0);
  if (result.violation) fmt::print("violation: {}\nreproduce with: {}\n", *result.violation, result.repro);
  return result.violation ? 70 : 0;
}
