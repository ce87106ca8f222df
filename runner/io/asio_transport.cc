#include "runner/io/asio_transport.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

namespace ddprun::io {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

// A peer that does not read is dropped rather than allowed to grow our memory.
constexpr size_t kMaxQueuedBytes = 16u << 20;
// An accepted connection must say who it is (agent or store client) within this time.
constexpr auto kClassifyTimeout = std::chrono::seconds(30);
// How long a store client waits, through the relay, for worker rank 0's store to listen.
constexpr auto kRelayConnectLimit = std::chrono::seconds(120);

core::ConnectError ClassifyConnectError(const error_code& ec) {
  if (ec == asio::error::connection_refused) return core::ConnectError::kRefused;
  if (ec == asio::error::timed_out || ec == asio::error::operation_aborted) {
    return core::ConnectError::kTimedOut;
  }
  if (ec == asio::error::host_unreachable || ec == asio::error::network_unreachable) {
    return core::ConnectError::kUnreachable;
  }
  return core::ConnectError::kOther;
}

}  // namespace

struct AsioTransport::Connection {
  Connection(asio::io_context& io, host::ConnId conn_id) : id(conn_id), socket(io), resolver(io), timer(io) {}
  host::ConnId id;
  tcp::socket socket;
  tcp::resolver resolver;
  asio::steady_timer timer;
  std::array<uint8_t, 64 * 1024> read_buffer{};
  std::deque<std::vector<uint8_t>> queue;
  size_t queued_bytes = 0;
  bool writing = false;
  bool connected = false;
  bool timed_out = false;
  bool closed = false;
  std::string peer;  // accepted connections: "addr:port"
};

struct AsioTransport::Listener {
  explicit Listener(asio::io_context& io) : acceptor(io) {}
  tcp::acceptor acceptor;
};

AsioTransport::AsioTransport(asio::io_context& io, Duration connect_timeout)
    : io_(io), connect_timeout_(connect_timeout) {}

AsioTransport::~AsioTransport() { Shutdown(); }

void AsioTransport::SetEvents(host::TransportEvents* events) { events_ = events; }

void AsioTransport::SetAllowedPeers(std::vector<asio::ip::address> allowed,
                                    std::function<void(const std::string&)> on_refused) {
  allowed_ = std::move(allowed);
  on_refused_ = std::move(on_refused);
}

void AsioTransport::Shutdown() {
  SetStoreRelay(0);
  if (listener_) {
    error_code ignored;
    listener_->acceptor.close(ignored);
  }
  for (auto& [id, conn] : conns_) {
    conn->closed = true;
    error_code ignored;
    conn->socket.close(ignored);
    conn->timer.cancel();
    conn->resolver.cancel();
  }
  conns_.clear();
}

std::string AsioTransport::Listen(const std::string& addr, uint16_t port) {
  error_code ec;
  tcp::resolver resolver(io_);
  auto results = resolver.resolve(addr, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    return fmt::format("cannot resolve cluster.master_addr \"{}\" on this node: {}", addr, ec.message());
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  auto listener = std::make_unique<Listener>(io_);
  listener->acceptor.open(endpoint.protocol(), ec);
  if (!ec) listener->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) listener->acceptor.bind(endpoint, ec);
  if (ec == asio::error::address_in_use) {
    const std::string owner = FindPortOwner(port);
    return fmt::format("cannot listen on {}:{}: the port is already in use{}\n"
                       "hint: stop that process, or pick another cluster.master_port in the job "
                       "file (on every node)",
                       addr, port, owner.empty() ? "" : " by " + owner);
  }
  if (ec.value() == EADDRNOTAVAIL) {
    return fmt::format("cannot listen on {}:{}: {} is not an address of this machine\n"
                       "hint: node 0 must run on the host of cluster.master_addr; check the node "
                       "rank (--node-rank) and master_addr",
                       addr, port, endpoint.address().to_string());
  }
  if (ec == asio::error::access_denied) {
    return fmt::format("cannot listen on {}:{}: permission denied (ports below 1024 need root)",
                       addr, port);
  }
  if (!ec) listener->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fmt::format("cannot listen on {}:{}: {}", addr, port, ec.message());
  listener_ = std::move(listener);
  StartAccept();
  return "";
}

