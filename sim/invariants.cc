#include "sim/invariants.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/assert.h"
#include "schema/duration.h"

namespace ddprun::sim {
namespace {

int ToInt(const std::string& text) {
  if (text.empty() || text.size() > 9) return -1;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return -1;
    value = value * 10 + (c - '0');
  }
  return value;
}

}  // namespace

Invariants::Invariants(InvariantBounds bounds, std::function<void(int64_t)> schedule_check)
    : bounds_(bounds), schedule_check_(std::move(schedule_check)) {}

void Invariants::AddNode(uint32_t node, std::string label, bool spare) {
  if (nodes_.size() <= node) nodes_.resize(node + 1);
  nodes_[node].label = std::move(label);
  nodes_[node].spare = spare;
}

// ---- observations ----------------------------------------------------------------------

void Invariants::WorkerStarted(WorkerStart start) {
  Observation o;
  o.kind = Kind::kStart;
  o.pid = starts_.size();
  starts_.push_back(std::move(start));
  log_.push_back(o);
}

void Invariants::WorkerEnded(uint64_t pid, bool exit_zero) {
  Observation o;
  o.kind = Kind::kEnd;
  o.pid = pid;
  o.flag = exit_zero;
  log_.push_back(o);
}

void Invariants::RoundFailed(RoundKey round) {
  Observation o;
  o.kind = Kind::kFailed;
  o.round = round;
  log_.push_back(o);
}

void Invariants::AgentExited(uint32_t node, int code, std::optional<RoundKey> round) {
  Observation o;
  o.kind = Kind::kExit;
  o.node = node;
  o.code = code;
  o.round = round;
  log_.push_back(o);
}

void Invariants::StoreConnected(uint64_t pid, RoundKey client, RoundKey store, uint16_t port) {
  Observation o;
  o.kind = Kind::kStore;
  o.pid = pid;
  o.round = client;
  o.other = store;
  o.code = port;
  log_.push_back(o);
}

void Invariants::AgentHung(uint32_t node, int64_t until_ns) {
  Node& n = nodes_[node];
  n.hung_until_ns = std::max(n.hung_until_ns, until_ns);
  if (until_ns != INT64_MAX) n.hang_end_ns = std::max(n.hang_end_ns, until_ns);
}

void Invariants::AgentGone(uint32_t node) {
  Node& n = nodes_[node];
  n.hung_until_ns = 0;
  n.hang_end_ns = -1;
}

void Invariants::HeardFromCoordinator(uint32_t node, int64_t now_ns) {
  Node& n = nodes_[node];
  if (now_ns - n.last_heard_ns > bounds_.cut_off.count()) n.reheard_ns = now_ns;
  n.last_heard_ns = now_ns;
}

void Invariants::HeardThroughout(uint32_t node, int64_t first_ns, int64_t last_ns, int64_t longest_gap_ns) {
  DDPRUN_ASSERT(!CutsOff(longest_gap_ns));
  HeardFromCoordinator(node, first_ns);
  nodes_[node].last_heard_ns = last_ns;
}

void Invariants::CoordinatorRestarts(int used) { restarts_ = used; }

void Invariants::CoordinatorStartedRound(uint64_t epoch, std::string label, RoundKey round) {
  Observation o;
  o.kind = Kind::kLeads;
  o.pid = epoch;
  o.round = round;
  o.node = static_cast<uint32_t>(labels_.size());
  labels_.push_back(std::move(label));
  log_.push_back(o);
}

// The job ends once: every coordinator that ends it (a new holder of an ended job tells the
// same verdict again) tells the same exit code. Checked at once: a verdict is not an event of
// the ledger.
void Invariants::CoordinatorEnded(int64_t now_ns, uint64_t launch, std::string label, int exit_code) {
  auto [it, inserted] = verdicts_.emplace(launch, std::make_pair(exit_code, label));
  if (inserted || it->second.first == exit_code) return;
  Fail(now_ns,
       fmt::format("the job ends once: the coordinator on {} ended it with exit code {}, the one on {} "
                   "with {}",
                   it->second.second, it->second.first, label, exit_code));
}

void Invariants::CoordinatorGone(uint64_t epoch) {
  Observation o;
  o.kind = Kind::kGone;
  o.pid = epoch;
  log_.push_back(o);
}

