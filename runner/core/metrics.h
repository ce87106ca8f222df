#pragma once
// What the state machines can say about themselves on a metrics endpoint: plain snapshots,
// filled by Agent::Metrics and Coordinator::Metrics (const: taking one changes nothing) and
// rendered as Prometheus text by host::RenderMetricsText. Sans-IO like the rest of the core.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runner/core/time.h"

namespace ddprun::core {

/// One running rank of this node, from its progress beacons.
struct RankMetrics {
  int global_rank = 0;
  int64_t last_step = -1;                // its last step beacon; -1 none yet
  std::optional<Duration> since_beacon;  // since its last step or phase beacon; none: no beacon
  std::optional<Duration> step_time;     // per step over the straggler window, once it is full
  std::optional<Duration> work_time;     // its own work per step, when its beacons carry it
  bool operator==(const RankMetrics&) const = default;
};

/// The agent's phases by name, in Agent::Phase order: a metric's label values.
inline constexpr std::array<std::string_view, 6> kAgentPhaseNames = {"connecting", "retry-wait", "joining",
                                                                     "waiting",    "running",    "exited"};

/// One node's agent, as Agent::Metrics(now) sees it.
struct AgentMetrics {
  int node_rank = 0;
  std::string host;
  std::string version;
  std::string_view phase = kAgentPhaseNames[0];  // one of kAgentPhaseNames
  int round = -1;                                // the round it last started; -1 none yet
  int plays = -1;  // the node rank it plays in that round (a spare: the one it replaced)
  int workers_running = 0;
  std::optional<int> exit_code;    // once it has decided how it exits
  std::vector<RankMetrics> ranks;  // its running ranks, by local rank
  bool operator==(const AgentMetrics&) const = default;
};

/// One rank as node 0's coordinator knows it from the agents' progress reports this round.
struct ReportedRankMetrics {
  int global_rank = 0;
  int node_rank = 0;
  int64_t last_step = -1;
  std::optional<Duration> step_time;
  std::optional<Duration> work_time;
  bool straggling = false;
  bool operator==(const ReportedRankMetrics&) const = default;
};

/// The coordinator's phases by name, in Coordinator::Phase order.
inline constexpr std::array<std::string_view, 7> kCoordinatorPhaseNames = {
    "rendezvous", "starting", "running", "stopping", "backoff", "ending", "done"};

/// The job's phase as a metric shows it: the coordinator's phase until the job's outcome is
/// known, then the outcome ("ending" and "done" say nothing a dashboard can use).
inline constexpr std::array<std::string_view, 8> kJobPhaseNames = {
    "rendezvous", "starting", "running", "stopping", "backoff", "succeeded", "failed", "interrupted"};

/// The most ranks a coordinator snapshot lists one by one (stragglers first, then the lowest
/// ranks): a scrape of a very large job stays small and never holds up the event loop.
inline constexpr size_t kMaxReportedRanks = 1024;

/// The job, as node 0's coordinator sees it (Coordinator::Metrics).
struct CoordinatorMetrics {
  std::string_view phase = kJobPhaseNames[0];  // one of kJobPhaseNames
  std::optional<int> exit_code;                // the job's, once its outcome is known
  int round = 0;
  int restarts_used = 0;
  int rounds_failed = 0;      // rounds that ended in a failure (restarted or not)
  int restarts_allowed = 0;   // restart.max_restarts
  int nodes = 0;              // the job's node count
  int spares = 0;             // the job's spares (cluster.spares)
  int nodes_joined = 0;       // agents (nodes and spares) connected and joined now
  int nodes_away = 0;         // agents that joined once and are not connected now
  int spares_waiting = 0;     // joined agents that play no node rank: ready to replace one
  int round_nodes = 0;        // nodes in the current (or last) round: fewer than `nodes` when
                              // it shrank (cluster.min_nodes); 0 before the first round
  int hosts_quarantined = 0;  // hosts kept out of the job now
  std::optional<int> last_failure_round;
  std::string last_failure_kind;           // the root cause's most specific kind ("exit:1"); "" none
  int stragglers = 0;                      // ranks reported as stragglers now
  size_t ranks_reported = 0;               // ranks with a progress report this round
  std::vector<ReportedRankMetrics> ranks;  // by global rank, at most kMaxReportedRanks
  bool operator==(const CoordinatorMetrics&) const = default;
};

}  // namespace ddprun::core