void AsioTransport::StartAccept() {
  listener_->acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !listener_ || !listener_->acceptor.is_open()) return;
    if (!ec) {
      auto conn = std::make_shared<Connection>(io_, next_id_++);
      conn->socket = std::move(socket);
      conn->connected = true;
      error_code ignored;
      conn->socket.set_option(tcp::no_delay(true), ignored);
      const auto remote = conn->socket.remote_endpoint(ignored);
      conn->peer = fmt::format("{}:{}", remote.address().to_string(), remote.port());
      // Listed nodes only: this also covers PyTorch's store, which has no authentication.
      auto address = remote.address();
      if (address.is_v6() && address.to_v6().is_v4_mapped()) {
        address = address.to_v6().to_v4();
      }
      if (!allowed_.empty() && std::find(allowed_.begin(), allowed_.end(), address) == allowed_.end()) {
        if (refused_reported_.insert(address.to_string()).second && on_refused_) {
          on_refused_(address.to_string());
        }
        conn->socket.close(ignored);
      } else {
        Classify(conn, 0);
      }
    }
    StartAccept();
  });
}

// The first bytes decide: the ddprun magic is an agent; anything else is a PyTorch store client
// for the relay. Both kinds speak first, so waiting for 4 bytes is enough; a peer that says
// nothing is dropped after kClassifyTimeout.
void AsioTransport::Classify(const std::shared_ptr<Connection>& conn, size_t have) {
  static constexpr uint8_t kMagic[4] = {'D', 'D', 'P', 'R'};
  if (have > 0 && std::memcmp(conn->read_buffer.data(), kMagic, std::min<size_t>(have, 4)) != 0) {
    conn->timer.cancel();
    StartRelay(conn, have);
    return;
  }
  if (have >= 4) {
    conn->timer.cancel();
    conns_[conn->id] = conn;
    if (events_) events_->OnAccepted(conn->id, conn->peer);
    if (events_ && !conn->closed) {
      events_->OnData(conn->id, std::span<const uint8_t>(conn->read_buffer.data(), have));
    }
    if (!conn->closed) StartRead(conn);
    return;
  }
  if (have == 0) {
    conn->timer.expires_after(kClassifyTimeout);
    conn->timer.async_wait([conn](error_code ec) {
      if (ec || conn->closed) return;
      conn->closed = true;
      error_code ignored;
      conn->socket.close(ignored);
    });
  }
  conn->socket.async_read_some(
      asio::buffer(conn->read_buffer.data() + have, conn->read_buffer.size() - have),
      [this, conn, have](error_code ec, size_t n) {
        if (conn->closed) return;
        if (ec) {
          conn->closed = true;
          conn->timer.cancel();
          return;
        }
        Classify(conn, have + n);
      });
}

struct AsioTransport::Relay : std::enable_shared_from_this<Relay> {
  Relay(asio::io_context& io, tcp::socket from) : client(std::move(from)), upstream(io), retry(io) {}
  tcp::socket client;
  tcp::socket upstream;
  asio::steady_timer retry;
  std::vector<uint8_t> pending;  // what the client sent before upstream was connected
  std::array<uint8_t, 64 * 1024> down_buffer{};
  std::array<uint8_t, 64 * 1024> up_buffer{};
  bool closed = false;
  void Close() {
    if (closed) return;
    closed = true;
    error_code ignored;
    retry.cancel();
    client.close(ignored);
    upstream.close(ignored);
  }
};

void AsioTransport::SetStoreRelay(uint16_t port) {
  relay_port_ = port;
  // A new round has a new store: connections to the old one end with it.
  for (auto& relay : relays_) relay->Close();
  relays_.clear();
}

void AsioTransport::StartRelay(const std::shared_ptr<Connection>& conn, size_t have) {
  conn->closed = true;  // the Connection object is done; the relay owns the socket now
  if (relay_port_ == 0) {
    error_code ignored;
    conn->socket.close(ignored);
    return;
  }
  auto relay = std::make_shared<Relay>(io_, std::move(conn->socket));
  relay->pending.assign(conn->read_buffer.begin(), conn->read_buffer.begin() + static_cast<std::ptrdiff_t>(have));
  relays_.push_back(relay);
  ConnectUpstream(relay, relay_port_, std::chrono::steady_clock::now() + kRelayConnectLimit);
}

