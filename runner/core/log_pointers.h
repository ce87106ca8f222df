#pragma once
// Where a summary sends the reader: the folder, on the node where the rank ran, that holds the
// failing rank's log or the hung rank's stacks. Each node writes its own run folders (logs.dir
// relative to its own job file), so the pointer names the node with the path.

#include <string>

#include "schema/job_spec.h"

namespace ddprun::core {

/// The summary's last line: "logs: logs/demo/latest-n1/attempt-0/rank-3.log on node 1
/// (gpu-02), in its job file's folder; each node keeps its own runs under
/// logs/demo/latest-n<node>". `global_rank` < 0 (a lost node) names the attempt's folder.
std::string LogsPointer(const JobSpec& spec, const std::string& node_name, int node_rank, int round,
                        int global_rank);

/// Where a hang's full stacks are: "rank 3's in logs/hang/latest-n1/attempt-0/rank-3.stacks on
/// node 1 (gpu-02), every rank's in latest-n<node>/attempt-0/rank-<r>.stacks on its node".
std::string StacksPointer(const JobSpec& spec, const std::string& node_name, int node_rank, int round,
                          int global_rank);

}  // namespace ddprun::core
