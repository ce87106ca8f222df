#include "runner/io/asio_transport.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>

#include <sys/resource.h>

#include <fmt/format.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "runner/io/tcp_listener.h"

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
// While the store does not listen yet, one connect attempt per interval stands for all
// waiting store clients.
constexpr auto kRelayRetryInterval = std::chrono::milliseconds(50);
// Per relayed connection: one buffer each way, and what a client may send before the store
// listens. TCPStore messages are small; a large value just takes more rounds.
constexpr size_t kRelayBufferBytes = 16 * 1024;
constexpr size_t kMaxPendingBytes = 16 * 1024;
// Accepted connections that have not yet sent their first 4 bytes.
constexpr size_t kMaxUnclassified = 256;
// Accepted ddprun connections whose agent has not joined yet (issue 36: 1,000 peers that each
// sent the magic and most of a 1 MiB frame took 685 MB). A real agent joins within one or two
// round trips of connecting, so it is rarely among the oldest; one that is dropped retries.
constexpr size_t kMaxUnproven = 256;
// Reads of a connection that has not proved itself go into this much; a joined agent's into
// kTrustedReadBytes (stack dumps and error tails are large).
constexpr size_t kUnprovenReadBytes = 4 * 1024;
constexpr size_t kTrustedReadBytes = 64 * 1024;
// Accepting again after EMFILE or a full socket budget: first after 100 ms, at most 2 s.
constexpr auto kAcceptBackoffMin = std::chrono::milliseconds(100);
constexpr auto kAcceptBackoffMax = std::chrono::milliseconds(2000);
// Connections that have not said what they are, closed when descriptors run out, so that
// workers and log files find some.
constexpr size_t kEvictOnExhaustion = 16;
// The socket budget never shrinks below this: agents must still be able to join.
constexpr size_t kMinSockets = 16;
// A limit that keeps being hit is said once per this interval, not once per connection.
constexpr auto kWarningInterval = std::chrono::seconds(60);
enum : int { kWarnAccept = 1, kWarnUnclassified = 2, kWarnRelays = 3, kWarnSockets = 4, kWarnUnproven = 5 };

std::string CurrentNoFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return "unknown";
  return limit.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(limit.rlim_cur);
}

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
  std::array<uint8_t, 4> hello{};    // accepted connections: the first bytes, to classify
  std::vector<uint8_t> read_buffer;  // allocated when reading starts
  std::deque<std::vector<uint8_t>> queue;
  size_t queued_bytes = 0;
  bool writing = false;
  bool connected = false;
  bool timed_out = false;
  bool closed = false;
  bool trusted = false;  // our own connect, or an accepted one whose agent joined (Trust)
  std::string peer;      // accepted connections: "addr:port"
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
  if (accept_timer_) accept_timer_->cancel();
  auto unclassified = std::move(unclassified_);
  unclassified_.clear();
  for (auto& [id, conn] : unclassified) DropUnclassified(conn);
  for (auto& [id, conn] : conns_) {
    conn->closed = true;
    error_code ignored;
    conn->socket.close(ignored);
    conn->timer.cancel();
    conn->resolver.cancel();
  }
  conns_.clear();
  unproven_.clear();
}

