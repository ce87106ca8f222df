#pragma once
// Every safety and liveness property the simulator checks, in one place (docs/simulator.md,
// "Invariants and swarm"). The parts of the simulator report what happened (a worker started
// or ended, a round failed, an agent exited, hung or heard from the coordinator) to this
// module; it keeps its own ledger, independent of the model's bookkeeping, and checks every
// property after every event. Properties with a time bound schedule their own check event, so
// a violation is found at the bound itself.

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runner/core/time.h"

namespace ddprun::sim {

/// A round job-wide: a rebooted node 0 starts a fresh coordinator that numbers rounds from 0
/// again, so the round number alone is ambiguous.
struct RoundKey {
  uint64_t coordinator = 0;  // the coordinator incarnation that started the round
  int round = 0;
  auto operator<=>(const RoundKey&) const = default;
};

/// With timeouts.progress: how soon a round that a hung rank stalled must be stopped.
struct HangBounds {
  std::optional<Duration> progress;  // timeouts.progress; nullopt: "auto"
  Duration progress_start{};         // until a rank's first step beacon
  /// "auto": the learnt timeout is at most this factor times the longest interval between two
  /// step beacons of one rank seen in the job, and at least the floor.
  int auto_factor = 5;
  Duration auto_floor{};
  /// After a rank's allowed silence: the coordinator's wait for stacks, the stop and slack.
  Duration after_silence{};
};

/// The bounds the checks hold the protocol to (derived from the job file by the caller).
struct InvariantBounds {
  int max_restarts = 0;
  int world = 0;  // the world size of the job node 0's coordinator runs
  /// After a round fails, every worker of it is gone within this (stop_grace + 3 heartbeats +
  /// slack); a hung agent cannot stop anything, so the bound starts again when it resumes.
  Duration stop_bound{};
  /// A worker runs at most this long after its agent last heard from the coordinator (loss
  /// detection + stop_grace + SIGKILL + slack), whether the agent runs or is hung (its guardian
  /// then kills it): the lease that fencing relies on.
  Duration lease{};
  /// Set when the job detects hung ranks (timeouts.progress).
  std::optional<HangBounds> hangs;
  /// The WORLD_SIZE every round must have lies in min_world..max_world (0: `world`):
  /// cluster.min_nodes x nproc_per_node .. nnodes x nproc_per_node.
  int min_world = 0;
  int max_world = 0;
  /// An agent that heard nothing from the coordinator for longer than this (a heartbeat and a
  /// second: the coordinator beats every heartbeat) is cut off from it, by a partition or
  /// because the coordinator's host died before it stopped the round: it learns of the stop
  /// only by losing the coordinator, so its workers answer to the lease until it hears again,
  /// and the stop bound starts again when it does. The default: never cut off.
  Duration cut_off = Duration::max();
};

/// A worker process as it starts, with what the agent put in its environment.
struct WorkerStart {
  uint32_t node = 0;  // simulator node index (an extra agent has its own)
  RoundKey round;
  int world = 0;        // the world size of the job the coordinator runs
  int global_rank = 0;  // the rank the agent meant to start
  int local_rank = 0;
  uint64_t pid = 0;
  std::string rank_env;       // RANK as the agent set it
  std::string world_env;      // WORLD_SIZE as the agent set it
  std::string node_rank_env;  // GROUP_RANK as the agent set it: the node rank it plays
};

/// How the run ended, for the liveness checks.
struct RunEnd {
  int exit_code = 0;  // the job's outcome (node 0's, else the nodes' majority)
  int restarts_used = 0;
  bool rendezvous_fault = false;  // a fault that may keep a node away long enough for exit 3
  /// Nodes still running at the end (labels, at most 8) and how many in all.
  std::vector<std::string> unfinished;
  int64_t unfinished_count = 0;
  bool deadlock = false;  // the event queue ran dry
  /// Every rank still running in the job's round hangs for good and nothing watches progress
  /// (no timeouts.progress): no mechanism can end that round, so no end is owed. The product
  /// says so instead: `check` warns when a job has no timeouts.progress.
  bool stuck_for_good = false;
  /// The job ended on a failure that restart.never_on names: exit 1 with restarts left, asked for.
  bool ended_by_rule = false;
  bool liveness_limit = false;  // the run stopped at the liveness deadline, not max_time
  int64_t limit_ns = 0;
  Duration max_time{};
};

class Invariants {
 public:
  /// `schedule_check` asks the event loop for an event at the given time (AfterEvent runs
  /// after it like after any other).
  Invariants(InvariantBounds bounds, std::function<void(int64_t)> schedule_check);

  /// A node (job node, spare or extra agent) and how messages name it ("node 3", "spare 0").
  void AddNode(uint32_t node, std::string label, bool spare = false);
  /// The WORLD_SIZE a round may have (InvariantBounds::min_world, max_world).
  void SetWorldBounds(int min_world, int max_world) {
    bounds_.min_world = min_world;
    bounds_.max_world = max_world;
  }

