#pragma once
// The local side of `ddprun up`: runs one ssh client per host at once, each in its own process
// group (so the terminal's Ctrl-C reaches `up` alone, which then decides), and either collects
// their output (the probe, the copy) or streams it line by line with each host's prefix into
// one stream (the agents). Interrupts (SIGINT, SIGTERM, SIGHUP) are read here, in the loop,
// and turned into stop requests on each agent's link (runner/io/controller_link.h).

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::io {

struct RemoteChild {
  std::vector<std::string> argv;
  /// Written to its stdin (the job file for --copy, this ddprun's files for --install); shared,
  /// as every host may get the same bytes.
  std::shared_ptr<const std::string> input;
  bool hold_stdin = false;  // keep stdin open after `input`: the agent's link to `up`
  std::string prefix;       // streamed lines start with it ("gpu-02: ")
  bool stream = false;      // print lines as they come; else collect them
};

struct ChildOutcome {
  int exit_status = -1;  // the exit code; 128 + N when killed by signal N; -1 killed at the deadline
  std::string out;       // collected (stream = false)
  std::string err;
};

struct RunLimits {
  /// Collecting children are killed after this long (their outcome is -1).
  std::chrono::milliseconds deadline{std::chrono::hours(24 * 365)};
  /// After the first interrupt, how long the agents get to stop before their ssh clients are
  /// killed (stop_grace and a margin).
  std::chrono::milliseconds stop_wait{std::chrono::seconds(30)};
};

struct RunOutcome {
  std::vector<ChildOutcome> children;  // in the order given
  int interrupted_by = 0;              // the first signal received, 0 if none
};

/// What the caller may do while the children run (`ddprun up` watches its agents).
struct RunHooks {
  /// A complete line of child `i`'s stdout (stream 0) or stderr (1) of a streamed child,
  /// without its newline, before it is printed; false keeps it out of the stream (a line meant
  /// for the caller alone).
  std::function<bool(size_t i, int stream, std::string_view line)> line;
  /// Child `i` exited with `status` (as ChildOutcome says it); true asks every other child that
  /// holds a link to stop, with SIGTERM's stop line, as the user's interrupt would (without
  /// counting as one: RunOutcome::interrupted_by stays 0).
  std::function<bool(size_t i, int status)> exited;
};

/// Starts every child, waits for all of them, returns their outcomes. A child that cannot be
/// started gets exit status 127 and the reason in `err`.
RunOutcome RunRemoteChildren(const std::vector<RemoteChild>& children, const RunLimits& limits,
                             const RunHooks& hooks = {});

}  // namespace ddprun::io