void Invariants::StepBeacon(uint64_t pid, int64_t now_ns) {
  if (!bounds_.hangs) return;
  auto it = workers_.find(pid);
  if (it == workers_.end()) return;
  Worker& w = it->second;
  if (w.last_step_ns >= 0) {
    longest_step_interval_ns_ = std::max(longest_step_interval_ns_, now_ns - w.last_step_ns);
  } else if (auto round = rounds_.find(w.round); round != rounds_.end()) {
    ++round->second.stepped;
  }
  w.last_step_ns = now_ns;
}

void Invariants::GangHung(RoundKey round, std::vector<int> hung) {
  Observation o;
  o.kind = Kind::kHung;
  o.round = round;
  o.pid = ranks_.size();
  ranks_.push_back(Ranks{std::move(hung), {}});
  log_.push_back(o);
}

void Invariants::GangResumed(RoundKey round) {
  Observation o;
  o.kind = Kind::kResumed;
  o.round = round;
  log_.push_back(o);
}

void Invariants::StacksTaken(RoundKey round, int global_rank, bool hung, bool training) {
  Observation o;
  o.kind = Kind::kStacks;
  o.round = round;
  o.code = global_rank;
  o.flag = hung;
  o.node = training ? 1 : 0;
  log_.push_back(o);
}

void Invariants::HangJudged(RoundKey round, std::vector<int> culprits, std::vector<int> with_stack) {
  Observation o;
  o.kind = Kind::kJudged;
  o.round = round;
  o.pid = ranks_.size();
  ranks_.push_back(Ranks{std::move(culprits), std::move(with_stack)});
  log_.push_back(o);
}

// ---- checks ----------------------------------------------------------------------------

void Invariants::Fail(int64_t now_ns, std::string what) {
  if (violation_) return;
  violation_ = fmt::format("{} (at {})", what, HumanDuration(Duration(now_ns)));
  what_ = std::move(what);
}

void Invariants::Schedule(int64_t at_ns) {
  if (schedule_check_) schedule_check_(at_ns);
}

void Invariants::AfterEvent(int64_t now_ns) {
  // Most events (a heartbeat, a packet) change nothing the checks read: millions per run at scale.
  if (log_.empty() && restarts_ == checked_restarts_ && now_ns < next_due_ns_) return;
  for (const Observation& o : log_) {
    if (violation_) break;
    switch (o.kind) {
      case Kind::kStart:
        CheckStart(now_ns, starts_[o.pid]);
        break;
      case Kind::kEnd:
        ApplyEnd(o.pid, o.flag);
        break;
      case Kind::kFailed: {
        Round& round = rounds_[*o.round];
        if (round.failed_ns) break;
        round.failed_ns = now_ns;
        round.stop_check_ns = now_ns + bounds_.stop_bound.count();
        Schedule(round.stop_check_ns);
        next_due_ns_ = std::min(next_due_ns_, round.stop_check_ns);
        break;
      }
      case Kind::kExit:
        CheckExit(now_ns, o.node, o.code, o.round);
        break;
      case Kind::kStore:
        CheckStore(now_ns, o);
        break;
      case Kind::kHung:
        if (bounds_.hangs) OnGangHung(now_ns, *o.round, std::move(ranks_[o.pid].first));
        break;
      case Kind::kResumed:
        if (auto it = rounds_.find(*o.round); it != rounds_.end()) it->second.hang_check_ns = -1;
        break;
      case Kind::kStacks:
        if (auto it = rounds_.find(*o.round); it != rounds_.end()) {
          (o.node == 1 ? it->second.trained_at_dump : it->second.stalled_at_dump) = true;
          auto& hung = it->second.hung_at_dump;
          if (o.flag && std::find(hung.begin(), hung.end(), o.code) == hung.end()) hung.push_back(o.code);
        }
        break;
      case Kind::kJudged:
        CheckJudgement(now_ns, *o.round, ranks_[o.pid]);
        break;
      case Kind::kLeads: {
        Coordinator& c = coordinators_[o.pid];
        c.label = labels_[o.node];
        CheckCoordinatorStart(now_ns, o.pid, *o.round);
        c.started = *o.round;
        break;
      }
      case Kind::kGone:
        coordinators_.erase(o.pid);
        break;
    }
  }
  log_.clear();
  labels_.clear();
  starts_.clear();
  ranks_.clear();
  checked_restarts_ = restarts_;
  if (!violation_ && restarts_ > bounds_.max_restarts) {
    Fail(now_ns, fmt::format("the coordinator used {} restarts; restart.max_restarts = {}", restarts_,
                             bounds_.max_restarts));
  }
  for (auto& [key, round] : rounds_) {
    if (violation_) break;
    if (round.stop_check_ns >= 0 && round.stop_check_ns <= now_ns) CheckStopBound(now_ns, key, round);
    if (!violation_ && round.hang_check_ns >= 0 && round.hang_check_ns <= now_ns) {
      CheckHangBound(now_ns, key, round);
    }
  }
  if (!violation_ && next_lease_check_ns_ <= now_ns) CheckLeases(now_ns);
  Prune();
  next_due_ns_ = next_lease_check_ns_;
  for (const auto& entry : rounds_) {
    if (entry.second.stop_check_ns >= 0) next_due_ns_ = std::min(next_due_ns_, entry.second.stop_check_ns);
    if (entry.second.hang_check_ns >= 0) next_due_ns_ = std::min(next_due_ns_, entry.second.hang_check_ns);
  }
}

