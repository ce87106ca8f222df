// `ddprun --simulate job.toml`: the whole cluster of a job file, with faults, in virtual time.
#include <fstream>
#include <functional>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "schema/diagnostics.h"
#include "schema/loader.h"
#include "report/render.h"
#include "sim/simulation.h"
#include "sim/swarm.h"

namespace ddprun::cli {
namespace {

// The simulator's own bound on --nodes: far beyond any job file (the loader allows 10,000
// nodes), enough for scale rehearsals.
constexpr int kMaxSimulatedNodes = 65'536;

bool WriteFile(const std::string& path, const std::string& what,
               const std::function<void(std::ostream&)>& write) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    fmt::print(stderr, "ddprun simulate: cannot write the {} to {}\n", what, path);
    return false;
  }
  write(file);
  file.close();
  if (!file) {
    fmt::print(stderr, "ddprun simulate: writing the {} to {} failed\n", what, path);
    return false;
  }
  fmt::print(stderr, "ddprun simulate: wrote the {} to {}\n", what, path);
  return true;
}

}  // namespace

int SimulateCommand(const SimulateOptions& options) {
  LoadResult loaded = LoadJobFile(options.job_path);
  std::fputs(RenderDiagnostics(loaded.diagnostics, options.job_path, loaded.source_text, false).c_str(),
             stderr);
  if (!loaded.spec) return kExitUsage;
  JobSpec spec = std::move(*loaded.spec);

  sim::SimOptions sim_options;
  sim_options.seed = options.seed.value_or(spec.simulate.seed);
  sim_options.quiet = options.quiet;
  sim_options.job_path = options.job_path;
  sim_options.record_timeline = !options.trace_path.empty() || !options.report_path.empty();
  if (options.nodes) {
    const int n = *options.nodes;
    if (n < 1 || n > kMaxSimulatedNodes) {
      fmt::print(stderr, "ddprun simulate: --nodes {} is out of range (1..{})\n", n, kMaxSimulatedNodes);
      return kExitUsage;
    }
    // A scale rehearsal of the same job: the node list (if any) gives way to a count; node 0
    // keeps master_addr.
    spec.cluster.nnodes = n;
    spec.cluster.nodes.clear();
    spec.trainer.num_nodes = n;
    sim_options.nodes_override = n;
  }
  for (const std::string& text : options.faults) {
    auto fault = ParseFaultFlag(text);
    if (!fault) {
      fmt::print(stderr, "ddprun simulate: --fault {}: {}\n", text, fault.error());
      return kExitUsage;
    }
    spec.simulate.faults.push_back(*fault);
    sim_options.flag_faults.push_back(*fault);
  }
  for (const FaultSpec& fault : spec.simulate.faults) {
    if (auto fits = FaultFitsJob(fault, spec); !fits) {
      fmt::print(stderr, "ddprun simulate: {}\n", fits.error());
      return kExitUsage;
    }
  }

  if (options.swarm) {
    if (*options.swarm < 1 || *options.swarm > 1'000'000) {
      fmt::print(stderr, "ddprun simulate: --swarm {} is out of range (1..1000000)\n", *options.swarm);
      return kExitUsage;
    }
    const sim::SwarmResult swarm = sim::RunSwarm(spec, sim_options, *options.swarm, std::cout);
    std::cout.flush();
    return swarm.failures > 0 ? kExitInternal : kExitOk;
  }

  sim::Timeline timeline;
  const sim::SimResult result =
      sim::RunSimulation(spec, sim_options, &std::cout, sim_options.record_timeline ? &timeline : nullptr);
  std::cout.flush();
  bool written = true;
  if (!options.trace_path.empty()) {
    written &= WriteFile(options.trace_path, "trace", [&](std::ostream& out) {
      report::WriteChromeTrace(timeline, out);
    });
  }
  if (!options.report_path.empty()) {
    const std::string summary = sim::FormatSummary(spec, sim_options, result);
    written &= WriteFile(options.report_path, "report", [&](std::ostream& out) {
      report::WriteHtmlReport(timeline, summary, out);
    });
  }
  if (result.violation) return kExitInternal;
  if (!written) return kExitUsage;
  return result.exit_code;
}

}  // namespace ddprun::cli
