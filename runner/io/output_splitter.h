#pragma once
// One worker output stream (stdout or stderr) cut into what the console shows: whole lines
// with the rank's prefix, and progress updates (text ended by '\r', as tqdm and Lightning's
// bar write it) at most one per kProgressInterval, always the latest. Keeps the last lines of
// stderr for the failure summary. With `triage`, a stderr stream's whole lines pass through a
// ConsequenceFilter, which holds back a peer's "lost a peer" traceback until the round's root
// cause is known. Pure: bytes and `now` in, text out; the launcher owns the pipes, the log
// file and the timer that calls FlushProgress.

#include <chrono>
#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runner/io/consequence_filter.h"

namespace ddprun::io {

class OutputSplitter {
 public:
  using Clock = std::chrono::steady_clock;

  /// Progress updates shown per stream: at most one per this interval.
  static constexpr std::chrono::milliseconds kProgressInterval{1000};
  /// A line without an end is shown in pieces of this size.
  static constexpr size_t kMaxLine = 64 * 1024;
  /// The stderr tail: at most this many lines and bytes.
  static constexpr size_t kTailLines = 20;
  static constexpr size_t kTailBytes = 8 * 1024;

  /// `prefix` starts every console line ("[n1 r9] " or ""); `show` false keeps nothing for
  /// the console; `keep_tail` keeps the last lines (stderr); `triage` passes the shown lines
  /// through a ConsequenceFilter (a shown rank's stderr).
  OutputSplitter(std::string prefix, bool show, bool keep_tail, bool triage = false);

  /// Splits `bytes`; appends what the console shows now to `console`. A line's text is what a
  /// terminal would show for it: what follows its last '\r'.
  void Feed(std::string_view bytes, Clock::time_point now, std::string& console);
  /// Shows a held-back progress update, or held-back lines, once their time has come.
  void FlushProgress(Clock::time_point now, std::string& console);
  /// When FlushProgress has something to show; nullopt when nothing is held back.
  std::optional<Clock::time_point> ProgressDeadline() const;
  /// End of the stream: shows the last line even without a newline. Lines the filter holds
  /// for a verdict stay held (FlushProgress or Verdict shows them, or not).
  void Finish(std::string& console);
  /// The round's root cause is known (ConsequenceFilter::Verdict); shows what that releases.
  void Verdict(bool is_cause, bool provisional, std::string& console);

  const std::deque<std::string>& tail() const { return tail_; }
  const ConsequenceFilter& filter() const { return filter_; }

 private:
  void CompleteLine(std::string_view line, Clock::time_point now, std::string& console);
  void Print(std::vector<std::string>& lines, std::string& console);
  void KeepTail(std::string line);
  void ShowProgress(Clock::time_point now, std::string& console);

  std::string prefix_;
  bool show_;
  bool keep_tail_;
  bool triage_;
  ConsequenceFilter filter_;
  std::vector<std::string> released_;  // lines the filter lets through, reused
  Clock::time_point last_now_{};       // the latest `now` seen, for Finish
  std::string partial_;                // the current line since its last '\r' or '\n'
  bool in_progress_ = false;           // the current line has had a '\r'
  std::string last_segment_;           // the current line's last text ended by '\r'
  std::string progress_;               // the latest progress update not yet shown
  std::string last_shown_;             // the current line's last update shown, not to repeat it
  std::optional<Clock::time_point> last_progress_time_;
  std::deque<std::string> tail_;
  size_t tail_bytes_ = 0;
};

}  // namespace ddprun::io
