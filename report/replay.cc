#include "report/replay.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "base/plural.h"
#include "runner/core/failure.h"
#include "schema/duration.h"
namespace ddprun::report {
namespace {

using std::chrono::milliseconds;

// The kind both sides name alike: the exit code or signal of a rank's own failure, else what
// the coordinator calls a failure that is no exit. The exception type is left out: a
// simulated worker raises its own.
std::string SharedKind(const std::vector<core::FailureKind>& kinds) {
  using Type = core::FailureKind::Type;
  for (const core::FailureKind& kind : kinds) {
    if (kind.type == Type::kExit || kind.type == Type::kSignal) return kind.Text();
  }
  for (const Type type : {Type::kHang, Type::kLostNode, Type::kStall, Type::kOom}) {
    for (const core::FailureKind& kind : kinds) {
      if (kind.type == type) return kind.Text();
    }
  }
  return kinds.empty() ? "unknown" : kinds.back().Text();
}

}  // namespace

bool IsCoordinatorRecord(std::string_view type) {
  static constexpr std::string_view kTypes[] = {
      "round-begin", "round-failed", "restart", "job-result", "node-joined",     "node-refused",
      "node-lost",   "hang-probe",   "replace", "quarantine", "coordinator-done"};
  return std::find(std::begin(kTypes), std::end(kTypes), type) != std::end(kTypes);
}

std::vector<const EventRecord*> CoordinatorRecords(const Run& run) {
  std::vector<const EventRecord*> records;
  for (const EventFile* file : run.files) {
    if (file->records.empty()) continue;
    const bool node_zero = file->records.front().node == 0;
    for (const EventRecord& record : file->records) {
      if (node_zero || IsCoordinatorRecord(record.type)) records.push_back(&record);
    }
  }
  std::stable_sort(records.begin(), records.end(),
                   [](const EventRecord* a, const EventRecord* b) { return a->unix_ms < b->unix_ms; });
  return records;
}

std::vector<std::string> RoundSequence(const std::vector<const EventRecord*>& records) {
  std::vector<std::string> steps;
  std::map<int64_t, size_t> failed_at;  // round -> its step (a revision replaces it)
  for (const EventRecord* r : records) {
    if (r->type == "round-begin") {
      const int64_t nodes = r->Int("nodes");
      steps.push_back(nodes > 0 ? fmt::format("round {} begins on {}", r->Int("round"),
                                              Counted(static_cast<size_t>(nodes), "node"))
                                : fmt::format("round {} begins", r->Int("round")));
    } else if (r->type == "round-failed") {
      const int64_t round = r->Int("round");
      const int64_t rank = r->Int("rank");
      const std::vector<core::FailureKind> kinds = core::ParseKinds(r->Texts("kinds"));
      const std::string step =
          rank >= 0 ? fmt::format("round {} fails: rank {} (node {}), {}", round, rank, r->Int("peer"),
                                  SharedKind(kinds))
                    : fmt::format("round {} fails: node {}, {}", round, r->Int("peer"), SharedKind(kinds));
      auto it = failed_at.find(round);
      if (it != failed_at.end()) {
        steps[it->second] = step;
      } else {
        failed_at[round] = steps.size();
        steps.push_back(step);
      }
    } else if (r->type == "restart") {
      steps.push_back(fmt::format("restart {} of {}", r->Int("restart"), r->Int("max_restarts")));
    } else if (r->type == "job-result") {
      steps.push_back(fmt::format("the job ends with exit code {}", r->Int("exit_code")));
    }
  }
  return steps;
}

namespace {

// Every agent start, by node, in time order (an agent started again after a crash or a kill).
std::map<int, std::vector<int64_t>> AgentStarts(const Run& run) {
  std::map<int, std::vector<int64_t>> starts;
  for (const EventFile* file : run.files) {
    for (const EventRecord& r : file->records) {
      if (r.type == "agent-start") starts[r.node].push_back(r.unix_ms);
    }
  }
  for (auto& [node, times] : starts) std::sort(times.begin(), times.end());
  return starts;
}

// How the workers ddprun stopped ended: SIGKILL means they outlived SIGTERM (Lightning's
// handler only sets a flag), SIGTERM that they took its default action. Empty: none was stopped.
std::optional<JobSpec::Simulate::Sigterm> StopModelOf(const Run& run) {
  int killed = 0, termed = 0;
  for (const EventFile* file : run.files) {
    for (const EventRecord& r : file->records) {
      if (r.type == "worker-exit" && r.Flag("stopped")) {
        killed += r.Int("signal") == 9 ? 1 : 0;
        termed += r.Int("signal") == 15 ? 1 : 0;
      }
    }
  }
  if (killed == 0 && termed == 0) return std::nullopt;
  return killed > termed ? JobSpec::Simulate::Sigterm::kIgnored : JobSpec::Simulate::Sigterm::kExits;
}

// The last round trains for as long as it did: from its start to the job's result, less the
// workers' start. Empty when node 0's records do not show both.
std::optional<Duration> LastRoundTrainTime(const std::vector<const EventRecord*>& zero,
                                           Duration worker_startup) {
  int64_t last_begin = -1, result = -1;
  for (const EventRecord* r : zero) {
    if (r->type == "round-begin") last_begin = r->unix_ms;
    if (r->type == "job-result") result = r->unix_ms;
  }
  if (last_begin < 0 || result <= last_begin) return std::nullopt;
  return std::max(Duration(milliseconds(result - last_begin)) - worker_startup, Duration(milliseconds(100)));
}

}  // namespace

namespace {

using RankEvent = std::tuple<int, std::string, int64_t, int64_t>;  // node, type, round, rank

/// Each rank's own exit or hang in each round, found in one pass (the first record of it, in
/// file order), so that a run of many rounds costs in proportion to its records.
std::map<RankEvent, const EventRecord*> RankEvents(const Run& run) {
  std::map<RankEvent, const EventRecord*> events;
  for (const EventFile* file : run.files) {
    for (const EventRecord& r : file->records) {
      if ((r.type == "worker-exit" || r.type == "hang") && !r.Flag("stopped")) {
        events.emplace(RankEvent{r.node, r.type, r.Int("round"), r.Int("rank")}, &r);
      }
    }
  }
  return events;
}

/// Each round's root cause in node 0's records, as last revised.
std::map<int64_t, const EventRecord*> RoundCauses(const std::vector<const EventRecord*>& zero) {
  std::map<int64_t, const EventRecord*> causes;
  for (const EventRecord* r : zero) {
    if (r->type == "round-failed") causes[r->Int("round")] = r;
  }
  return causes;
}

}  // namespace

ReplayPlan PlanReplay(const Run& run, const JobSpec& spec) {
  ReplayPlan plan;
  const std::vector<const EventRecord*> zero = CoordinatorRecords(run);
  // The simulation's 0 is node 0's agent start (the coordinator's), else the run's first record.
  int64_t t0 = run.first_unix_ms;
  for (const EventRecord* r : zero) {
    if (r->type == "agent-start") {
      t0 = r->unix_ms;
      break;
    }
  }
  if (zero.empty())
    plan.notes.push_back("node 0 wrote no event file here: the run's own sequence is unknown");
  auto since = [&](int64_t unix_ms) { return Duration(milliseconds(std::max<int64_t>(unix_ms - t0, 0))); };
  std::map<int, std::vector<int64_t>> starts = AgentStarts(run);
  // An agent that started more than a second after node 0's joined late.
  for (const auto& [node, times] : starts) {
    if (node == 0 || times.empty() || times.front() - t0 <= 1000) continue;
    FaultSpec& late = plan.faults.emplace_back();
    late.kind = FaultKind::kSlowJoiner;
    late.node = node;
    late.duration = since(times.front());
  }
  const std::map<RankEvent, const EventRecord*> rank_events = RankEvents(run);
  plan.sigterm = StopModelOf(run);
  auto find = [&](int node, const char* type, int64_t round, int64_t rank) -> const EventRecord* {
    const auto it = rank_events.find(RankEvent{node, type, round, rank});
    return it == rank_events.end() ? nullptr : it->second;
  };
  // Node 0's node-lost records by peer, in time order.
  std::map<int64_t, std::vector<const EventRecord*>> lost_records;
  for (const EventRecord* r : zero) {
    if (r->type == "node-lost") lost_records[r->Int("peer")].push_back(r);
  }
  const std::map<int64_t, const EventRecord*> causes = RoundCauses(zero);
  const int nproc = std::max(spec.cluster.nproc_per_node, 1);
  const Duration loss_bound = spec.timeouts.LossBound();
  for (const auto& [round, cause] : causes) {
    const std::vector<core::FailureKind> kinds = core::ParseKinds(cause->Texts("kinds"));
    const int peer = static_cast<int>(cause->Int("peer"));
    const int64_t rank = cause->Int("rank");
    if (core::HasKind(kinds, core::FailureKind::Type::kLostNode)) {
      // Lost when node 0 last noticed it before the cause; a silent one died a loss bound
      // before that.
      int64_t crash_ms = cause->unix_ms;
      const std::vector<const EventRecord*>& lost = lost_records[peer];
      const auto after = std::upper_bound(lost.begin(), lost.end(), cause->unix_ms,
                                          [](int64_t ms, const EventRecord* r) { return ms < r->unix_ms; });
      if (after != lost.begin()) {
        const EventRecord* noticed = *std::prev(after);
        crash_ms = noticed->unix_ms;
        // Event logs before typed causes said it only in the reason's words.
        const std::string loss = noticed->Text("cause");
        const bool silent =
            !loss.empty() ? loss == "silent" : noticed->Text("reason").find("silent") != std::string::npos;
        if (silent) {
          crash_ms -= std::chrono::duration_cast<milliseconds>(loss_bound).count();
        }
      }
      FaultSpec crash;
      crash.kind = FaultKind::kNodeCrash;
      crash.at = since(crash_ms);
      crash.node = peer;
      const std::vector<int64_t>& times = starts[peer];
      if (const auto next = std::upper_bound(times.begin(), times.end(), crash_ms); next != times.end()) {
        crash.reboot_after = Duration(milliseconds(*next - crash_ms));
      }
      plan.faults.push_back(crash);
    } else if (core::HasKind(kinds, core::FailureKind::Type::kHang) && rank >= 0) {
      const EventRecord* hang = find(peer, "hang", round, rank);
      FaultSpec fault;
      fault.kind = FaultKind::kWorkerHang;
      fault.node = peer;
      fault.local_rank = static_cast<int>(rank % nproc);
      fault.at = since(hang ? hang->unix_ms - std::max<int64_t>(hang->Int("silent_ms"), 0) : cause->unix_ms);
      plan.faults.push_back(fault);
    } else if (rank >= 0) {
      const EventRecord* exit = find(peer, "worker-exit", round, rank);
      FaultSpec fault;
      fault.kind = FaultKind::kWorkerExit;
      fault.node = peer;
      fault.local_rank = static_cast<int>(rank % nproc);
      fault.at = since(exit ? exit->unix_ms : cause->unix_ms);
      const int64_t signal = exit ? exit->Int("signal", 0) : 0;
      const int64_t code = exit ? (signal > 0 ? 128 + signal : exit->Int("exit_code", 1)) : 1;
      fault.exit_code = static_cast<int>(std::clamp<int64_t>(code, 1, 255));
      plan.faults.push_back(fault);
    } else {
      plan.notes.push_back(fmt::format("round {}'s root cause ({}) has no simulator fault: not replayed",
                                       round, SharedKind(kinds)));
    }
  }
  std::stable_sort(plan.faults.begin(), plan.faults.end(),
                   [](const FaultSpec& a, const FaultSpec& b) { return a.at < b.at; });
  // Real workers start in seconds, not the model's default.
  plan.worker_startup = milliseconds(500);
  plan.train_time = LastRoundTrainTime(zero, plan.worker_startup).value_or(spec.simulate.train_time);
  return plan;
}

std::vector<StepDuration> RoundDurations(const std::vector<const EventRecord*>& records) {
  std::vector<StepDuration> steps;
  std::map<int64_t, int64_t> failed_at;  // round -> when it first failed (a revision keeps it)
  std::optional<int64_t> open_stop;      // the failed round whose stop has not ended
  std::optional<int64_t> open_restart;   // the failed round no round has followed yet
  for (const EventRecord* r : records) {
    if (r->type == "round-failed") {
      const int64_t round = r->Int("round");
      if (failed_at.emplace(round, r->unix_ms).second) open_stop = open_restart = round;
    } else if ((r->type == "restart" || r->type == "job-result") && open_stop) {
      steps.push_back({fmt::format("round {} stop", *open_stop), Millis(r->unix_ms - failed_at[*open_stop])});
      open_stop.reset();
    } else if (r->type == "round-begin" && open_restart) {
      steps.push_back(
          {fmt::format("round {} restart", *open_restart), Millis(r->unix_ms - failed_at[*open_restart])});
      open_restart.reset();
    }
  }
  return steps;
}

DurationComparison CompareDurations(const std::vector<StepDuration>& real,
                                    const std::vector<StepDuration>& simulated) {
  constexpr Duration kFloor = Seconds(1);
  DurationComparison c;
  if (real.empty() && simulated.empty()) return c;
  std::map<std::string, Duration> predicted;
  for (const StepDuration& step : simulated) predicted.emplace(step.what, step.took);
  size_t width = std::string_view("durations").size();
  for (const StepDuration& step : real) width = std::max(width, step.what.size());
  c.text = fmt::format("  {:<{}}   {:>10}   {:>10}\n", "durations", width, "real", "simulated");
  int off = 0;
  for (const StepDuration& step : real) {
    const auto it = predicted.find(step.what);
    if (it == predicted.end()) {
      c.text += fmt::format("  {:<{}}   {:>10}   {:>10}\n", step.what, width, HumanDuration(step.took), "-");
      continue;
    }
    const Duration error = it->second > step.took ? it->second - step.took : step.took - it->second;
    const bool close = error <= std::max(kFloor, step.took / 5);
    const double percent = step.took > Duration::zero()
                               ? 100.0 * static_cast<double>((it->second - step.took).count()) /
                                     static_cast<double>(step.took.count())
                               : 0.0;
    c.text += fmt::format("{} {:<{}}   {:>10}   {:>10}{}\n", close ? ' ' : '!', step.what, width,
                          HumanDuration(step.took), HumanDuration(it->second),
                          close ? "" : fmt::format("   ({:+.0f}%)", percent));
    if (!close) ++off;
  }
  c.within = off == 0;
  c.text += off == 0
                ? "the durations match (each within 20% or 1s of the real one)\n"
                : fmt::format("{} of the durations {} more than 20% (and 1s) off the real one (marked !)\n",
                              off, off == 1 ? "is" : "are");
  return c;
}

SequenceComparison CompareSequences(const std::vector<std::string>& real,
                                    const std::vector<std::string>& simulated) {
  SequenceComparison c;
  size_t width = std::string_view("real run").size();
  for (const std::string& step : real) width = std::max(width, step.size());
  c.text = fmt::format("  {:<{}}   {}\n", "real run", width, "simulated");
  const size_t n = std::max(real.size(), simulated.size());
  std::optional<size_t> first_difference;
  for (size_t i = 0; i < n; ++i) {
    const std::string a = i < real.size() ? real[i] : "-";
    const std::string b = i < simulated.size() ? simulated[i] : "-";
    const bool same = i < real.size() && i < simulated.size() && a == b;
    if (!same && !first_difference) first_difference = i;
    c.text += fmt::format("{} {:<{}}   {}\n", same ? ' ' : '!', a, width, b);
  }
  c.match = !first_difference && !real.empty();
  if (real.empty()) {
    c.text += "the real run recorded no rounds (node 0's event file is missing or empty)\n";
  } else if (first_difference) {
    c.text += fmt::format("the sequences differ from step {} on (marked !)\n", *first_difference + 1);
  } else {
    c.text += fmt::format("the sequences match ({} steps)\n", real.size());
  }
  return c;
}

}  // namespace ddprun::report
