#pragma once
// The real Transport: TCP over Boost.Asio on the driver's one io_context.

#include <chrono>
#include <cstdint>
#include <vector>
#include <map>
#include <memory>
#include <string>

#include "runner/host/ports.h"

#include <functional>
#include <set>

#include <boost/asio/ip/address.hpp>

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

class AsioTransport final : public host::Transport {
 public:
  /// `connect_timeout` bounds one connect attempt (Asio has none of its own).
  AsioTransport(boost::asio::io_context& io, Duration connect_timeout);
  ~AsioTransport() override;

  void SetEvents(host::TransportEvents* events) override;
  std::string Listen(const std::string& addr, uint16_t port) override;
  host::ConnId Connect(const std::string& addr, uint16_t port) override;
  void Send(host::ConnId conn, std::vector<uint8_t> bytes) override;
  void Close(host::ConnId conn) override;
  uint16_t ReserveStorePort() override;
  void SetStoreRelay(uint16_t port) override;

  /// Only these peers may connect to the listener (empty: anyone). `on_refused` hears about
  /// each refused peer address once.
  void SetAllowedPeers(std::vector<boost::asio::ip::address> allowed,
                       std::function<void(const std::string&)> on_refused);

  /// Closes the listener and every connection (no events).
  void Shutdown();

 private:
  struct Connection;
  struct Listener;
  struct Relay;
  void Classify(const std::shared_ptr<Connection>& conn, size_t have);
  void StartRelay(const std::shared_ptr<Connection>& conn, size_t have);
  void ConnectUpstream(const std::shared_ptr<Relay>& relay, uint16_t port,
                       std::chrono::steady_clock::time_point give_up);
  void Pump(const std::shared_ptr<Relay>& relay, bool client_to_upstream);
  void StartRead(const std::shared_ptr<Connection>& conn);
  void StartWrite(const std::shared_ptr<Connection>& conn);
  void StartAccept();
  void Fail(const std::shared_ptr<Connection>& conn, const std::string& reason);

  boost::asio::io_context& io_;
  Duration connect_timeout_;
  host::TransportEvents* events_ = nullptr;
  std::unique_ptr<Listener> listener_;
  std::map<host::ConnId, std::shared_ptr<Connection>> conns_;
  host::ConnId next_id_ = 1;
  uint16_t relay_port_ = 0;
  std::vector<std::shared_ptr<Relay>> relays_;
  std::vector<boost::asio::ip::address> allowed_;
  std::function<void(const std::string&)> on_refused_;
  std::set<std::string> refused_reported_;
};

/// "pid 4242 (python3 -m http.server 50000)" for the process listening on TCP `port`, or ""
/// when it cannot be found (another user's process without privileges, or a race).
std::string FindPortOwner(uint16_t port);

}  // namespace ddprun::io