void Invariants::CheckStart(int64_t now_ns, const WorkerStart& start) {
  Node& node = nodes_[start.node];
  const std::string& label = node.label;
  Round& round = rounds_[start.round];
  if (!latest_round_ || *latest_round_ < start.round) latest_round_ = start.round;
  if (round.world == 0) {
    round.world = start.world;
    round.started.assign(static_cast<size_t>(start.world), 0);
  }
  // The worker contract: every rank of a round agrees on the world size; ranks form a
  // permutation of 0..world-1.
  const int rank = ToInt(start.rank_env);
  if (ToInt(start.world_env) != round.world) {
    return Fail(now_ns, fmt::format("{} rank {}: WORLD_SIZE={} but the job has {} ranks", label,
                                    start.global_rank, start.world_env, round.world));
  }
  // The world size within its bounds: every round has nnodes x nproc_per_node ranks (a job
  // that may shrink lowers the bound).
  const int max_world = bounds_.max_world > 0 ? bounds_.max_world : bounds_.world;
  const int min_world = bounds_.min_world > 0 ? bounds_.min_world : max_world;
  if (round.world < min_world || round.world > max_world) {
    return Fail(now_ns, fmt::format("world size: round {} runs with WORLD_SIZE={} ({} rank {}); the job "
                                    "allows {}",
                                    start.round.round, round.world, label, start.global_rank,
                                    min_world == max_world ? std::to_string(max_world)
                                                           : fmt::format("{}..{}", min_world, max_world)));
  }
  if (rank < 0 || rank >= round.world || rank != start.global_rank) {
    return Fail(now_ns, fmt::format("{}: RANK={} is not a rank of a {}-rank job", label, start.rank_env,
                                    round.world));
  }
  // The node rank the agent plays: a spare takes a lost node's, never node 0's (node 0 hosts
  // the coordinator and rank 0's store).
  const int node_rank = ToInt(start.node_rank_env);
  if (node_rank < 0 || node_rank >= round.world) {
    return Fail(now_ns,
                fmt::format("{}: GROUP_RANK={} is not a node rank of the job", label, start.node_rank_env));
  }
  if (node.spare && node_rank == 0 && !rank_zero_anywhere_) {
    return Fail(now_ns, fmt::format("a spare never plays node rank 0: {} starts rank {} of round {} as "
                                    "node rank 0",
                                    label, rank, start.round.round));
  }
  // Fencing: one holder per rank. A rank is not started anywhere while an earlier holder (of
  // any round, on any node, lost or not) may still run.
  if (holders_.size() < static_cast<size_t>(round.world))
    holders_.resize(static_cast<size_t>(round.world), 0);
  uint64_t& holder = holders_[static_cast<size_t>(rank)];
  if (holder != 0) {
    const Worker& old = workers_.at(holder);
    return Fail(now_ns, fmt::format("one holder per rank: rank {} starts on {} in round {} while rank {} "
                                    "of round {} still runs on {} (pid {})",
                                    rank, label, start.round.round, rank, old.round.round,
                                    nodes_[old.node].label, old.pid));
  }
  // One holder per node rank: the workers of a node rank run on one agent at a time. A new
  // holder (a spare that took the rank, or the node that comes back for it) starts nothing
  // while any worker of the old holder may still run (fencing).
  if (node_holders_.size() <= static_cast<size_t>(node_rank))
    node_holders_.resize(static_cast<size_t>(node_rank) + 1);
  NodeRankHolder& owner = node_holders_[static_cast<size_t>(node_rank)];
  if (owner.live > 0 && owner.node != start.node) {
    if (owner.round == start.round) {
      return Fail(now_ns,
                  fmt::format("one holder per node rank: round {} runs node rank {} on both {} and {}",
                              start.round.round, node_rank, nodes_[owner.node].label, label));
    }
    return Fail(now_ns, fmt::format("fencing: {} starts node rank {} in round {} while {} worker(s) of {} "
                                    "that held it in round {} still run",
                                    label, node_rank, start.round.round, owner.live, nodes_[owner.node].label,
                                    owner.round.round));
  }
  // One round at a time: no worker of another round may still run anywhere.
  if (round.live == 0) {
    for (const auto& [key, other] : rounds_) {
      if (key == start.round || other.live == 0) continue;
      return Fail(now_ns, fmt::format("one round at a time: {} starts round {} while {} worker(s) of "
                                      "round {} still run",
                                      label, start.round.round, other.live, key.round));
    }
  }
  if (round.started[static_cast<size_t>(rank)] != 0) {
    return Fail(now_ns,
                fmt::format("round {}: rank {} started twice (again on {})", start.round.round, rank, label));
  }
  Admit(now_ns, start, rank, node_rank);
}

