// The simulated network: TCP-like connections between nodes. Reliable and in order per
// connection; loss costs a retransmission delay, a partition holds packets until it heals, a
// crashed host drops them silently, and a rebooted host (or a closed socket) answers with RST.
#include <algorithm>

#include <fmt/format.h>

#include "sim/cluster.h"

namespace ddprun::sim {

int64_t Cluster::Latency() {
  const NetworkOptions& net = options_.network;
  int64_t latency = net_rng_.Between(net.latency_min, net.latency_max).count();
  if (net_rng_.Chance(net.loss)) latency += net.retransmit.count();
  return latency;
}

bool Cluster::Cut(uint32_t a, uint32_t b) const {
  if (cuts_.empty() || a == b) return false;
  // Extra agents (duplicate node rank) share the network fate of no job node.
  if (a >= static_cast<uint32_t>(job_nodes_) || b >= static_cast<uint32_t>(job_nodes_)) return false;
  return cuts_.count({std::min(a, b), std::max(a, b)}) > 0;
}

std::pair<uint64_t, int> Cluster::Lookup(ConnId id) const {
  if (id == 0 || id >= conn_of_id_.size()) return {UINT64_MAX, 0};
  const uint64_t packed = conn_of_id_[id];
  return {packed >> 1, static_cast<int>(packed & 1)};
}

std::string Cluster::Listen(uint32_t index, const std::string& addr, uint16_t port) {
  auto [it, inserted] = listeners_.emplace(std::make_pair(addr, port), index);
  if (!inserted && it->second != index) {
    return fmt::format("cannot listen on {}:{}: address already in use (by {}'s agent)", addr, port,
                       NodeLabel(it->second));
  }
  return "";
}

ConnId Cluster::Connect(uint32_t index, const std::string& addr, uint16_t port) {
  const uint64_t c = conns_.size();
  conns_.emplace_back();
  const ConnId id = next_conn_id_++;
  conn_of_id_.push_back(c << 1);
  Node& client = *nodes_[index];
  conns_[c].side[0] = Side{index, client.incarnation, id, true};
  client.conns.push_back(c);

  Event done;
  done.kind = EventKind::kConnectDone;
  done.node = index;
  done.target = c;
  const int64_t rtt = Latency() + Latency();
  // master_addr belongs to node 0's machine whether or not its agent listens yet.
  const bool known = addr == spec_.cluster.master_addr;
  const uint32_t server = 0;
  auto fail = [&](core::ConnectError error, std::string detail, int64_t after) {
    conns_[c].connect_ok = false;
    conns_[c].error = error;
    conns_[c].error_detail = std::move(detail);
    queue_.Push(TimePoint(Duration(now_ns_ + after)), done);
    return id;
  };
  if (!known) return fail(core::ConnectError::kUnreachable, "No route to host", rtt);
  const bool blocked = port == spec_.cluster.master_port && server != index &&
                       (port_blocked_forever_ || port_blocked_until_ns_ > now_ns_);
  const int64_t timeout = options_.network.connect_timeout.count();
  if (!nodes_[server]->up || blocked || Cut(index, server)) {
    return fail(core::ConnectError::kTimedOut, "Connection timed out", timeout);
  }
  auto it = listeners_.find({addr, port});
  if (it == listeners_.end()) return fail(core::ConnectError::kRefused, "Connection refused", rtt);
  const uint32_t listener = it->second;
  const ConnId server_id = next_conn_id_++;
  conn_of_id_.push_back((c << 1) | 1);
  conns_[c].side[1] = Side{listener, nodes_[listener]->incarnation, server_id, true};
  conns_[c].connect_ok = true;
  nodes_[listener]->conns.push_back(c);
  // The listening side sees the connection after the SYN, the client after the SYN-ACK; bytes
  // the client sends afterwards arrive after the accept.
  const int64_t syn = rtt / 2;
  Event accept;
  accept.kind = EventKind::kAccept;
  accept.node = listener;
  accept.target = c;
  queue_.Push(TimePoint(Duration(now_ns_ + syn)), accept);
  queue_.Push(TimePoint(Duration(now_ns_ + rtt)), done);
  conns_[c].toward[0].last_ready_ns = now_ns_ + rtt;
  conns_[c].toward[1].last_ready_ns = now_ns_ + rtt;
  return id;
}

void Cluster::ConnectDone(uint64_t c) {
  Side& client = conns_[c].side[0];
  Node& n = *nodes_[client.node];
  if (!n.up || n.incarnation != client.incarnation || !client.open) {
    // The client gave up (closed) or died before the handshake finished: the server's socket
    // hears a FIN (or nothing, if the client's machine is down).
    if (conns_[c].connect_ok && n.up && n.incarnation == client.incarnation) {
      Enqueue(c, 1, PacketKind::kFin, {});
    }
    return;
  }
  const ConnId id = client.id;
  if (!conns_[c].connect_ok) {
    client.open = false;
    if (n.tevents) n.tevents->OnConnectFailed(id, conns_[c].error, conns_[c].error_detail);
    return;
  }
  if (n.tevents) n.tevents->OnConnected(id);
}

void Cluster::Accept(uint64_t c) {
  const Side server = conns_[c].side[1];
  Node& n = *nodes_[server.node];
  if (!n.up || n.incarnation != server.incarnation || !conns_[c].side[1].open) return;
  const bool listening = std::any_of(listeners_.begin(), listeners_.end(),
                                     [&](const auto& entry) { return entry.second == server.node; });
  if (!listening || n.finished) {
    conns_[c].side[1].open = false;
    Enqueue(c, 0, PacketKind::kRst, {});
    return;
  }
  const Side& client = conns_[c].side[0];
  const std::string peer = fmt::format("{}:{}", nodes_[client.node]->addr, 32768 + (client.id % 28000));
  const Subject subject(this, client.node);
  if (n.tevents) n.tevents->OnAccepted(server.id, peer);
}

void Cluster::Send(uint32_t index, ConnId id, std::vector<uint8_t> bytes) {
  auto [c, side] = Lookup(id);
  if (c == UINT64_MAX || !conns_[c].side[side].open) return;
  ++stats_.messages;
  stats_.bytes += bytes.size();
  const Node& n = *nodes_[index];
  if (!n.extra && n.rank < job_nodes_) ++stats_.messages_by_node[static_cast<size_t>(n.rank)];
  if (side == 1) ++stats_.coordinator_messages;
  Enqueue(c, 1 - side, PacketKind::kData, std::move(bytes));
}

void Cluster::Close(uint32_t index, ConnId id) {
  (void)index;
  auto [c, side] = Lookup(id);
  if (c == UINT64_MAX || !conns_[c].side[side].open) return;
  CloseSide(c, side, true);
}

void Cluster::CloseSide(uint64_t c, int side, bool send_fin) {
  conns_[c].side[side].open = false;
  // A connect still in flight has nobody to tell yet; ConnectDone sends the FIN.
  if (send_fin && (side == 1 || conns_[c].connect_ok)) Enqueue(c, 1 - side, PacketKind::kFin, {});
}

uint16_t Cluster::ReserveStorePort(uint32_t index) {
  (void)index;
  const uint16_t port = next_store_port_;
  next_store_port_ = next_store_port_ >= 60000 ? 40000 : static_cast<uint16_t>(next_store_port_ + 1);
  return port;
}

void Cluster::Enqueue(uint64_t c, int toward, PacketKind kind, std::vector<uint8_t> bytes) {
  Direction& dir = conns_[c].toward[toward];
  const int64_t ready = std::max(now_ns_ + Latency(), dir.last_ready_ns);
  dir.last_ready_ns = ready;
  dir.queue.push_back(Packet{ready, kind, std::move(bytes)});
  if (!dir.pump_scheduled && !dir.blocked) SchedulePump(c, toward, ready);
}

void Cluster::SchedulePump(uint64_t c, int toward, int64_t at_ns) {
  Direction& dir = conns_[c].toward[toward];
  dir.pump_scheduled = true;
  Event event;
  event.kind = EventKind::kPump;
  event.node = conns_[c].side[toward].node;
  event.target = c;
  event.side = static_cast<uint8_t>(toward);
  queue_.Push(TimePoint(Duration(std::max(at_ns, now_ns_))), event);
}

void Cluster::Pump(uint64_t c, int toward) {
  conns_[c].toward[toward].pump_scheduled = false;
  for (;;) {
    // Callbacks below may add connections: index again every time, never keep references.
    Direction& dir = conns_[c].toward[toward];
    if (dir.Empty()) return;
    if (dir.Front().ready_ns > now_ns_) {
      SchedulePump(c, toward, dir.Front().ready_ns);
      return;
    }
    const Side to = conns_[c].side[toward];
    const Side from = conns_[c].side[1 - toward];
    if (Cut(from.node, to.node)) {
      dir.blocked = true;  // TCP retransmits until the partition heals
      return;
    }
    Packet packet = std::move(dir.Front());
    dir.PopFront();
    Node& n = *nodes_[to.node];
    const bool alive = n.up && n.incarnation == to.incarnation;
    if (!alive || !to.open) {
      // A machine that is down says nothing; a live kernel without that socket answers RST.
      const bool kernel_answers = n.up && packet.kind == PacketKind::kData;
      if (kernel_answers && conns_[c].side[1 - toward].open) Enqueue(c, 1 - toward, PacketKind::kRst, {});
      continue;
    }
    host::TransportEvents* events = n.tevents;
    // What the coordinator says while it handles this node's bytes is about this node.
    const Subject subject(this, toward == 1 ? std::optional<uint32_t>(from.node) : std::nullopt);
    switch (packet.kind) {
      case PacketKind::kData:
        // Agents connect, the coordinator listens: bytes toward the connecting side renew
        // that agent's lease.
        if (toward == 0) invariants_.HeardFromCoordinator(to.node, now_ns_);
        if (events) events->OnData(to.id, packet.bytes);
        break;
      case PacketKind::kFin:
        conns_[c].side[toward].open = false;
        if (events) events->OnClosed(to.id, "connection closed by the peer");
        break;
      case PacketKind::kRst:
        conns_[c].side[toward].open = false;
        if (events) events->OnClosed(to.id, "connection reset by the peer");
        break;
    }
    // The receiver may now hang (it cannot: hangs start from fault events) or close; the
    // loop re-reads the state for every packet.
    if (nodes_[to.node]->hung_until_ns > now_ns_) {
      if (!conns_[c].toward[toward].Empty()) SchedulePump(c, toward, nodes_[to.node]->hung_until_ns);
      return;
    }
  }
}

void Cluster::HealPaths() {
  for (uint64_t c = 0; c < conns_.size(); ++c) {
    for (int toward = 0; toward < 2; ++toward) {
      Direction& dir = conns_[c].toward[toward];
      if (!dir.blocked) continue;
      if (Cut(conns_[c].side[0].node, conns_[c].side[1].node)) continue;
      dir.blocked = false;
      if (!dir.Empty() && !dir.pump_scheduled) SchedulePump(c, toward, now_ns_ + Latency());
    }
  }
}

}  // namespace ddprun::sim
