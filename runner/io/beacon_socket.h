#pragma once
// The agent's end of the progress beacons (worker/README.md): a UDP socket on 127.0.0.1 with
// a random token. Datagrams that are not well-formed beacons with the token are dropped
// unread beyond their first kMaxBeaconSize bytes; the rest go to `on_beacon`.

#include <array>
#include <functional>
#include <memory>
#include <string>

#include "base/result.h"
#include "runner/core/progress.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

class BeaconSocket {
 public:
  /// Binds 127.0.0.1 on a free port; fails with why (the agent then runs without beacons).
  static Result<std::unique_ptr<BeaconSocket>> Open(boost::asio::io_context& io,
                                                    std::function<void(const core::Beacon&)> on_beacon);
  ~BeaconSocket();

  /// "127.0.0.1:<port>", for DDPRUN_PROGRESS_ADDR.
  const std::string& address() const { return address_; }
  /// 32 hex characters from the system's randomness, for DDPRUN_PROGRESS_TOKEN.
  const std::string& token() const { return token_; }
  /// Datagrams dropped so far (not beacons, or a wrong token).
  uint64_t dropped() const { return dropped_; }

 private:
  struct Impl;
  explicit BeaconSocket(std::unique_ptr<Impl> impl);
  void Receive();

  std::unique_ptr<Impl> impl_;
  std::string address_;
  std::string token_;
  uint64_t dropped_ = 0;
};

}  // namespace ddprun::io
