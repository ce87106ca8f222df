#pragma once
// TOML text -> JobSpec, with every rule of DESIGN.md section 2 checked and all problems collected.
// The rules live in the key table (schema/keys.h), one loader per section (schema/sections.h)
// and the fault checks shared with --fault (schema/faults.h).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <functional>
#include "schema/diagnostics.h"
#include "schema/ephemeral_ports.h"
#include "schema/faults.h"
#include "schema/job_spec.h"

#include "base/result.h"
#include "schema/keys.h"

namespace ddprun {

struct LoadResult {
  std::optional<JobSpec> spec;  // set when there is no error (warnings allowed)
  Diagnostics diagnostics;
  std::string source_text;  // what was read, for rendering the diagnostics
};

/// What the loader is told about the machine it runs on (it reads nothing itself).
struct LoadContext {
  /// cluster.hosts_from = "slurm": the allocation's hosts, in SLURM's order, or why they are
  /// not known. Not called when the file does not ask; unset: outside an allocation.
  std::function<Result<std::vector<std::string>>()> slurm_hosts;
};

/// Parses and validates job file text. Never throws, never crashes, bounded in time and memory
/// for any input (binary, truncated, deeply nested, huge numbers).
LoadResult ParseJobText(std::string_view text, std::string_view source_name, const LoadContext& context = {});

/// Reads `path` (at most 1 MiB) and parses it; a missing or unreadable file is a diagnostic.
LoadResult LoadJobFile(const std::string& path, const LoadContext& context = {});

/// Appends `args` (what followed `--` on the ddprun command line) to job.command. Called
/// before the fingerprint is computed, so every node must be given the same arguments.
void AppendScriptArgs(JobSpec& spec, const std::vector<std::string>& args);

/// The same job on `nnodes` nodes (`--simulate --nodes N`): the host list gives way to a
/// count, and what the loader derives from the node count is derived again: trainer.num_nodes
/// follows, cluster.min_nodes is nnodes when the file left it out and keeps its share of the
/// nodes when the file set it (12 of 16 becomes 1,536 of 2,048). Returns one line per value
/// the file set that changed, for the user to see.
std::vector<std::string> ResizeCluster(JobSpec& spec, int nnodes);

}  // namespace ddprun
