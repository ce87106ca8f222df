#pragma once
// The wall clock, for records that must mean something after a reboot (node 0's journal and
// quarantine state, the event log). Everything that measures time uses the monotonic clock.

#include <chrono>
#include <cstdint>

namespace ddprun {

/// Milliseconds since the Unix epoch, now.
inline int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace ddprun
