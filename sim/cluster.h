#pragma once
// The simulated cluster, built from parts: the nodes (each a real host::NodeHost over simulated
// ports, sim/node.h), the network (sim/network.h), the workers with the training model
// (sim/workers.h), the fault injector (faults.cc: one function per fault kind) and the
// invariants (sim/invariants.h). The Cluster owns them, runs the event loop and writes the
// event log. Internal to sim/; users call RunSimulation (simulation.h).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "sim/event_queue.h"
#include "sim/invariants.h"
#include "sim/network.h"
#include "sim/node.h"
#include "sim/prng.h"
#include "sim/sim_store.h"
#include "sim/simulation.h"
#include "sim/timeline.h"
#include "sim/workers.h"

namespace ddprun::sim {

/// Workers of a failed round must all be gone within stop_grace + 3 heartbeats + this: it
/// covers the SIGTERM delay, the agent's give-up after SIGKILL and peer-failure detection.
/// The same slack bounds a worker's life after its agent last heard from the coordinator.
inline constexpr Duration kStopSlack = Seconds(30);

/// With timeouts.progress, the invariants' bounds on a round that a hung rank stalled
/// (InvariantBounds::hangs); nullopt when the job detects no hangs.
std::optional<HangBounds> HangBoundsOf(const JobSpec& spec);

/// `text` split at newlines (a trailing newline gives a last empty line).
std::vector<std::string> Split(std::string_view text);

class Cluster {
 public:
  Cluster(const JobSpec& spec, const SimOptions& options, std::ostream* out, Timeline* timeline);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  /// Runs until every node is finished (or down for good), the liveness deadline or max_time.
  SimResult Run();

  // ---- called by the ports (sim_ports.h) ----
  void ArmTimer(uint32_t node, TimePoint when);
  void DisarmTimer(uint32_t node);
  void SetTransportEvents(uint32_t node, host::TransportEvents* events) { node_(node).tevents = events; }
  void SetProcessEvents(uint32_t node, host::ProcessEvents* events) { node_(node).pevents = events; }
  Network& network() { return network_; }
  /// The modelled etcd (rendezvous.backend = "etcd" only).
  SimEtcd& etcd() { return *etcd_; }
  /// An answer of the etcd model reaches `node`'s agent, unless the agent it was meant for is
  /// gone (crashed since: `incarnation` differs); a hung agent reads it when it resumes.
  void DeliverStore(uint32_t node, uint32_t incarnation, host::StoreResult result);
  Workers& workers() { return workers_; }
  void ConsoleLog(uint32_t node, core::LogLevel level, std::string_view source, std::string_view text);
  void ConsoleSummary(uint32_t node, std::string_view text);

  // ---- what the parts share ----
  TimePoint now() const { return TimePoint(Duration(now_ns_)); }
  int64_t now_ns() const { return now_ns_; }
  EventQueue& queue() { return queue_; }
  Node& node(uint32_t index) { return *nodes_[index]; }
  SimStats& stats() { return stats_; }
  Invariants& invariants() { return invariants_; }
  Timeline* timeline() { return timeline_; }
  /// What tells the rounds of `node`'s agent apart from other rounds of the same number: the
  /// incarnation of the coordinator that now runs rounds (+1 per coordinator started); with
  /// etcd, where rounds go on across coordinators, the launch of the job its agent runs.
  uint64_t RoundEpochOf(uint32_t node) const;
  std::string NodeLabel(uint32_t index) const { return nodes_[index]->label; }
  /// The agent (node index) whose workers last played node rank `node_rank`.
  uint32_t HolderOf(int node_rank) const { return holders_[static_cast<size_t>(node_rank)]; }
  /// Workers::Spawn: `index`'s agent starts workers as node rank `node_rank`. When that rank
  /// changes hands (a spare takes it, or its own node takes it back), says so on both rows.
  void NodePlays(uint32_t index, int node_rank, int round_nodes);
  /// A "sim:" line (no node) or a line on a node's behalf, in the event log.
  void PrintSim(std::optional<uint32_t> node, std::string_view text);
  void AddMark(uint32_t node, MarkKind kind, std::string text, int64_t end_ns = -1);
  /// Records what `node` is doing now on its timeline row (only when a timeline is kept).
  void SetPhase(uint32_t node);
  void SetAllPhases();

  /// While a node's bytes (or its connect) are handed to the coordinator, the lines the
  /// coordinator logs are about that node: the subject comes from the data being delivered,
  /// never from the words of the line.
  class Subject {
   public:
    Subject(Cluster* cluster, std::optional<uint32_t> node) : cluster_(cluster), saved_(cluster->subject_) {
      cluster_->subject_ = node;
    }
    ~Subject() { cluster_->subject_ = saved_; }
    Subject(const Subject&) = delete;
    Subject& operator=(const Subject&) = delete;

   private:
    Cluster* cluster_;
    std::optional<uint32_t> saved_;
  };

 private:
  Node& node_(uint32_t index) { return *nodes_[index]; }

