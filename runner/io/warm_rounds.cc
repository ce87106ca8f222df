#include "runner/io/warm_rounds.h"

#include <fmt/format.h>

namespace ddprun::io {
namespace {

// The summary names this many rounds, the newest; the event log has all of them.
constexpr size_t kSummaryRounds = 4;

}  // namespace

bool RoundStartLog::Requested(int round, Clock::time_point now) {
  auto [it, added] = open_.try_emplace(round);
  if (added) it->second.began = now;
  ++it->second.requested;
  return added;
}

void RoundStartLog::Closed(int round, Clock::time_point now) {
  auto it = open_.find(round);
  if (it == open_.end()) return;
  it->second.closed = true;
  if (it->second.done == 0) it->second.last = now;
  MaybeDone(round);
}

void RoundStartLog::Started(int round, Clock::time_point now, bool warm, bool failed,
                            const std::string& cold_reason) {
  auto it = open_.find(round);
  if (it == open_.end()) return;
  Round& r = it->second;
  ++r.done;
  r.last = now;
  if (failed) {
    ++r.failed;
  } else if (warm) {
    ++r.warm;
  } else {
    ++r.cold;
    if (r.cold_reason.empty()) r.cold_reason = cold_reason;
  }
  MaybeDone(round);
}

void RoundStartLog::MaybeDone(int round) {
  auto it = open_.find(round);
  if (it == open_.end() || !it->second.closed || it->second.done < it->second.requested) return;
  const Round r = it->second;
  open_.erase(it);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(r.last - r.began).count();
  if (sink_) {
    host::Event event{"workers-started", {}};
    event.Add("round", int64_t{round})
        .Add("warm", int64_t{r.warm})
        .Add("cold", int64_t{r.cold})
        .Add("failed", int64_t{r.failed})
        .Add("start_us", int64_t{us});
    if (warm_configured_ && r.cold > 0) event.Add("cold_reason", r.cold_reason);
    sink_(event);
  }
  std::string how;
  if (r.warm > 0) how += fmt::format("{} warm", r.warm);
  if (r.cold > 0) how += fmt::format("{}{} cold", how.empty() ? "" : ", ", r.cold);
  if (r.failed > 0) how += fmt::format("{}{} not started", how.empty() ? "" : ", ", r.failed);
  lines_.push_back(
      Line{round, r.began,
           fmt::format("round {}: {} in {:.1f} ms", round, how, static_cast<double>(us) / 1000.0)});
  if (lines_.size() > kSummaryRounds) lines_.pop_front();
  ++rounds_done_;
}

void RoundStartLog::Stepped(int round, Clock::time_point now) {
  for (Line& line : lines_) {
    if (line.round != round || line.stepped) continue;
    line.stepped = true;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - line.began).count();
    line.text +=
        fmt::format(", first step {:.2f} s after the round began here", static_cast<double>(ms) / 1000.0);
  }
}

std::string RoundStartLog::SummaryLine() const {
  if (lines_.empty()) return "";
  std::string text = "worker starts on this node: ";
  if (rounds_done_ > static_cast<int>(lines_.size())) {
    text +=
        fmt::format("({} earlier rounds in the event log) ", rounds_done_ - static_cast<int>(lines_.size()));
  }
  for (size_t i = 0; i < lines_.size(); ++i) text += (i ? "; " : "") + lines_[i].text;
  return text + "\n";
}

}  // namespace ddprun::io