Status AsioTransport::Listen(const std::string& addr, uint16_t port) {
  error_code ec;
  tcp::resolver resolver(io_);
  auto results = resolver.resolve(addr, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    return ddprun::Fail(
        fmt::format("cannot resolve cluster.master_addr \"{}\" on this node: {}", addr, ec.message()));
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  auto listener = std::make_unique<Listener>(io_);
  if (auto error = OpenListener(listener->acceptor, endpoint, fmt::format("{}:{}", addr, port))) {
    switch (error->kind) {
      case ListenError::Kind::kInUse:
        return ddprun::Fail(error->text +
                            "\nhint: stop that process, or pick another cluster.master_port "
                            "in the job file (on every node)");
      case ListenError::Kind::kNotHere:
        return ddprun::Fail(error->text +
                            "\nhint: node 0 must run on the host of cluster.master_addr; "
                            "check master_addr, and how this agent got node rank 0");
      case ListenError::Kind::kOther:
        return ddprun::Fail(error->text);
    }
  }
  listener_ = std::move(listener);
  StartAccept();
  return {};
}

void AsioTransport::StartAccept() {
  // Within the socket budget, the descriptors left are the reserve for workers and logs: make
  // room by closing the oldest connection that has not said what it is, or wait.
  if (SocketsInUse() >= limits_.max_sockets) {
    const std::string why = fmt::format(
        "{} connections are open, the most this agent keeps with "
        "RLIMIT_NOFILE {} (the rest is kept for workers and log files)",
        SocketsInUse(), CurrentNoFileLimit());
    if (!EvictOldestUnclassified()) {
      AcceptLater(why + "; not accepting more for now");
      return;
    }
    Warn(kWarnSockets, why + "; closing the oldest that has not said what it is");
  }
  listener_->acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !listener_ || !listener_->acceptor.is_open()) return;
    if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec == asio::error::no_buffer_space ||
        ec == asio::error::no_memory) {
      // Re-arming at once would fail again at once: a busy loop. The budget was too generous
      // (descriptors went elsewhere): lower it to what is open now, free some descriptors for
      // workers and logs, and try again later; the connection waits in the kernel's backlog.
      for (size_t i = 0; i < kEvictOnExhaustion && EvictOldestUnclassified(); ++i) {
      }
      limits_.max_sockets = std::max(SocketsInUse(), kMinSockets);
      AcceptLater(
          fmt::format("cannot accept connections on the master port: {} (RLIMIT_NOFILE {}); "
                      "keeping at most {} connections from now on",
                      ec.message(), CurrentNoFileLimit(), limits_.max_sockets));
      return;
    }
    accept_backoff_ = std::chrono::milliseconds(0);
    if (!ec) OnAccepted(std::move(socket));
    StartAccept();
  });
}

void AsioTransport::AcceptLater(const std::string& why) {
  Warn(kWarnAccept, why);
  accept_backoff_ = std::clamp(accept_backoff_ * 2, kAcceptBackoffMin, kAcceptBackoffMax);
  if (!accept_timer_) accept_timer_ = std::make_unique<asio::steady_timer>(io_);
  accept_timer_->expires_after(accept_backoff_);
  accept_timer_->async_wait([this](error_code ec) {
    if (ec || !listener_ || !listener_->acceptor.is_open()) return;
    StartAccept();
  });
}

void AsioTransport::OnAccepted(tcp::socket socket) {
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
    return;
  }
  // Agents say who they are at once; a flood of connections that do not must not crowd them
  // out, so the oldest silent one makes room.
  if (unclassified_.size() >= kMaxUnclassified) {
    Warn(kWarnUnclassified, fmt::format("more than {} connections to the master port have not said what "
                                        "they are; closing the oldest",
                                        kMaxUnclassified));
    EvictOldestUnclassified();
  }
  unclassified_[conn->id] = conn;
  Classify(conn, 0);
}

bool AsioTransport::EvictOldestUnclassified() {
  if (unclassified_.empty()) return false;
  const std::shared_ptr<Connection> oldest = unclassified_.begin()->second;  // outlives the erase
  DropUnclassified(oldest);
  return true;
}

void AsioTransport::DropUnclassified(const std::shared_ptr<Connection>& conn) {
  conn->closed = true;
  error_code ignored;
  conn->socket.close(ignored);
  conn->timer.cancel();
  const host::ConnId id = conn->id;
  unclassified_.erase(id);
}

size_t AsioTransport::SocketsInUse() const {
  // A relay holds two sockets (client and store); everything else one.
  return conns_.size() + unclassified_.size() + 2 * relays_.size() + (listener_ ? 1 : 0);
}

void AsioTransport::Warn(int kind, const std::string& text) {
  const auto now = std::chrono::steady_clock::now();
  auto it = last_warning_.find(kind);
  if (it != last_warning_.end() && now - it->second < kWarningInterval) return;
  last_warning_[kind] = now;
  if (on_warning_) on_warning_(text);
}

