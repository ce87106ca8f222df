#include "sim/sim_store.h"

#include <algorithm>

#include <fmt/format.h>

#include "sim/cluster.h"

namespace ddprun::sim {
namespace {

// A new leader is elected within this (etcd's election timeout, then a vote).
constexpr Duration kElectionMin = Seconds(1);
constexpr Duration kElectionMax = Seconds(2);
// etcd's smallest lease: shorter requests are lengthened to it.
constexpr Duration kMinTtl = Seconds(2);

}  // namespace

SimEtcd::SimEtcd(EventQueue& queue, Hooks hooks, const JobSpec& spec, const NetworkOptions& network,
                 uint64_t seed, bool ignore_fencing)
    : queue_(queue),
      hooks_(std::move(hooks)),
      spec_(spec),
      network_(network),
      rng_(seed, 7),
      ignore_fencing_(ignore_fencing),
      down_(kEtcdMembers, 0) {}

int64_t SimEtcd::Latency() {
  int64_t latency = rng_.Between(network_.latency_min, network_.latency_max).count();
  if (rng_.Chance(network_.loss)) latency += network_.retransmit.count();
  return latency;
}

bool SimEtcd::Available() const {
  const auto up = std::count(down_.begin(), down_.end(), 0);
  return up * 2 > kEtcdMembers && has_leader_ && Now() >= electing_until_ns_;
}

std::string SimEtcd::Unanswered() const {
  return fmt::format("no etcd endpoint answered within {} ({})", FormatDuration(kStoreCallBound),
                     fmt::join(spec_.rendezvous.endpoints, ", "));
}

void SimEtcd::Request(uint32_t node, uint32_t incarnation, uint64_t id, Op op) {
  if (cut_.size() <= node) cut_.resize(node + 1, 0);
  const uint64_t seq = next_seq_++;
  const int64_t deadline = Now() + Ns(kStoreCallBound);
  pending_.emplace(seq, Pending{node, incarnation, id, std::move(op), deadline, false});
  queue_.PushCall(TimePoint(Duration(Now() + Latency())), [this, seq] { Arrive(seq); });
  queue_.PushCall(TimePoint(Duration(deadline)), [this, seq] { Expire(seq); });
}

void SimEtcd::Arrive(uint64_t seq) {
  if (pending_.count(seq) == 0) return;  // the client gave up already
  TryServe(seq);
}

void SimEtcd::TryServe(uint64_t seq) {
  Pending& p = pending_.at(seq);
  // A host cut off from etcd: the request never arrives (the client retries each endpoint
  // until its bound). Without a quorum or a leader, the members hold it.
  if (!Available() || cut_[p.node] > 0) {
    p.waiting = true;
    return;
  }
  p.waiting = false;
  host::StoreResult result = Apply(p.op);
  result.id = p.id;
  queue_.PushCall(TimePoint(Duration(Now() + Latency())), [this, seq, result] { Answer(seq, result); });
}

host::StoreResult SimEtcd::Apply(const Op& op) {
  host::StoreResult result;
  const int64_t now = Now();
  if (const auto* grant = std::get_if<GrantOp>(&op)) {
    // TTLs are whole seconds, at least etcd's minimum.
    const auto seconds = std::chrono::ceil<std::chrono::seconds>(std::max(grant->ttl, kMinTtl));
    const Duration ttl = std::chrono::duration_cast<Duration>(seconds);
    const int64_t lease = next_lease_++;
    leases_[lease] = Lease{ttl, now + Ns(ttl)};
    ScheduleExpiry(lease, now + Ns(ttl));
    result.lease = lease;
    result.ttl = ttl;
  } else if (const auto* keep = std::get_if<KeepAliveOp>(&op)) {
    auto it = leases_.find(keep->lease);
    if (it != leases_.end()) {
      it->second.expiry_ns = now + Ns(it->second.ttl);
      ScheduleExpiry(keep->lease, it->second.expiry_ns);
      result.ttl = it->second.ttl;
    }
  } else if (const auto* revoke = std::get_if<RevokeOp>(&op)) {
    if (leases_.count(revoke->lease) == 0) {
      result.error = "etcdserver: requested lease not found";
    } else {
      DeleteLease(revoke->lease);
    }
  } else if (const auto* get = std::get_if<GetOp>(&op)) {
    if (auto it = kv_.find(get->key); it != kv_.end()) result.entry = it->second;
  } else if (const auto* put = std::get_if<PutIfOp>(&op)) {
    auto it = kv_.find(put->key);
    const int64_t current = it == kv_.end() ? 0 : it->second.create_revision;
    // The test knob (SimOptions::Sabotage::kStoreIgnoresFencing) makes every compare hold.
    if (current != put->create_revision && !ignore_fencing_) {
      if (it != kv_.end()) result.entry = it->second;
    } else {
      for (const host::StorePut& p : put->puts) {
        if (p.lease != 0 && leases_.count(p.lease) == 0) {
          result.error = "etcdserver: requested lease not found";
          result.revision = revision_;
          return result;
        }
      }
      ++revision_;
      for (const host::StorePut& p : put->puts) {
        host::StoreEntry& entry = kv_[p.key];
        if (entry.create_revision == 0) entry.create_revision = revision_;
        entry.mod_revision = revision_;
        entry.value = p.value;
        entry.lease = p.lease;
      }
      result.succeeded = true;
    }
  }
  result.revision = revision_;
  return result;
}

void SimEtcd::Answer(uint64_t seq, host::StoreResult result) {
  auto it = pending_.find(seq);
  if (it == pending_.end()) return;  // the client's bound passed first
  // An answer toward a host cut off from etcd is lost: the client's bound answers instead.
  if (cut_[it->second.node] > 0) return;
  const Pending p = std::move(it->second);
  pending_.erase(it);
  hooks_.deliver(p.node, p.incarnation, std::move(result));
}

void SimEtcd::Expire(uint64_t seq) {
  auto it = pending_.find(seq);
  if (it == pending_.end()) return;
  const Pending p = std::move(it->second);
  pending_.erase(it);
  host::StoreResult result;
  result.id = p.id;
  result.error = Unanswered();
  hooks_.deliver(p.node, p.incarnation, std::move(result));
}

void SimEtcd::ServeWaiting() {
  std::vector<uint64_t> waiting;
  for (const auto& [seq, p] : pending_) {
    if (p.waiting) waiting.push_back(seq);
  }
  for (uint64_t seq : waiting) {
    if (pending_.count(seq) != 0) TryServe(seq);
  }
}

void SimEtcd::DeleteLease(int64_t lease) {
  leases_.erase(lease);
  bool deleted = false;
  for (auto it = kv_.begin(); it != kv_.end();) {
    if (it->second.lease == lease) {
      it = kv_.erase(it);
      deleted = true;
    } else {
      ++it;
    }
  }
  if (deleted) ++revision_;
}

void SimEtcd::ScheduleExpiry(int64_t lease, int64_t at_ns) {
  queue_.PushCall(TimePoint(Duration(at_ns)), [this, lease] { CheckExpiry(lease); });
}

void SimEtcd::CheckExpiry(int64_t lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end() || it->second.expiry_ns > Now()) return;
  // Only a leader expires leases; the next one renews them all (BeginElection).
  if (!Available()) return;
  DeleteLease(lease);
}