  // setup
  void BuildNodes();
  uint32_t AddNode(int rank, const JobSpec* spec, bool extra);

  // the fault injector (faults.cc)
  void ScheduleFaults();
  void ScheduleFault(const FaultSpec& fault);
  void InjectNodeCrash(const FaultSpec& fault);
  void InjectAgentHang(const FaultSpec& fault);
  void ScheduleGuardianLease(uint32_t index);
  void InjectWorkerExit(const FaultSpec& fault);
  void InjectWorkerHang(const FaultSpec& fault);
  void InjectWorkerSlow(const FaultSpec& fault);
  void InjectPartition(const FaultSpec& fault);
  void InjectMasterPortBlocked(const FaultSpec& fault);
  void InjectDuplicateNodeRank(const FaultSpec& fault);
  void InjectEtcdFault(const FaultSpec& fault);
  void ScheduleRandomNodeCrash(TimePoint from);
  void ScheduleRandomWorkerExit(TimePoint from);
  void ScheduleRandomWorkerHang(TimePoint from);

  // nodes
  void StartNode(uint32_t node);
  void CrashNode(uint32_t node, std::optional<Duration> reboot_after, const std::string& why);
  void OnNodeExit(uint32_t node, int code);
  void ReleaseNode(uint32_t node);

  // event loop
  void Dispatch(const Event& event);
  bool DeferIfHung(uint32_t node, const Event& event);

  // output and checks
  void Print(uint32_t node, std::string_view who, std::string_view text);
  /// Prints the violation the invariants found (once) to the event log.
  void ReportViolation();
  void ObserveCoordinator();
  /// rendezvous.backend = "etcd": any agent may run the coordinator, and rounds and the budget
  /// go on across coordinators.
  void ObserveCoordinators();
  SimResult Finish(RunEnd& end);

  const JobSpec& spec_;
  SimOptions options_;
  std::ostream* out_;
  Timeline* timeline_;
  EventQueue queue_;
  Prng fault_rng_;
  Prng instance_rng_;
  Prng hang_rng_;                      // simulate.worker_hang_mtbf: never shifts the other draws
  SimClock clock_;
  int64_t now_ns_ = 0;
  int64_t limit_ns_ = 0;
  bool liveness_limit_ = false;  // limit_ns_ is the liveness deadline, not max_time
  bool ended_by_rule_ = false;   // a coordinator ended the job by restart.never_on
  int64_t random_faults_until_ns_ = 0;
  bool condense_ = false;
  std::optional<uint32_t> subject_;    // see Subject
  std::vector<std::unique_ptr<Node>> nodes_;
  int job_nodes_ = 0;                  // cluster.nnodes: the node ranks
  int agents_ = 0;                     // the nodes, then the spares (JobSpec::Cluster::Agents)
  std::vector<uint32_t> holders_;      // node rank -> the agent that last played it
  std::vector<std::string> replacements_;  // "at 12m03s: spare 0 (host) replaced node 1 (host)"
  Invariants invariants_;
  Network network_;
  Workers workers_;
  std::unique_ptr<SimEtcd> etcd_;      // rendezvous.backend = "etcd"
  // etcd: each coordinator the nodes' agents ran, as ObserveCoordinator saw it (by node).
  struct SeenCoordinator {
    const core::Coordinator* coordinator = nullptr;  // identity only, never dereferenced stale
    uint64_t epoch = 0;              // 1, 2, ...: the order coordinators appeared in
    int started = -1;                // the last round it started
    uint64_t judgements = 0;
    bool ended = false;              // its verdict was reported
    uint64_t launch = 0;             // the launch of the job it runs (LaunchOf)
  };
  /// etcd: the launch of the job a coordinator that just took the role runs, from what etcd
  /// holds under its state key: the current one, or a new one when the state says it ended.
  uint64_t LaunchOf(const host::Election& election);
  std::map<std::string, uint64_t> launch_of_key_;  // state key -> its current launch
  uint64_t launches_ = 0;
  std::vector<SeenCoordinator> seen_coordinators_;
  uint64_t coordinator_epochs_ = 0;
  int most_restarts_ = 0;              // etcd: the most restarts any coordinator counted
  bool violation_printed_ = false;
  uint64_t coordinator_incarnation_ = 0;
  int last_coordinator_restarts_ = 0;
  uint64_t observed_incarnation_ = 0;
  uint64_t node0_incarnation_ = 0;     // the incarnation of node 0's own coordinator
  uint64_t observed_judgements_ = 0;   // hang judgements of node 0's coordinator seen so far
  int64_t unfinished_ = 0;             // nodes that may still act (not exited, not down for good)
  bool rendezvous_fault_ = false;      // a fault that may justify exit 3
  uint64_t condensed_lines_ = 0;
  uint64_t condensed_nodes_ = 0;
  uint64_t condense_epoch_ = 1;
  std::map<std::string, uint32_t> summaries_seen_;
  SimStats stats_;
};

}  // namespace ddprun::sim
