#pragma once
// The simulated network: TCP-like connections between nodes. Reliable and in order per
// connection; loss costs a retransmission delay, a partition holds packets until it heals, a
// crashed host drops them silently, and a rebooted host (or a closed socket) answers with RST.
// It reads the node table (up, incarnation, hung) and hands bytes to each node's transport
// events; the ports reach it through the Cluster, the workers through StoreNetwork. Internal
// to sim/.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/result.h"
#include "runner/core/events.h"
#include "schema/job_spec.h"
#include "sim/invariants.h"
#include "sim/parts.h"
#include "sim/prng.h"
#include "sim/simulation.h"

namespace ddprun::sim {

/// What the workers need of the network: PyTorch's store, which rank 0 hosts and the other
/// ranks reach through node 0's relay (store_relay.cc), and whether a partition stalls the
/// gang's collectives.
class StoreNetwork {
 public:
  virtual ~StoreNetwork() = default;
  /// A rank-0 worker of `round` on `node` listens on `port` (MASTER_PORT) for its store.
  virtual void OpenStore(uint32_t node, uint16_t port, RoundKey round, uint64_t pid) = 0;
  virtual void CloseStore(uint32_t node, uint16_t port, uint64_t pid) = 0;
  /// What a store client on `from` reaches when it connects to master_addr:`port` now.
  struct StoreReach {
    enum class Result : uint8_t { kConnected, kRetry } result = Result::kRetry;
    RoundKey store;  // the round whose store answered (kConnected)
    uint16_t store_port = 0;
    uint32_t relay = 0;  // the node whose relay carried it (or that hosts the store)
  };
  virtual StoreReach ReachStore(uint32_t from, const std::string& addr, uint16_t port,
                                uint64_t client_pid) = 0;
  /// Some partition is in force (the gang's collectives cannot make progress).
  virtual bool partitioned() const = 0;
};

class Network final : public StoreNetwork {
 public:
  Network(Handles handles, const JobSpec& spec, const NetworkOptions& options, uint64_t seed);

  // ---- the transport port (SimTransport) ----
  Status Listen(uint32_t node, const std::string& addr, uint16_t port);
  core::ConnId Connect(uint32_t node, const std::string& addr, uint16_t port);
  void Send(uint32_t node, core::ConnId conn, std::vector<uint8_t> bytes);
  void Close(core::ConnId conn);
  uint16_t ReserveStorePort();

  // ---- events (EventKind::kConnectDone, kAccept, kPump) ----
  void ConnectDone(uint64_t conn);
  void Accept(uint64_t conn);
  void Pump(uint64_t conn, int toward);

  // ---- nodes ----
  /// A crashed machine: its sockets go silent (no FIN, no RST) and its listeners are gone.
  void Silence(uint32_t node);
  /// An exited process: the kernel closes its sockets (FIN) and its listeners.
  void Release(uint32_t node);
  void AddNode() {
    conns_of_node_.emplace_back();
    relay_port_.push_back(0);
    relayed_.emplace_back();
  }

  // ---- the store relay (DESIGN.md section 5; modelled in store_relay.cc) ----
  /// Node `node`'s agent relays store clients on master_port to its own 127.0.0.1:`port` from
  /// now on (0: refuses them); the relayed connections of the previous round end.
  void SetStoreRelay(uint32_t node, uint16_t port);
  void OpenStore(uint32_t node, uint16_t port, RoundKey round, uint64_t pid) override;
  void CloseStore(uint32_t node, uint16_t port, uint64_t pid) override;
  StoreReach ReachStore(uint32_t from, const std::string& addr, uint16_t port, uint64_t client_pid) override;

  /// The machine (node index) an address belongs to: master_addr is node 0's, a host listed in
  /// [cluster] is its agent's (with etcd the coordinator listens on its own host); nullopt:
  /// no machine of the job.
  std::optional<uint32_t> MachineOf(const std::string& addr) const;
  /// Client connections the relays carried so far (ended ones included).
  uint64_t relayed_connections() const { return relayed_total_; }

  // ---- quiet stretches (sim/quiet.cc) ----
  /// One node's heartbeats in a quiet stretch: the first at `first_ns`, then one every period,
  /// each written to `directions` (indices into BeatPlan::directions) in that order: one for an
  /// agent, one per joined agent for the coordinator.
  struct BeatSender {
    int64_t first_ns = 0;
    uint32_t node = 0;
    bool coordinator = false;
    std::vector<uint32_t> directions;
  };
  /// What a direction (connection, toward) carried in the stretch; `heard_ns` starts as its
  /// receiver's last word.
  struct BeatDirection {
    uint64_t conn = 0;
    int toward = 0;
    int64_t heard_ns = 0;    // the last delivery before the stretch's end
    bool delivered = false;  // at least one in the stretch
    int64_t last_ready_ns = 0;
    int64_t beats = 0;               // heartbeats its sender sends in the stretch
    std::vector<int64_t> in_flight;  // deliveries at or after the end, in order
    int64_t first_delivery_ns = -1;  // the first in the stretch
    int64_t longest_gap_ns = 0;      // between two deliveries in the stretch
  };
  struct BeatPlan {
    std::vector<BeatDirection> directions;
    uint64_t sends = 0;
    uint64_t coordinator_sends = 0;
    std::vector<uint64_t> sends_by_node;  // indexed by node
  };
  /// (connection, toward) of the side `id` sends on; nullopt when it is not open.
  std::optional<std::pair<uint64_t, int>> SendsOn(core::ConnId id) const;
  /// 0 when nothing is in flight but `frame` (a heartbeat), no path is cut and none is held;
  /// otherwise when the other packets will have arrived (INT64_MAX: not before a fault heals).
  int64_t OthersInFlightUntil(const std::vector<uint8_t>& frame) const;
  /// Plays the heartbeats of `senders` sent before `until_ns`, after the packets already in
  /// flight (TCP keeps the order), with the latencies they would have drawn (BeatLatency).
  /// False when some receiver would go silent for `silence_ns` or more (then nothing changed);
  /// otherwise `plan` says what each direction delivered and what is still in flight, ready for
  /// CommitBeats. Beats that surely arrive inside the stretch, more than one period apart from
  /// its ends, are not drawn one by one when the gaps between them cannot exceed
  /// `allowed_gap_ns`: their direction's `longest_gap_ns` is then that bound.
  bool PlanBeats(const std::vector<BeatSender>& senders, int64_t period_ns, int64_t until_ns,
                 int64_t silence_ns, int64_t allowed_gap_ns, BeatPlan& plan);
  /// Makes the plan happen: each direction counts the heartbeats it carried, the packets still
  /// in flight wait in their directions, and the stats count them.
  void CommitBeats(const BeatPlan& plan, const std::vector<uint8_t>& frame);