void Invariants::Admit(int64_t now_ns, const WorkerStart& start, int rank, int node_rank) {
  Node& node = nodes_[start.node];
  Round& round = rounds_[start.round];
  round.started[static_cast<size_t>(rank)] = 1;
  holders_[static_cast<size_t>(rank)] = start.pid;
  NodeRankHolder& owner = node_holders_[static_cast<size_t>(node_rank)];
  owner.node = start.node;
  owner.round = start.round;
  ++owner.live;
  workers_.emplace(start.pid, Worker{start.node, start.round, rank, start.pid, -1, node_rank});
  node.live.push_back(start.pid);
  ++round.live;
  round.pids.push_back(start.pid);
  // The lease starts with the order that started the worker.
  node.last_heard_ns = std::max(node.last_heard_ns, now_ns);
  const int64_t expiry = node.last_heard_ns + bounds_.lease.count();
  if (expiry < next_lease_check_ns_) {
    next_lease_check_ns_ = expiry;
    Schedule(expiry);
  }
  next_due_ns_ = std::min(next_due_ns_, next_lease_check_ns_);
}

void Invariants::ApplyEnd(uint64_t pid, bool exit_zero) {
  auto it = workers_.find(pid);
  if (it == workers_.end()) return;
  const Worker w = it->second;
  workers_.erase(it);
  uint64_t& holder = holders_[static_cast<size_t>(w.global_rank)];
  if (holder == pid) holder = 0;
  NodeRankHolder& owner = node_holders_[static_cast<size_t>(w.node_rank)];
  if (owner.node == w.node && owner.live > 0) --owner.live;
  auto& live = nodes_[w.node].live;
  live.erase(std::find(live.begin(), live.end(), pid));
  auto round = rounds_.find(w.round);
  if (round == rounds_.end()) return;
  --round->second.live;
  if (exit_zero) ++round->second.exited_zero;
}

void Invariants::CheckExit(int64_t now_ns, uint32_t index, int code, std::optional<RoundKey> key) {
  const Node& node = nodes_[index];
  // No worker outlives its agent (a crashed node's workers die with it).
  if (!node.live.empty()) {
    return Fail(now_ns, fmt::format("{}'s agent exited with {} worker(s) still running", node.label,
                                    node.live.size()));
  }
  // Success only if every rank of the job's last round exited 0. Not the agent's own last
  // round: a later one may have run without it (a waiting spare, a node left out of a smaller
  // round), and after node 0 rebooted its round number belongs to the previous coordinator.
  if (code != 0) return;
  if (latest_round_) key = latest_round_;
  const auto round = key ? rounds_.find(*key) : rounds_.end();
  const int done = round == rounds_.end() ? 0 : round->second.exited_zero;
  const int world = round == rounds_.end() ? bounds_.world : round->second.world;
  if (done != world) {
    Fail(now_ns, fmt::format("{} exited 0 but only {} of {} ranks of round {} exited 0", node.label, done,
                             world, key ? key->round : -1));
  }
}

