#include "runner/io/real_time.h"

#include <chrono>

namespace ddprun::io {

TimePoint RealClock::Now() const {
  return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
}

void AsioTimer::ArmAt(TimePoint when) {
  const uint64_t generation = ++generation_;
  timer_.expires_at(std::chrono::steady_clock::time_point(when.time_since_epoch()));
  timer_.async_wait([this, generation](boost::system::error_code ec) {
    if (ec || generation != generation_) return;  // replaced or cancelled
    on_fire_();
  });
}

void AsioTimer::Disarm() {
  ++generation_;
  timer_.cancel();
}

}  // namespace ddprun::io
