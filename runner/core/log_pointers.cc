#include "runner/core/log_pointers.h"

#include <fmt/format.h>

#include "schema/worker_env.h"

namespace ddprun::core {
namespace {

// A relative logs.dir is relative to each node's own job file, which node 0 cannot see: say so.
std::string WhereOnTheNode(const JobSpec& spec) {
  return spec.logs.dir.starts_with("/") ? "" : ", in its job file's folder";
}

}  // namespace

std::string LogsPointer(const JobSpec& spec, const std::string& node_name, int node_rank, int round,
                        int global_rank) {
  const std::string folder =
      fmt::format("{}/{}/{}/attempt-{}/", spec.logs.dir, spec.job.name, NodeLatestLink(node_rank), round);
  return fmt::format("logs: {}{} on {}{}; each node keeps its own runs under {}/{}/latest-n<node>", folder,
                     global_rank >= 0 ? fmt::format("rank-{}.log", global_rank) : "", node_name,
                     WhereOnTheNode(spec), spec.logs.dir, spec.job.name);
}

std::string StacksPointer(const JobSpec& spec, const std::string& node_name, int node_rank, int round,
                          int global_rank) {
  return fmt::format(
      "rank {}'s in {}/{}/{}/attempt-{}/rank-{}.stacks on {}{}, every rank's in "
      "latest-n<node>/attempt-{}/rank-<r>.stacks on its node",
      global_rank, spec.logs.dir, spec.job.name, NodeLatestLink(node_rank), round, global_rank, node_name,
      WhereOnTheNode(spec), round);
}

}  // namespace ddprun::core
