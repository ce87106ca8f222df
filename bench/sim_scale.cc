// The simulator's scale benchmark: runs one job file quietly at a given node count and prints
// events (by kind: timers, deliveries, workers), wall and CPU time, events per CPU second (the
// machine is shared: CPU time is the figure that does not depend on the neighbours) and peak
// RSS. Wall time is read here, in the benchmark,
// never inside a simulation. Usage: ddprun_sim_bench JOB.toml NODES [SEED [--verbose] [--max-time=D]]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "schema/diagnostics.h"
#include "schema/duration.h"
#include "schema/loader.h"
#include "sim/simulation.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fputs("usage: ddprun_sim_bench JOB.toml NODES [SEED [--verbose] [--max-time=D]]\n", stderr);
    return 2;
  }
  ddprun::LoadResult loaded = ddprun::LoadJobFile(argv[1]);
  if (!loaded.spec) {
    std::fputs(ddprun::RenderDiagnostics(loaded.diagnostics, argv[1], loaded.source_text, false).c_str(),
               stderr);
    return 2;
  }
  ddprun::JobSpec spec = *loaded.spec;
  const int nodes = std::atoi(argv[2]);
  // As --nodes does: a job that runs only whole stays whole (min_nodes = nnodes).
  if (spec.cluster.min_nodes == spec.cluster.nnodes || spec.cluster.min_nodes > nodes)
    spec.cluster.min_nodes = nodes;
  spec.cluster.nnodes = nodes;
  spec.cluster.nodes.clear();
  spec.trainer.num_nodes = nodes;
  ddprun::sim::SimOptions options;
  options.seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : spec.simulate.seed;
  bool verbose = false;
  for (int i = 4; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--verbose") verbose = true;
    // --beat-by-beat: run quiet stretches one heartbeat at a time (sim/quiet.cc), to compare.
    if (arg == "--beat-by-beat") options.lazy_heartbeats = false;
    // --max-time=D: stop the run at D of virtual time (the cost of a run too long to finish).
    if (arg.rfind("--max-time=", 0) == 0) {
      const auto limit = ddprun::ParseDuration(arg.substr(11));
      if (!limit) {
        std::fputs("ddprun_sim_bench: --max-time wants a duration (\"1h\")\n", stderr);
        return 2;
      }
      spec.simulate.max_time = *limit;
    }
  }
  options.quiet = !verbose;
  const auto start = std::chrono::steady_clock::now();
  const ddprun::sim::SimResult result =
      ddprun::sim::RunSimulation(spec, options, verbose ? &std::cout : nullptr);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double events = static_cast<double>(result.stats.events);
  rusage cpu{};
  getrusage(RUSAGE_SELF, &cpu);
  const double cpu_s = static_cast<double>(cpu.ru_utime.tv_sec + cpu.ru_stime.tv_sec) +
                       static_cast<double>(cpu.ru_utime.tv_usec + cpu.ru_stime.tv_usec) / 1e6;
  const auto& s = result.stats;
  fmt::print(
      "nodes={} gpus={} exit={} virtual={} events={} (timers={} deliveries={} workers={} other={}) "
      "quiet_stretches={} quiet_beats={} messages={} per_node_messages={:.1f} peak_queue={} wall_s={:.3f} "
      "cpu_s={:.3f} events_per_s={:.0f} max_rss_mib={:.0f}\n",
      nodes, spec.WorldSize(), result.exit_code, ddprun::HumanDuration(ddprun::Duration(s.end_ns)), s.events,
      s.timer_events, s.delivery_events, s.worker_events,
      s.events - s.timer_events - s.delivery_events - s.worker_events, s.quiet_stretches, s.quiet_beats,
      result.stats.messages, static_cast<double>(result.stats.messages) / nodes, result.stats.peak_queue,
      wall, cpu_s, events / cpu_s, static_cast<double>(usage.ru_maxrss) / 1024.0);
  if (result.violation) fmt::print("violation: {}\nreproduce with: {}\n", *result.violation, result.repro);
  return result.violation ? 70 : 0;
}
