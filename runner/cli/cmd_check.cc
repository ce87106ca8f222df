// `ddprun check` and `ddprun schema`: validate a job file and print its plan, or print the
// JSON Schema of job files.
#include <cstdio>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "runner/cli/commands.h"
#include "schema/diagnostics.h"
#include "schema/loader.h"
#include "schema/plan.h"

namespace ddprun::cli {
namespace {

// The first line of a small /proc file ("" when unreadable).
std::string ReadProcLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line.size() > 4096 ? std::string() : line;
}

}  // namespace

int CheckCommand(const CheckOptions& options) {
  LoadResult result = LoadJobFile(options.job_path);
  if (result.spec) AppendScriptArgs(*result.spec, options.script_args);
  if (result.spec) {
    // Read here, not in schema/, which stays free of the machine it runs on. Linux's default
    // range stands in where /proc cannot be read (containers, other systems).
    const PortRange ephemeral =
        ParsePortRange(ReadProcLine("/proc/sys/net/ipv4/ip_local_port_range")).value_or(PortRange{});
    CheckEphemeralPorts(*result.spec, ephemeral,
                        ParseReservedPorts(ReadProcLine("/proc/sys/net/ipv4/ip_local_reserved_ports")),
                        result.diagnostics);
  }
  // --json: stdout carries the diagnostics in the JSON, and stderr stays quiet for tools.
  if (!options.json) {
    const std::string rendered = RenderDiagnostics(result.diagnostics, options.job_path,
                                                   result.source_text, options.color);
    std::fputs(rendered.c_str(), stderr);
  }
  if (!result.spec) {
    if (options.json) {
      fmt::print("{}\n", RenderCheckJson(result.diagnostics, options.job_path, nullptr, nullptr));
    }
    return kExitUsage;
  }
  const JobSpec& spec = *result.spec;
  if (options.node_rank && (*options.node_rank < 0 || *options.node_rank >= spec.cluster.nnodes)) {
    fmt::print(stderr, "ddprun check: --node-rank {} is out of range: {} has nodes 0..{}\n",
               *options.node_rank, options.job_path, spec.cluster.nnodes - 1);
    return kExitUsage;
  }
  const Plan plan = MakePlan(spec, options.node_rank);
  if (options.json) {
    fmt::print("{}\n", RenderCheckJson(result.diagnostics, options.job_path, &spec, &plan));
  } else if (!options.full && !options.node_rank &&
             spec.cluster.nnodes > kPlanSummaryAboveNodes) {
    fmt::print("{}", RenderPlanSummary(spec, plan));
  } else {
    fmt::print("{}", RenderPlanText(spec, plan));
  }
  std::fflush(stdout);
  return kExitOk;
}

int SchemaCommand() {
  fmt::print("{}\n", JobFileJsonSchema());
  return kExitOk;
}

}  // namespace ddprun::cli
