#pragma once
// Fault validation, one copy for both spellings of a fault: [[simulate.faults]] in the job file
// (schema/load_simulate.cc) and `--fault kind@time:key=value` on the command line (here). Which
// keys exist, which kinds take them, their types and ranges come from the key table
// (schema/keys.h); the two front ends only differ in how they read a value.

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/result.h"
#include "schema/job_spec.h"
#include "schema/keys.h"

namespace ddprun {

/// The job a fault is checked against: its node count and workers per node; 0 when not known
/// (the --fault flag is parsed before the job file, or [cluster] had errors), and then the
/// table's bounds for any job apply.
struct FaultBounds {
  int nnodes = 0;
  int nproc_per_node = 0;
  int spares = 0;  // a fault's node nnodes + i addresses spare i (cluster.spares)
};

/// Where a key stands for a fault of some kind.
enum class FaultKeyUse {
  kUnknown,     // not a fault key at all
  kNotForKind,  // a fault key this kind does not take
  kTaken,
};

/// Whether a fault of kind `kind` takes `key`; with no kind (it was missing or wrong), every
/// fault key is taken so that its value is still checked.
FaultKeyUse UseOfFaultKey(const FaultKindSpec* kind, std::string_view key);

/// The kind spec of `kind`.
const FaultKindSpec& FaultKindSpecOf(FaultKind kind);

/// The allowed values of the integer fault key `key` (node, local_rank, exit_code) or of the
/// items of `peers`, narrowed to the job when `bounds` knows it.
IntRange FaultKeyRange(std::string_view key, FaultBounds bounds);

/// A checked value of a fault key: an integer, a duration or a list of node ranks.
using FaultValue = std::variant<int64_t, Duration, std::vector<int>>;

/// Stores the checked value of `key` in `fault`; the one place that maps keys to fields.
void SetFaultKey(FaultSpec& fault, std::string_view key, FaultValue value);

/// "a node-crash fault takes: at, kind, node, reboot_after".
std::string FaultKeysHint(const FaultKindSpec& kind);

/// "node-crash, agent-hang, ...": every kind, for messages.
std::string KnownFaultKinds();

/// Parses the command-line form `kind@time[:key=value,...]`, e.g. `node-crash@40m:node=1` or
/// `worker-exit@90s:node=1,local_rank=0,exit_code=3`; peers are joined with `+`
/// (`partition@5m:node=1,peers=0+2,duration=1m`). Checks syntax, the keys each kind takes and
/// the table's ranges for any job, not the job's own (see FaultFitsJob). A failure is one
/// sentence.
Result<FaultSpec> ParseFaultFlag(std::string_view text);

/// Whether `fault` addresses nodes, workers and peers that exist in `spec`; why not, if not.
Status FaultFitsJob(const FaultSpec& fault, const JobSpec& spec);

/// The members of the etcd cluster the simulator models; an etcd-member-down fault names one.
inline constexpr int kSimulatedEtcdMembers = 3;

}  // namespace ddprun
