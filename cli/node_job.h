#pragma once
// What `ddprun run` and `ddprun preflight` share: load the job file (printing diagnostics) and
// find this node's rank and name.

#include <optional>
#include <string>
#include <vector>

#include "runner/io/driver.h"
#include "schema/job_spec.h"

namespace ddprun::cli {

struct NodeJob {
  JobSpec spec;
  io::NodeRunOptions run;
};

/// nullopt after printing why (a job file error or an unknown node rank: exit 2).
/// `script_args` (what followed `--` on the command line) are appended to job.command before
/// anything reads the spec, so they are part of the fingerprint every node must agree on.
std::optional<NodeJob> LoadNodeJob(const std::string& job_path, std::optional<int> node_rank_flag,
                                   const std::vector<std::string>& script_args);

}  // namespace ddprun::cli