void AsioTransport::ConnectUpstream(const std::shared_ptr<Relay>& relay, uint16_t port,
                                    std::chrono::steady_clock::time_point give_up) {
  // Worker rank 0 may not listen yet: store clients start as fast as it does.
  relay->upstream.async_connect(
      tcp::endpoint(asio::ip::address_v4::loopback(), port), [this, relay, port, give_up](error_code ec) {
        if (relay->closed) return;
        if (ec) {
          if (std::chrono::steady_clock::now() >= give_up) {
            relay->Close();
            return;
          }
          error_code ignored;
          relay->upstream.close(ignored);
          relay->retry.expires_after(std::chrono::milliseconds(50));
          relay->retry.async_wait([this, relay, port, give_up](error_code tec) {
            if (!tec && !relay->closed) ConnectUpstream(relay, port, give_up);
          });
          return;
        }
        error_code ignored;
        relay->upstream.set_option(tcp::no_delay(true), ignored);
        asio::async_write(relay->upstream, asio::buffer(relay->pending), [this, relay](error_code wec, size_t) {
          if (wec || relay->closed) {
            relay->Close();
            return;
          }
          relay->pending.clear();
          Pump(relay, true);
          Pump(relay, false);
        });
      });
}

void AsioTransport::Pump(const std::shared_ptr<Relay>& relay, bool client_to_upstream) {
  tcp::socket& from = client_to_upstream ? relay->client : relay->upstream;
  tcp::socket& to = client_to_upstream ? relay->upstream : relay->client;
  auto& buffer = client_to_upstream ? relay->up_buffer : relay->down_buffer;
  from.async_read_some(asio::buffer(buffer), [this, relay, client_to_upstream, &to, &buffer](error_code ec, size_t n) {
    if (relay->closed) return;
    if (ec) {
      relay->Close();
      return;
    }
    asio::async_write(to, asio::buffer(buffer.data(), n), [this, relay, client_to_upstream](error_code wec, size_t) {
      if (wec || relay->closed) {
        relay->Close();
        return;
      }
      Pump(relay, client_to_upstream);
    });
  });
}

host::ConnId AsioTransport::Connect(const std::string& addr, uint16_t port) {
  auto conn = std::make_shared<Connection>(io_, next_id_++);
  conns_[conn->id] = conn;
  conn->timer.expires_after(connect_timeout_);
  conn->timer.async_wait([this, conn](error_code ec) {
    if (ec || conn->closed || conn->connected) return;
    conn->timed_out = true;
    conn->resolver.cancel();
    error_code ignored;
    conn->socket.close(ignored);
  });
  conn->resolver.async_resolve(
      addr, std::to_string(port), [this, conn](error_code ec, tcp::resolver::results_type results) {
        if (conn->closed) return;
        if (ec) {
          conn->closed = true;
          conn->timer.cancel();
          conns_.erase(conn->id);
          const auto kind = conn->timed_out ? core::ConnectError::kTimedOut : core::ConnectError::kNameNotResolved;
          if (events_) events_->OnConnectFailed(conn->id, kind, ec.message());
          return;
        }
        asio::async_connect(conn->socket, results, [this, conn](error_code cec, const tcp::endpoint&) {
          if (conn->closed) return;
          conn->timer.cancel();
          if (cec) {
            conn->closed = true;
            conns_.erase(conn->id);
            const auto kind = conn->timed_out ? core::ConnectError::kTimedOut : ClassifyConnectError(cec);
            if (events_) {
              events_->OnConnectFailed(conn->id, kind, conn->timed_out ? "no answer" : cec.message());
            }
            return;
          }
          conn->connected = true;
          error_code ignored;
          conn->socket.set_option(tcp::no_delay(true), ignored);
          if (events_) events_->OnConnected(conn->id);
          if (!conn->closed) {
            StartRead(conn);
            if (!conn->queue.empty() && !conn->writing) StartWrite(conn);
          }
        });
      });
  return conn->id;
}

