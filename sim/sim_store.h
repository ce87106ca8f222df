#pragma once
// The job's etcd, modelled (rendezvous.backend = "etcd"): a 3-member cluster behind the
// host::Store port, in virtual time. One linearizable key-value store with a global revision,
// create and mod revisions, leases whose TTL runs out in virtual time (their keys go with them)
// and PutIf as the one transaction ports.h describes. Each agent has its own client handle
// (SimStoreClient); a request crosses the simulated network to the cluster and back, and is
// answered through the event queue, or with an error once the client's bound has passed.
//
// Faithful to etcd where ddprun depends on it: requests are applied one at a time in arrival
// order (linearizable); a write needs a quorum and a leader; a lease only expires while there is
// a leader, and a new leader renews every lease's remaining TTL (etcd's lease promotion); a TTL
// is whole seconds; a put attached to a lease that is gone fails. Simplified: members are not
// separate state machines (no log, no follower reads), a member that is down is skipped by the
// client at no cost, and watches are not modelled (ddprun does not use them). Internal to sim/.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runner/host/ports.h"
#include "schema/faults.h"
#include "schema/job_spec.h"
#include "sim/event_queue.h"
#include "sim/prng.h"
#include "sim/simulation.h"

namespace ddprun::sim {

class Cluster;

/// How long a client waits for an answer before it reports the request failed: the real
/// client's bound per call (runner/io/etcd_store).
inline constexpr Duration kStoreCallBound = Seconds(3);
/// The members of the modelled etcd cluster.
inline constexpr int kEtcdMembers = kSimulatedEtcdMembers;

class SimEtcd {
 public:
  /// What the model needs of the simulator (the Cluster; a test drives its own queue).
  struct Hooks {
    std::function<int64_t()> now_ns;
    /// An answer reaches `node`'s agent of `incarnation` (if it is still that one).
    std::function<void(uint32_t node, uint32_t incarnation, host::StoreResult result)> deliver;
    /// A "sim:" line (no node) or one on a node's behalf.
    std::function<void(std::optional<uint32_t> node, const std::string& text)> print;
  };
  SimEtcd(EventQueue& queue, Hooks hooks, const JobSpec& spec, const NetworkOptions& network, uint64_t seed,
          bool ignore_fencing);

  // ---- the client calls (SimStoreClient): each returns the id its answer carries ----
  struct GrantOp {
    Duration ttl{};
  };
  struct KeepAliveOp {
    int64_t lease = 0;
  };
  struct RevokeOp {
    int64_t lease = 0;
  };
  struct GetOp {
    std::string key;
  };
  struct PutIfOp {
    std::string key;
    int64_t create_revision = 0;
    std::vector<host::StorePut> puts;
  };
  using Op = std::variant<GrantOp, KeepAliveOp, RevokeOp, GetOp, PutIfOp>;
  /// Sends `op` from `node`'s agent (of `incarnation`); `id` is the client's id for it.
  void Request(uint32_t node, uint32_t incarnation, uint64_t id, Op op);

  // ---- faults (sim/faults.cc) ----
  /// Member `member` stops for `duration` (nullopt: for good).
  void MemberDown(int member, std::optional<Duration> duration);
  /// The leader is lost: an election of `duration` during which no request is served.
  void LeaderLost(Duration duration);
  /// `node`'s host cannot reach any member for `duration` (nullopt: for good).
  void Partition(uint32_t node, std::optional<Duration> duration);

  /// What the store holds under `key` now (tests and the invariants' reporting).
  std::optional<host::StoreEntry> Peek(const std::string& key) const;
  int64_t revision() const { return revision_; }
  /// The store serves requests now: a quorum of members and a leader.
  bool Available() const;

 private:
  struct Lease {
    Duration ttl{};
    int64_t expiry_ns = 0;
  };
  struct Pending {
    uint32_t node = 0;
    uint32_t incarnation = 0;
    uint64_t id = 0;
    Op op;
    int64_t deadline_ns = 0;
    bool waiting = false;  // arrived while the store could not serve it
  };

  int64_t Latency();
  void Arrive(uint64_t seq);
  void TryServe(uint64_t seq);
  host::StoreResult Apply(const Op& op);
  void Answer(uint64_t seq, host::StoreResult result);
  void Expire(uint64_t seq);
  /// Serves the requests that waited, in arrival order (the store became available again).
  void ServeWaiting();
  void DeleteLease(int64_t lease);
  void ScheduleExpiry(int64_t lease, int64_t at_ns);
  void CheckExpiry(int64_t lease);
  /// The members changed: lose the leader without a quorum, elect one when a quorum is back.
  void UpdateLeader();
  void BeginElection(Duration duration);
  std::string Unanswered() const;

  int64_t Now() const { return hooks_.now_ns(); }

  EventQueue& queue_;
  Hooks hooks_;
  const JobSpec& spec_;
  NetworkOptions network_;
  Prng rng_;
  bool ignore_fencing_ = false;
  std::map<std::string, host::StoreEntry> kv_;
  std::map<int64_t, Lease> leases_;
  int64_t revision_ = 1;
  int64_t next_lease_ = 0x694d0000;  // etcd's lease ids are opaque numbers
  std::vector<int> down_;            // per member: faults keeping it down
  bool has_leader_ = true;
  int leader_ = 0;  // the member that leads (while has_leader_)
  int64_t electing_until_ns_ = 0;
  std::vector<int> cut_;  // per node: partitions from etcd in force
  uint64_t next_seq_ = 1;
  std::map<uint64_t, Pending> pending_;  // by arrival order
};

/// One agent's etcd client: forwards to the model; answers go through the event queue.
class SimStoreClient final : public host::Store {
 public:
  SimStoreClient(Cluster* cluster, uint32_t node) : cluster_(cluster), node_(node) {}
  void SetEvents(host::StoreEvents* events) override { events_ = events; }
  uint64_t Grant(Duration ttl) override;
  uint64_t KeepAlive(int64_t lease) override;
  uint64_t Revoke(int64_t lease) override;
  uint64_t Get(const std::string& key) override;
  uint64_t PutIf(const std::string& key, int64_t create_revision, std::vector<host::StorePut> puts) override;
  host::StoreEvents* events() const { return events_; }

 private:
  uint64_t Send(SimEtcd::Op op);

  Cluster* cluster_;
  uint32_t node_;
  host::StoreEvents* events_ = nullptr;
  uint64_t next_id_ = 1;  // kept across the agent's restarts: an old answer never matches a new id
};

}  // namespace ddprun::sim
