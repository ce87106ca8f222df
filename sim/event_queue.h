#pragma once
// The simulator's event queue: a binary min-heap ordered by (time, sequence), so events at the
// same virtual time run in the order they were scheduled and a seed reproduces the run.
// Events are small plain records (no allocation per event); the rare ones that need a closure
// keep it in a side table.

#include <cstdint>
#include <functional>
#include <vector>

#include "runner/core/time.h"

namespace ddprun::sim {

enum class EventKind : uint8_t {
  kTimer,          // a node's timer: node, a = generation
  kPump,           // deliver queued bytes on a connection direction: a = connection, b = side
  kConnectDone,    // a connect attempt finishes: a = connection
  kAccept,         // the listening side sees a new connection: a = connection
  kWorkerReady,    // a node's workers finished starting: node, a = worker-set generation
  kWorkerExit,     // a worker process ends: a = worker index, b = exit generation
  kWorkerNotify,   // tell a node's agent that a worker exited (deferred while the agent hangs)
  kTrainingDone,   // the round reaches train_time: a = gang generation
  kPeerFailure,    // a node's workers notice a dead peer: node, a = gang generation
  kCollectiveTimeout,  // the NCCL watchdog fires on a stalled gang: a = gang generation
  kCall,           // a closure from the side table: a = slot
};

struct Event {
  int64_t time_ns = 0;
  uint64_t seq = 0;
  EventKind kind = EventKind::kCall;
  uint32_t node = 0;
  uint64_t a = 0;
  uint64_t b = 0;
};

class EventQueue {
 public:
  /// Schedules `event` at `at`; events at equal times run in scheduling order.
  void Push(TimePoint at, Event event);
  /// Schedules `call` at `at` (for rare events: faults, heals, reboots).
  void PushCall(TimePoint at, std::function<void()> call);
  bool Empty() const { return heap_.empty(); }
  TimePoint NextTime() const { return TimePoint(Duration(heap_.front().time_ns)); }
  /// Removes and returns the earliest event.
  Event Pop();
  /// Takes the closure of a kCall event out of the side table.
  std::function<void()> TakeCall(uint64_t slot);
  size_t size() const { return heap_.size(); }

 private:
  std::vector<Event> heap_;
  uint64_t next_seq_ = 0;
  std::vector<std::function<void()>> calls_;
  std::vector<uint64_t> free_calls_;
};

}  // namespace ddprun::sim
