#include "runner/core/hang_watch.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/assert.h"
#include "base/plural.h"
#include "runner/core/log_pointers.h"
#include "schema/duration.h"

namespace ddprun::core {
namespace {

// The most groups of identical stacks a hang summary lists, and culprits shown with a stack.
constexpr size_t kMaxGroups = 12;
constexpr size_t kMaxCulpritStacks = 4;
constexpr size_t kMaxStragglersNamed = 16;

std::string Seconds3(int64_t us) { return fmt::format("{:.3g}s", static_cast<double>(us) / 1e6); }

std::string StepRange(int64_t low, int64_t high) {
  if (high < 0) return "no step yet";
  if (low == high) return fmt::format("last step {}", low);
  return fmt::format("last steps {}..{}", std::max<int64_t>(low, 0), high);
}

// The timeout the first silent rank passed, as the verdict names it.
std::string LimitPassed(const JobSpec::Timeouts& t, const wire::RankHung& first) {
  if (first.first_beat) return fmt::format("timeouts.progress_start = {}", FormatDuration(t.progress_start));
  if (t.progress) return fmt::format("timeouts.progress = {}", FormatDuration(*t.progress));
  if (first.learnt) {
    return fmt::format("timeouts.progress = \"auto\", {} learnt from this job",
                       HumanDuration(Millis(first.timeout_ms)));
  }
  return fmt::format("timeouts.progress = \"auto\", nothing learnt yet: timeouts.progress_start = {}",
                     FormatDuration(t.progress_start));
}

}  // namespace

void HangWatch::NewRound() {
  probe_.reset();
  ranks_seen_.clear();
  next_straggler_check_.reset();
}

std::optional<TimePoint> HangWatch::DeadlineOf(Deadline deadline) const {
  switch (deadline) {
    case Deadline::kProbe:
      return probe_ ? std::optional<TimePoint>(probe_->until) : std::nullopt;
    case Deadline::kStragglers:
      return next_straggler_check_;
    case Deadline::kCount:
      break;
  }
  return std::nullopt;
}

bool HangWatch::OnRankHung(TimePoint now, int round, int agent, const wire::RankHung& hung,
                           std::vector<CoordinatorEffect>& out) {
  const int nproc = spec_.cluster.nproc_per_node;
  if (hung.round != round || probe_ || hung.global_rank < 0 ||
      hung.global_rank / nproc != roster_.at(agent).plays) {
    return false;  // stale, already probing, or not a rank of that node
  }
  probe_ = Probe{hung,
                 agent,
                 now + spec_.timeouts.StacksWait(),
                 std::vector<bool>(static_cast<size_t>(roster_.agents())),
                 0,
                 {}};
  out.push_back(
      LogLine{LogLevel::kError,
              fmt::format("round {}: {} sent no progress beacon for {}; asking every "
                          "node where its ranks are before stopping the round",
                          round, roster_.RankName(hung.global_rank), HumanDuration(Millis(hung.silent_ms)))});
  return true;
}

bool HangWatch::OnRankStacks(int round, int agent, const wire::RankStacks& stacks, int connected) {
  if (!probe_ || stacks.round != round || probe_->answered[static_cast<size_t>(agent)]) return false;
  probe_->answered[static_cast<size_t>(agent)] = true;
  ++probe_->answers;
  const int nproc = spec_.cluster.nproc_per_node;
  const int position = roster_.at(agent).plays;
  for (const wire::RankState& state : stacks.ranks) {
    if (state.global_rank < 0 || state.global_rank / nproc != position) continue;
    probe_->ranks[state.global_rank] =
        RankAtHang{state.global_rank, agent,           state.global_rank % nproc,
                   state.step,        state.silent_ms, ParseFrames(state.stack)};
  }
  return probe_->answers >= connected;
}

std::string HangWatch::WhereEachRankWas(const Probe& probe, const HangVerdict& verdict,
                                        const RankAtHang& culprit, int round,
                                        const std::vector<std::string>& reach_problems) const {
  const int nproc = spec_.cluster.nproc_per_node;
  // Where everyone was: the culprits with their stacks, then the others grouped by stack.
  std::string detail =
      fmt::format("  why {}: {}\n",
                  verdict.culprits.size() == 1 ? fmt::format("rank {}", culprit.global_rank)
                                               : fmt::format("ranks {}", RankRanges(verdict.culprits)),
                  verdict.reason);
  detail += fmt::format("  where each rank was (its main thread, innermost call first; all threads: {}):\n",
                        StacksPointer(spec_, roster_.NodeName(culprit.node_rank), culprit.node_rank, round,
                                      culprit.global_rank));
  const std::vector<int> with_stacks(
      verdict.culprits.begin(), verdict.culprits.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                               verdict.culprits.size(), kMaxCulpritStacks)));
  for (int rank : with_stacks) {
    const RankAtHang& r = probe.ranks.at(rank);
    detail += fmt::format("    rank {}, {}, silent {}: {}\n", rank, StepRange(r.step, r.step),
                          r.silent_ms >= 0 ? HumanDuration(Millis(r.silent_ms)) : "?",
                          r.stack.empty() ? "no stack" : DescribeStack(r.stack));
    for (const Frame& f : r.stack) {
      detail += fmt::format("      File \"{}\", line {} in {}\n", f.file, f.line, f.function);
    }
  }
  struct Group {
    std::vector<int> ranks;
    int64_t low = INT64_MAX, high = -1;
    std::string where;
  };
  std::map<std::string, Group> groups;
  for (const auto& [rank, r] : probe.ranks) {
    if (std::find(with_stacks.begin(), with_stacks.end(), rank) != with_stacks.end()) continue;
    const std::string key = r.stack.empty() ? std::string() : FormatFrames(r.stack);
    Group& g = groups[key];
    g.ranks.push_back(rank);
    g.low = std::min(g.low, r.step);
    g.high = std::max(g.high, r.step);
    g.where = r.stack.empty() ? "no stack (the worker does not `import ddprun`, or sent no hello)"
                              : DescribeStack(r.stack);
  }
  std::vector<const Group*> ordered;
  for (const auto& [key, g] : groups) ordered.push_back(&g);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const Group* a, const Group* b) { return a->ranks.size() > b->ranks.size(); });
  for (size_t i = 0; i < ordered.size() && i < kMaxGroups; ++i) {
    const Group& g = *ordered[i];
    detail += fmt::format("    {} {}, {}: {}\n",
                          g.ranks.size() == 1 ? "rank" : fmt::format("{} ranks", g.ranks.size()),
                          RankRanges(g.ranks), StepRange(g.low, g.high), g.where);
  }
  if (ordered.size() > kMaxGroups) {
    detail += fmt::format("    ... and {} more groups of ranks\n", ordered.size() - kMaxGroups);
  }
  std::vector<int> unanswered;  // node ranks of the round
  const std::vector<int>& players = roster_.players();
  for (size_t p = 0; p < players.size(); ++p) {
    if (!probe.answered[static_cast<size_t>(players[p])]) unanswered.push_back(static_cast<int>(p));
  }
  if (!unanswered.empty()) {
    detail +=
        fmt::format("    node{} {} did not answer in time: {} unknown\n", unanswered.size() == 1 ? "" : "s",
                    RankRanges(unanswered), Counted(unanswered.size() * static_cast<size_t>(nproc), "rank"));
  }
  if (!reach_problems.empty()) {
    detail += fmt::format(
        "  likely cause: before round 0 some nodes could not connect on a port other than "
        "master_port (rendezvous.probe = \"warn\" started the job anyway), so gloo and NCCL "
        "cannot connect either:\n    {}\n",
        fmt::join(reach_problems, "\n    "));
  }
  return detail;
}