  // ---- faults ----
  /// Cuts (or, with `heal`, restores) the paths between `node` and each of `peers`.
  void Partition(int node, const std::vector<int>& peers, bool heal);
  bool partitioned() const override { return active_partitions_ > 0; }
  /// New connections to master_port time out until `until_ns` (INT64_MAX: for good).
  void BlockMasterPort(int64_t until_ns);
  int64_t master_port_blocked_until() const { return port_blocked_until_ns_; }

 private:
  enum class PacketKind : uint8_t { kData, kFin, kRst };
  struct Packet {
    int64_t ready_ns = 0;
    PacketKind kind = PacketKind::kData;
    std::vector<uint8_t> bytes;
  };
  struct Side {
    uint32_t node = 0;
    uint32_t incarnation = 0;
    core::ConnId id = 0;
    bool open = false;  // the owning process still has the socket
  };
  /// Packets travelling toward one side, delivered in order (TCP).
  struct Direction {
    // A FIFO as a vector and a read position: empty costs no allocation (a std::deque
    // allocates a kilobyte up front, and there are two per connection).
    std::vector<Packet> queue;
    size_t head = 0;
    bool Empty() const { return head == queue.size(); }
    Packet& Front() { return queue[head]; }
    void PopFront() {
      if (++head == queue.size()) {
        queue.clear();
        head = 0;
      }
    }
    int64_t last_ready_ns = 0;
    int64_t beats = 0;  // heartbeat frames sent this way (BeatLatency's counter)
    bool pump_scheduled = false;
    bool blocked = false;  // held by a partition until it heals
  };
  struct Connection {
    Side side[2];         // 0: the connecting side, 1: the listening side
    Direction toward[2];  // toward[i]: packets for side[i]
    bool connect_ok = false;
    core::ConnectError error = core::ConnectError::kOther;
    std::string error_detail;
  };

  int64_t Latency() { return LatencyFrom(rng_); }
  int64_t LatencyFrom(Prng& rng) const;
  /// The latency of the `k`-th heartbeat on direction `toward` of connection `conn`: drawn from
  /// (seed, conn, toward, k) alone, so that a quiet stretch can draw the few beats that matter
  /// and skip the rest, and the run is the same either way (sim/quiet.cc).
  int64_t BeatLatency(uint64_t conn, int toward, int64_t k) const;
  bool Cut(uint32_t a, uint32_t b) const;
  void Enqueue(uint64_t conn, int toward, PacketKind kind, std::vector<uint8_t> bytes);
  void SchedulePump(uint64_t conn, int toward, int64_t at_ns);
  void HealPaths();
  std::pair<uint64_t, int> Lookup(core::ConnId id) const;
  void CloseSide(uint64_t conn, int side, bool send_fin);
  void DropListeners(uint32_t node);

  Loop& loop_;
  Nodes& nodes_;
  SimLog& log_;
  SimStats& stats_;
  Invariants& invariants_;
  const JobSpec& spec_;
  NetworkOptions options_;
  Prng rng_;
  uint64_t beat_seed_ = 0;           // BeatLatency's
  std::vector<uint8_t> beat_frame_;  // a heartbeat, as it goes on the wire
  int job_nodes_ = 0;
  std::map<std::pair<std::string, uint16_t>, uint32_t> listeners_;
  std::vector<Connection> conns_;
  std::vector<uint64_t> conn_of_id_;                  // ConnId -> (connection << 1) | side
  std::vector<std::vector<uint64_t>> conns_of_node_;  // per node: its connections
  core::ConnId next_conn_id_ = 1;
  std::map<std::pair<uint32_t, uint32_t>, int> cuts_;  // partitioned node pairs (a < b)
  int active_partitions_ = 0;
  int64_t port_blocked_until_ns_ = 0;
  uint16_t next_store_port_ = 40000;
  struct Store {
    RoundKey round;
    uint64_t pid = 0;
  };
  std::map<std::pair<uint32_t, uint16_t>, Store> stores_;  // (machine, port): a rank 0's store
  std::vector<uint16_t> relay_port_;                       // per node: 0 off
  std::vector<std::vector<uint64_t>> relayed_;             // per relay node: client pids carried
  uint64_t relayed_total_ = 0;
};

}  // namespace ddprun::sim