void SimEtcd::BeginElection(Duration duration) {
  has_leader_ = true;
  electing_until_ns_ = std::max(electing_until_ns_, Now() + Ns(duration));
  const int64_t until = electing_until_ns_;
  queue_.PushCall(TimePoint(Duration(until)), [this, until] {
    if (electing_until_ns_ != until || !Available()) return;
    // The new leader starts every lease's TTL afresh (etcd's lease promotion).
    for (auto& [id, lease] : leases_) {
      lease.expiry_ns = Now() + Ns(lease.ttl);
      ScheduleExpiry(id, lease.expiry_ns);
    }
    hooks_.print(std::nullopt, "etcd: a leader is elected; requests are served again");
    ServeWaiting();
  });
}

void SimEtcd::UpdateLeader() {
  const auto up = std::count(down_.begin(), down_.end(), 0);
  if (up * 2 <= kEtcdMembers) {
    if (has_leader_) hooks_.print(std::nullopt, "etcd: no quorum; requests wait, then fail");
    has_leader_ = false;
    return;
  }
  if (has_leader_ && down_[static_cast<size_t>(leader_)] == 0) return;
  // No leader, or the leader went down: the members that are up elect the first of them.
  leader_ = static_cast<int>(std::find(down_.begin(), down_.end(), 0) - down_.begin());
  BeginElection(rng_.Between(kElectionMin, kElectionMax));
}

void SimEtcd::MemberDown(int member, std::optional<Duration> duration) {
  const auto m = static_cast<size_t>(member % kEtcdMembers);
  ++down_[m];
  const std::string endpoint = m < spec_.rendezvous.endpoints.size() ? spec_.rendezvous.endpoints[m] : "?";
  hooks_.print(std::nullopt, fmt::format("etcd: member {} ({}) is down{}", m, endpoint,
                                         duration ? " for " + FormatDuration(*duration) : ""));
  UpdateLeader();
  if (!duration) return;
  queue_.PushCall(TimePoint(Duration(Now() + Ns(*duration))), [this, m] {
    --down_[m];
    if (down_[m] == 0) hooks_.print(std::nullopt, fmt::format("etcd: member {} is back", m));
    UpdateLeader();
  });
}

void SimEtcd::LeaderLost(Duration duration) {
  hooks_.print(std::nullopt,
               fmt::format("etcd: the leader is lost; an election takes {}", FormatDuration(duration)));
  if (has_leader_) BeginElection(duration);
}

void SimEtcd::Partition(uint32_t node, std::optional<Duration> duration) {
  if (cut_.size() <= node) cut_.resize(node + 1, 0);
  ++cut_[node];
  hooks_.print(node, fmt::format("etcd: this host is cut off from etcd{}",
                                 duration ? " for " + FormatDuration(*duration) : ""));
  if (!duration) return;
  queue_.PushCall(TimePoint(Duration(Now() + Ns(*duration))), [this, node] {
    --cut_[node];
    if (cut_[node] == 0) hooks_.print(node, "etcd: this host reaches etcd again");
    ServeWaiting();
  });
}

std::optional<host::StoreEntry> SimEtcd::Peek(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  return it->second;
}

// ---- the client handle ---------------------------------------------------------------------

uint64_t SimStoreClient::Send(SimEtcd::Op op) {
  const uint64_t id = next_id_++;
  cluster_->etcd().Request(node_, cluster_->node(node_).incarnation, id, std::move(op));
  return id;
}

uint64_t SimStoreClient::Grant(Duration ttl) { return Send(SimEtcd::GrantOp{ttl}); }
uint64_t SimStoreClient::KeepAlive(int64_t lease) { return Send(SimEtcd::KeepAliveOp{lease}); }
uint64_t SimStoreClient::Revoke(int64_t lease) { return Send(SimEtcd::RevokeOp{lease}); }
uint64_t SimStoreClient::Get(const std::string& key) { return Send(SimEtcd::GetOp{key}); }
uint64_t SimStoreClient::PutIf(const std::string& key, int64_t create_revision,
                               std::vector<host::StorePut> puts) {
  return Send(SimEtcd::PutIfOp{key, create_revision, std::move(puts)});
}

}  // namespace ddprun::sim