// The first bytes decide: the ddprun magic is an agent; anything else is a PyTorch store client
// for the relay. Both kinds speak first, so waiting for 4 bytes is enough; a peer that says
// nothing is dropped after kClassifyTimeout. Only those 4 bytes are read here, into a small
// buffer: a connection costs little until it has said what it is.
void AsioTransport::Classify(const std::shared_ptr<Connection>& conn, size_t have) {
  static constexpr uint8_t kMagic[4] = {'D', 'D', 'P', 'R'};
  if (have > 0 && std::memcmp(conn->hello.data(), kMagic, have) != 0) {
    unclassified_.erase(conn->id);
    conn->timer.cancel();
    StartRelay(conn, have);
    return;
  }
  if (have == conn->hello.size()) {
    unclassified_.erase(conn->id);
    conn->timer.cancel();
    conns_[conn->id] = conn;
    if (unproven_.size() >= kMaxUnproven) {
      Warn(kWarnUnproven, fmt::format("more than {} connections to the master port have not joined; closing "
                                      "the oldest",
                                      kMaxUnproven));
      const std::shared_ptr<Connection> oldest = unproven_.begin()->second;
      unproven_.erase(unproven_.begin());
      Fail(oldest, "dropped: too many connections that have not joined");
    }
    unproven_[conn->id] = conn;
    if (events_) events_->OnAccepted(conn->id, conn->peer);
    if (events_ && !conn->closed) {
      events_->OnData(conn->id, std::span<const uint8_t>(conn->hello.data(), have));
    }
    if (!conn->closed) StartRead(conn);
    return;
  }
  if (have == 0) {
    conn->timer.expires_after(kClassifyTimeout);
    conn->timer.async_wait([this, conn](error_code ec) {
      if (ec || conn->closed) return;
      DropUnclassified(conn);
    });
  }
  conn->socket.async_read_some(asio::buffer(conn->hello.data() + have, conn->hello.size() - have),
                               [this, conn, have](error_code ec, size_t n) {
                                 if (conn->closed) return;
                                 if (ec) {
                                   DropUnclassified(conn);
                                   return;
                                 }
                                 Classify(conn, have + n);
                               });
}

// A relayed store connection. Its buffers are small and allocated per relay; a relay is freed
// as soon as either side closes, and the number of relays is capped (Limits::max_relays), so
// memory stays bounded whatever connects.
struct AsioTransport::Relay {
  Relay(asio::io_context& io, tcp::socket from) : client(std::move(from)), upstream(io) {}
  uint64_t id = 0;
  uint64_t generation = 0;
  tcp::socket client;
  tcp::socket upstream;
  std::chrono::steady_clock::time_point give_up;
  std::vector<uint8_t> pending;   // from the client, not yet written to the store (bounded)
  std::vector<uint8_t> flushing;  // being written to the store
  std::vector<uint8_t> up_buffer = std::vector<uint8_t>(kRelayBufferBytes);
  std::vector<uint8_t> down_buffer;  // allocated once the store is connected
  bool upstream_connected = false;
  bool flushing_pending = false;
  bool client_reading = false;
  bool closed = false;
};

void AsioTransport::SetStoreRelay(uint16_t port) {
  relay_port_ = port;
  ++relay_generation_;
  // A new round has a new store: connections to the old one end with it.
  auto relays = std::move(relays_);
  relays_.clear();
  for (auto& [id, relay] : relays) CloseRelay(relay);
  waiting_relays_.clear();
  upstream_listening_ = false;
  probing_ = false;
  if (probe_timer_) probe_timer_->cancel();
}

void AsioTransport::CloseRelay(const std::shared_ptr<Relay>& relay) {
  if (relay->closed) return;
  relay->closed = true;
  error_code ignored;
  relay->client.close(ignored);
  relay->upstream.close(ignored);
  // The callers hold their own reference, so the relay outlives its entry here.
  const uint64_t id = relay->id;
  relays_.erase(id);
}

