#pragma once
// Time in the core is a parameter: drivers pass `now` in. The real driver's epoch is
// steady_clock's; the simulator's is the start of the simulation.

#include <chrono>

#include "schema/duration.h"

namespace ddprun {

using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

/// The simulator's and tests' way to make a time point: `at` after the epoch.
inline TimePoint AtOffset(Duration at) { return TimePoint(at); }

}  // namespace ddprun
