#pragma once
// What the simulator's checks learn from the coordinators. Each coordinator says what happened
// in typed observations (core::Observed: a round started or failed, a restart spent, the job
// ended); its host's event recorder turns them into records on the node's event-log port, and
// here that port is an ObservationSink that hands them to the CoordinatorWatch. The watch
// applies them after the event, as the invariants and the timeline expect, by one path for both
// backends: without etcd the job's coordinator is node 0's (each of its incarnations counts its
// restarts from 0), with etcd whichever agent holds the role (rounds and the budget go on across
// coordinators). Nothing reads a coordinator's phase or counters after every event: only when
// one takes or leaves the role, its count then, and the details no record carries (who a hang
// verdict named, whether restart.never_on ended the job) when the record says they changed.
// Internal to sim/.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runner/host/election.h"
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

  /// The event-log port for node `index`'s host: its records reach `forward` (the caller's
  /// log; may be null) unchanged. Null when no coordinator of that node counts and there is
  /// nothing to forward to (static jobs: only node 0's coordinator is the job's).
  host::EventLog* PortOf(uint32_t index, host::EventLog* forward);
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

 private:
  class Sink;
  /// One observation, as its node's recorder wrote it.
  struct Heard {
    enum class Kind : uint8_t {
      kRoundStarted,
      kRestartSpent,
      kRoundFailed,
      kJobEnded
    } kind = Kind::kRoundStarted;
    uint32_t node = 0;
    int round = 0;
    int restarts = 0;  // kRoundStarted, kRestartSpent (the restart), kJobEnded
    int exit_code = 0;
  };
  /// A coordinator as the watch knows it (by node).
  struct Seen {
    const core::Coordinator* coordinator = nullptr;  // identity only, never dereferenced stale
    uint64_t epoch = 0;                              // etcd: 1, 2, ...: the order coordinators appeared in
    uint64_t launch = 0;                             // what tells its rounds apart (RoundKey::coordinator)
    int restarts = 0;                                // without etcd: the restarts of it counted so far
    int started = -1;                                // etcd: the last round it started
    uint64_t judgements = 0;
    bool ended = false;  // etcd: its verdict was reported
  };
  /// A record of node `index`'s recorder (the observations it consumed), queued for AfterEvent.
  void Recorded(uint32_t index, const host::Event& event);
  /// The coordinator of `index` now, if it is one the job counts.
  const core::Coordinator* CoordinatorOf(uint32_t index) const;
  void CheckRole(uint32_t index);
  void Apply(const Heard& heard);
  void Restarts(Seen& seen, int used);
  /// etcd: the launch of the job a coordinator that just took the role runs, from what etcd
  /// holds under its state key: the current one, or a new one when the state says it ended.
  uint64_t LaunchOf(const host::Election& election);

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
  std::map<std::string, uint64_t> launch_of_key_;  // etcd: state key -> its current launch
  uint64_t launches_ = 0;
};

}  // namespace ddprun::sim
