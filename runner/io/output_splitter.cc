#include "runner/io/output_splitter.h"

#include <algorithm>
#include <utility>

namespace ddprun::io {

OutputSplitter::OutputSplitter(std::string prefix, bool show, bool keep_tail, bool triage)
    : prefix_(std::move(prefix)), show_(show), keep_tail_(keep_tail), triage_(triage && show) {}

void OutputSplitter::Feed(std::string_view bytes, Clock::time_point now, std::string& console) {
  last_now_ = now;
  size_t start = 0;
  while (start < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", start);
    if (end == std::string_view::npos) {
      partial_.append(bytes.substr(start));
      break;
    }
    partial_.append(bytes.substr(start, end - start));
    if (bytes[end] == '\n') {
      // What a terminal shows for "\rA\rB\n" is B; for "\rA\r\n" it is A.
      const std::string line = partial_.empty() ? std::move(last_segment_) : std::move(partial_);
      const bool shown_as_progress = in_progress_ && line == last_shown_;
      if (!shown_as_progress) {
        CompleteLine(line, now, console);
      } else if (keep_tail_) {
        KeepTail(line);
      }
      partial_.clear();
      last_segment_.clear();
      progress_.clear();
      last_shown_.clear();
      in_progress_ = false;
    } else {
      // '\r': the text before it is one finished progress update.
      in_progress_ = true;
      if (!partial_.empty()) {
        last_segment_ = partial_;
        progress_ = std::move(partial_);
        partial_.clear();
      }
    }
    start = end + 1;
  }
  if (in_progress_ && !partial_.empty()) {
    // tqdm writes "\r" then the update: the text after the last '\r' is normally complete
    // when a read returns. If it was cut, the next update replaces it within a second.
    progress_ = partial_;
  }
  if (partial_.size() > kMaxLine) {  // a line without end: show it in pieces
    CompleteLine(partial_, now, console);
    partial_.clear();
  }
  ShowProgress(now, console);
}

void OutputSplitter::FlushProgress(Clock::time_point now, std::string& console) {
  last_now_ = std::max(last_now_, now);
  if (triage_) {
    filter_.Expire(now, released_);
    Print(released_, console);
  }
  ShowProgress(now, console);
}

std::optional<OutputSplitter::Clock::time_point> OutputSplitter::ProgressDeadline() const {
  std::optional<Clock::time_point> deadline = triage_ ? filter_.Deadline() : std::nullopt;
  if (progress_.empty() || progress_ == last_shown_ || !last_progress_time_) return deadline;
  const Clock::time_point progress = *last_progress_time_ + kProgressInterval;
  return deadline && *deadline < progress ? deadline : progress;
}

void OutputSplitter::Verdict(bool is_cause, bool provisional, std::string& console) {
  if (!triage_) return;
  filter_.Verdict(is_cause, provisional, released_);
  Print(released_, console);
}

void OutputSplitter::Print(std::vector<std::string>& lines, std::string& console) {
  for (const std::string& line : lines) {
    console += prefix_;
    console += line;
    console += '\n';
  }
  lines.clear();
}

void OutputSplitter::Finish(std::string& console) {
  std::string line = partial_.empty() ? std::move(last_segment_) : std::move(partial_);
  if (!line.empty()) {
    if (!(in_progress_ && line == last_shown_))
      CompleteLine(line, last_now_, console);
    else if (keep_tail_)
      KeepTail(line);
  }
  partial_.clear();
  last_segment_.clear();
  progress_.clear();
  in_progress_ = false;
  if (triage_) {
    filter_.Finish(released_);
    Print(released_, console);
  }
}

void OutputSplitter::CompleteLine(std::string_view line, Clock::time_point now, std::string& console) {
  if (triage_) {
    filter_.Line(std::string(line), now, released_);
    Print(released_, console);
  } else if (show_) {
    console += prefix_;
    console += line;
    console += '\n';
  }
  if (keep_tail_) KeepTail(std::string(line));
}

void OutputSplitter::KeepTail(std::string line) {
  tail_bytes_ += line.size();
  tail_.push_back(std::move(line));
  while (tail_.size() > kTailLines || tail_bytes_ > kTailBytes) {
    tail_bytes_ -= tail_.front().size();
    tail_.pop_front();
  }
}

void OutputSplitter::ShowProgress(Clock::time_point now, std::string& console) {
  if (progress_.empty() || progress_ == last_shown_) {
    progress_.clear();
    return;
  }
  if (last_progress_time_ && now < *last_progress_time_ + kProgressInterval) return;  // held back
  if (show_ && !filter_.collapsing()) {
    console += prefix_;
    console += progress_;
    console += '\n';
  }
  last_progress_time_ = now;
  last_shown_ = std::move(progress_);
  progress_.clear();
}

}  // namespace ddprun::io
