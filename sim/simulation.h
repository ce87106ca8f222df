#pragma once
// `ddprun --simulate`: the whole cluster of one job file in one process, over virtual time.
// Every node runs the real host::NodeHost (and so the real core::Agent and, on node 0, the
// real core::Coordinator) over simulated ports; faults come from the job file, the command
// line or failure rates. Deterministic: one seed and job file give byte-identical output.

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "schema/job_spec.h"
#include "sim/timeline.h"

namespace ddprun::host {
class EventLog;
}  // namespace ddprun::host

namespace ddprun::sim {

/// The simulated network between nodes (TCP-like: reliable, in order per connection).
struct NetworkOptions {
  Duration latency_min = std::chrono::microseconds(50);  // one way
  Duration latency_max = std::chrono::microseconds(400);
  double loss = 0.001;                     // chance a packet needs one retransmission
  Duration retransmit = Millis(200);       // the delay a lost packet adds (TCP's minimum RTO)
  Duration connect_timeout = Seconds(10);  // what a dropped SYN costs the connecting side
};

struct SimOptions {
  uint64_t seed = 1;
  NetworkOptions network;
  bool quiet = false;  // no per-event lines, only the summary
  /// Quiet stretches are computed, not run beat by beat (sim/quiet.cc); off: --beat-by-beat.
  bool lazy_heartbeats = true;
  bool record_timeline = false;  // keep per-node phases (needed for --trace and --report)
  int condense_above = 64;       // more nodes than this: only node 0's and faulted nodes' lines
  /// For the repro line: the job file as the user named it, and the command-line faults and
  /// --nodes that changed the spec (the job file's own faults are in the file).
  std::string job_path = "job.toml";
  std::vector<FaultSpec> flag_faults;
  std::optional<int> nodes_override;
  /// --set changes to the job file ("cluster.spares=2"; "cluster.nodes=" removes the key), as
  /// the repro line repeats them.
  std::vector<std::string> overrides;
  /// Test-only: node 1's side of the simulated world misbehaves, so tests can watch an
  /// invariant fire through the whole simulator (tests/sim/invariants_test.cc). The CLI never
  /// sets it.
  enum class Sabotage : uint8_t {
    kNone,
    kWrongWorldSize,     // node 1's workers get WORLD_SIZE one too large
    kSpawnTwice,         // node 1 starts its first worker of each round twice
    kUnkillableWorkers,  // node 1's workers ignore every signal (stuck in the kernel)
    // Progress beacons (with timeouts.progress):
    kBeaconsFromAThread,     // every worker beacons from a thread: steps keep coming while its
                             // gang stalls, so no hang is ever seen
    kHungStackLooksWaiting,  // node 1's hung worker dumps an all_reduce stack, and its local
                             // rank 0 the stack of a rank stuck elsewhere
    // Hot spares:
    kSparePlaysNodeZero,  // a spare's workers say (GROUP_RANK) they play node rank 0
    // etcd (rendezvous.backend = "etcd"):
    kStoreIgnoresFencing,  // the modelled etcd lets every PutIf's compare hold
  };
  Sabotage sabotage = Sabotage::kNone;
  /// Where node 0's agents (every incarnation) record their events, as a real node writes its
  /// event log (docs/report.md); null: nowhere. `--replay` compares it with a real run's.
  host::EventLog* node0_events = nullptr;
  /// Every other node's events (with etcd the coordinator role moves to another node); nullptr: none.
  host::EventLog* other_events = nullptr;
};

/// How one node ended.
struct NodeOutcome {
  enum class State { kExited, kDown, kHung, kUnfinished };
  int node_rank = 0;
  std::string host;
  bool extra = false;  // a duplicate-node-rank agent, not one of the job's nodes
  bool spare = false;  // an entry of cluster.spares (node_rank: nnodes + its index)
  int plays = -1;      // the node rank its workers last played (-1: none)
  State state = State::kUnfinished;
  int exit_code = 0;  // when kExited
};

struct SimStats {
  uint64_t events = 0;
  /// Events by what they were, for the scale benchmark's account of where the time goes:
  /// timers (an agent's or the coordinator's deadline: mostly heartbeats), deliveries of bytes,
  /// workers (start, exit, training, beacons, store) and the rest (connects, faults, checks).
  uint64_t timer_events = 0;
  uint64_t delivery_events = 0;
  uint64_t worker_events = 0;
  uint64_t messages = 0;  // frames sent by all agents and the coordinator
  uint64_t bytes = 0;
  std::vector<uint64_t> messages_by_node;  // frames each job node sent (index = node rank)
  uint64_t coordinator_messages = 0;       // of those, what node 0's coordinator sent
  int64_t end_ns = 0;                      // virtual time the job ended (last agent exit)
  std::optional<int64_t> first_training_ns;
  int rounds_started = 0;
  int restarts_used = 0;
  int max_restarts = 0;
  int interruptions = 0;    // rounds that ended without success
  int64_t training_ns = 0;  // time the gang was training (useful or later lost)
  int64_t useful_ns = 0;    // training progress kept at the end
  int64_t lost_ns = 0;      // progress since the last checkpoint, lost on failures
  int64_t train_target_ns = 0;
  int node_crashes = 0;
  int worker_failures = 0;  // workers that exited non-zero or were killed by faults
  int faults_injected = 0;
  uint64_t store_clients = 0;  // store clients that reached rank 0's store (relayed or not)
  uint64_t beacons = 0;        // progress beacons delivered to agents (0 without timeouts.progress)
  int worker_hangs = 0;        // workers that hung (faults and simulate.worker_hang_mtbf)
  int hangs_judged = 0;        // rounds node 0's coordinator stopped because ranks hung
  uint64_t peak_queue = 0;
  /// Quiet stretches computed instead of run beat by beat (sim/quiet.cc), and the heartbeats
  /// in them.
  uint64_t quiet_stretches = 0;
  uint64_t quiet_beats = 0;
  uint64_t events_inside_stretches = 0;  // worker events run inside a computed stretch
};

struct SimResult {
  int exit_code = 0;  // the job's outcome: node 0's exit code (70 when an invariant broke)
  std::vector<NodeOutcome> nodes;
  std::optional<std::string> violation;  // the first invariant or liveness violation
  std::string repro;                     // one command line that reproduces this run
  /// Node ranks that changed hands, in order: "at 3m12s: spare 0 (node-0004) replaces node 1
  /// (node-0001) as node rank 1".
  std::vector<std::string> replacements;
  SimStats stats;
  /// The run ended with every rank of the job's round hung for good and nothing watching
  /// progress: the job never ends (no end is owed, RunEnd::stuck_for_good).
  bool stuck_for_good = false;
};

/// Runs one simulation of `spec` (whose [simulate] faults, with the command line's already
/// merged in, are injected). Lines go to `out` (nullptr: nowhere), and the summary after them.
SimResult RunSimulation(const JobSpec& spec, const SimOptions& options, std::ostream* out,
                        Timeline* timeline = nullptr);

/// The summary block printed after a run: outcome per node (grouped), time to the first
/// training step, restarts, downtime, goodput, lost work.
std::string FormatSummary(const JobSpec& spec, const SimOptions& options, const SimResult& result);

/// A run's printed lines without the summary's count of events run, which is all that differs
/// between quiet stretches computed and run --beat-by-beat (sim/quiet.cc).
std::string WithoutEventCount(const std::string& output);

/// `kind@time:key=value,...`: the --fault spelling of `fault` (ParseFaultFlag reads it back).
std::string FormatFaultFlag(const FaultSpec& fault);

/// "ddprun --simulate job.toml --seed 7 --fault ..." for this run.
std::string ReproCommand(const SimOptions& options);

/// "[   40m06.012s]": a virtual time as the event lines show it.
std::string FormatSimTime(int64_t ns);

}  // namespace ddprun::sim
