#pragma once
// What the simulator's checks learn from the coordinators. Each coordinator says what happened
// in typed observations (core::Observed: a round started or failed, a hang judged, a restart
// spent, the job ended); its host hands them to the node's Observer port, which here is a sink
// of the CoordinatorWatch. The watch
// applies them after the event, as the invariants and the timeline expect, by one path for both
// backends: without etcd the job's coordinator is node 0's (each of its incarnations counts its
// restarts from 0), with etcd whichever agent holds the role (rounds and the budget go on across
// coordinators). Nothing reads a coordinator's phase or counters after every event: only when
// one takes or leaves the role, and its restart count then.
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

class CoordinatorWatch {
 public:
  /// `etcd` is null unless rendezvous.backend = "etcd".
  CoordinatorWatch(Handles handles, SimEtcd* etcd);
  ~CoordinatorWatch();
  CoordinatorWatch(const CoordinatorWatch&) = delete;
  CoordinatorWatch& operator=(const CoordinatorWatch&) = delete;

  /// The observer port for node `index`'s host; null when no coordinator of that node counts
  /// (static jobs: only node 0's coordinator is the job's).
  host::Observer* ObserverOf(uint32_t index);
  /// Node `index`'s host started; `coordinator`: it runs a coordinator from the start (node
  /// rank 0 without etcd, an extra agent's included: its rounds are numbered from 0 again).
  void HostStarted(uint32_t index, bool coordinator);
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
  /// A coordinator as the watch knows it (by node).
  struct Seen {
    const core::Coordinator* coordinator = nullptr;  // identity only, never dereferenced stale
    uint64_t epoch = 0;                              // etcd: 1, 2, ...: the order coordinators appeared in
    uint64_t launch = 0;                             // what tells its rounds apart (RoundKey::coordinator)
    int restarts = 0;                                // without etcd: the restarts of it counted so far
    int started = -1;                                // etcd: the last round it started
    bool ended = false;  // etcd: its verdict was reported
  };
  /// An observation of node `index`'s coordinator, queued for AfterEvent.
  void Observed(uint32_t index, const core::Observation& what);
  /// The coordinator of `index` now, if it is one the job counts.
  const core::Coordinator* CoordinatorOf(uint32_t index) const;
  void CheckRole(uint32_t index);
  void Apply(const Heard& heard);
  void Restarts(Seen& seen, int used);
  /// etcd: the launch of the job a coordinator that just took the role runs, from what etcd
  /// holds under its state key: the current one, or a new one when the state says it ended.
  uint64_t LaunchOf(std::string_view record_key);

  Loop& loop_;
  Nodes& nodes_;
  SimLog& log_;
  SimStats& stats_;
  Invariants& invariants_;
  SimEtcd* etcd_;
  std::vector<std::unique_ptr<Sink>> sinks_;
  std::vector<Seen> seen_;
  std::vector<uint32_t> touched_;  // nodes whose host ran in this event, in order
  std::vector<uint8_t> is_touched_;
  std::vector<Heard> heard_;              // this event's observations, in order
  uint64_t coordinator_incarnation_ = 0;  // +1 per coordinator a host started with
  uint64_t node0_incarnation_ = 0;        // the incarnation of node 0's own coordinator
  uint64_t coordinator_epochs_ = 0;
  int most_restarts_ = 0;  // etcd: the most restarts any coordinator counted
  bool ended_by_rule_ = false;
  std::optional<int64_t> first_verdict_ns_;
  std::map<std::string, uint64_t> launch_of_key_;  // etcd: state key -> its current launch
  uint64_t launches_ = 0;
};

}  // namespace ddprun::sim
