#pragma once
// The real driver: one io_context on one thread, the real ports, one NodeHost. Which rank this
// node is comes first (node_identity.h); RunNode composes the rest.

#include <optional>
#include <string>

#include "schema/job_spec.h"

namespace ddprun::io {

struct NodeRunOptions {
  int node_rank = 0;
  std::string host;     // this node's name, as the coordinator will print it
  std::string job_dir;  // the job file's directory: workdir and logs.dir are relative to it
  bool verbose = false;
  /// When set, the console shows only this global rank's output, without the `[n0 r0] `
  /// prefix, whatever logs.console says (preflight's report); the log files keep everything.
  std::optional<int> raw_console_rank;
  /// How the node rank was found ("--node-rank", "this host (gpu-02) is cluster.nodes[1]"),
  /// for a message that blames the rank; "" when unknown.
  std::string rank_source;
  /// Started by `ddprun up`: stdin is the link to it (runner/io/controller_link.h).
  bool controlled_by_up = false;
  /// False on every node but node 0 under `ddprun up`: that node prints only its own footer
  /// (its log folder), since `up` shows one stream and the job's summary once.
  bool print_job_summary = true;
};

/// Runs this node's agent (and on node 0 the coordinator) until the job ends; returns the
/// process exit code (DESIGN.md section 1): the job's, as the coordinator decided it (a
/// core::ExitCode, or 128 + the signal that interrupted it), or the named core::ExitCode of
/// the step that kept this node from running (its secret, its etcd, its coordinator).
int RunNode(const JobSpec& spec, const NodeRunOptions& options);

}  // namespace ddprun::io
