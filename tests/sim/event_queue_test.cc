// The simulator's event queue: earliest first, ties in push order, and virtual time that never
// goes back (an event pushed before the last one popped is a simulator bug and aborts).
#include "sim/event_queue.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace ddprun::testing {
namespace {

using namespace std::chrono_literals;

TimePoint At(Duration d) { return TimePoint(d); }

TEST(EventQueueTest, EarliestFirstAndTiesInPushOrder) {
  sim::EventQueue queue;
  sim::Event a, b, c;
  a.node = 1;
  b.node = 2;
  c.node = 3;
  queue.Push(At(2s), a);
  queue.Push(At(1s), b);
  queue.Push(At(2s), c);
  EXPECT_EQ(queue.Pop().node, 2u);
  EXPECT_EQ(queue.Pop().node, 1u);
  EXPECT_EQ(queue.Pop().node, 3u);
  EXPECT_TRUE(queue.Empty());
}

// The heap is hand-written (4-ary): against a sorted reference, with pushes between pops and
// many ties, every pop is the earliest (time, push order) of what is queued.
TEST(EventQueueTest, InterleavedPushesAndPopsComeOutInTimeThenPushOrder) {
  std::mt19937_64 rng(7);
  sim::EventQueue queue;
  std::vector<std::tuple<int64_t, uint64_t>> reference;  // (time, push index) still queued
  uint64_t pushed = 0;
  int64_t now = 0;
  for (int step = 0; step < 20000; ++step) {
    const bool push = reference.empty() || rng() % 3 != 0;
    if (push) {
      const int64_t at = now + static_cast<int64_t>(rng() % 50);  // few distinct times: ties
      sim::Event event;
      event.target = pushed;
      queue.Push(At(Duration(at)), event);
      reference.emplace_back(at, pushed++);
      continue;
    }
    const auto least = std::min_element(reference.begin(), reference.end());
    const sim::Event popped = queue.Pop();
    ASSERT_EQ(popped.time_ns, std::get<0>(*least)) << "step " << step;
    ASSERT_EQ(popped.target, std::get<1>(*least)) << "step " << step;
    now = popped.time_ns;
    reference.erase(least);
  }
  EXPECT_EQ(queue.size(), reference.size());
}

// Postpone moves many events at once as if each had been popped and pushed again at its new
// time, in the order they would have popped: against a second queue that does exactly that,
// the same events come out in the same order.
TEST(EventQueueTest, PostponingIsPoppingAndPushingAgainInPopOrder) {
  std::mt19937_64 rng(11);
  sim::EventQueue fast;
  sim::EventQueue slow;
  uint64_t id = 0;
  const auto push = [&](int64_t at) {
    sim::Event event;
    event.target = id++;
    event.node = static_cast<uint32_t>(rng() % 4);  // node 0's events get postponed
    fast.Push(At(Duration(at)), event);
    slow.Push(At(Duration(at)), event);
  };
  for (int i = 0; i < 2000; ++i) push(static_cast<int64_t>(rng() % 100));
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 50; ++i) {
      const sim::Event a = fast.Pop();
      const sim::Event b = slow.Pop();
      ASSERT_EQ(a.target, b.target) << "round " << round;
      ASSERT_EQ(a.time_ns, b.time_ns);
    }
    const int64_t now = fast.NextTime().time_since_epoch().count();
    const int64_t later = now + static_cast<int64_t>(rng() % 60);
    const auto moved = [&](const sim::Event& e) { return e.node == 0 && e.time_ns < later; };
    // The slow way: pop everything, push the moved ones again in pop order, the rest as they were.
    std::vector<sim::Event> all;
    while (!slow.Empty()) all.push_back(slow.Pop());
    sim::EventQueue rebuilt;
    for (sim::Event e : all) {
      if (!moved(e)) rebuilt.Push(At(Duration(e.time_ns)), e);
    }
    // Pushing keeps the relative order of the unmoved ones; the moved ones come after them all.
    for (sim::Event e : all) {
      if (moved(e)) rebuilt.Push(At(Duration(later)), e);
    }
    slow = std::move(rebuilt);
    fast.Postpone([&](const sim::Event& e) -> std::optional<int64_t> {
      return moved(e) ? std::optional<int64_t>(later) : std::nullopt;
    });
    for (int i = 0; i < 30; ++i) push(later + static_cast<int64_t>(rng() % 40));
  }
  while (!fast.Empty()) {
    ASSERT_FALSE(slow.Empty());
    const sim::Event a = fast.Pop();
    const sim::Event b = slow.Pop();
    ASSERT_EQ(a.target, b.target);
    ASSERT_EQ(a.time_ns, b.time_ns);
  }
  EXPECT_TRUE(slow.Empty());
}

TEST(EventQueueDeathTest, AnEventBeforeTheLastPoppedOneAborts) {
  sim::EventQueue queue;
  queue.Push(At(5s), sim::Event{});
  queue.Pop();
  queue.Push(At(5s), sim::Event{});  // the same time is fine
  queue.Pop();
  EXPECT_DEATH(queue.Push(At(4s), sim::Event{}), "assertion failed: event.time_ns >= popped_ns_");
}

}  // namespace
}  // namespace ddprun::testing
