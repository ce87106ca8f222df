#include "sim/network.h"

#include <algorithm>

#include <fmt/format.h>

#include "runner/core/wire.h"
#include "sim/node.h"
#include "sim/sim_log.h"

namespace ddprun::sim {

Network::Network(Handles handles, const JobSpec& spec, const NetworkOptions& options, uint64_t seed)
    : loop_(handles.loop),
      nodes_(handles.nodes),
      log_(handles.log),
      stats_(handles.stats),
      invariants_(handles.invariants),
      spec_(spec),
      options_(options),
      rng_(seed, 1),
      beat_seed_(Prng(seed, 9).Next()),
      beat_frame_(wire::Encode(wire::Heartbeat{})),
      job_nodes_(spec.cluster.Agents()) {
  conn_of_id_.push_back(0);  // ConnId 0 is never used
}

int64_t Network::LatencyFrom(Prng& rng) const {
  int64_t latency = rng.Between(options_.latency_min, options_.latency_max).count();
  if (rng.Chance(options_.loss)) latency += options_.retransmit.count();
  return latency;
}

int64_t Network::BeatLatency(uint64_t conn, int toward, int64_t k) const {
  uint64_t state = beat_seed_ + 2 * conn + static_cast<uint64_t>(toward);
  state = SplitMix64(state) ^ static_cast<uint64_t>(k);
  const uint64_t spread = SplitMix64(state);
  const uint64_t loss = SplitMix64(state);
  int64_t latency = options_.latency_min.count();
  if (options_.latency_max > options_.latency_min) {
    const auto span = static_cast<uint64_t>((options_.latency_max - options_.latency_min).count()) + 1;
    latency += static_cast<int64_t>(spread % span);
  }
  if (options_.loss > 0 && static_cast<double>(loss >> 11) * 0x1.0p-53 < options_.loss) {
    latency += options_.retransmit.count();
  }
  return latency;
}

bool Network::Cut(uint32_t a, uint32_t b) const {
  if (cuts_.empty() || a == b) return false;
  // Extra agents (duplicate node rank) share the network fate of no job node (spares do).
  if (a >= static_cast<uint32_t>(job_nodes_) || b >= static_cast<uint32_t>(job_nodes_)) return false;
  return cuts_.count({std::min(a, b), std::max(a, b)}) > 0;
}

std::pair<uint64_t, int> Network::Lookup(core::ConnId id) const {
  if (id == 0 || id >= conn_of_id_.size()) return {UINT64_MAX, 0};
  const uint64_t packed = conn_of_id_[id];
  return {packed >> 1, static_cast<int>(packed & 1)};
}

std::optional<uint32_t> Network::MachineOf(const std::string& addr) const {
  if (addr == spec_.cluster.master_addr) return 0;
  for (int agent = 0; agent < job_nodes_; ++agent) {
    if (spec_.cluster.HostOf(agent) == addr) return static_cast<uint32_t>(agent);
  }
  return std::nullopt;
}

Status Network::Listen(uint32_t index, const std::string& addr, uint16_t port) {
  // master_addr belongs to node 0's machine, a listed host to its agent's: an agent on any
  // other machine (a second agent claiming node rank 0) cannot bind it, as bind(2) answers
  // EADDRNOTAVAIL there.
  const auto machine = MachineOf(addr);
  if (machine && *machine != index) {
    return Fail(
        fmt::format("cannot listen on {}:{}: {} is not an address of this machine", addr, port, addr));
  }
  auto [it, inserted] = listeners_.emplace(std::make_pair(addr, port), index);
  if (!inserted && it->second != index) {
    return Fail(fmt::format("cannot listen on {}:{}: address already in use (by {}'s agent)", addr, port,
                            nodes_.Label(it->second)));
  }
  return {};
}

core::ConnId Network::Connect(uint32_t index, const std::string& addr, uint16_t port) {
  const uint64_t c = conns_.size();
  conns_.emplace_back();
  const core::ConnId id = next_conn_id_++;
  conn_of_id_.push_back(c << 1);
  Node& client = nodes_[index];
  conns_[c].side[0] = Side{index, client.incarnation, id, true};
  conns_of_node_[index].push_back(c);

  Event done;
  done.kind = EventKind::kConnectDone;
  done.node = index;
  done.target = c;
  const int64_t rtt = Latency() + Latency();
  // master_addr belongs to node 0's machine whether or not its agent listens yet.
  const auto machine = MachineOf(addr);
  const bool known = machine.has_value();
  const uint32_t server = machine.value_or(0);
  auto fail = [&](core::ConnectError error, std::string detail, int64_t after) {
    conns_[c].connect_ok = false;
    conns_[c].error = error;
    conns_[c].error_detail = std::move(detail);
    loop_.queue.Push(TimePoint(Duration(loop_.now_ns + after)), done);
    return id;
  };
  if (!known) return fail(core::ConnectError::kUnreachable, "No route to host", rtt);
  const bool blocked =
      port == spec_.cluster.master_port && server != index && port_blocked_until_ns_ > loop_.now_ns;
  const int64_t timeout = options_.connect_timeout.count();
  if (!nodes_[server].up || blocked || Cut(index, server)) {
    return fail(core::ConnectError::kTimedOut, "Connection timed out", timeout);
  }
  auto it = listeners_.find({addr, port});
  if (it == listeners_.end()) return fail(core::ConnectError::kRefused, "Connection refused", rtt);
  const uint32_t listener = it->second;
  const core::ConnId server_id = next_conn_id_++;
  conn_of_id_.push_back((c << 1) | 1);
  conns_[c].side[1] = Side{listener, nodes_[listener].incarnation, server_id, true};
  conns_[c].connect_ok = true;
  conns_of_node_[listener].push_back(c);
  // The listening side sees the connection after the SYN, the client after the SYN-ACK; bytes
  // the client sends afterwards arrive after the accept.
  const int64_t syn = rtt / 2;
  Event accept;
  accept.kind = EventKind::kAccept;
  accept.node = listener;
  accept.target = c;
  loop_.queue.Push(TimePoint(Duration(loop_.now_ns + syn)), accept);
  loop_.queue.Push(TimePoint(Duration(loop_.now_ns + rtt)), done);
  conns_[c].toward[0].last_ready_ns = loop_.now_ns + rtt;
  conns_[c].toward[1].last_ready_ns = loop_.now_ns + rtt;
  return id;
}

void Network::ConnectDone(uint64_t c) {
  Side& client = conns_[c].side[0];
  Node& n = nodes_[client.node];
  if (!n.up || n.incarnation != client.incarnation || !client.open) {
    // The client gave up (closed) or died before the handshake finished: the server's socket
    // hears a FIN (or nothing, if the client's machine is down).
    if (conns_[c].connect_ok && n.up && n.incarnation == client.incarnation) {
      Enqueue(c, 1, PacketKind::kFin, {});
    }
    return;
  }
  const core::ConnId id = client.id;
  if (!conns_[c].connect_ok) {
    client.open = false;
    if (n.tevents) n.tevents->OnConnectFailed(id, conns_[c].error, conns_[c].error_detail);
    return;
  }
  if (n.tevents) n.tevents->OnConnected(id);
}

void Network::Accept(uint64_t c) {
  const Side server = conns_[c].side[1];
  Node& n = nodes_[server.node];
  if (!n.up || n.incarnation != server.incarnation || !conns_[c].side[1].open) return;
  const bool listening = std::any_of(listeners_.begin(), listeners_.end(),
                                     [&](const auto& entry) { return entry.second == server.node; });
  if (!listening || n.finished) {
    conns_[c].side[1].open = false;
    Enqueue(c, 0, PacketKind::kRst, {});
    return;
  }
  const Side& client = conns_[c].side[0];
  const std::string peer = fmt::format("{}:{}", nodes_[client.node].addr, 32768 + (client.id % 28000));
  const SimLog::Subject subject(log_, client.node);
  if (n.tevents) n.tevents->OnAccepted(server.id, peer);
}

void Network::Send(uint32_t index, core::ConnId id, std::vector<uint8_t> bytes) {
  auto [c, side] = Lookup(id);
  if (c == UINT64_MAX || !conns_[c].side[side].open) return;
  ++stats_.messages;
  stats_.bytes += bytes.size();
  const Node& n = nodes_[index];
  if (!n.extra && n.rank < spec_.cluster.nnodes) ++stats_.messages_by_node[static_cast<size_t>(n.rank)];
  if (side == 1) ++stats_.coordinator_messages;
  Enqueue(c, 1 - side, PacketKind::kData, std::move(bytes));
}

void Network::Close(core::ConnId id) {
  auto [c, side] = Lookup(id);
  if (c == UINT64_MAX || !conns_[c].side[side].open) return;
  CloseSide(c, side, true);
}

void Network::CloseSide(uint64_t c, int side, bool send_fin) {
  conns_[c].side[side].open = false;
  // A connect still in flight has nobody to tell yet; ConnectDone sends the FIN.
  if (send_fin && (side == 1 || conns_[c].connect_ok)) Enqueue(c, 1 - side, PacketKind::kFin, {});
}

uint16_t Network::ReserveStorePort() {
  const uint16_t port = next_store_port_;
  next_store_port_ = next_store_port_ >= 60000 ? 40000 : static_cast<uint16_t>(next_store_port_ + 1);
  return port;
}

void Network::Enqueue(uint64_t c, int toward, PacketKind kind, std::vector<uint8_t> bytes) {
  Direction& dir = conns_[c].toward[toward];
  const bool beat = kind == PacketKind::kData && bytes == beat_frame_;
  const int64_t latency = beat ? BeatLatency(c, toward, dir.beats++) : Latency();
  const int64_t ready = std::max(loop_.now_ns + latency, dir.last_ready_ns);
  dir.last_ready_ns = ready;
  dir.queue.push_back(Packet{ready, kind, std::move(bytes)});
  if (!dir.pump_scheduled && !dir.blocked) SchedulePump(c, toward, ready);
}

void Network::SchedulePump(uint64_t c, int toward, int64_t at_ns) {
  Direction& dir = conns_[c].toward[toward];
  dir.pump_scheduled = true;
  Event event;
  event.kind = EventKind::kPump;
  event.node = conns_[c].side[toward].node;
  event.target = c;
  event.side = static_cast<uint8_t>(toward);
  loop_.queue.Push(TimePoint(Duration(std::max(at_ns, loop_.now_ns))), event);
}

void Network::Pump(uint64_t c, int toward) {
  conns_[c].toward[toward].pump_scheduled = false;
  for (;;) {
    // Callbacks below may add connections: index again every time, never keep references.
    Direction& dir = conns_[c].toward[toward];
    if (dir.Empty()) return;
    if (dir.Front().ready_ns > loop_.now_ns) {
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
    Node& n = nodes_[to.node];
    const bool alive = n.up && n.incarnation == to.incarnation;
    if (!alive || !to.open) {
      // A machine that is down says nothing; a live kernel without that socket answers RST.
      const bool kernel_answers = n.up && packet.kind == PacketKind::kData;
      if (kernel_answers && conns_[c].side[1 - toward].open) Enqueue(c, 1 - toward, PacketKind::kRst, {});
      continue;
    }
    host::TransportEvents* events = n.tevents;
    // What the coordinator says while it handles this node's bytes is about this node.
    const SimLog::Subject subject(log_, toward == 1 ? std::optional<uint32_t>(from.node) : std::nullopt);
    switch (packet.kind) {
      case PacketKind::kData:
        // Agents connect, the coordinator listens: bytes toward the connecting side renew
        // that agent's lease.
        if (toward == 0) invariants_.HeardFromCoordinator(to.node, loop_.now_ns);
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
    if (nodes_[to.node].hung_until_ns > loop_.now_ns) {
      if (!conns_[c].toward[toward].Empty()) SchedulePump(c, toward, nodes_[to.node].hung_until_ns);
      return;
    }
  }
}

std::optional<std::pair<uint64_t, int>> Network::SendsOn(core::ConnId id) const {
  const auto [c, side] = Lookup(id);
  if (c == UINT64_MAX || !conns_[c].side[side].open) return std::nullopt;
  return std::make_pair(c, 1 - side);
}

int64_t Network::OthersInFlightUntil(const std::vector<uint8_t>& frame) const {
  if (!cuts_.empty() || active_partitions_ > 0) return INT64_MAX;
  int64_t until = 0;
  for (const Connection& conn : conns_) {
    for (const Direction& dir : conn.toward) {
      if (dir.blocked) return INT64_MAX;
      for (size_t i = dir.head; i < dir.queue.size(); ++i) {
        if (dir.queue[i].kind != PacketKind::kData || dir.queue[i].bytes != frame) {
          until = std::max(until, dir.queue[i].ready_ns);
        }
      }
    }
  }
  return until;
}

bool Network::PlanBeats(const std::vector<BeatSender>& senders, int64_t period_ns, int64_t until_ns,
                        int64_t silence_ns, int64_t allowed_gap_ns, BeatPlan& plan) {
  // A direction with packets that no sender writes to would deliver (or answer) on its own in
  // the stretch: not quiet.
  size_t busy = 0;
  for (const Connection& conn : conns_)
    busy += static_cast<size_t>(!conn.toward[0].Empty()) + !conn.toward[1].Empty();
  for (const BeatDirection& d : plan.directions) busy -= !conns_[d.conn].toward[d.toward].Empty();
  if (busy != 0) return false;
  bool ok = true;
  const auto deliver = [&](BeatDirection& d, int64_t ready) {
    if (ready >= until_ns) {
      d.in_flight.push_back(ready);
      return;
    }
    // The receiver declares the link lost silence_ns after its last word: that must not come first.
    if (ready - d.heard_ns >= silence_ns) ok = false;
    if (d.delivered) {
      d.longest_gap_ns = std::max(d.longest_gap_ns, ready - d.heard_ns);
    } else {
      d.first_delivery_ns = ready;
    }
    d.heard_ns = ready;
    d.delivered = true;
  };
  // What is in flight already arrives first (TCP keeps the order).
  for (BeatDirection& d : plan.directions) {
    const Direction& dir = conns_[d.conn].toward[d.toward];
    d.last_ready_ns = dir.last_ready_ns;
    for (size_t i = dir.head; i < dir.queue.size(); ++i) deliver(d, dir.queue[i].ready_ns);
  }
  // When the slowest beat arrives before the fastest of the next period would, each beat
  // arrives its own latency after it is sent, whatever came before it, and two beats arrive at
  // most `widest` apart.
  const int64_t fastest = options_.latency_min.count();
  const int64_t slowest = std::max(options_.latency_min, options_.latency_max).count() +
                          (options_.loss > 0 ? options_.retransmit.count() : 0);
  const bool on_their_own = slowest <= period_ns + fastest;
  const int64_t widest = period_ns + slowest - fastest;
  const bool skip = on_their_own && widest <= allowed_gap_ns && widest < silence_ns;
  plan.sends_by_node.assign(nodes_.size(), 0);
  for (const BeatSender& sender : senders) {
    const int64_t count = sender.first_ns >= until_ns ? 0 : (until_ns - 1 - sender.first_ns) / period_ns + 1;
    const auto sent = [&](int64_t k) { return sender.first_ns + k * period_ns; };
    // The first beat that may still be on its way at until_ns; those before it arrive inside.
    int64_t late = count;
    while (late > 0 && sent(late - 1) + slowest >= until_ns) --late;
    for (uint32_t index : sender.directions) {
      BeatDirection& d = plan.directions[index];
      d.beats = count;
      const int64_t base = conns_[d.conn].toward[d.toward].beats;
      const auto beat = [&](int64_t k) {
        const int64_t ready = std::max(sent(k) + BeatLatency(d.conn, d.toward, base + k), d.last_ready_ns);
        d.last_ready_ns = ready;
        deliver(d, ready);
      };
      int64_t k = 0;
      // Beats that may queue behind what came before, one by one.
      while (k < count && !(on_their_own && d.last_ready_ns <= sent(k) + fastest)) beat(k++);
      if (skip && k + 2 < late) {
        // Beats k+1 .. late-2 arrive inside the stretch, each within `widest` of the one before:
        // draw beat k (the first word of this run of beats) and late-1 (the last before the end).
        beat(k);
        const int64_t ready = sent(late - 1) + BeatLatency(d.conn, d.toward, base + late - 1);
        d.longest_gap_ns = std::max(d.longest_gap_ns, widest);
        d.heard_ns = ready;
        d.last_ready_ns = ready;
        k = late;
      }
      while (k < count) beat(k++);
    }
    const uint64_t sends = static_cast<uint64_t>(count) * sender.directions.size();
    plan.sends += sends;
    if (sender.coordinator) plan.coordinator_sends += sends;
    plan.sends_by_node[sender.node] += sends;
  }
  // Nor may a receiver's loss deadline fall inside the stretch after its last word in it.
  for (const BeatDirection& d : plan.directions) {
    if (d.heard_ns + silence_ns <= until_ns) ok = false;
  }
  return ok;
}

void Network::CommitBeats(const BeatPlan& plan, const std::vector<uint8_t>& frame) {
  for (const BeatDirection& d : plan.directions) {
    Direction& dir = conns_[d.conn].toward[d.toward];
    dir.queue.clear();
    dir.head = 0;
    for (int64_t ready : d.in_flight) dir.queue.push_back(Packet{ready, PacketKind::kData, frame});
    dir.last_ready_ns = d.last_ready_ns;
    dir.beats += d.beats;
    if (!dir.Empty() && !dir.pump_scheduled) SchedulePump(d.conn, d.toward, dir.Front().ready_ns);
  }
  stats_.messages += plan.sends;
  stats_.bytes += plan.sends * frame.size();
  stats_.coordinator_messages += plan.coordinator_sends;
  for (uint32_t index = 0; index < plan.sends_by_node.size(); ++index) {
    const Node& n = nodes_[index];
    if (plan.sends_by_node[index] > 0 && !n.extra && n.rank < spec_.cluster.nnodes) {
      stats_.messages_by_node[static_cast<size_t>(n.rank)] += plan.sends_by_node[index];
    }
  }
}

void Network::HealPaths() {
  for (uint64_t c = 0; c < conns_.size(); ++c) {
    for (int toward = 0; toward < 2; ++toward) {
      Direction& dir = conns_[c].toward[toward];
      if (!dir.blocked) continue;
      if (Cut(conns_[c].side[0].node, conns_[c].side[1].node)) continue;
      dir.blocked = false;
      if (!dir.Empty() && !dir.pump_scheduled) SchedulePump(c, toward, loop_.now_ns + Latency());
    }
  }
}

void Network::DropListeners(uint32_t node) {
  for (auto it = listeners_.begin(); it != listeners_.end();) {
    it = it->second == node ? listeners_.erase(it) : std::next(it);
  }
}

void Network::Silence(uint32_t node) {
  const uint32_t incarnation = nodes_[node].incarnation;
  for (uint64_t c : conns_of_node_[node]) {
    for (Side& side : conns_[c].side) {
      if (side.node == node && side.incarnation == incarnation) side.open = false;
    }
  }
  conns_of_node_[node].clear();
  DropListeners(node);
}

void Network::Release(uint32_t node) {
  const uint32_t incarnation = nodes_[node].incarnation;
  for (uint64_t c : conns_of_node_[node]) {
    for (int s = 0; s < 2; ++s) {
      const Side& side = conns_[c].side[s];
      if (side.node == node && side.incarnation == incarnation && side.open) CloseSide(c, s, true);
    }
  }
  DropListeners(node);
}

void Network::Partition(int node, const std::vector<int>& peers, bool heal) {
  for (int p : peers) {
    const std::pair<uint32_t, uint32_t> pair{static_cast<uint32_t>(std::min(node, p)),
                                             static_cast<uint32_t>(std::max(node, p))};
    if (!heal) {
      ++cuts_[pair];
    } else if (auto it = cuts_.find(pair); it != cuts_.end() && --it->second == 0) {
      cuts_.erase(it);
    }
  }
  active_partitions_ += heal ? -1 : 1;
  if (heal) HealPaths();
}

void Network::BlockMasterPort(int64_t until_ns) {
  port_blocked_until_ns_ = std::max(port_blocked_until_ns_, until_ns);
}

}  // namespace ddprun::sim
