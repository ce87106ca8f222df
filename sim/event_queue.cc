#include "sim/event_queue.h"

#include "base/assert.h"

namespace ddprun::sim {
namespace {

// A 4-ary min-heap: half the levels of a binary one, and a node's four children share a cache
// line or two, which pays at millions of events. (time, seq) is a total order (seq is unique),
// so any correct heap pops the same sequence.
constexpr size_t kArity = 4;

}  // namespace

void EventQueue::Push(TimePoint at, Event event) {
  event.time_ns = at.time_since_epoch().count();
  event.seq = next_seq_++;
  PushWithSeq(event);
}

void EventQueue::PushWithSeq(const Event event) {
  DDPRUN_ASSERT(event.time_ns >= popped_ns_);
  size_t hole = heap_.size();
  heap_.push_back(event);
  while (hole > 0) {
    const size_t parent = (hole - 1) / kArity;
    if (!Earlier(event, heap_[parent])) break;
    heap_[hole] = heap_[parent];
    hole = parent;
  }
  heap_[hole] = event;
}

uint64_t EventQueue::CallSlot(std::function<void()> call) {
  uint64_t slot = 0;
  if (!free_calls_.empty()) {
    slot = free_calls_.back();
    free_calls_.pop_back();
    calls_[slot] = std::move(call);
  } else {
    slot = calls_.size();
    calls_.push_back(std::move(call));
  }
  return slot;
}

void EventQueue::PushCall(TimePoint at, std::function<void()> call) {
  Event event;
  event.kind = EventKind::kCall;
  event.target = CallSlot(std::move(call));
  Push(at, event);
}

void EventQueue::PushReservedCall(TimePoint at, uint64_t seq, std::function<void()> call) {
  DDPRUN_ASSERT(seq < next_seq_);
  Event event;
  event.kind = EventKind::kCall;
  event.target = CallSlot(std::move(call));
  event.time_ns = at.time_since_epoch().count();
  event.seq = seq;
  PushWithSeq(event);
}

void EventQueue::SiftDown(size_t hole, const Event event) {
  const size_t size = heap_.size();
  for (;;) {
    const size_t first = hole * kArity + 1;
    if (first >= size) break;
    const size_t end = first + kArity < size ? first + kArity : size;
    size_t least = first;
    for (size_t child = first + 1; child < end; ++child) {
      if (Earlier(heap_[child], heap_[least])) least = child;
    }
    if (!Earlier(heap_[least], event)) break;
    heap_[hole] = heap_[least];
    hole = least;
  }
  heap_[hole] = event;
}

void EventQueue::Rebuild() {
  // Floyd's: sift every inner node down, the last first.
  for (size_t k = heap_.size() / kArity + 1; k-- > 0;) {
    if (k < heap_.size()) SiftDown(k, heap_[k]);
  }
}

Event EventQueue::Pop() {
  DDPRUN_ASSERT(!heap_.empty());
  const Event top = heap_.front();
  const Event last = heap_.back();
  heap_.pop_back();
  // Sift the last event down from the root's hole.
  if (!heap_.empty()) SiftDown(0, last);
  popped_ns_ = top.time_ns;
  return top;
}

std::function<void()> EventQueue::TakeCall(uint64_t slot) {
  std::function<void()> call = std::move(calls_[slot]);
  calls_[slot] = nullptr;
  free_calls_.push_back(slot);
  return call;
}

}  // namespace ddprun::sim
