#pragma once
// The real Clock and Timer ports: steady_clock, and one Asio timer on the driver's loop that
// NodeHost re-arms at the earlier of its state machines' next deadlines.

#include <cstdint>
#include <functional>

#include <boost/asio/steady_timer.hpp>

#include "runner/host/ports.h"

namespace ddprun::io {

class RealClock final : public host::Clock {
 public:
  TimePoint Now() const override;
};

class AsioTimer final : public host::Timer {
 public:
  explicit AsioTimer(boost::asio::io_context& io) : timer_(io) {}
  /// What a firing calls; set before the first ArmAt.
  void SetCallback(std::function<void()> on_fire) { on_fire_ = std::move(on_fire); }
  /// Replaces the armed time: a wait that was replaced or disarmed never calls back.
  void ArmAt(TimePoint when) override;
  void Disarm() override;

 private:
  boost::asio::steady_timer timer_;
  std::function<void()> on_fire_;
  uint64_t generation_ = 0;
};

}  // namespace ddprun::io
