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
