#pragma once
// The job's agents as the coordinator sees them: one slot per agent (the nodes, then the
// spares), the node rank each holds, who plays in the current round, and how each is named in
// what the coordinator says. State and names only: the coordinator decides what changes.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/time.h"
#include "schema/job_spec.h"

namespace ddprun::core {

/// One agent of the job. Indexed by the node rank the agent was started with (its "agent
/// index"); `position` is the node rank it holds now, `plays` the one it plays this round.
struct AgentSlot {
  /// Where an agent stands with the verdict once the job is ending.
  enum class EndState {
    kSettled,  // acknowledged, closed after being told, or never joined: not waited for
    kTold,     // JobEnd sent on its connection; waiting for the acknowledgement
    kAway,     // joined once, not connected at the end: waiting for it to rejoin
  };
  /// Set when the agent was lost while its workers might run: no round starts before `until`
  /// unless the agent whose workers they are rejoins (it rejoins only once they are gone).
  struct Fence {
    TimePoint until;
    uint64_t holder = 0;  // that agent's instance; 0: workers of two agents (only time ends it)
  };

  std::optional<ConnId> conn;
  std::string host;
  uint64_t instance = 0;
  bool done = false;     // NodeDone for the current round
  bool stopped = false;  // RoundStopped for the stopping round
  int stopped_ranks = 0;
  bool ever_joined = false;
  std::string refused;       // why its last join was refused, for the rendezvous summary
  std::string refusal_said;  // the last refusal logged for this rank (its source port left out)
  std::string left;          // why it was lost after joining
  EndState end = EndState::kSettled;
  std::optional<Fence> fence;
  int position = -1;                      // the node rank it holds; -1: none (a waiting spare)
  int plays = -1;                         // the node rank it plays in the current round; -1: none. The
                                          // same as `position` unless the round shrank (cluster.min_nodes)
  std::optional<TimePoint> absent_since;  // not connected since then (for timeouts.replace)
  std::string probe_endpoint;             // from its Join: where the others probe it ("" none)
};

class Roster {
 public:
  /// Every agent of `spec`, absent since `start`; node rank p is held by agent p.
  Roster(const JobSpec& spec, TimePoint start);

  int agents() const { return static_cast<int>(slots_.size()); }
  AgentSlot& at(int agent) { return slots_[static_cast<size_t>(agent)]; }
  const AgentSlot& at(int agent) const { return slots_[static_cast<size_t>(agent)]; }
  std::vector<AgentSlot>& slots() { return slots_; }
  const std::vector<AgentSlot>& slots() const { return slots_; }

  /// By node rank: the agent that holds it.
  std::vector<int>& holders() { return holders_; }
  const std::vector<int>& holders() const { return holders_; }
  /// By node rank of the current round: the agent that plays it (fewer than the holders when
  /// the round shrank).
  std::vector<int>& players() { return players_; }
  const std::vector<int>& players() const { return players_; }

  /// Connects or disconnects `agent`: the one place a slot's connection changes, so that
  /// the counts below stay O(1) at 16,384 nodes.
  void SetConn(int agent, std::optional<ConnId> conn);
  /// Node rank `p` goes to `agent` (a waiting spare); its holder waits on the bench.
  void MoveRank(int p, int agent);
  /// Agents with a connection.
  int connected() const { return connected_; }
  /// Every node rank's holder is connected.
  bool PositionsFilled() const { return filled_ == static_cast<int>(holders_.size()); }
  /// `agent` holds node rank 0 from now on; the agent that held it takes `agent`'s place (its
  /// node rank, or the bench). rendezvous.backend = "etcd" (Coordinator::PlaceRankZero).
  void PlaceRankZero(int agent);

  /// Agent `agent` as it was started, with its host and, when it holds another one, the node
  /// rank it holds: "node 2 (gpu-03)", "spare 0 (gpu-09, node rank 2)", "node 0 (gpu-01, node
  /// rank 5)". A name never moves to another host, whatever ranks change hands (issue 37: "node 3"
  /// named two hosts in one log).
  std::string NodeName(int agent) const;
  /// Agent `agent` by what it was started as ("node 2", "spare 0"), with its host.
  std::string AgentName(int agent) const;
  /// "rank 9 (node 1 (gpu-02), local rank 1)", by the node that plays it this round.
  std::string RankName(int global_rank) const;

 private:
  const JobSpec& spec_;
  std::vector<AgentSlot> slots_;
  std::vector<int> holders_;
  std::vector<int> players_;
  int connected_ = 0;  // agents with a connection
  int filled_ = 0;     // node ranks whose holder has a connection
};

}  // namespace ddprun::core
