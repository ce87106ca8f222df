#pragma once
// One worker's stderr lines on their way to the console while its round may be failing.
//
// When one rank raises, its peers lose it in the next collective and print tracebacks of
// their own ("Connection closed by peer"), often before anyone knows which rank failed first;
// with 8 ranks per node that is a screen of consequences under the one traceback that matters.
// So a Python traceback is read whole before it is shown, and judged by its last line: an
// error that says the rank lost a peer, or that it received the stop (core/failure.h), is held
// back until the round's root cause is known (Verdict). If the root cause is another rank, the
// held text and everything this rank prints afterwards stays off the console (counted, for the
// node's one-line digest); if it is this rank, or no verdict comes within kHold, it is shown.
// Any other traceback is shown as soon as it is complete: it may be the real cause.
//
// Only the console is filtered: the launcher writes every byte to the rank's log file first.
// Pure: lines and `now` in, lines out; the launcher owns the timer that calls Expire.

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::io {

class ConsequenceFilter {
 public:
  using Clock = std::chrono::steady_clock;

  /// How long a traceback may be read, and a consequence held, before it is shown anyway: the
  /// root cause normally reaches every node within a heartbeat of the failure; when no verdict
  /// comes (the coordinator is lost), nothing is kept from the console for longer.
  static constexpr std::chrono::seconds kHold{5};
  /// The most that is held: beyond this the text is shown (or, after the verdict, dropped
  /// from the console) rather than kept.
  static constexpr size_t kMaxHeldLines = 4000;
  static constexpr size_t kMaxHeldBytes = 512 * 1024;

  /// One complete line of stderr, without its end; appends the lines to show now to `shown`.
  void Line(std::string line, Clock::time_point now, std::vector<std::string>& shown);
  /// The round's root cause is known: this rank (`is_cause`), or another one, or not one rank.
  /// Can come again when the coordinator revises the root cause. `provisional`: the cause's
  /// own error says it lost a peer, so the coordinator may yet name another rank (the ranks
  /// raced to it); a rank so named keeps its text held, as without a verdict, until the
  /// revision or kHold.
  void Verdict(bool is_cause, bool provisional, std::vector<std::string>& shown);
  /// Shows what was held for kHold without a verdict.
  void Expire(Clock::time_point now, std::vector<std::string>& shown);
  /// When Expire has something to show; nullopt when nothing waits for time.
  std::optional<Clock::time_point> Deadline() const;
  /// The stream ended: a traceback cut short is judged as it is.
  void Finish(std::vector<std::string>& shown);

  /// Nothing held back any more (waiting for a verdict or for the end of a traceback).
  bool Settled() const { return block_.empty() && held_.empty(); }
  /// After a verdict that names another rank: lines kept off the console so far.
  size_t collapsed_lines() const { return collapsed_lines_; }
  /// Whether a traceback kept off the console said the rank lost a peer, or received the stop.
  bool collapsed_lost_peer() const { return collapsed_lost_peer_; }
  bool collapsed_the_stop() const { return collapsed_the_stop_; }
  /// After a verdict that names another rank (the console shows nothing new of this one).
  bool collapsing() const { return mode_ == Mode::kConsequence; }

 private:
  enum class Mode { kOpen, kCause, kConsequence };
  /// The traceback in block_ is complete (or cut short): shows it, holds it or drops it.
  void Judge(Clock::time_point now, std::vector<std::string>& shown);
  void Collapse(std::vector<std::string>& lines);
  static void Show(std::vector<std::string>& lines, std::vector<std::string>& shown);

  Mode mode_ = Mode::kOpen;
  std::vector<std::string> block_;  // the traceback being read
  Clock::time_point block_since_{};
  std::vector<std::string> held_;  // consequences (and what followed them), no verdict yet
  Clock::time_point held_since_{};
  size_t held_bytes_ = 0;           // block_ and held_ together
  bool pending_lost_peer_ = false;  // what held_ says, for the digest once it is collapsed
  bool pending_the_stop_ = false;
  size_t collapsed_lines_ = 0;
  bool collapsed_lost_peer_ = false;
  bool collapsed_the_stop_ = false;
};

/// One rank of a node whose stderr the filter kept off the console after the root cause.
struct CollapsedRank {
  int global_rank = 0;
  size_t lines = 0;
  bool lost_peer = false;  // a traceback it printed said it lost a peer
  bool the_stop = false;   // ... or that it received the stop
};

/// The one console line that stands for `ranks` of round `round`: what they printed, by kind,
/// how much, and where every byte is (`log_folder`, their attempt's folder).
/// "round 0: after rank 3 failed, ranks 0-1 lost a peer, as expected; 30 lines of their stderr
/// are not shown here (every byte is in DIR/rank-<r>.log)".
std::string ConsequenceDigest(int round, int cause_rank, const std::vector<CollapsedRank>& ranks,
                              const std::string& log_folder);

}  // namespace ddprun::io