void AsioTransport::StartRead(const std::shared_ptr<Connection>& conn) {
  conn->socket.async_read_some(asio::buffer(conn->read_buffer), [this, conn](error_code ec, size_t n) {
    if (conn->closed) return;
    if (ec) {
      Fail(conn, ec == asio::error::eof ? "connection closed by the peer" : ec.message());
      return;
    }
    if (events_) events_->OnData(conn->id, std::span<const uint8_t>(conn->read_buffer.data(), n));
    if (!conn->closed) StartRead(conn);
  });
}

void AsioTransport::Send(host::ConnId id, std::vector<uint8_t> bytes) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  const auto& conn = it->second;
  conn->queued_bytes += bytes.size();
  conn->queue.push_back(std::move(bytes));
  if (conn->queued_bytes > kMaxQueuedBytes) {
    // Reported from the loop, not from inside Send (ports never call back synchronously).
    asio::post(io_, [this, conn] { if (!conn->closed) Fail(conn, "peer does not read its messages"); });
    return;
  }
  if (conn->connected && !conn->writing) StartWrite(conn);
}

void AsioTransport::StartWrite(const std::shared_ptr<Connection>& conn) {
  conn->writing = true;
  asio::async_write(conn->socket, asio::buffer(conn->queue.front()), [this, conn](error_code ec, size_t) {
    conn->writing = false;
    if (conn->closed) return;
    if (ec) {
      Fail(conn, ec.message());
      return;
    }
    conn->queued_bytes -= conn->queue.front().size();
    conn->queue.pop_front();
    if (!conn->queue.empty()) StartWrite(conn);
  });
}

void AsioTransport::Fail(const std::shared_ptr<Connection>& conn, const std::string& reason) {
  conn->closed = true;
  error_code ignored;
  conn->socket.close(ignored);
  conns_.erase(conn->id);
  if (events_) events_->OnClosed(conn->id, reason);
}

void AsioTransport::Close(host::ConnId id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  auto conn = it->second;
  conns_.erase(it);
  conn->closed = true;
  conn->timer.cancel();
  conn->resolver.cancel();
  error_code ignored;
  // Let queued frames (a Reject, a JobEnd) go out before the close: best effort into the
  // kernel's buffer, never blocking the loop on a peer that does not read.
  if (conn->connected && !conn->queue.empty() && !conn->writing) {
    conn->socket.non_blocking(true, ignored);
    for (const auto& b : conn->queue) {
      error_code wec;
      const size_t n = conn->socket.write_some(asio::buffer(b), wec);
      if (wec || n != b.size()) break;
    }
  }
  conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
  conn->socket.close(ignored);
}

uint16_t AsioTransport::ReserveStorePort() {
  // PyTorch's TCPStore binds the wildcard address, so the port must be free there.
  error_code ec;
  tcp::acceptor probe(io_);
  probe.open(tcp::v4(), ec);
  if (!ec) probe.bind(tcp::endpoint(tcp::v4(), 0), ec);
  if (ec) return 0;
  const uint16_t port = probe.local_endpoint(ec).port();
  return ec ? 0 : port;
}

std::string FindPortOwner(uint16_t port) {
  namespace fs = std::filesystem;
  std::vector<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retrans, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retrans >> uid >> timeout >> inode;
      const auto colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;  // 0A: LISTEN
      if (std::stoul(local.substr(colon + 1), nullptr, 16) == port) inodes.push_back("socket:[" + inode + "]");
    }
  }
  if (inodes.empty()) return "";
  std::error_code ec;
  for (const auto& proc : fs::directory_iterator("/proc", ec)) {
    const std::string pid = proc.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fd_ec;
    for (const auto& fd : fs::directory_iterator(proc.path() / "fd", fd_ec)) {
      std::error_code link_ec;
      const auto target = fs::read_symlink(fd.path(), link_ec).string();
      if (link_ec || std::find(inodes.begin(), inodes.end(), target) == inodes.end()) continue;
      std::ifstream cmdline(proc.path() / "cmdline");
      std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
      std::replace(args.begin(), args.end(), '\0', ' ');
      while (!args.empty() && args.back() == ' ') args.pop_back();
      return fmt::format("pid {} ({})", pid, args);
    }
  }
  return "";
}

}  // namespace ddprun::io
