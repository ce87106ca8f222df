#pragma once
// The simulator's event queue: a binary min-heap ordered by (time, sequence), so events at the
// same virtual time run in the order they were scheduled and a seed reproduces the run.
// Events are small plain records (no allocation per event); the rare ones that need a closure
// keep it in a side table.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "runner/core/time.h"

namespace ddprun::sim {

enum class EventKind : uint8_t {
  kTimer,              // a node's timer fires (generation: the timer's)
  kPump,               // deliver queued bytes on one direction of a connection (target, side)
  kConnectDone,        // a connect attempt finishes (target: the connection)
  kAccept,             // the listening side sees a new connection (target: the connection)
  kWorkerReady,        // a node's workers finished starting (target: the gang)
  kWorkerExit,         // a worker process ends (target: the worker, generation: its exit's)
  kWorkerNotify,       // tell a node's agent that a worker exited (deferred while the agent hangs)
  kTrainingDone,       // the round reaches train_time (target: the gang, generation: its done's)
  kPeerFailure,        // a node's workers notice a dead peer (target: the gang)
  kCollectiveTimeout,  // the NCCL watchdog fires on a stalled gang (target, generation)
  kStoreConnect,       // a node's PyTorch store clients connect (target: the group of clients)
  kBeacons,            // a node's workers beacon: side 0 the periodic batch (generation: the node's
                       // chain), side 1 the last step before their gang stalled (target: the gang,
                       // generation: the step)
  kCheck,              // a time bound of an invariant comes due (sim/invariants.h); does nothing
  kCall,               // a closure from the side table (target: the slot)
};

/// One scheduled event. The fields are named for what they hold; which ones an event kind uses
/// is listed with the kind above. 40 bytes: the queue holds millions at scale.
struct Event {
  int64_t time_ns = 0;
  uint64_t seq = 0;
  /// What the event is about: a connection, worker, gang or call slot, by kind.
  uint64_t target = 0;
  /// Invalidates stale events: the event is dropped unless its target still has this one.
  uint64_t generation = 0;
  uint32_t node = 0;  // the node whose agent or workers the event concerns
  EventKind kind = EventKind::kCall;
  uint8_t side = 0;  // kPump: the side of the connection the bytes travel toward
};

class EventQueue {
 public:
  /// Schedules `event` at `at`; events at equal times run in scheduling order.
  void Push(TimePoint at, Event event);
  /// Schedules `call` at `at` (for rare events: faults, heals, reboots).
  void PushCall(TimePoint at, std::function<void()> call);
  /// Takes the next sequence number for an event pushed later with PushReservedCall: among
  /// events at its time it runs where it would have, had it been pushed now. A replay's
  /// thousands of faults are fed one at a time this way (FaultInjector), so the queue stays
  /// the size of the cluster and scanning it (sim/quiet.cc) stays O(nodes), not O(faults).
  uint64_t ReserveSeq() { return next_seq_++; }
  void PushReservedCall(TimePoint at, uint64_t seq, std::function<void()> call);
  bool Empty() const { return heap_.empty(); }
  TimePoint NextTime() const { return TimePoint(Duration(heap_.front().time_ns)); }
  /// Removes and returns the earliest event.
  Event Pop();
  /// Takes the closure of a kCall event out of the side table.
  std::function<void()> TakeCall(uint64_t slot);
  size_t size() const { return heap_.size(); }
  /// Calls `visit` with every queued event, in no particular order.
  template <typename Visit>
  void ForEach(Visit visit) const {
    for (const Event& event : heap_) visit(event);
  }
  /// Moves every event for which `later` returns a time (no earlier than its own) to that
  /// time, as if each had been popped and pushed again there in the order they would have
  /// popped. O(size): for many events at once.
  template <typename Later>
  void Postpone(Later later) {
    std::vector<std::pair<Event*, int64_t>> moves;
    for (Event& event : heap_) {
      if (const std::optional<int64_t> at = later(event)) moves.emplace_back(&event, *at);
    }
    if (moves.empty()) return;
    std::sort(moves.begin(), moves.end(),
              [](const auto& a, const auto& b) { return Earlier(*a.first, *b.first); });
    for (auto& [event, at] : moves) {
      event->time_ns = at;
      event->seq = next_seq_++;
    }
    Rebuild();
  }

 private:
  static bool Earlier(const Event& x, const Event& y) {
    return x.time_ns != y.time_ns ? x.time_ns < y.time_ns : x.seq < y.seq;
  }
  void SiftDown(size_t hole, Event event);
  void Rebuild();
  void PushWithSeq(Event event);
  uint64_t CallSlot(std::function<void()> call);

  std::vector<Event> heap_;
  uint64_t next_seq_ = 0;
  int64_t popped_ns_ = 0;  // virtual time never goes back: no event before the last popped
  std::vector<std::function<void()>> calls_;
  std::vector<uint64_t> free_calls_;
};

}  // namespace ddprun::sim