void AsioTransport::StartRelay(const std::shared_ptr<Connection>& conn, size_t have) {
  conn->closed = true;  // the Connection object is done; the relay owns the socket now
  error_code ignored;
  if (relay_port_ == 0) {
    conn->socket.close(ignored);
    return;
  }
  if (relays_.size() >= limits_.max_relays) {
    Warn(kWarnRelays, fmt::format("{} store connections are relayed already, the most this job needs "
                                  "({} per rank and some spare); closing new ones",
                                  relays_.size(), Limits::kRelaysPerRank));
    conn->socket.close(ignored);
    return;
  }
  auto relay = std::make_shared<Relay>(io_, std::move(conn->socket));
  relay->id = next_relay_id_++;
  relay->generation = relay_generation_;
  relay->give_up = std::chrono::steady_clock::now() + kRelayConnectLimit;
  relay->pending.assign(conn->hello.begin(), conn->hello.begin() + static_cast<std::ptrdiff_t>(have));
  relays_[relay->id] = relay;
  // The client is read from the start, so a client that leaves before the store listens frees
  // its relay at once.
  ReadClient(relay);
  if (upstream_listening_) {
    ConnectUpstream(relay);
  } else {
    // Relays that closed while waiting leave entries behind; drop them before they pile up.
    if (waiting_relays_.size() >= 2 * limits_.max_relays) {
      std::erase_if(waiting_relays_, [](const std::weak_ptr<Relay>& weak) { return weak.expired(); });
    }
    waiting_relays_.push_back(relay);
    ProbeUpstream();
  }
}

void AsioTransport::ReadClient(const std::shared_ptr<Relay>& relay) {
  if (relay->closed || relay->client_reading) return;
  const bool direct = relay->upstream_connected && !relay->flushing_pending;
  // Until the store takes bytes, at most kMaxPendingBytes wait here; then the client waits
  // (TCP flow control) instead of our memory growing.
  const size_t room = direct ? relay->up_buffer.size()
                             : std::min(relay->up_buffer.size(),
                                        kMaxPendingBytes - std::min(kMaxPendingBytes, relay->pending.size()));
  if (room == 0) return;
  relay->client_reading = true;
  relay->client.async_read_some(
      asio::buffer(relay->up_buffer.data(), room), [this, relay](error_code ec, size_t n) {
        relay->client_reading = false;
        if (relay->closed) return;
        if (ec) {
          CloseRelay(relay);
          return;
        }
        if (relay->upstream_connected && !relay->flushing_pending) {
          asio::async_write(relay->upstream, asio::buffer(relay->up_buffer.data(), n),
                            [this, relay](error_code wec, size_t) {
                              if (relay->closed) return;
                              if (wec) {
                                CloseRelay(relay);
                                return;
                              }
                              ReadClient(relay);
                            });
          return;
        }
        relay->pending.insert(relay->pending.end(), relay->up_buffer.begin(),
                              relay->up_buffer.begin() + static_cast<std::ptrdiff_t>(n));
        ReadClient(relay);
      });
}

void AsioTransport::FlushPending(const std::shared_ptr<Relay>& relay) {
  if (relay->closed) return;
  if (relay->pending.empty()) {
    relay->flushing_pending = false;
    ReadClient(relay);
    return;
  }
  relay->flushing_pending = true;
  relay->flushing = std::move(relay->pending);
  relay->pending.clear();
  asio::async_write(relay->upstream, asio::buffer(relay->flushing), [this, relay](error_code ec, size_t) {
    if (relay->closed) return;
    if (ec) {
      CloseRelay(relay);
      return;
    }
    relay->flushing.clear();
    FlushPending(relay);
  });
}

void AsioTransport::PumpDown(const std::shared_ptr<Relay>& relay) {
  relay->upstream.async_read_some(asio::buffer(relay->down_buffer), [this, relay](error_code ec, size_t n) {
    if (relay->closed) return;
    if (ec) {
      CloseRelay(relay);
      return;
    }
    asio::async_write(relay->client, asio::buffer(relay->down_buffer.data(), n),
                      [this, relay](error_code wec, size_t) {
                        if (relay->closed) return;
                        if (wec) {
                          CloseRelay(relay);
                          return;
                        }
                        PumpDown(relay);
                      });
  });
}

