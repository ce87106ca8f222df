#pragma once
// What the simulator's checks learn from the coordinators. Each coordinator says what happened
// in typed observations (core::Observed: a round started or failed, a hang judged, a restart
// spent, the job ended); its host hands them to the node's Observer port, which here is a sink
// of the CoordinatorWatch. The watch
// applies them after the event, as the invariants and the timeline expect, by one path for both
// roles (host::CoordinatorRole); what differs between them is a port of its own, CountedRole,
// chosen once: with a static role the job's coordinator is node 0's (each of its incarnations
// counts its restarts from 0), with an elected one whichever agent holds the role (rounds and the
// budget go on across coordinators). Nothing reads a coordinator's phase or counters after every
// event: only when one takes or leaves the role, and its restart count then.
// Internal to sim/.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runner/core/coordinator.h"
#include "runner/core/election.h"
#include "runner/host/ports.h"
#include "sim/parts.h"

namespace ddprun::sim {

class SimEtcd;

/// A coordinator as the watch knows it (by node).
struct SeenCoordinator {
  const core::Coordinator* coordinator = nullptr;  // identity only, never dereferenced stale
  uint64_t epoch = 0;                              // elected: 1, 2, ...: the order coordinators appeared in
  uint64_t launch = 0;                             // what tells its rounds apart (RoundKey::coordinator)
  int restarts = 0;                                // static: the restarts of it counted so far
  int started = -1;                                // elected: the last round it started
  bool ended = false;                              // elected: its verdict was reported
};

/// Where the job's coordinator runs, as the checks count it: the simulator's side of
/// host::CoordinatorRole, one implementation per role (StaticCount: node 0's coordinator, whose
/// incarnations each start counting again; ElectedCount: whichever agent holds the role, with
/// launches, epochs and the budget read from the modelled store).
class CountedRole {
 public:
  virtual ~CountedRole() = default;
  /// Any agent may hold the role (not only node 0's): rank 0 may be played anywhere, the first
  /// holder decides what the job is, and node 0's exit is not the job's by itself.
  virtual bool AnyAgentLeads() const = 0;
  /// Node `index`'s coordinator is one the job counts.
  virtual bool Counts(uint32_t index) const = 0;
  /// Node `index`'s host started; `coordinator`: it runs a coordinator from its start.
  virtual void HostStarted(uint32_t index, bool coordinator) = 0;
  /// A coordinator the job counts appeared on node `index` (`seen` is fresh): its epoch, launch.
  virtual void Took(SeenCoordinator& seen, uint32_t index) = 0;
  /// `seen`'s coordinator is gone (it stepped down, or its host crashed or exited).
  virtual void Gone(const SeenCoordinator& seen) = 0;
  /// `seen`'s coordinator on node `index` started round `round`.
  virtual void RoundStarted(SeenCoordinator& seen, uint32_t index, int round) = 0;
  /// `seen`'s coordinator on node `index` told the agents the verdict `exit_code`.
  virtual void Ended(SeenCoordinator& seen, uint32_t index, int exit_code) = 0;
  /// `seen`'s coordinator counts `used` restarts spent.
  virtual void Restarts(SeenCoordinator& seen, int used) = 0;
  /// Roles::RoundEpochOf.
  virtual uint64_t RoundEpochOf(uint32_t index) const = 0;
};

class CoordinatorWatch {
 public:
  /// `etcd` is null unless rendezvous.backend = "etcd" (the elected role, counted from it).
  CoordinatorWatch(Handles handles, SimEtcd* etcd);
  ~CoordinatorWatch();
  CoordinatorWatch(const CoordinatorWatch&) = delete;
  CoordinatorWatch& operator=(const CoordinatorWatch&) = delete;

  /// The observer port for node `index`'s host; null when no coordinator of that node counts
  /// (static jobs: only node 0's coordinator is the job's).
  host::Observer* ObserverOf(uint32_t index);
  /// Node `index`'s host started; `coordinator`: it runs a coordinator from the start (node
  /// rank 0 of a static job, an extra agent's included: its rounds are numbered from 0 again).
  void HostStarted(uint32_t index, bool coordinator);
  /// CountedRole::AnyAgentLeads.
  bool AnyAgentLeads() const { return role_->AnyAgentLeads(); }
  /// Node `index`'s host ran (or crashed) in this event: it may have taken or left the role.
  void Touched(uint32_t index);
  /// After every event: who holds the role now, then what the coordinators observed, in order.
  void AfterEvent();

  /// Roles::RoundEpochOf: what tells the rounds of `index`'s agent apart.
  uint64_t RoundEpochOf(uint32_t index) const;
  /// A coordinator ended the job by restart.never_on.
  bool ended_by_rule() const { return ended_by_rule_; }
  /// When a coordinator first told the agents the job's verdict; nullopt: none did.
  std::optional<int64_t> first_verdict_ns() const { return first_verdict_ns_; }

 private:
  class Sink;
  /// One observation of node `node`'s coordinator, queued for AfterEvent.
  struct Heard {
    uint32_t node = 0;
    core::Observation what;
  };
  /// An observation of node `index`'s coordinator, queued for AfterEvent.
  void Observed(uint32_t index, const core::Observation& what);
  /// The coordinator of `index` now, if it is one the job counts.
  const core::Coordinator* CoordinatorOf(uint32_t index) const;
  void CheckRole(uint32_t index);
  void Apply(const Heard& heard);

  Loop& loop_;
  Nodes& nodes_;
  Invariants& invariants_;
  SimStats& stats_;
  std::unique_ptr<CountedRole> role_;
  std::vector<std::unique_ptr<Sink>> sinks_;
  std::vector<SeenCoordinator> seen_;
  std::vector<uint32_t> touched_;  // nodes whose host ran in this event, in order
  std::vector<uint8_t> is_touched_;
  std::vector<Heard> heard_;  // this event's observations, in order
  bool ended_by_rule_ = false;
  std::optional<int64_t> first_verdict_ns_;
};

}  // namespace ddprun::sim
