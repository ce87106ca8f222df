#include "runner/io/consequence_filter.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "runner/core/failure.h"

namespace ddprun::io {

namespace {

constexpr std::string_view kTracebackStart = "Traceback (most recent call last):";

// A line that continues the traceback being read: its frames and source lines are indented,
// and chained exceptions sit between blank lines and one of Python's two separator lines.
bool ContinuesTraceback(std::string_view line) {
  return line.empty() || line.front() == ' ' || line.front() == '\t' || line == kTracebackStart ||
         line == "During handling of the above exception, another exception occurred:" ||
         line == "The above exception was the direct cause of the following exception:";
}

// "rank 4", "ranks 0-2", "ranks 0, 2, 5-7".
std::string RankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(parts, ", "));
}

}  // namespace

std::string ConsequenceDigest(int round, int cause_rank, const std::vector<CollapsedRank>& ranks,
                              const std::string& log_folder) {
  std::vector<int> lost, stopped, other;
  size_t lines = 0;
  for (const CollapsedRank& rank : ranks) {
    lines += rank.lines;
    (rank.lost_peer ? lost : rank.the_stop ? stopped : other).push_back(rank.global_rank);
  }
  std::vector<std::string> what;
  if (!lost.empty()) what.push_back(RankList(lost) + " lost a peer, as expected");
  if (!stopped.empty()) {
    what.push_back(RankList(stopped) + (stopped.size() == 1 ? " was" : " were") + " stopped");
  }
  if (!other.empty()) what.push_back(RankList(other) + " kept writing to stderr");
  return fmt::format(
      "round {}: after {}, {}; {} line{} of {} stderr {} not shown here (every byte "
      "is in {}/rank-<r>.log)",
      round, cause_rank >= 0 ? fmt::format("rank {} failed", cause_rank) : "the root cause",
      fmt::join(what, "; "), lines, lines == 1 ? "" : "s", ranks.size() == 1 ? "its" : "their",
      lines == 1 ? "is" : "are", log_folder);
}

void ConsequenceFilter::Line(std::string line, Clock::time_point now, std::vector<std::string>& shown) {
  if (mode_ == Mode::kCause) {
    shown.push_back(std::move(line));
    return;
  }
  if (!block_.empty()) {
    const bool last = !ContinuesTraceback(line);  // "RuntimeError: ...": the exception itself
    held_bytes_ += line.size();
    block_.push_back(std::move(line));
    if (last || block_.size() + held_.size() > kMaxHeldLines || held_bytes_ > kMaxHeldBytes) {
      Judge(now, shown);
    }
    return;
  }
  if (line == kTracebackStart) {
    block_since_ = now;
    held_bytes_ += line.size();
    block_.push_back(std::move(line));
    return;
  }
  if (mode_ == Mode::kConsequence) {
    ++collapsed_lines_;
    return;
  }
  if (!held_.empty() && held_.size() < kMaxHeldLines && held_bytes_ + line.size() <= kMaxHeldBytes) {
    // What a rank prints after it lost a peer belongs with that error.
    held_bytes_ += line.size();
    held_.push_back(std::move(line));
    return;
  }
  Show(held_, shown);
  held_bytes_ = 0;
  shown.push_back(std::move(line));
}

void ConsequenceFilter::Judge(Clock::time_point now, std::vector<std::string>& shown) {
  std::string text;
  for (const std::string& line : block_) text += line + "\n";
  const bool lost_peer = core::LooksLikeALostPeer("", text);
  const bool the_stop = core::LooksLikeTheStop("", text);
  if (!lost_peer && !the_stop) {
    // Perhaps the real cause: shown whatever the verdict, after what was held before it.
    Show(held_, shown);
    Show(block_, shown);
    held_bytes_ = 0;
    return;
  }
  if (mode_ == Mode::kConsequence) {
    collapsed_lost_peer_ = collapsed_lost_peer_ || lost_peer;
    collapsed_the_stop_ = collapsed_the_stop_ || the_stop;
    Collapse(block_);
    held_bytes_ = 0;
    return;
  }
  if (held_.empty()) held_since_ = now;
  held_.insert(held_.end(), std::make_move_iterator(block_.begin()), std::make_move_iterator(block_.end()));
  block_.clear();
  // Remembered for the digest in case the verdict names another rank.
  pending_lost_peer_ = pending_lost_peer_ || lost_peer;
  pending_the_stop_ = pending_the_stop_ || the_stop;
  if (held_.size() > kMaxHeldLines || held_bytes_ > kMaxHeldBytes) {
    Show(held_, shown);
    held_bytes_ = 0;
  }
}

void ConsequenceFilter::Verdict(bool is_cause, bool provisional, std::vector<std::string>& shown) {
  if (is_cause && provisional) return;  // the real cause may be another rank: no verdict yet
  if (is_cause) {
    mode_ = Mode::kCause;
    Show(held_, shown);
    Show(block_, shown);
    held_bytes_ = 0;
    return;
  }
  mode_ = Mode::kConsequence;
  if (!held_.empty()) {
    collapsed_lost_peer_ = collapsed_lost_peer_ || pending_lost_peer_;
    collapsed_the_stop_ = collapsed_the_stop_ || pending_the_stop_;
    Collapse(held_);
  }
  held_bytes_ = 0;
  for (const std::string& line : block_) held_bytes_ += line.size();
}

void ConsequenceFilter::Expire(Clock::time_point now, std::vector<std::string>& shown) {
  if (!block_.empty() && now >= block_since_ + kHold) {
    // A traceback without its last line for this long: judged as it is.
    Judge(now, shown);
  }
  if (!held_.empty() && now >= held_since_ + kHold) {
    Show(held_, shown);
    held_bytes_ = 0;
    for (const std::string& line : block_) held_bytes_ += line.size();
  }
}

std::optional<ConsequenceFilter::Clock::time_point> ConsequenceFilter::Deadline() const {
  std::optional<Clock::time_point> deadline;
  if (!block_.empty()) deadline = block_since_ + kHold;
  if (!held_.empty() && (!deadline || held_since_ + kHold < *deadline)) deadline = held_since_ + kHold;
  return deadline;
}

void ConsequenceFilter::Finish(std::vector<std::string>& shown) {
  if (!block_.empty()) Judge(block_since_, shown);
}

void ConsequenceFilter::Collapse(std::vector<std::string>& lines) {
  collapsed_lines_ += lines.size();
  lines.clear();
}

void ConsequenceFilter::Show(std::vector<std::string>& lines, std::vector<std::string>& shown) {
  shown.insert(shown.end(), std::make_move_iterator(lines.begin()), std::make_move_iterator(lines.end()));
  lines.clear();
}

}  // namespace ddprun::io
