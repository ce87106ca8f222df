#pragma once
// The real driver: one io_context on one thread, the real ports, one NodeHost.

#include <cstdint>
#include <optional>
#include <string>

#include "base/result.h"
#include "schema/job_spec.h"

namespace ddprun::io {

struct NodeRunOptions {
  int node_rank = 0;
  std::string host;            // this node's name, as the coordinator will print it
  std::string job_dir;         // the job file's directory: workdir and logs.dir are relative to it
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

struct SharedSecret {
  std::string secret;   // "" when neither variable is set
  std::string warning;  // e.g. a file other users can read; "" if none
};
/// The shared secret from DDPRUN_SECRET or the file named by DDPRUN_SECRET_FILE. An unreadable
/// or empty file is a failure.
Result<SharedSecret> ReadSharedSecret();

/// Runs this node's agent (and on node 0 the coordinator) until the job ends; returns the
/// process exit code (DESIGN.md section 1).
int RunNode(const JobSpec& spec, const NodeRunOptions& options);

/// This node's rank: `flag` > DDPRUN_NODE_RANK > SLURM_NODEID > this host's name or one of its
/// addresses in cluster.nodes; with how it was found, for the user.
struct DetectedRank {
  int rank = 0;
  std::string how;  // "--node-rank", "DDPRUN_NODE_RANK", "this host (gpu-02) is cluster.nodes[1]"
  std::string warning;  // a source that was overruled (SLURM_NODEID), for the user; "" if none
};
Result<DetectedRank> DetectNodeRank(const JobSpec& spec, std::optional<int> flag);
/// This node's rank from its host name or addresses alone (cluster.nodes and spares).
Result<DetectedRank> DetectNodeRankByHost(const JobSpec& spec);

/// Why cluster.master_addr cannot work for a job of several hosts when seen from this host: a
/// host name (not an address, not "localhost") that resolves here to a loopback address, as
/// Debian and Ubuntu map the host's own name to 127.0.1.1 in /etc/hosts. Node 0 would listen
/// where no other node can reach it; another node would connect to itself. Returns "" when
/// fine, else the problem and a "hint:" line. `check`, `preflight` and the run all use it.
std::string LoopbackMasterProblem(const JobSpec& spec);

}  // namespace ddprun::io