  /// rendezvous.backend = "etcd": whichever agent holds the coordinator role plays node rank 0,
  /// a spare included.
  void SetRankZeroAnywhere() { rank_zero_anywhere_ = true; }
  /// etcd: the node whose agent now runs the coordinator (node 0 without etcd).
  void SetCoordinatorNode(uint32_t node) { coordinator_node_ = node; }

  // ---- observations: recorded in order, checked by AfterEvent ----
  void WorkerStarted(WorkerStart start);
  /// The process ended; `exit_zero`: it exited with code 0 by itself.
  void WorkerEnded(uint64_t pid, bool exit_zero);
  /// The first failure of a round (a rank died, a node crashed): the stop bound starts.
  void RoundFailed(RoundKey round);
  /// The agent stopped processing events until `until_ns` (INT64_MAX: for good).
  void AgentHung(uint32_t node, int64_t until_ns);
  /// A crashed or exited agent is gone: nothing of it can hang any more.
  void AgentGone(uint32_t node);
  /// The agent received bytes from the coordinator: its lease is renewed.
  void HeardFromCoordinator(uint32_t node, int64_t now_ns);
  /// A quiet stretch (sim/quiet.cc): the agent heard the coordinator from `first_ns` to
  /// `last_ns`, never silent for longer than `longest_gap_ns` in between.
  void HeardThroughout(uint32_t node, int64_t first_ns, int64_t last_ns, int64_t longest_gap_ns);
  /// Whether a gap of `gap_ns` between two words cuts an agent off (InvariantBounds::cut_off).
  bool CutsOff(int64_t gap_ns) const { return gap_ns > longest_gap_ns(); }
  int64_t longest_gap_ns() const { return bounds_.cut_off.count(); }
  /// The agent exited with `code`; `round` is the round it last took part in (if any).
  void AgentExited(uint32_t node, int code, std::optional<RoundKey> round);
  /// A store client (worker `pid` of `client`) reached the store of round `store` on `port`.
  void StoreConnected(uint64_t pid, RoundKey client, RoundKey store, uint16_t port);
  /// The coordinator's count of restarts used (read after every event).
  void CoordinatorRestarts(int used);
  /// etcd: coordinator `epoch` (1, 2, ... in the order they appeared; `label` its agent) began
  /// `round` (its launch of the job, and the number): its StartRounds went out.
  void CoordinatorStartedRound(uint64_t epoch, std::string label, RoundKey round);
  /// etcd: coordinator `epoch` is gone (it stepped down, or its agent crashed or exited).
  void CoordinatorGone(uint64_t epoch);
  /// etcd: the coordinator on `label` ended launch `launch` of the job with `exit_code` (told
  /// every agent). A launch begins when a coordinator finds no state, or the state of an ended
  /// launch, in etcd (an agent started after the end begins a new one, as a relaunch does).
  void CoordinatorEnded(int64_t now_ns, uint64_t launch, std::string label, int exit_code);

  // ---- hung ranks (only with InvariantBounds::hangs) ----
  /// A step beacon of worker `pid` reached its agent (recorded at once: one per step per rank).
  void StepBeacon(uint64_t pid, int64_t now_ns);
  /// The gang of `round` stopped training because the ranks `hung` hang (nothing else stalls
  /// it): the round must be stopped within the hang bound.
  void GangHung(RoundKey round, std::vector<int> hung);
  /// ... and no longer (the rank runs again, the round failed, a partition stalls it too).
  void GangResumed(RoundKey round);
  /// The agent signalled `global_rank` of `round` for its stacks; `hung`: the rank hangs now;
  /// `training`: its gang trains now (no rank of it hangs, nothing stalls it).
  void StacksTaken(RoundKey round, int global_rank, bool hung, bool training);
  /// The coordinator stopped `round` as hung naming `culprits`, with the stacks of `with_stack`.
  void HangJudged(RoundKey round, std::vector<int> culprits, std::vector<int> with_stack);

  /// Checks every property against what this event changed, and the time bounds due by `now`.
  void AfterEvent(int64_t now_ns);
  /// The end-of-run checks: liveness, exit 1 only with the budget spent, exit 3 only with a
  /// fault that kept a node away.
  void AtEnd(int64_t now_ns, const RunEnd& end);

  /// The first violation, "what (at 12m03s)"; set once.
  const std::optional<std::string>& violation() const { return violation_; }
  /// The violation text without the time, as it was detected (for the event log).
  const std::string& what() const { return what_; }

