// The simulator's event queue: earliest first, ties in push order, and virtual time that never
// goes back (an event pushed before the last one popped is a simulator bug and aborts).
#include "sim/event_queue.h"

#include <chrono>

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