void AsioTransport::ConnectUpstream(const std::shared_ptr<Relay>& relay) {
  relay->upstream.async_connect(tcp::endpoint(asio::ip::address_v4::loopback(), relay_port_),
                                [this, relay](error_code ec) {
                                  if (relay->closed) return;
                                  if (ec) {
                                    // The round's store was listening and is gone: so is this
                                    // connection, as if it had reached the store directly.
                                    CloseRelay(relay);
                                    return;
                                  }
                                  error_code ignored;
                                  relay->upstream.set_option(tcp::no_delay(true), ignored);
                                  relay->upstream_connected = true;
                                  relay->down_buffer.resize(kRelayBufferBytes);
                                  FlushPending(relay);
                                  PumpDown(relay);
                                });
}

// Worker rank 0 may not listen yet: store clients start as fast as it does. One connect
// attempt at a time, every kRelayRetryInterval, stands for all waiting relays, so the cost of
// waiting does not grow with their number; once one succeeds, all of them connect.
void AsioTransport::ProbeUpstream() {
  if (probing_) return;
  const auto now = std::chrono::steady_clock::now();
  std::shared_ptr<Relay> probe;
  while (!waiting_relays_.empty()) {
    auto relay = waiting_relays_.front().lock();
    if (relay && !relay->closed && now >= relay->give_up) CloseRelay(relay);
    if (relay && !relay->closed) {
      probe = relay;
      break;
    }
    waiting_relays_.pop_front();
  }
  if (!probe) return;
  probing_ = true;
  const uint64_t generation = relay_generation_;
  probe->upstream.async_connect(tcp::endpoint(asio::ip::address_v4::loopback(), relay_port_),
                                [this, probe, generation](error_code ec) {
                                  if (generation != relay_generation_) return;  // a new round took over
                                  if (!ec && !probe->closed) {
                                    probing_ = false;
                                    upstream_listening_ = true;
                                    error_code ignored;
                                    probe->upstream.set_option(tcp::no_delay(true), ignored);
                                    probe->upstream_connected = true;
                                    probe->down_buffer.resize(kRelayBufferBytes);
                                    FlushPending(probe);
                                    PumpDown(probe);
                                    auto waiting = std::move(waiting_relays_);
                                    waiting_relays_.clear();
                                    for (auto& weak : waiting) {
                                      auto relay = weak.lock();
                                      if (relay && relay != probe && !relay->closed) ConnectUpstream(relay);
                                    }
                                    return;
                                  }
                                  error_code ignored;
                                  probe->upstream.close(ignored);
                                  if (!probe_timer_) probe_timer_ = std::make_unique<asio::steady_timer>(io_);
                                  probe_timer_->expires_after(kRelayRetryInterval);
                                  probe_timer_->async_wait([this, generation](error_code tec) {
                                    if (tec || generation != relay_generation_) return;
                                    probing_ = false;
                                    ProbeUpstream();
                                  });
                                });
}

host::ConnId AsioTransport::Connect(const std::string& addr, uint16_t port) {
  auto conn = std::make_shared<Connection>(io_, next_id_++);
  conn->trusted = true;  // ours: what it sends is the coordinator's, whom the agent authenticates
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
          const auto kind =
              conn->timed_out ? core::ConnectError::kTimedOut : core::ConnectError::kNameNotResolved;
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

void AsioTransport::Trust(host::ConnId id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  it->second->trusted = true;
  unproven_.erase(id);
}

void AsioTransport::StartRead(const std::shared_ptr<Connection>& conn) {
  const size_t wanted = conn->trusted ? kTrustedReadBytes : kUnprovenReadBytes;
  if (conn->read_buffer.size() != wanted) {
    conn->read_buffer.resize(wanted);
    conn->read_buffer.shrink_to_fit();
  }
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
    asio::post(io_, [this, conn] {
      if (!conn->closed) Fail(conn, "peer does not read its messages");
    });
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
  unproven_.erase(conn->id);
  if (events_) events_->OnClosed(conn->id, reason);
}

void AsioTransport::Close(host::ConnId id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  auto conn = it->second;
  conns_.erase(it);
  unproven_.erase(id);
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

}  // namespace ddprun::io
