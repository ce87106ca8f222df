#pragma once
// The simulated cluster, built from parts: the nodes (each a real host::NodeHost over simulated
// ports, sim/node.h), the network (sim/network.h), the workers with the training model
// (sim/workers.h), the fault injector (sim/faults.h), the event log (sim/sim_log.h), the
// coordinator watch (sim/coordinators.h) and the invariants (sim/invariants.h). The Cluster
// owns them, hands each only the narrow handles it needs (sim/parts.h), boots and crashes
// machines, and runs the event loop. Internal to sim/; users call RunSimulation
// (simulation.h).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "sim/coordinators.h"
#include "sim/event_queue.h"
#include "sim/faults.h"
#include "sim/invariants.h"
#include "sim/network.h"
#include "sim/node.h"
#include "sim/parts.h"
#include "sim/prng.h"
#include "sim/sim_log.h"
#include "sim/sim_store.h"
#include "sim/simulation.h"
#include "sim/test_hooks.h"
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

struct QuietStretch;  // sim/quiet.cc

class Cluster final : public Roles, public Machines, public PhaseSource {
 public:
  Cluster(const JobSpec& spec, const SimOptions& options, std::ostream* out, Timeline* timeline);
  ~Cluster() override;
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  /// Runs until every node is finished (or down for good), the liveness deadline or max_time.
  SimResult Run();

  // ---- called by the ports (sim_ports.h) ----
  void ArmTimer(uint32_t node, TimePoint when);
  void DisarmTimer(uint32_t node);
  void SetTransportEvents(uint32_t node, host::TransportEvents* events) { nodes_[node].tevents = events; }
  void SetProcessEvents(uint32_t node, host::ProcessEvents* events) { nodes_[node].pevents = events; }
  Network& network() { return network_; }
  /// The modelled etcd (rendezvous.backend = "etcd" only).
  SimEtcd& etcd() { return *etcd_; }
  /// An answer of the etcd model reaches `node`'s agent, unless the agent it was meant for is
  /// gone (crashed since: `incarnation` differs); a hung agent reads it when it resumes.
  void DeliverStore(uint32_t node, uint32_t incarnation, host::StoreResult result);
  Workers& workers() { return workers_; }
  SimLog& log() { return log_; }
  TimePoint now() const { return loop_.now(); }
  int64_t now_ns() const { return loop_.now_ns; }
  Node& node(uint32_t index) { return nodes_[index]; }

  // ---- Roles (the workers) ----
  uint64_t RoundEpochOf(uint32_t node) const override;
  void NodePlays(uint32_t index, int node_rank, int round_nodes) override;

  // ---- Machines (the fault injector) ----
  void StartIfPending(uint32_t node) override {
    if (nodes_[node].pending_start) StartNode(node);
  }
  void Crash(uint32_t node, std::optional<Duration> reboot_after, const std::string& why) override;
  uint32_t AddExtraAgent(int node_rank) override { return AddNode(node_rank, &spec_, true); }
  uint32_t HolderOf(int node_rank) const override { return holders_[static_cast<size_t>(node_rank)]; }
  bool AnyUnfinished() const override { return unfinished_ > 0; }
  void HungForGood(uint32_t) override { --unfinished_; }

  // ---- PhaseSource (the timeline) ----
  NodePhase PhaseOf(uint32_t node, int* round) const override;

 private:
  Handles handles() { return Handles{loop_, nodes_, log_, stats_, invariants_}; }
  std::unique_ptr<SimEtcd> MakeEtcd();

  // setup
  void BuildNodes();
  uint32_t AddNode(int rank, const JobSpec* spec, bool extra);

  // nodes
  void StartNode(uint32_t node);
  void OnNodeExit(uint32_t node, int code);
  void ReleaseNode(uint32_t node);

  // event loop
  static bool DrivesHost(EventKind kind);
  void Dispatch(const Event& event);
  bool DeferIfHung(uint32_t node, const Event& event);
  /// Heartbeats of a quiet stretch computed instead of run (sim/quiet.cc): true when one was
  /// skipped. Either way it sets when to look next (next_quiet_try_ns_).
  bool SkipQuietStretch();
  /// Its steps: every live node's cores are quiet (and one runs the coordinator); nothing else
  /// is queued before the stretch's end; the beats are planned and cut no peer off; then they
  /// are applied to the network and the cores.
  bool QuietCores(QuietStretch& s) const;
  void QuietQueue(QuietStretch& s);
  bool PlanQuietBeats(QuietStretch& s);
  void ApplyQuietStretch(const QuietStretch& s, const std::vector<uint8_t>& frame);
  int64_t next_quiet_try_ns_ = 0;
  int64_t quiet_end_ns_ = 0;      // the last beat or delivery a computed stretch stood for
  int64_t stretch_until_ns_ = 0;  // the end of the last computed stretch

  SimResult Finish(RunEnd& end);

  const JobSpec& spec_;
  SimOptions options_;
  TestHooks hooks_;
  Loop loop_;
  Prng instance_rng_;
  SimClock clock_;
  int64_t limit_ns_ = 0;
  bool liveness_limit_ = false;  // limit_ns_ is the liveness deadline, not max_time
  Nodes nodes_;
  int job_nodes_ = 0;                      // cluster.nnodes: the node ranks
  int agents_ = 0;                         // the nodes, then the spares (JobSpec::Cluster::Agents)
  std::vector<uint32_t> holders_;          // node rank -> the agent that last played it
  std::vector<std::string> replacements_;  // "at 12m03s: spare 0 (host) replaced node 1 (host)"
  /// When hosts were down: [crash, reboot) in virtual ns (-1: still down), in crash order.
  std::vector<std::pair<int64_t, int64_t>> down_;
  int min_world_ = 0;  // the smallest WORLD_SIZE a round may have (BuildNodes)
  /// Whether a host was down (a crash) or a planned fault kept a node away at some instant
  /// of [from, to].
  bool SomeOutageDuring(int64_t from, int64_t to) const;
  SimStats stats_;
  Invariants invariants_;
  SimLog log_;
  Network network_;
  Workers workers_;
  std::unique_ptr<SimEtcd> etcd_;  // rendezvous.backend = "etcd"
  FaultInjector faults_;
  CoordinatorWatch coordinators_;
  int64_t unfinished_ = 0;  // nodes that may still act (not exited, not down for good)
};

}  // namespace ddprun::sim
