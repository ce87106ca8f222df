#pragma once
// What each node was doing over time: recorded while a simulation runs (virtual time), or
// rebuilt from a real run's event log (report/event_log.h, wall-clock time). The Chrome trace
// and the HTML page (report/render.h) draw it.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::report {

/// A node's state as the timeline shows it.
enum class NodePhase : uint8_t {
  kOff,         // not started yet (slow joiner)
  kRendezvous,  // agent connecting or waiting for the other nodes
  kStarting,    // workers spawned, still starting up
  kTraining,    // the whole gang is training
  kStalled,     // workers up but the gang makes no progress (hung worker, partition, peer lost)
  kStopping,    // workers signalled, not all exited yet
  kWaiting,     // joined, no workers: between rounds (backoff) or waiting for the others
  kDown,        // crashed
  kDone,        // the agent exited
};

/// The lower-case name of a phase, as the trace and report label it.
const char* NodePhaseName(NodePhase phase);

struct Segment {
  int64_t start_ns = 0;
  int64_t end_ns = 0;  // -1 while open
  NodePhase phase = NodePhase::kOff;
  int32_t round = -1;
};

enum class MarkKind : uint8_t { kFault, kFailure, kRestart, kExit, kHeal };

/// A point (or, with end_ns > at_ns, a span) of note on a node's row or job-wide.
struct Mark {
  int64_t at_ns = 0;
  int64_t end_ns = 0;
  static constexpr uint32_t kJob = 0xffffffffu;
  uint32_t node = kJob;
  MarkKind kind = MarkKind::kFault;
  std::string text;
};

struct Timeline {
  std::vector<std::string> labels;             // per row: "node 3 (node-0003)"
  std::vector<std::vector<Segment>> segments;  // per row, in time order
  std::vector<bool> focus;                     // rows touched by a fault
  std::vector<Mark> marks;
  std::vector<std::pair<int64_t, int64_t>> training;  // job-wide spans when the gang trained
  int64_t end_ns = 0;
  std::string title;
  /// What the page calls itself ("ddprun simulation", "ddprun run") and what its time axis
  /// measures ("virtual time", "wall-clock time since the first record").
  std::string kind = "ddprun simulation";
  std::string clock = "virtual time";
};

}  // namespace ddprun::report
