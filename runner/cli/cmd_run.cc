// `ddprun job.toml` / `ddprun run job.toml`: this node's agent.

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "runner/cli/commands.h"
#include "runner/io/driver.h"
#include "schema/loader.h"

namespace ddprun::cli {

int RunCommand(const RunOptions& options) {
  LoadResult loaded = LoadJobFile(options.job_path);
  if (!loaded.diagnostics.items.empty()) {
    const std::string text = RenderDiagnostics(loaded.diagnostics, options.job_path,
                                               loaded.source_text, false);
    std::fwrite(text.data(), 1, text.size(), stderr);
  }
  if (!loaded.spec) return kExitUsage;
  const JobSpec& spec = *loaded.spec;

  std::string error, how;
  const auto node_rank = io::DetectNodeRank(spec, options.node_rank, error, how);
  if (!node_rank) {
    std::fprintf(stderr, "ddprun: error: %s\n", error.c_str());
    return kExitUsage;
  }
  io::NodeRunOptions run;
  run.node_rank = *node_rank;
  run.host = static_cast<size_t>(*node_rank) < spec.cluster.nodes.size()
                 ? spec.cluster.nodes[static_cast<size_t>(*node_rank)]
                 : io::LocalHostName();
  run.job_dir = std::filesystem::path(options.job_path).parent_path().string();
  run.verbose = options.verbose;
  return io::RunNode(spec, run);
}

}  // namespace ddprun::cli
