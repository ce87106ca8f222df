// The agent's watch over its ranks' progress beacons: how long each may stay silent (fixed, or
// learnt with timeouts.progress = "auto"), a hung rank reported to the coordinator, the stacks
// it asks for dumped and sent, and the periodic progress report (straggler windows). Methods
// of Agent (agent.h), apart from its link and rounds.
#include <algorithm>

#include <fmt/format.h>

#include "runner/core/agent.h"
#include "schema/duration.h"

namespace ddprun::core {
namespace {

// faulthandler writes from its C signal handler at once; this leaves time for the scheduler.
constexpr Duration kStackWait = Seconds(1);
// The most stack text one RankStacks carries (a frame is far below kMaxPayload).
constexpr size_t kMaxStacksBytes = 512 * 1024;

int64_t Ms(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

}  // namespace

bool Agent::WatchesProgress() const {
  const auto* running = std::get_if<Running>(&work_);
  if (!spec_.timeouts.DetectsHangs() || Exited() || !running || !IsJoined() || leaving() ||
      running->told != Told::kNothing) {
    return false;
  }
  // Once the round's stacks were asked for, it stops anyway: no second report.
  return !running->stacks.asked;
}

std::optional<Duration> Agent::LearntTimeout() const {
  if (longest_interval_ <= Duration(0)) return std::nullopt;
  return std::max(JobSpec::Timeouts::kAutoProgressFloor,
                  JobSpec::Timeouts::kAutoProgressFactor * longest_interval_);
}

Duration Agent::SilenceAllowed(const Beats& beats) const {
  const auto& t = spec_.timeouts;
  const Duration step = t.progress ? *t.progress : LearntTimeout().value_or(t.progress_start);
  // To the first step, and after a phase: start-up, checkpoint loads and saves.
  if (!beats.stepped) return std::max(step, t.progress_start);
  return step;
}

Duration Agent::ReportPeriod() const { return spec_.ProgressReportPeriod(); }

void Agent::OnBeacon(TimePoint now, const Beacon& beacon) {
  auto* running = std::get_if<Running>(&work_);
  if (!running || !IsJoined() || beacon.round != round_ || beacon.local_rank < 0 ||
      beacon.local_rank >= static_cast<int>(workers_.size())) {
    return;  // stale (an earlier round's process), or nothing runs
  }
  Worker& worker = workers_[static_cast<size_t>(beacon.local_rank)];
  if (!worker.running) return;
  Beats& b = worker.beats;
  b.stack_signal = beacon.stack_signal;
  switch (beacon.kind) {
    case BeaconKind::kHello:
      return;  // alive and imported: not progress
    case BeaconKind::kPhase:
      b.since = now;
      b.stepped = false;
      b.after_phase = true;
      return;
    case BeaconKind::kStep:
      break;
  }
  if (b.stepped) {
    const Duration interval = now - b.since;
    ++b.intervals;
    b.longest = std::max(b.longest, interval);
    if (b.intervals >= JobSpec::Timeouts::kAutoProgressWarmup) {
      longest_interval_ = std::max(longest_interval_, b.longest);
    }
  }
  // Throttled beacons skip steps: the window counts the steps between them.
  // A beacon that repeats its step (validation batches) shows life, not training steps.
  const int64_t steps = b.step < 0 ? 1 : std::max<int64_t>(beacon.step - b.step, 0);
  b.current.steps += steps;
  if (beacon.busy_us >= 0 && steps > 0) {
    b.current.busy_steps += steps;
    b.current.busy_us += beacon.busy_us;
  }
  b.since = now;
  b.stepped = true;
  b.after_phase = false;
  b.step = beacon.step;
  if (!running->next_report) running->next_report = now + ReportPeriod();
}

void Agent::OnProgressExpired(TimePoint now, std::vector<AgentEffect>& out) {
  Worker* hung = nullptr;
  TimePoint hung_at{};
  for (Worker& w : workers_) {
    if (!w.running) continue;
    const TimePoint at = w.beats.since + SilenceAllowed(w.beats);
    if (!hung || at < hung_at) {
      hung = &w;
      hung_at = at;
    }
  }
  if (!hung) return;
  const Beats& b = hung->beats;
  const Duration allowed = SilenceAllowed(b);
  const auto& t = spec_.timeouts;
  std::string limit;
  const bool start_limit = !b.stepped && allowed == t.progress_start;
  const bool learnt = !t.progress && LearntTimeout().has_value();
  if (start_limit) {
    limit = fmt::format("timeouts.progress_start = {}", FormatDuration(t.progress_start));
  } else if (t.progress) {
    limit = fmt::format("timeouts.progress = {}", FormatDuration(*t.progress));
  } else if (learnt) {
    limit = fmt::format("timeouts.progress = \"auto\": {}", HumanDuration(allowed));
  } else {
    // Fewer intervals seen than the warm-up needs: the start-up timeout stands in.
    limit = fmt::format("timeouts.progress = \"auto\", nothing learnt yet: timeouts.progress_start = {}",
                        FormatDuration(t.progress_start));
  }
  const int local = static_cast<int>(hung - workers_.data());
  const std::string since = b.after_phase ? "since its last phase"
                            : !b.stepped  ? "since it started"
                                          : fmt::format("after step {}", b.step);
  Log(LogLevel::kError,
      fmt::format("rank {} (local rank {}) sent no progress beacon for {} {} ({}); asking every "
                  "rank where it is before the round is stopped",
                  hung->global_rank, local, HumanDuration(now - b.since), since, limit),
      out);
  std::get<Running>(work_).told = Told::kHang;
  Send(wire::RankHung{round_, hung->global_rank, local, b.step, Ms(now - b.since), Ms(allowed), start_limit,
                      learnt},
       out);
}

void Agent::OnHangCleared(const wire::HangCleared& cleared, std::vector<AgentEffect>& out) {
  auto* running = std::get_if<Running>(&work_);
  if (cleared.round != round_ || !running || !IsJoined()) return;
  running->stacks.asked = false;
  if (running->told == Told::kHang) running->told = Told::kNothing;
  Log(LogLevel::kInfo,
      fmt::format(
          "round {}: every rank progresses again (the coordinator saw it in their stacks); the round goes on",
          round_),
      out);
}

void Agent::OnDumpStacks(TimePoint now, const wire::DumpStacks& dump, std::vector<AgentEffect>& out) {
  // A stop begun meanwhile does not cancel it: the coordinator waits for every node's ranks.
  if (dump.round != round_ || !RoundOpen() || stacks()->asked) return;
  stacks()->asked = true;
  SignalForStacks signal{round_, {}};
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    if (w.running && w.beats.stack_signal > 0) {
      signal.targets.emplace_back(static_cast<int>(i), w.beats.stack_signal);
    }
  }
  if (signal.targets.empty()) {
    SendStacks(now, {}, out);  // no rank can dump: say where they were without stacks
    return;
  }
  out.push_back(std::move(signal));
  stacks()->due = now + kStackWait;
}

void Agent::SendStacks(TimePoint now, const std::vector<std::string>& dumps, std::vector<AgentEffect>& out) {
  wire::RankStacks message{round_, {}};
  size_t bytes = 0;
  int with_stack = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    if (!w.running) continue;
    wire::RankState state{w.global_rank, w.beats.step, Ms(now - w.beats.since), ""};
    if (i < dumps.size() && bytes < kMaxStacksBytes) {
      state.stack = FormatFrames(MainThreadStack(dumps[i]));
      bytes += state.stack.size();
      if (!state.stack.empty()) ++with_stack;
    }
    message.ranks.push_back(std::move(state));
  }
  Log(LogLevel::kInfo,
      fmt::format("round {}: sending where this node's {} running rank{} are ({} with a stack; all "
                  "threads in {}/attempt-{}/rank-<r>.stacks)",
                  round_, message.ranks.size(), message.ranks.size() == 1 ? "" : "s", with_stack,
                  config_.logs_dir, round_),
      out);
  Send(std::move(message), out);
}

