#include "sim/event_queue.h"

#include <algorithm>

#include "base/assert.h"

namespace ddprun::sim {
namespace {

// std::push_heap builds a max-heap: "later" compares as smaller so the earliest is on top.
bool Later(const Event& x, const Event& y) {
  return x.time_ns != y.time_ns ? x.time_ns > y.time_ns : x.seq > y.seq;
}

}  // namespace

void EventQueue::Push(TimePoint at, Event event) {
  event.time_ns = at.time_since_epoch().count();
  DDPRUN_ASSERT(event.time_ns >= popped_ns_);
  event.seq = next_seq_++;
  heap_.push_back(event);
  std::push_heap(heap_.begin(), heap_.end(), Later);
}

void EventQueue::PushCall(TimePoint at, std::function<void()> call) {
  uint64_t slot = 0;
  if (!free_calls_.empty()) {
    slot = free_calls_.back();
    free_calls_.pop_back();
    calls_[slot] = std::move(call);
  } else {
    slot = calls_.size();
    calls_.push_back(std::move(call));
  }
  Event event;
  event.kind = EventKind::kCall;
  event.target = slot;
  Push(at, event);
}

Event EventQueue::Pop() {
  DDPRUN_ASSERT(!heap_.empty());
  std::pop_heap(heap_.begin(), heap_.end(), Later);
  Event event = heap_.back();
  heap_.pop_back();
  popped_ns_ = event.time_ns;
  return event;
}

std::function<void()> EventQueue::TakeCall(uint64_t slot) {
  std::function<void()> call = std::move(calls_[slot]);
  calls_[slot] = nullptr;
  free_calls_.push_back(slot);
  return call;
}

}  // namespace ddprun::sim