void Invariants::CheckStore(int64_t now_ns, const Observation& o) {
  // The store relay: a round's clients reach that round's store, never an older or newer one
  // (stale keys, or a stale rank joining the new round's rendezvous).
  if (*o.round == o.other) return;
  auto it = workers_.find(o.pid);
  const std::string who = it == workers_.end() ? fmt::format("pid {}", o.pid)
                                               : fmt::format("rank {} on {} (pid {})", it->second.global_rank,
                                                             nodes_[it->second.node].label, o.pid);
  Fail(now_ns, fmt::format("store relay: {} of round {} reached the store of round {} (port {})", who,
                           o.round->round, o.other.round, o.code));
}

// Two coordinators never act at once (etcd, where any agent may hold the coordinator role and
// rounds and the budget go on across holders). Checked when a coordinator starts round R (its
// StartRounds go out, after etcd recorded R under the role's fence):
//   1. no other coordinator started R before (a round number is started by one coordinator);
//   2. no other coordinator that still exists, and so believes it leads, started R or a later
//      round: a deposed holder may linger (a hung agent, a host cut off from etcd) but never
//      acts again, and a new holder starts only rounds after every one the old one started;
//   3. no worker of a round another coordinator started still runs: a new holder starts once
//      its predecessor's workers are gone (TakeOver waits out their agents' lease).
// A coordinator counts as existing from when its agent takes the role until it steps down,
// crashes or exits; the simulator reads that after every event (Cluster::ObserveCoordinators).
void Invariants::CheckCoordinatorStart(int64_t now_ns, uint64_t epoch, const RoundKey& round) {
  const std::string& label = coordinators_[epoch].label;
  auto [it, inserted] = round_starters_.emplace(round, std::make_pair(epoch, label));
  if (!inserted && it->second.first != epoch) {
    return Fail(now_ns, fmt::format("two coordinators act at once: round {} was started by the coordinator "
                                    "on {} and again by the one on {}",
                                    round.round, it->second.second, label));
  }
  while (round_starters_.size() > 64) round_starters_.erase(round_starters_.begin());
  for (const auto& [other, c] : coordinators_) {
    // Another launch of the job (an agent that started after the end) is another job.
    if (other == epoch || !c.started || c.started->coordinator != round.coordinator ||
        c.started->round < round.round) {
      continue;
    }
    return Fail(now_ns, fmt::format("two coordinators act at once: the coordinator on {} starts round {} "
                                    "while the one on {}, which still holds its state, started round {}",
                                    label, round.round, c.label, c.started->round));
  }
  for (const auto& [key, r] : rounds_) {
    if (r.live == 0 || key == round) continue;
    auto starter = round_starters_.find(key);
    if (starter == round_starters_.end() || starter->second.first == epoch) continue;
    return Fail(now_ns, fmt::format("two coordinators act at once: the coordinator on {} starts round {} "
                                    "while {} worker(s) of round {}, which the one on {} started, still run",
                                    label, round.round, r.live, key.round, starter->second.second));
  }
}

int64_t Invariants::ResumedAt(const Node& node) const { return node.hang_end_ns; }

void Invariants::CheckStopBound(int64_t now_ns, const RoundKey& key, Round& round) {
  round.stop_check_ns = -1;
  if (round.live == 0) return;
  const int64_t bound = bounds_.stop_bound.count();
  int64_t recheck = 0;
  for (uint64_t pid : round.pids) {
    auto it = workers_.find(pid);
    if (it == workers_.end()) continue;
    const Worker& w = it->second;
    const Node& node = nodes_[w.node];
    // A hung agent cannot stop anything; the bound starts again when it resumes.
    if (node.hung_until_ns == INT64_MAX) continue;
    if (HungAt(node, now_ns)) {
      recheck = std::max(recheck, node.hung_until_ns + bound);
      continue;
    }
    // Cut off from the coordinator: the lease (CheckLeases) bounds its workers until it hears
    // again, and the bound starts again then.
    if (now_ns - node.last_heard_ns > bounds_.cut_off.count()) {
      recheck = std::max(recheck, node.last_heard_ns + bounds_.lease.count());
      continue;
    }
    const int64_t due = std::max({*round.failed_ns, ResumedAt(node), node.reheard_ns}) + bound;
    if (due > now_ns) {
      recheck = std::max(recheck, due);
      continue;
    }
    return Fail(now_ns, fmt::format("round {} failed {} ago but rank {} on {} (pid {}) still runs; every "
                                    "worker should be gone within {}",
                                    key.round, HumanDuration(Duration(now_ns - *round.failed_ns)),
                                    w.global_rank, node.label, w.pid, HumanDuration(bounds_.stop_bound)));
  }
  if (recheck > now_ns) {
    round.stop_check_ns = recheck;
    Schedule(recheck);
  }
}

