#pragma once
// How long each round took to start on this node, and how its workers started (warm: forked
// from the template of job.preload; cold: a new interpreter): measured from the first worker the
// round asked for to the last one started, for the event log ("workers-started") and the
// summary. Plain bookkeeping; the launcher feeds it the clock.

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <string>

#include "runner/host/ports.h"

namespace ddprun::io {

class RoundStartLog {
 public:
  using Clock = std::chrono::steady_clock;
  /// `warm_configured`: job.preload is set (the record then says why a cold worker was cold).
  explicit RoundStartLog(bool warm_configured) : warm_configured_(warm_configured) {}

  void SetSink(std::function<void(const host::Event&)> sink) { sink_ = std::move(sink); }

  /// A worker of `round` was asked for at `now`. Returns true for the round's first.
  bool Requested(int round, Clock::time_point now);
  /// All workers of `round` have been asked for (the effect that asked is done).
  void Closed(int round, Clock::time_point now);
  /// One worker of `round` started (warm or cold) or could not start.
  void Started(int round, Clock::time_point now, bool warm, bool failed, const std::string& cold_reason);

  /// A step beacon of `round` came: the first one says how long the round took to train.
  void Stepped(int round, Clock::time_point now);

  /// "worker starts on this node: round 0: 4 warm in 9 ms; ..." (the last few rounds), or "".
  std::string SummaryLine() const;

 private:
  struct Round {
    Clock::time_point began{};
    Clock::time_point last{};
    int requested = 0;
    int done = 0;
    int warm = 0;
    int cold = 0;
    int failed = 0;
    bool closed = false;
    std::string cold_reason;
  };
  void MaybeDone(int round);

  bool warm_configured_;
  std::function<void(const host::Event&)> sink_;
  std::map<int, Round> open_;
  struct Line {
    int round = 0;
    Clock::time_point began{};
    std::string text;
    bool stepped = false;
  };
  std::deque<Line> lines_;  // the newest rounds
  int rounds_done_ = 0;
};

}  // namespace ddprun::io
