#include "runner/io/node_identity_slurm.h"

#include <fmt/format.h>

#include "base/parse_int.h"

namespace ddprun::io {

Result<DetectedRank> RankFromSlurmNodeId(const JobSpec& spec, const std::string& value,
                                         const Result<DetectedRank>& by_host) {
  const auto parsed = ParseNonNegative(value, 1'000'000);
  if (!parsed) return Fail(fmt::format("SLURM_NODEID=\"{}\" is not a node rank (a non-negative integer)", value));
  const int slurm_rank = static_cast<int>(*parsed);
  if (spec.cluster.nodes.empty()) return DetectedRank{slurm_rank, "SLURM_NODEID", ""};
  const std::string listed = spec.cluster.HostOf(slurm_rank);
  if (!by_host) {
    return Fail(fmt::format("SLURM_NODEID={} makes this node {} ({}), but {}\nhint: under SLURM, list "
                            "the allocation's hosts (`scontrol show hostnames`) in cluster.nodes, or "
                            "pass --node-rank",
                            slurm_rank, slurm_rank, listed.empty() ? "not listed" : listed, by_host.error()));
  }
  if (by_host->rank == slurm_rank) {
    return DetectedRank{slurm_rank, fmt::format("SLURM_NODEID={}, and {}", slurm_rank, by_host->how), ""};
  }
  DetectedRank rank = *by_host;
  rank.warning = fmt::format(
      "SLURM_NODEID={} is not used: {}, so this is node {}. SLURM numbers an allocation's hosts in "
      "its own order; the job file's order decides (cluster.nodes[0] is where the coordinator "
      "listens)",
      slurm_rank, by_host->how, by_host->rank);
  return rank;
}

void RemoveSlurmTaskLayout(std::map<std::string, std::string>& env) {
  static constexpr const char* kTaskLayout[] = {
      "SLURM_NTASKS",         "SLURM_NPROCS",           "SLURM_PROCID",     "SLURM_LOCALID",
      "SLURM_NODEID",         "SLURM_NTASKS_PER_NODE",  "SLURM_TASKS_PER_NODE",
      "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_GTIDS",  "SLURM_TASK_PID",
  };
  for (const char* name : kTaskLayout) env.erase(name);
}

}  // namespace ddprun::io