void Invariants::CheckLeases(int64_t now_ns) {
  const int64_t lease = bounds_.lease.count();
  int64_t next = INT64_MAX;
  for (const Node& node : nodes_) {
    if (node.live.empty()) continue;
    // The lease runs from the last word the agent heard, whether it runs or not: one that
    // runs SIGKILLs its workers at the loss bound + stop_grace after it, and the guardian of
    // one that is hung (for good or not) does the same. A pause does not extend it.
    const int64_t from = node.last_heard_ns;
    const int64_t expiry = from + lease;
    if (expiry <= now_ns) {
      const Worker& w = workers_.at(node.live.front());
      return Fail(
          now_ns,
          fmt::format("rank {} on {} (pid {}) still runs {} after its agent last heard from "
                      "the coordinator{}; an agent (or the guardian of a hung one) stops its "
                      "workers within {}",
                      w.global_rank, node.label, w.pid, HumanDuration(Duration(now_ns - from)),
                      HungAt(node, now_ns) ? " (the agent is hung)" : "", HumanDuration(bounds_.lease)));
    }
    next = std::min(next, expiry);
  }
  next_lease_check_ns_ = next;
  if (next != INT64_MAX) Schedule(next);
}

// ---- hung ranks ---------------------------------------------------------------------------

int64_t Invariants::SilenceAllowed(const Round& round) const {
  const HangBounds& b = *bounds_.hangs;
  // The most silence an agent allows a rank (JobSpec::Timeouts, Agent::SilenceAllowed): the
  // timeout, or before a rank's first step also progress_start. "auto" learns at most factor x
  // the longest interval seen between two step beacons (this ledger's own, job-wide), and until
  // it has learnt, progress_start applies. The longest interval may still grow after the stall
  // (the last step reaches the agents when the gang stops): computed when checked.
  const int64_t start = b.progress_start.count();
  int64_t timeout = 0;
  if (b.progress) {
    timeout = b.progress->count();
  } else {
    timeout = std::max({start, b.auto_floor.count(), b.auto_factor * longest_step_interval_ns_});
  }
  const bool stepped = round.world > 0 && round.stepped >= round.world;
  return stepped ? timeout : std::max(timeout, start);
}

void Invariants::OnGangHung(int64_t now_ns, const RoundKey& key, std::vector<int> hung) {
  auto it = rounds_.find(key);
  if (it == rounds_.end()) return;
  Round& round = it->second;
  round.hung = std::move(hung);
  round.hung_since_ns = now_ns;
  round.hang_check_ns = now_ns + SilenceAllowed(round) + bounds_.hangs->after_silence.count();
  Schedule(round.hang_check_ns);
  next_due_ns_ = std::min(next_due_ns_, round.hang_check_ns);
}

void Invariants::CheckHangBound(int64_t now_ns, const RoundKey& key, Round& round) {
  round.hang_check_ns = -1;
  if (round.live == 0) return;
  const int64_t allowed = SilenceAllowed(round);
  const int64_t bound = allowed + bounds_.hangs->after_silence.count();
  // A hung agent neither sees the silence nor stops its workers, and node 0's (with etcd,
  // the holder's) runs the coordinator: the bound starts again when the last of them resumed. One that never
  // resumes is left to the lease checks (its guardian kills its workers; the others lose it).
  int64_t from = round.hung_since_ns;
  const Worker* late = nullptr;
  auto count_hang = [&](const Node& node) {
    if (node.hung_until_ns == INT64_MAX) return false;
    if (HungAt(node, now_ns)) {
      from = std::max(from, node.hung_until_ns);
    } else if (node.hang_end_ns > round.hung_since_ns) {
      from = std::max(from, node.hang_end_ns);
    }
    return true;
  };
  if (coordinator_node_ < nodes_.size() && !count_hang(nodes_[coordinator_node_])) return;
  for (uint64_t pid : round.pids) {
    auto it = workers_.find(pid);
    if (it == workers_.end()) continue;
    if (!count_hang(nodes_[it->second.node])) return;
    if (!late) late = &it->second;
  }
  if (!late) return;
  if (from + bound > now_ns) {
    round.hang_check_ns = from + bound;
    Schedule(round.hang_check_ns);
    return;
  }
  std::vector<std::string> hung;
  for (int rank : round.hung) hung.push_back(std::to_string(rank));
  Fail(now_ns,
       fmt::format("round {} stopped training {} ago because rank {} hung, but rank {} on {} (pid {}) "
                   "still runs; with timeouts.progress the round is stopped within {} (a "
                   "silence of {}, then the stacks, the stop and slack)",
                   key.round, HumanDuration(Duration(now_ns - round.hung_since_ns)), fmt::join(hung, ", "),
                   late->global_rank, nodes_[late->node].label, late->pid, HumanDuration(Duration(bound)),
                   HumanDuration(Duration(allowed))));
}

