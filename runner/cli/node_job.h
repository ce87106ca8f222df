#pragma once
// What `ddprun run` and `ddprun preflight` share: load the job file (printing diagnostics) and
// find this node's rank and name.

#include <optional>
#include <string>

#include "runner/io/driver.h"
#include "schema/job_spec.h"

namespace ddprun::cli {

struct NodeJob {
  JobSpec spec;
  io::NodeRunOptions run;
};

/// nullopt after printing why (a job file error or an unknown node rank: exit 2).
std::optional<NodeJob> LoadNodeJob(const std::string& job_path, std::optional<int> node_rank_flag);

}  // namespace ddprun::cli
