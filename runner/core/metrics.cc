// The state machines' metrics snapshots (runner/core/metrics.h). Kept apart from agent.cc and
// coordinator.cc: these functions only read state, and nothing the protocol decides depends
// on them.
#include "runner/core/metrics.h"

#include <algorithm>
#include <chrono>

#include "runner/core/agent.h"
#include "runner/core/coordinator.h"

namespace ddprun::core {

// The name tables keep in step with the phases they name.
static_assert(kAgentPhaseNames.size() == static_cast<size_t>(Agent::Phase::kExited) + 1);
static_assert(kCoordinatorPhaseNames.size() == static_cast<size_t>(Coordinator::Phase::kDone) + 1);
static_assert(static_cast<size_t>(Coordinator::Phase::kBackoff) == 4 && kJobPhaseNames[4] == "backoff" &&
              kCoordinatorPhaseNames[4] == "backoff");

namespace {

std::optional<Duration> Micros(int64_t us) {
  if (us < 0) return std::nullopt;
  return std::chrono::duration_cast<Duration>(std::chrono::microseconds(us));
}

}  // namespace

AgentMetrics Agent::Metrics(TimePoint now) const {
  AgentMetrics m;
  m.node_rank = config_.node_rank;
  m.host = config_.host;
  m.version = config_.ddprun_version;
  m.phase = kAgentPhaseNames[static_cast<size_t>(phase())];
  m.round = round_;
  m.plays = node_rank_;
  m.workers_running = running_workers();
  m.exit_code = exit_code();
  // The step and work times of the last progress report (Report), over the full window.
  const size_t buckets = spec_.ProgressWindowBuckets();
  const Duration window = ReportPeriod() * static_cast<int64_t>(buckets);
  for (const Worker& w : workers_) {
    if (!w.running) continue;
    const Beats& b = w.beats;
    RankMetrics rank;
    rank.global_rank = w.global_rank;
    rank.last_step = b.step;
    if (b.step >= 0 || b.after_phase) rank.since_beacon = now - b.since;
    if (b.window.size() == buckets) {
      const Beats::Bucket sum = b.WindowSum();
      if (sum.steps > 0) rank.step_time = window / sum.steps;
      if (sum.busy_steps > 0) rank.work_time = Micros(sum.busy_us / sum.busy_steps);
    }
    m.ranks.push_back(rank);
  }
  return m;
}

CoordinatorMetrics Coordinator::Metrics() const {
  CoordinatorMetrics m;
  m.exit_code = exit_code_;
  if (exit_code_ && (phase() == Phase::kEnding || phase() == Phase::kDone)) {
    // 128 + SIGHUP, SIGINT or SIGTERM: the job was interrupted (exit_code.h).
    const int code = *exit_code_;
    m.phase = code == 0                                     ? "succeeded"
              : (code == 129 || code == 130 || code == 143) ? "interrupted"
                                                            : "failed";
  } else {
    m.phase = kJobPhaseNames[static_cast<size_t>(phase())];  // the first five are the same
  }
  m.round = round_;
  m.restarts_used = restarts_used_;
  // Every restart followed a failed round; a failure of the current round is the last one.
  m.rounds_failed = restarts_used_ + (last_failure_ && last_failure_->round == round_ ? 1 : 0);
  m.restarts_allowed = spec_.restart.max_restarts;
  m.nodes = spec_.cluster.nnodes;
  m.spares = spec_.cluster.spares;
  m.nodes_joined = roster_.connected();
  for (const AgentSlot& slot : roster_.slots()) {
    if (slot.ever_joined && !slot.conn) ++m.nodes_away;
    if (slot.conn && slot.position < 0) ++m.spares_waiting;
  }
  m.round_nodes = static_cast<int>(roster_.players().size());
  m.hosts_quarantined = placement_.book().Sitting(last_input_);
  if (last_failure_) {
    m.last_failure_round = last_failure_->round;
    if (!last_failure_->kinds.empty()) m.last_failure_kind = last_failure_->kinds.front().Text();
  }
  const auto& ranks_seen = hangs_.ranks_seen();
  m.ranks_reported = ranks_seen.size();
  std::vector<ReportedRankMetrics> ranks;
  ranks.reserve(ranks_seen.size());
  for (const auto& [global_rank, seen] : ranks_seen) {
    if (seen.straggling) ++m.stragglers;
    ranks.push_back({global_rank, seen.node_rank, seen.rate.step, Micros(seen.rate.step_us),
                     Micros(seen.rate.work_us), seen.straggling});
  }
  // Stragglers first, then the lowest ranks, up to the limit; listed by rank.
  auto by_interest = [](const ReportedRankMetrics& a, const ReportedRankMetrics& b) {
    if (a.straggling != b.straggling) return a.straggling;
    return a.global_rank < b.global_rank;
  };
  if (ranks.size() > kMaxReportedRanks) {
    std::nth_element(ranks.begin(), ranks.begin() + static_cast<std::ptrdiff_t>(kMaxReportedRanks),
                     ranks.end(), by_interest);
    ranks.resize(kMaxReportedRanks);
  }
  std::sort(ranks.begin(), ranks.end(), [](const ReportedRankMetrics& a, const ReportedRankMetrics& b) {
    return a.global_rank < b.global_rank;
  });
  m.ranks = std::move(ranks);
  return m;
}

}  // namespace ddprun::core
