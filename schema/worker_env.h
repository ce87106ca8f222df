#pragma once
// The worker contract (DESIGN.md section 6): the variables ddprun adds to each worker's
// environment, named and valued as torchrun gives them to a worker in the same position.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "schema/job_spec.h"

namespace ddprun {

using EnvList = std::vector<std::pair<std::string, std::string>>;

struct WorkerPosition {
  int node_rank = 0;
  int nnodes = 0;  // the round's node count (cluster.min_nodes); 0: cluster.nnodes
  int local_rank = 0;
  int restart_count = 0;     // the round number: 0 for the first attempt
  uint16_t master_port = 0;  // what this rank gets as MASTER_PORT
  std::string master_addr;   // MASTER_ADDR: the round's rank 0 host; "": cluster.master_addr
  std::string error_file;    // TORCHELASTIC_ERROR_FILE
  std::string run_id;        // TORCHELASTIC_RUN_ID; "" computes RunId(spec) (costly per rank)
  // Progress beacons (worker/README.md); "" leaves the variables out.
  std::string progress_addr;   // DDPRUN_PROGRESS_ADDR: the agent's UDP socket, "127.0.0.1:port"
  std::string progress_token;  // DDPRUN_PROGRESS_TOKEN
  std::string stacks_file;     // DDPRUN_STACKS_FILE: where faulthandler writes this rank's stacks
  std::string python_dir;      // appended to PYTHONPATH: where `import ddprun` finds the module
  // The interface the other nodes reach this node at (runner/io/net_interfaces.h), for
  // GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME; "" leaves them out.
  std::string socket_ifname;
};

/// The variables that name the interface of the workers' own sockets, each set to
/// WorkerPosition::socket_ifname unless the user set it (job.env or the agent's environment).
/// NCCL's gets a leading '=' (an exact name, where NCCL would take "eth1" as a prefix of "eth10").
inline constexpr std::string_view kSocketIfnameNames[] = {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                                                          "TP_SOCKET_IFNAME"};

/// Where faulthandler writes rank `global_rank`'s stacks: "attempt-<k>/rank-<r>.stacks".
std::string RankStacksPath(const JobSpec& spec, int restart_count, int global_rank);

/// `path` (a PYTHONPATH value) with `dir` appended, ":"-joined. Unchanged when `dir` is
/// already one of its entries, or when `dir` is empty or holds a ':' (it cannot be one entry).
/// An empty entry of `path` (the current folder for Python) is kept.
std::string AppendToSearchPath(const std::string& path, const std::string& dir);

/// The variables ddprun sets for one worker, sorted by name: torchrun's set, job.env, and
/// PL_TRAINER_*. `inherited` is the agent's own environment: variables that torchrun sets only
/// "unless set" (OMP_NUM_THREADS, *NCCL_ASYNC_ERROR_HANDLING) are left out when present there.
EnvList WorkerEnvironment(const JobSpec& spec, const WorkerPosition& position,
                          const std::map<std::string, std::string>& inherited);

/// WorkerEnvironment for `position` from `sibling`, the environment of another local rank of
/// the same node and round (the same spec and inherited environment): only the variables that
/// differ between local ranks are set again. The agent builds one per worker, 16,384 per round
/// at Llama-3 scale in the simulator.
EnvList SiblingWorkerEnvironment(EnvList sibling, const JobSpec& spec, const WorkerPosition& position);

/// The names ddprun owns; job.env may not set them.
bool IsOwnedEnvName(std::string_view name);

/// Whether an environment variable's value must not be printed: names ending in _KEY or
/// _TOKEN, or containing SECRET or PASSWORD (any case), e.g. WANDB_API_KEY, HF_TOKEN.
bool LooksSecret(std::string_view name);

/// What `ddprun check` and every other output print instead of such a value.
inline constexpr std::string_view kHiddenValue = "<hidden>";

/// `value`, or kHiddenValue when `name` looks secret.
std::string PrintableEnvValue(std::string_view name, std::string_view value);

/// TORCHELASTIC_RUN_ID: the job name and a fingerprint prefix, the same on every node.
std::string RunId(const JobSpec& spec);
/// The same from an already computed Fingerprint(spec).
std::string RunId(const JobSpec& spec, std::string_view fingerprint);
/// rendezvous.backend = "etcd": the folder of the job's keys, <prefix>/<job>: one per job name,
/// whatever the file says, so that agents with differing files meet (and are refused) there.
std::string EtcdKeyDir(const JobSpec& spec);

/// PL_TRAINER_<KEY> value in the spelling Lightning's literal_eval reads back.
std::string TrainerEnvValue(const TrainerValue& value);

/// The Python literal of `value`; with `top_level`, strings that literal_eval cannot read as
/// anything else stay bare (as TrainerEnvValue writes them), else every string is quoted (inside
/// lists and dicts). The loader builds TrainerLiteral from these.
std::string TrainerPythonLiteral(const TrainerValue& value, bool top_level);
/// A Python string literal of `text` ('...', escaped), e.g. for dict keys.
std::string TrainerPythonString(std::string_view text);

/// Each run of an agent writes its logs in a folder of its own under logs.dir,
/// "<job>/<run>" (RunLogFolder), beside a link "<job>/latest" to the newest one.
/// `run` is RunFolderName: the UTC start time, the node rank and a random id, e.g.
/// "20261203T081500Z-n0-3fa2c1". Nodes do not agree on it (no message carries it): each names
/// its own, so on a logs.dir shared by several nodes their folders never collide.
std::string RunFolderName(int64_t unix_seconds, int node_rank, uint32_t random_id);
std::string RunLogFolder(const JobSpec& spec, const std::string& run);
/// "latest-n<node>": the link beside the run folders, "<job>/latest-n<node>", to the newest run
/// of that node's agent. On a logs.dir that several nodes share, "<job>/latest" names whichever
/// node started last; this one names the same node's run on every node, so summaries use it.
std::string NodeLatestLink(int node_rank);

/// Paths relative to the run's folder: "attempt-<k>/rank-<r>.log" and ".error.json".
std::string RankLogPath(const JobSpec& spec, int restart_count, int global_rank);
std::string RankErrorFilePath(const JobSpec& spec, int restart_count, int global_rank);

}  // namespace ddprun