void Agent::Report(TimePoint now, std::vector<AgentEffect>& out) {
  const Duration period = ReportPeriod();
  std::get<Running>(work_).next_report = now + period;
  const size_t buckets = spec_.ProgressWindowBuckets();
  wire::RankProgress report{round_, {}};
  for (Worker& w : workers_) {
    Beats& b = w.beats;
    b.window.push_back(b.current);
    b.current = {};
    if (b.window.size() > buckets) b.window.erase(b.window.begin());
    if (!w.running || b.step < 0) continue;
    wire::RankRate rate{w.global_rank, b.step, -1, -1, 0};
    if (b.window.size() == buckets) {
      const Beats::Bucket sum = b.WindowSum();
      if (sum.steps > 0) {
        rate.step_us =
            std::chrono::duration_cast<std::chrono::microseconds>(period * static_cast<int64_t>(buckets))
                .count() /
            sum.steps;
      }
      if (sum.busy_steps > 0) rate.work_us = sum.busy_us / sum.busy_steps;
    }
    if (b.intervals >= JobSpec::Timeouts::kAutoProgressWarmup) rate.longest_ms = Ms(b.longest);
    report.ranks.push_back(rate);
  }
  if (!report.ranks.empty()) Send(std::move(report), out);
}

}  // namespace ddprun::core
