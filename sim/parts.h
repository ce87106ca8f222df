#pragma once
// The narrow handles the parts of the simulator (network, workers, fault injector) are given
// instead of the Cluster that owns them: the event queue and virtual time, the node table, the
// event log, the stats and the invariants, and, each as a small interface, the few things a
// part asks of the cluster. A part can so be read, and built in a test, without the rest.
// Internal to sim/.

#include <cstdint>
#include <optional>
#include <string>

#include "runner/core/time.h"
#include "sim/event_queue.h"

namespace ddprun::sim {

class Invariants;
class Nodes;
class SimLog;
struct SimStats;

/// The event queue and the virtual time of the event being processed: what every part
/// schedules on and reads the time from. Only the Cluster's event loop moves the time.
/// A virtual duration in the nanoseconds the queue and the node table count in.
inline int64_t Ns(Duration d) { return d.count(); }

struct Loop {
  EventQueue queue;
  int64_t now_ns = 0;
  TimePoint now() const { return TimePoint(Duration(now_ns)); }
};

/// What every part shares: the loop, the nodes, the event log and timeline, the run's stats
/// and the invariants' ledger (to which the parts report what happened).
struct Handles {
  Loop& loop;
  Nodes& nodes;
  SimLog& log;
  SimStats& stats;
  Invariants& invariants;
};

/// What the workers ask about the agents that start them.
class Roles {
 public:
  virtual ~Roles() = default;
  /// What tells the rounds of `node`'s agent apart from other rounds of the same number: the
  /// incarnation of the coordinator that now runs rounds (+1 per coordinator started); with
  /// etcd, where rounds go on across coordinators, the launch of the job its agent runs.
  virtual uint64_t RoundEpochOf(uint32_t node) const = 0;
  /// `node`'s agent starts workers as node rank `node_rank` in a round of `round_nodes` nodes.
  /// When that rank changes hands (a spare takes it, or its own node takes it back), the event
  /// log says so on both rows.
  virtual void NodePlays(uint32_t node, int node_rank, int round_nodes) = 0;
};

/// What the fault injector does to machines, and asks about them.
class Machines {
 public:
  virtual ~Machines() = default;
  /// Boots `node` (its agent starts) if a start is still pending.
  virtual void StartIfPending(uint32_t node) = 0;
  /// The machine dies now: its agent, sockets and workers vanish; it reboots after
  /// `reboot_after`, or stays down.
  virtual void Crash(uint32_t node, std::optional<Duration> reboot_after, const std::string& why) = 0;
  /// A duplicate-node-rank agent: a second agent on a machine of its own claims `node_rank`.
  /// Returns its node index; it is not started yet.
  virtual uint32_t AddExtraAgent(int node_rank) = 0;
  /// The agent (node index) whose workers last played node rank `node_rank`.
  virtual uint32_t HolderOf(int node_rank) const = 0;
  /// Some node may still act (not exited, not down or hung for good).
  virtual bool AnyUnfinished() const = 0;
  /// `node`'s agent hangs for good: it will never act again (a crash counts it back).
  virtual void HungForGood(uint32_t node) = 0;
};

}  // namespace ddprun::sim
