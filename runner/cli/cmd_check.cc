// `ddprun check` and `ddprun schema`: validate a job file and print its plan, or print the
// JSON Schema of job files.
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "runner/cli/commands.h"
#include "runner/io/driver.h"
#include "schema/diagnostics.h"
#include "schema/loader.h"
#include "schema/plan.h"

namespace ddprun::cli {

int CheckCommand(const CheckOptions& options) {
  LoadResult result = LoadJobFile(options.job_path);
  const std::string rendered = RenderDiagnostics(result.diagnostics, options.job_path,
                                                 result.source_text, options.color);
  std::fputs(rendered.c_str(), stderr);
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
  // Seen from this host only (its /etc/hosts): run `check` on node 0 to check node 0.
  if (const std::string loopback = io::LoopbackMasterProblem(spec); !loopback.empty() && !options.json) {
    fmt::print(stderr, "warning: {}\n", loopback);
  }
  const Plan plan = MakePlan(spec, options.node_rank);
  if (options.json) {
    fmt::print("{}\n", RenderCheckJson(result.diagnostics, options.job_path, &spec, &plan));
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