std::optional<RoundFailure> HangWatch::Verdict(int round, const std::vector<std::string>& reach_problems) {
  DDPRUN_ASSERT(probe_.has_value());
  Probe probe = std::move(*probe_);
  probe_.reset();
  if (!probe.ranks.count(probe.first.global_rank)) {
    // Its node did not answer: what it said when it reported the silence.
    probe.ranks[probe.first.global_rank] =
        RankAtHang{probe.first.global_rank, probe.first_node,      probe.first.local_rank,
                   probe.first.step,        probe.first.silent_ms, {}};
  }
  // Only a rank still silent for the timeout it passed can be hung: the stacks are the second
  // look (issue 37: rank 6 stalled 29 s of timeouts.progress = 30s and recovered; ranks 0-4,
  // one step behind and silent for 687 ms when their stacks came, were named).
  const int64_t limit_ms = probe.first.timeout_ms;
  std::vector<RankAtHang> ranks;
  int64_t longest_ms = -1;
  int longest_rank = -1;
  for (auto& [rank, state] : probe.ranks) {
    if (state.silent_ms >= limit_ms) ranks.push_back(state);
    if (state.silent_ms > longest_ms) longest_ms = state.silent_ms, longest_rank = rank;
  }
  if (ranks.empty()) {
    ++clearances_;
    cleared_ = fmt::format(
        "round {}: no hang: {} sent no progress beacon for {}, but when the stacks came back every rank had "
        "progressed again (the longest silence, {}'s, was {}, under the {} it passed); the round goes on",
        round, roster_.RankName(probe.first.global_rank), HumanDuration(Millis(probe.first.silent_ms)),
        roster_.RankName(longest_rank), HumanDuration(Millis(std::max<int64_t>(longest_ms, 0))),
        HumanDuration(Millis(limit_ms)));
    return std::nullopt;
  }
  const HangVerdict verdict = FindHungRanks(ranks, probe.first.global_rank);
  ++judgements_;
  last_judgement_ = HangJudgement{round, verdict.culprits, {}};
  for (const RankAtHang& r : ranks) {
    if (!r.stack.empty()) last_judgement_.with_stack.push_back(r.global_rank);
  }
  const RankAtHang& culprit = probe.ranks.at(verdict.culprits.front());

  const std::string limit = LimitPassed(spec_.timeouts, probe.first);
  RoundFailure failure;
  failure.round = round;
  failure.node_rank = culprit.node_rank;
  failure.global_rank = culprit.global_rank;
  failure.kinds = {FailureKind::Of(FailureKind::Type::kHang)};
  const std::string who = verdict.culprits.size() == 1
                              ? roster_.RankName(culprit.global_rank)
                              : fmt::format("ranks {} ({} first)", RankRanges(verdict.culprits),
                                            roster_.RankName(culprit.global_rank));
  failure.what = fmt::format(
      "{} hung: no progress for {} {} ({})", who,
      HumanDuration(Millis(std::max<int64_t>(culprit.silent_ms, 0))),
      culprit.step >= 0 ? fmt::format("after step {}", culprit.step) : std::string("since it started"),
      limit);

  failure.detail = WhereEachRankWas(probe, verdict, culprit, round, reach_problems);
  return failure;
}

