// The job file loader: checks the text, parses it with toml++, then runs the section loaders
// of schema/sections.h in the one order their inputs allow.
#include "schema/loader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "schema/prescan.h"
#include "schema/sections.h"

namespace ddprun {
namespace {

// Every section of `root` into `spec`. The order is what the sections need from each other:
// - [trainer] before [cluster]: nproc_per_node defaults to the trainer.devices count;
// - [cluster] before [logs], [metrics] and [simulate]: console ranks and fault nodes and
//   workers must exist in the job (the world size, the node and worker counts), the metrics
//   port must not be one of the cluster's, and "*" needs cluster.nodes;
// - [cluster] and [timeouts] before [rendezvous]: etcd needs every agent's host, and a lease
//   shorter than the rendezvous timeout;
// - every section before CheckAcrossSections, which compares [trainer] with [cluster] and
//   [restart] with [timeouts] once both sides hold their final values.
// Diagnostics are printed sorted by position, so this order does not show in the output.
void LoadSections(const toml::table& root, JobSpec& spec, Diagnostics& diagnostics,
                  const LoadContext& context) {
  TomlReader reader(diagnostics, spec.locations);
  reader.CheckKeys(root, SectionNamed(""), "");
  LoadVersion(root, reader);
  LoadJob(root, reader, spec.job);
  const TrainerFacts trainer = LoadTrainer(root, reader, spec.trainer);
  const ClusterFacts cluster =
      LoadCluster(root, reader, spec.trainer, trainer, context.slurm_hosts, spec.cluster);
  LoadRestart(root, reader, spec.restart);
  LoadTimeouts(root, reader, spec.timeouts);
  LoadRendezvous(root, reader, spec.cluster, spec.timeouts, spec.rendezvous);
  LoadStragglers(root, reader, spec.stragglers);
  LoadQuarantine(root, reader, spec.quarantine);
  LoadLogs(root, reader, spec.WorldSize(), spec.logs);
  LoadMetrics(root, reader, spec.cluster, spec.metrics);
  LoadSimulate(root, reader,
               FaultBounds{spec.cluster.nnodes, spec.cluster.nproc_per_node, spec.cluster.spares},
               spec.simulate);
  CheckAcrossSections(spec, trainer, cluster, reader);
}

}  // namespace

LoadResult ParseJobText(std::string_view text, std::string_view source_name, const LoadContext& context) {
  LoadResult result;
  result.source_text = std::string(text.substr(0, std::min(text.size(), kMaxFileBytes + 1)));
  if (!PreScan(text, result.diagnostics)) return result;

  toml::table root;
  // The Debian toml++ is built with exceptions; they stop here and become diagnostics.
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& error) {
    std::string description(error.description());
    result.diagnostics.Error(LocOf(error.source()), "", fmt::format("invalid TOML: {}", description));
    return result;
  } catch (const std::exception& error) {
    result.diagnostics.Error({}, "", fmt::format("cannot parse the job file: {}", error.what()));
    return result;
  }

  JobSpec spec;
  spec.source_name = std::string(source_name);
  LoadSections(root, spec, result.diagnostics, context);
  if (!result.diagnostics.HasErrors()) result.spec = std::move(spec);
  return result;
}

LoadResult LoadJobFile(const std::string& path, const LoadContext& context) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    LoadResult result;
    result.diagnostics.Error({}, "", fmt::format("cannot read job file {}", path),
                             "check the path; `ddprun check` takes the job file as argument");
    return result;
  }
  // Read one byte past the limit so an oversized file is recognised without reading it all.
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) {
    LoadResult result;
    result.diagnostics.Error({}, "", fmt::format("cannot read job file {}", path));
    return result;
  }
  LoadResult result = ParseJobText(text, path, context);
  if (result.spec) {
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
    if (!ec) result.spec->source_dir = absolute.parent_path().lexically_normal().string();
  }
  return result;
}

void AppendScriptArgs(JobSpec& spec, const std::vector<std::string>& args) {
  spec.job.command.insert(spec.job.command.end(), args.begin(), args.end());
  spec.script_args.insert(spec.script_args.end(), args.begin(), args.end());
}

std::vector<std::string> ResizeCluster(JobSpec& spec, int nnodes) {
  std::vector<std::string> changed;
  JobSpec::Cluster& c = spec.cluster;
  const int before = c.nnodes;
  if (spec.LocationOf("cluster.min_nodes").line > 0 && before > 0 && c.min_nodes < before) {
    // Rounded up: a rehearsal must not tolerate more loss than the file's share allows.
    const int64_t scaled = (static_cast<int64_t>(c.min_nodes) * nnodes + before - 1) / before;
    const int min_nodes = static_cast<int>(std::clamp<int64_t>(scaled, 1, nnodes));
    if (min_nodes != c.min_nodes) {
      changed.push_back(fmt::format("cluster.min_nodes = {} of {} nodes becomes {} of {}", c.min_nodes,
                                    before, min_nodes, nnodes));
    }
    c.min_nodes = min_nodes;
  } else {
    c.min_nodes = nnodes;
  }
  c.nnodes = nnodes;
  c.nodes.clear();
  if (spec.trainer.num_nodes) {
    spec.trainer.num_nodes = nnodes;
    for (auto& [key, value] : spec.trainer.settings) {
      if (key == "num_nodes") value.value = int64_t{nnodes};
    }
  }
  return changed;
}

}  // namespace ddprun
