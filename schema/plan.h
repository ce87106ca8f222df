#pragma once
// The plan `ddprun check` prints: ranks, each worker's environment, equivalent torchrun commands.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schema/diagnostics.h"
#include "schema/job_spec.h"
#include "schema/worker_env.h"

namespace ddprun {

/// POSIX shell quoting: bare when only safe characters, else single quotes. For the torchrun
/// lines of the plan and for commands ddprun itself runs through a shell.
std::string ShellQuote(std::string_view word);

/// What job.code_check found, for people: "train.py sha256 1a2b3c4d5e6f (the script python3
/// runs), git 0a1b2c3d4e5f (dirty)", or "nothing to hash (why), git ...".
std::string DescribeCodeFields(const JobSpec::Code& code);

/// What job.library_check found, for people: "python 3.11.2 (/usr/bin/python3.11), torch
/// 2.3.1, lightning -, pytorch_lightning -, nccl -, cuda -" ("-": not installed or not found).
std::string DescribeLibraries(const JobSpec::Libraries& libraries);

/// Rank 0's MASTER_PORT in the plan under the store relay: a free port node 0's agent picks
/// each round, unknown before the round starts.
inline constexpr std::string_view kRankZeroRelayPort = "<private port, picked each round>";

/// The value of GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME in the plan of a
/// job of several nodes: each agent finds the interface when it starts (runner/io/net_interfaces.h).
inline constexpr std::string_view kSocketIfnamePlaceholder = "<interface found by this node's agent>";

struct RankPlan {
  int global_rank = 0;
  int node_rank = 0;
  int local_rank = 0;
  std::string host;               // nodes[node_rank], or "node<k>" when only nnodes is given
  std::optional<int64_t> device;  // CUDA device index for GPU jobs
  EnvList env;                    // what ddprun adds (first round, empty inherited env)
};

struct NodePlan {
  int node_rank = 0;
  std::string host;
  std::vector<RankPlan> ranks;
  std::string torchrun_command;  // one shell line, the equivalent torchrun invocation
  std::string ddprun_command;    // "ddprun job.toml" (with --node-rank when nodes are unnamed)
};

struct Plan {
  std::vector<NodePlan> nodes;
};

/// Builds the plan for every node, or only `only_node` when set (must be in range).
Plan MakePlan(const JobSpec& spec, std::optional<int> only_node);

/// Human text: the rank table, per-node environment and commands.
std::string RenderPlanText(const JobSpec& spec, const Plan& plan);

/// `ddprun check` prints RenderPlanSummary instead of the whole plan above this many nodes
/// (2,048 nodes would be 90,000 lines).
inline constexpr int kPlanSummaryAboveNodes = 32;

/// A plan of many nodes in a screenful: the header, the first and last nodes, the environment
/// every worker shares, the names that differ per node and per worker, and the per-worker
/// table and commands of the first and last node. `plan` must hold every node.
std::string RenderPlanSummary(const JobSpec& spec, const Plan& plan);

/// The same plan as JSON (for tools), pretty-printed.
std::string RenderPlanJson(const JobSpec& spec, const Plan& plan);

/// What `ddprun check --json` prints: {"valid": ..., "diagnostics": [...], "plan": {...}}.
/// `spec` and `plan` are null when the file is invalid (then "plan" is null).
std::string RenderCheckJson(const Diagnostics& diagnostics, std::string_view source_name, const JobSpec* spec,
                            const Plan* plan);

}  // namespace ddprun