void HangWatch::OnRankProgress(TimePoint now, int round, int agent, const wire::RankProgress& progress) {
  if (progress.round != round) return;
  const int nproc = spec_.cluster.nproc_per_node;
  const int position = roster_.at(agent).plays;
  for (const wire::RankRate& rate : progress.ranks) {
    if (rate.global_rank < 0 || rate.global_rank / nproc != position) continue;
    RankSeen& seen = ranks_seen_[rate.global_rank];
    seen.node_rank = agent;
    seen.rate = rate;
    // Bounded by what a rank can be silent for: a year.
    longest_interval_ms_ =
        std::max(longest_interval_ms_, std::clamp<int64_t>(rate.longest_ms, 0, 365LL * 86'400'000));
  }
  if (!next_straggler_check_ && spec_.stragglers.slower_percent > 0) {
    next_straggler_check_ = now + spec_.ProgressReportPeriod();
  }
}

void HangWatch::CheckStragglers(TimePoint now, int round, std::vector<CoordinatorEffect>& out) {
  next_straggler_check_ = now + spec_.ProgressReportPeriod();
  // Like with like: the ranks' own work per step when every rank reports it (DDP ranks wait
  // for each other, so their step times are equal), else the time per step.
  std::vector<std::pair<int, RankSeen*>> ranks;
  bool all_work = true;
  for (auto& [rank, seen] : ranks_seen_) {
    if (seen.rate.step_us <= 0) continue;
    ranks.emplace_back(rank, &seen);
    if (seen.rate.work_us <= 0) all_work = false;
  }
  if (ranks.size() < 2) return;
  std::sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  auto metric = [&](const RankSeen& s) { return all_work ? s.rate.work_us : s.rate.step_us; };
  std::vector<int64_t> values;
  for (const auto& [rank, seen] : ranks) values.push_back(metric(*seen));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2),
                   values.end());
  const int64_t median = values[values.size() / 2];
  if (median <= 0) return;
  const int percent = spec_.stragglers.slower_percent;
  const char* what = all_work ? "its own work per step" : "its time per step";
  for (auto& [rank, seen] : ranks) {
    const int64_t value = metric(*seen);
    const bool slow = value * 100 > median * (100 + percent);
    if (slow == seen->straggling) continue;
    seen->straggling = slow;
    const double factor = static_cast<double>(value) / static_cast<double>(median);
    if (slow) {
      out.push_back(
          LogLine{LogLevel::kWarn,
                  fmt::format("{} is a straggler: {} is {}, {:.2g}x the median {} of {} "
                              "ranks over the last {} (stragglers.slower_percent = {})",
                              roster_.RankName(rank), what, Seconds3(value), factor, Seconds3(median),
                              ranks.size(), FormatDuration(spec_.stragglers.window), percent)});
      if (stragglers_seen_.size() < kMaxStragglersNamed) {
        stragglers_seen_.push_back(fmt::format("{} in round {}: {} {}, {:.2g}x the median {}",
                                               roster_.RankName(rank), round, what, Seconds3(value), factor,
                                               Seconds3(median)));
      }
    } else {
      out.push_back(LogLine{LogLevel::kInfo,
                            fmt::format("{} is no longer a straggler: {} is {}, the median {}",
                                        roster_.RankName(rank), what, Seconds3(value), Seconds3(median))});
    }
  }
}

std::string HangWatch::StragglerNote() const {
  if (stragglers_seen_.empty()) return "";
  std::string text = fmt::format("stragglers (more than {}% slower than the median rank for {}):",
                                 spec_.stragglers.slower_percent, FormatDuration(spec_.stragglers.window));
  for (const std::string& s : stragglers_seen_) text += "\n  " + s;
  return text;
}

}  // namespace ddprun::core