void Invariants::CheckJudgement(int64_t now_ns, const RoundKey& key, const Ranks& judged) {
  auto it = rounds_.find(key);
  if (it == rounds_.end()) return;
  const std::vector<int>& hung = it->second.hung_at_dump;
  auto is_hung = [&](int rank) { return std::find(hung.begin(), hung.end(), rank) != hung.end(); };
  // A verdict whose stacks were all taken while the round trained (no rank hung, nothing
  // stalled it) blames ranks that were working (issue 37: a rank stalled for 29 s of
  // timeouts.progress = 30s, recovered, and the ranks one step behind were called hung).
  if (hung.empty() && it->second.trained_at_dump && !it->second.stalled_at_dump) {
    std::vector<int> named = judged.first;
    std::sort(named.begin(), named.end());
    return Fail(now_ns,
                fmt::format("round {} was stopped as hung naming rank {}, but every rank was training when "
                            "the stacks were taken: none hung",
                            key.round, fmt::join(named, ", ")));
  }
  // Only a verdict that had a hung rank's stack can be held to naming it; without, the
  // coordinator names the rank first found silent, which may be any.
  const std::vector<int>& with_stack = judged.second;
  if (std::none_of(with_stack.begin(), with_stack.end(), is_hung)) return;
  for (int culprit : judged.first) {
    if (is_hung(culprit)) continue;
    std::vector<int> sorted = hung;
    std::sort(sorted.begin(), sorted.end());
    return Fail(now_ns,
                fmt::format("round {} was stopped as hung naming rank {}, which did not hang; rank {} "
                            "hung (its stack was taken)",
                            key.round, culprit, fmt::join(sorted, ", ")));
  }
}

void Invariants::Prune() {
  // Finished rounds are only needed for the exit-0 check of the latest ones; keep the map small
  // on long runs.
  while (rounds_.size() > 8) {
    auto oldest = rounds_.begin();
    if (oldest->second.live > 0 || oldest->second.stop_check_ns >= 0 || oldest->second.hang_check_ns >= 0)
      break;
    rounds_.erase(oldest);
  }
}

// ---- end of run ------------------------------------------------------------------------

void Invariants::AtEnd(int64_t now_ns, const RunEnd& end) {
  if (violation_) return;
  if (end.unfinished_count > 0) {
    const std::string who =
        fmt::format("{}{}", fmt::join(end.unfinished, ", "),
                    end.unfinished_count > 8 ? fmt::format(" and {} more", end.unfinished_count - 8) : "");
    if (end.stuck_for_good) return;  // nothing can end it: no end is owed
    if (end.deadlock) {
      return Fail(now_ns, fmt::format("hang: nothing left to happen but {} never finished", who));
    }
    if (end.liveness_limit) {
      return Fail(now_ns, fmt::format("hang: {} still running {} after the start, past the liveness bound "
                                      "(all faults healed; the restart budget bounds the rounds)",
                                      who, HumanDuration(Duration(end.limit_ns))));
    }
    return Fail(now_ns, fmt::format("hang: {} still running when simulate.max_time = {} was reached", who,
                                    FormatDuration(end.max_time)));
  }
  if (end.exit_code == 1 && end.restarts_used < bounds_.max_restarts && !end.ended_by_rule) {
    return Fail(now_ns, fmt::format("the job failed (exit 1) with restarts left ({} of {} used)",
                                    end.restarts_used, bounds_.max_restarts));
  }
  if (end.exit_code == 3 && !end.rendezvous_fault) {
    Fail(now_ns, "the rendezvous failed (exit 3) although no fault kept a node away long enough");
  }
}

}  // namespace ddprun::sim
