#pragma once
// The real Transport: TCP over Boost.Asio on the driver's one io_context.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runner/host/ports.h"

#include <functional>
#include <set>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

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
  Status Listen(const std::string& addr, uint16_t port) override;
  host::ConnId Connect(const std::string& addr, uint16_t port) override;
  void Send(host::ConnId conn, std::vector<uint8_t> bytes) override;
  void Close(host::ConnId conn) override;
  uint16_t ReserveStorePort() override;
  void SetStoreRelay(uint16_t port) override;
  void Trust(host::ConnId conn) override;

  /// Only these peers may connect to the listener (empty: anyone). `on_refused` hears about
  /// each refused peer address once.
  void SetAllowedPeers(std::vector<boost::asio::ip::address> allowed,
                       std::function<void(const std::string&)> on_refused);

  /// Limits that keep memory, descriptors and CPU bounded whatever connects to the listener.
  struct Limits {
    /// Store clients per rank that the relay expects at most (a TCPStore client per rank, and
    /// a few for libraries that open more).
    static constexpr size_t kRelaysPerRank = 4;
    /// Relayed store connections at once (pending or connected); more are closed at once.
    size_t max_relays = 256;
    /// Sockets this transport may hold; the rest of RLIMIT_NOFILE is the reserve that worker
    /// start and log files need. Over it, the oldest connection that has not yet said what it
    /// is gets closed, or accepting pauses.
    size_t max_sockets = 1024;
  };
  void SetLimits(const Limits& limits) { limits_ = limits; }
  /// Hears about limits being hit (at most once a minute per kind), for the console.
  void SetWarningSink(std::function<void(const std::string&)> on_warning) {
    on_warning_ = std::move(on_warning);
  }

  /// For tests and diagnostics: live relays and connections not yet classified.
  size_t RelayCount() const { return relays_.size(); }

  /// Closes the listener and every connection (no events).
  void Shutdown();

 private:
  struct Connection;
  struct Listener;
  struct Relay;
  void Classify(const std::shared_ptr<Connection>& conn, size_t have);
  void DropUnclassified(const std::shared_ptr<Connection>& conn);
  void StartRelay(const std::shared_ptr<Connection>& conn, size_t have);
  void CloseRelay(const std::shared_ptr<Relay>& relay);
  void ReadClient(const std::shared_ptr<Relay>& relay);
  void FlushPending(const std::shared_ptr<Relay>& relay);
  void PumpDown(const std::shared_ptr<Relay>& relay);
  void ConnectUpstream(const std::shared_ptr<Relay>& relay);
  void ProbeUpstream();
  void StartRead(const std::shared_ptr<Connection>& conn);
  void StartWrite(const std::shared_ptr<Connection>& conn);
  void StartAccept();
  void OnAccepted(boost::asio::ip::tcp::socket socket);
  void AcceptLater(const std::string& why);
  bool EvictOldestUnclassified();
  size_t SocketsInUse() const;
  void Warn(int kind, const std::string& text);
  void Fail(const std::shared_ptr<Connection>& conn, const std::string& reason);

  boost::asio::io_context& io_;
  Duration connect_timeout_;
  host::TransportEvents* events_ = nullptr;
  std::unique_ptr<Listener> listener_;
  std::map<host::ConnId, std::shared_ptr<Connection>> conns_;
  host::ConnId next_id_ = 1;
  uint16_t relay_port_ = 0;
  uint64_t relay_generation_ = 0;  // one per SetStoreRelay: stale callbacks see a change
  uint64_t next_relay_id_ = 1;
  std::map<uint64_t, std::shared_ptr<Relay>> relays_;
  std::deque<std::weak_ptr<Relay>> waiting_relays_;  // for the store to listen, oldest first
  bool upstream_listening_ = false;                  // a connect to this round's store succeeded
  bool probing_ = false;                             // one connect attempt (or its retry wait) at a time
  std::unique_ptr<boost::asio::steady_timer> probe_timer_;
  std::map<host::ConnId, std::shared_ptr<Connection>> unclassified_;  // oldest first
  // Accepted ddprun connections whose agent has not joined (not yet Trust()ed): at most
  // kMaxUnproven, the oldest closed to make room, each reading into a small buffer.
  std::map<host::ConnId, std::shared_ptr<Connection>> unproven_;  // oldest first
  std::unique_ptr<boost::asio::steady_timer> accept_timer_;
  std::chrono::milliseconds accept_backoff_{0};
  Limits limits_;
  std::function<void(const std::string&)> on_warning_;
  std::map<int, std::chrono::steady_clock::time_point> last_warning_;
  std::vector<boost::asio::ip::address> allowed_;
  std::function<void(const std::string&)> on_refused_;
  std::set<std::string> refused_reported_;
};

}  // namespace ddprun::io