 private:
  struct Worker {
    uint32_t node = 0;
    RoundKey round;
    int global_rank = 0;
    uint64_t pid = 0;
    int64_t last_step_ns = -1;  // its last step beacon (hung ranks)
    int node_rank = 0;          // the node rank its agent played (GROUP_RANK)
  };
  /// Who holds a node rank: the agent whose workers of it run (live > 0), and their round.
  struct NodeRankHolder {
    uint32_t node = 0;
    RoundKey round;
    int live = 0;
  };
  struct Round {
    int world = 0;
    std::vector<uint8_t> started;  // per rank: a worker of this rank started in this round
    int exited_zero = 0;
    int live = 0;
    std::vector<uint64_t> pids;  // in start order (deterministic iteration)
    std::optional<int64_t> failed_ns;
    int64_t stop_check_ns = -1;  // when the stop bound is checked next
    // Hung ranks.
    int stepped = 0;                // ranks whose step beacons reached their agent
    std::vector<int> hung;          // the ranks whose hang stalled the round
    int64_t hung_since_ns = -1;     // when it stalled because of them
    int64_t hang_check_ns = -1;     // when the hang bound is checked next
    std::vector<int> hung_at_dump;  // ranks that hung when their stacks were taken
    bool trained_at_dump = false;   // a stack was taken while the round trained
    bool stalled_at_dump = false;   // a stack was taken while it did not
  };
  struct Node {
    std::string label;
    bool spare = false;          // an entry of cluster.spares
    std::vector<uint64_t> live;  // pids of this node's running workers
    int64_t last_heard_ns = 0;
    int64_t hung_until_ns = 0;  // INT64_MAX: for good
    int64_t hang_end_ns = -1;   // when its last finite hang ended
    int64_t reheard_ns = -1;    // when it last heard the coordinator again after a cut-off
  };
  enum class Kind : uint8_t {
    kStart,
    kEnd,
    kFailed,
    kExit,
    kStore,
    kHung,
    kResumed,
    kStacks,
    kJudged,
    kLeads,
    kGone
  };
  /// etcd: a coordinator as the invariants know it.
  struct Coordinator {
    std::string label;
    std::optional<RoundKey> started;  // the last round it started
  };
  struct Observation {
    Kind kind = Kind::kStart;
    uint32_t node = 0;
    int code = 0;
    bool flag = false;
    uint64_t pid = 0;
    std::optional<RoundKey> round;
    RoundKey other;  // kStore: the round of the store reached
  };
  /// What kHung and kJudged carry (by Observation::pid, an index here).
  struct Ranks {
    std::vector<int> first;
    std::vector<int> second;
  };

  void Fail(int64_t now_ns, std::string what);
  void CheckStart(int64_t now_ns, const WorkerStart& start);
  /// The worker of `start`, past every check: it holds its rank and node rank, and runs.
  void Admit(int64_t now_ns, const WorkerStart& start, int rank, int node_rank);
  void ApplyEnd(uint64_t pid, bool exit_zero);
  void CheckExit(int64_t now_ns, uint32_t node, int code, std::optional<RoundKey> round);
  void CheckStore(int64_t now_ns, const Observation& o);
  void CheckStopBound(int64_t now_ns, const RoundKey& key, Round& round);
  void CheckLeases(int64_t now_ns);
  void CheckCoordinatorStart(int64_t now_ns, uint64_t epoch, const RoundKey& round);
  void OnGangHung(int64_t now_ns, const RoundKey& key, std::vector<int> hung);
  /// The most silence an agent allows a rank of `round` now (hung ranks).
  int64_t SilenceAllowed(const Round& round) const;
  void CheckHangBound(int64_t now_ns, const RoundKey& key, Round& round);
  void CheckJudgement(int64_t now_ns, const RoundKey& key, const Ranks& judged);
  int64_t ResumedAt(const Node& node) const;
  bool HungAt(const Node& node, int64_t now_ns) const { return node.hung_until_ns > now_ns; }
  void Schedule(int64_t at_ns);
  void Prune();

  InvariantBounds bounds_;
  std::function<void(int64_t)> schedule_check_;
  std::vector<Node> nodes_;
  std::vector<Observation> log_;
  std::vector<WorkerStart> starts_;
  std::vector<Ranks> ranks_;                      // kHung, kJudged payloads of log_
  int64_t longest_step_interval_ns_ = 0;          // between two step beacons of one rank, job-wide
  std::unordered_map<uint64_t, Worker> workers_;  // by pid; looked up, never iterated
  std::vector<uint64_t> holders_;                 // global rank -> pid of its live holder, 0: none
  std::vector<NodeRankHolder> node_holders_;      // node rank -> the agent whose workers run it
  std::map<RoundKey, Round> rounds_;
  std::optional<RoundKey> latest_round_;  // the last round any worker started in
  int restarts_ = 0;
  bool rank_zero_anywhere_ = false;
  uint32_t coordinator_node_ = 0;
  std::map<uint64_t, Coordinator> coordinators_;  // etcd: the coordinators that exist, by epoch
  std::map<RoundKey, std::pair<uint64_t, std::string>> round_starters_;  // round -> (epoch, label)
  std::vector<std::string> labels_;                           // kLeads payloads of log_ (by Observation::pid)
  std::map<uint64_t, std::pair<int, std::string>> verdicts_;  // etcd: by launch, (code, coordinator)
  int checked_restarts_ = 0;
  int64_t next_due_ns_ = INT64_MAX;  // the earliest time bound to check
  int64_t next_lease_check_ns_ = INT64_MAX;
  std::optional<std::string> violation_;
  std::string what_;
};

}  // namespace ddprun::sim
