#pragma once
// Progress beacons and hung ranks: the words of the worker contract (worker/README.md) and the
// pure functions both state machines use on them. The agent parses beacon datagrams and
// faulthandler dumps; the coordinator finds the hung rank among every rank's last step and
// stack. Sans-IO: text in, values out.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::core {

enum class BeaconKind {
  kHello,  // the module was imported; says whether a stack handler is registered
  kStep,   // ddprun.progress(step)
  kPhase,  // ddprun.phase(name): the next step may take up to timeouts.progress_start
};

/// One datagram from a worker:
/// "ddprun1 <token> <round> <local_rank> <kind> <step> <busy_us> <stack_signal>".
struct Beacon {
  int round = 0;
  int local_rank = 0;
  BeaconKind kind = BeaconKind::kStep;
  int64_t step = 0;
  int64_t busy_us = -1;  // the rank's own work since its previous step beacon; -1 unknown
  int stack_signal = 0;  // faulthandler dumps all threads on this signal; 0 none
};

/// The longest datagram a worker sends; longer ones are not beacons.
inline constexpr size_t kMaxBeaconSize = 256;

/// The beacon in `datagram` when it is well formed and carries `token`; nullopt otherwise
/// (another program's packet, a stale token, garbage). Total: never fails on any input.
std::optional<Beacon> ParseBeacon(std::string_view datagram, std::string_view token);

/// "ddprun1 <token> ..." for `beacon`: what the Python module and the C header send.
std::string FormatBeacon(const Beacon& beacon, std::string_view token);

/// One Python frame of a faulthandler dump: `File "train.py", line 88 in main`.
struct Frame {
  std::string file;
  int line = 0;
  std::string function;
  bool operator==(const Frame&) const = default;
};

/// The most frames of one stack that ddprun keeps (innermost first); deeper ones are dropped.
inline constexpr size_t kMaxFrames = 24;

/// The main thread's stack from a faulthandler dump (all threads, "most recent call first"):
/// the thread whose outermost frame is `<module>`, else the "Current thread", else the first.
/// Several dumps in `dump` (the file is appended to): the last one. Innermost first, at most
/// kMaxFrames. Empty when `dump` holds no stack.
std::vector<Frame> MainThreadStack(std::string_view dump);

/// Frames as faulthandler writes them, one per line, innermost first; ParseFrames reads them.
std::string FormatFrames(const std::vector<Frame>& frames);
std::vector<Frame> ParseFrames(std::string_view text);

/// Where a stack stands, in a few words: "in all_reduce at train.py:95" (the innermost
/// function, and the innermost frame of the user's own code when that is another frame).
std::string DescribeStack(const std::vector<Frame>& frames);

/// Whether a stack waits for other ranks: it is inside torch.distributed (a collective, a
/// barrier, the store), DDP's gradient synchronisation or a backward pass that DDP drives.
bool WaitsForOtherRanks(const std::vector<Frame>& frames);

/// One rank as the coordinator knows it when a round stopped making progress.
struct RankAtHang {
  int global_rank = 0;
  int node_rank = 0;
  int local_rank = 0;
  int64_t step = -1;         // its last step beacon; -1 none
  int64_t silent_ms = -1;    // since its last beacon; -1 unknown (its node did not answer)
  std::vector<Frame> stack;  // empty: no stack (no handler, no answer)
};

struct HangVerdict {
  std::vector<int> culprits;  // global ranks, ascending
  std::string reason;         // why those: "the only rank not waiting for the others", ...
};

/// Which ranks hung the round. In DDP every rank stops soon after one does (the others wait
/// for it in the next collective), so silence alone does not say who. In order:
///  1. ranks behind the others (the lowest last step, when not all are equal);
///  2. of those (or of all), the ranks whose stack is not waiting for other ranks;
///  3. the ranks whose stack differs from that of a strict majority;
///  4. else `first_silent`, the rank that was reported first.
HangVerdict FindHungRanks(const std::vector<RankAtHang>& ranks, int first_silent);

/// "0-2, 5, 7-9".
std::string RankRanges(std::vector<int> ranks);

}  // namespace ddprun::core
