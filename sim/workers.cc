#include "sim/workers.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>

#include <fmt/format.h>

#include "runner/core/failure.h"
#include "sim/network.h"
#include "sim/node.h"
#include "sim/sim_log.h"

namespace ddprun::sim {
namespace {

// A worker that takes SIGTERM's default action (simulate.sigterm = "exits") is gone after this
// long: a bare Python process is reaped 1-2 ms after the signal (measured on the bed: 20 runs,
// median 1.0 ms, at most 1.7 ms); a training process also unmaps its memory and, with a GPU,
// releases its CUDA context, which the range allows for.
constexpr Duration kTermDelayMin = Millis(10);
constexpr Duration kTermDelayMax = Millis(500);
constexpr Duration kKillDelay = Millis(5);
// A store client that finds no store (rank 0 not up yet, the relay unreachable) tries again
// this often, for about PyTorch's default store timeout (5 minutes).
constexpr Duration kStoreRetry = Seconds(2);
constexpr int kStoreAttempts = 150;

// A batch of beacons per node at most this often: the Python module throttles its datagrams
// too, and a second is far below any hang timeout.
constexpr Duration kMinBeaconPeriod = Seconds(1);

std::string Env(const EnvList& env, std::string_view name) {
  for (const auto& [key, value] : env) {
    if (key == name) return value;
  }
  return "";
}

// A TCP port from its decimal text; 0 (no store to host or dial) for anything else.
uint16_t Port(const std::string& text) {
  if (text.empty() || text.size() > 5) return 0;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return 0;
    value = value * 10 + (c - '0');
  }
  return value < 65536 ? static_cast<uint16_t>(value) : 0;
}

// A positive count from its decimal text; 0 for anything else.
int Count(const std::string& text) {
  if (text.empty() || text.size() > 9) return 0;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return 0;
    value = value * 10 + (c - '0');
  }
  return value;
}

}  // namespace

Workers::Workers(Handles handles, StoreNetwork& store, Roles& roles, const TestHooks& hooks,
                 const JobSpec& spec, uint64_t seed)
    : loop_(handles.loop),
      nodes_(handles.nodes),
      log_(handles.log),
      stats_(handles.stats),
      invariants_(handles.invariants),
      store_(store),
      roles_(roles),
      hooks_(hooks),
      ignores_sigterm_(spec.SimulatedWorkersIgnoreSigterm()),
      spec_(spec),
      rng_(seed, 2),
      checkpoint_every_ns_(Ns(spec.simulate.checkpoint_every)),
      train_time_ns_(Ns(spec.simulate.train_time)),
      beacons_(spec.timeouts.DetectsHangs() ||
               std::any_of(spec.simulate.faults.begin(), spec.simulate.faults.end(),
                           [](const FaultSpec& f) { return f.kind == FaultKind::kWorkerSlow; })),
      watch_hangs_(spec.timeouts.DetectsHangs()),
      step_ns_(Ns(spec.simulate.step_time)),
      beacon_period_(std::max(spec.simulate.step_time, kMinBeaconPeriod)),
      beacon_rng_(seed, 5) {
  // Every agent's workers of one round at once, allocated once: growing by doubling would
  // hold the old and the new copy at the peak (26 MB each at 16,384 x 8).
  workers_.reserve(static_cast<size_t>(spec.cluster.Agents()) *
                   static_cast<size_t>(spec.cluster.nproc_per_node));
}

Workers::Gang* Workers::CurrentGang() {
  if (current_gang_ == 0) return nullptr;
  auto it = gangs_.find(current_gang_);
  return it == gangs_.end() ? nullptr : &it->second;
}

bool Workers::RoundStuckForGood() const {
  if (watch_hangs_) return false;  // timeouts.progress ends a hung round
  const Gang* g = CurrentGang();
  if (!g || g->broken || g->completed) return false;  // a failure's stop SIGKILLs hung ranks
  int running = 0;
  for (uint32_t wi : g->workers) {
    const Worker& w = workers_[wi];
    if (w.gang != g->id || !w.running) continue;
    if (!w.hung || !w.hung_for_good) return false;  // it will time out in a collective
    ++running;
  }
  return running > 0;
}

const Workers::Gang* Workers::CurrentGang() const {
  auto it = gangs_.find(current_gang_);
  return it == gangs_.end() ? nullptr : &it->second;
}

void Workers::Spawn(uint32_t index, int round, const core::WorkerLaunch& launch) {
  const Node& n = nodes_[index];
  const uint64_t coordinator = roles_.RoundEpochOf(index);
  Gang* g = CurrentGang();
  if (!g || g->coordinator != coordinator || g->round != round) {
    if (g) g->workers.clear();
    Gang fresh;
    fresh.id = next_gang_++;
    fresh.coordinator = coordinator;
    fresh.round = round;
    // The round's world as its first worker's environment gives it: fewer ranks than the job
    // when the round shrank (cluster.min_nodes). The invariants check that every rank agrees.
    const int world = Count(Env(launch.env, "WORLD_SIZE"));
    fresh.world = world > 0 ? world : world_;
    current_gang_ = fresh.id;
    gangs_.emplace(fresh.id, std::move(fresh));
    // Older gangs are only needed for their counts; keep the map small on long runs.
    while (gangs_.size() > 4) gangs_.erase(gangs_.begin());
    g = CurrentGang();
    ++stats_.rounds_started;
    log_.AddMark(Mark::kJob, MarkKind::kRestart, fmt::format("round {}", round));
  }
  uint32_t wi = 0;
  if (!free_workers_.empty()) {
    wi = free_workers_.back();
    free_workers_.pop_back();
  } else {
    wi = static_cast<uint32_t>(workers_.size());
    workers_.emplace_back();
  }
  Worker& w = workers_[wi];
  w = Worker{};
  w.node = index;
  w.incarnation = n.incarnation;
  w.gang = g->id;
  w.round = round;
  w.local_rank = launch.local_rank;
  w.global_rank = launch.global_rank;
  w.pid = next_pid_++;
  w.coordinator = g->coordinator;
  w.master_port = Port(Env(launch.env, "MASTER_PORT"));
  w.master_addr = Env(launch.env, "MASTER_ADDR");
  // The round resumes from the last checkpoint: its first step is the one after it.
  w.last_step = progress_ns_ / step_ns_;
  // A spare plays the node rank the coordinator gave it: its ranks are that node's (the agent
  // computed launch.global_rank from it); the cluster says when a rank changes hands.
  const std::string group_rank = Env(launch.env, "GROUP_RANK");
  roles_.NodePlays(index, group_rank.empty() || group_rank.size() > 6 ? -1 : std::atoi(group_rank.c_str()),
                   Count(Env(launch.env, "GROUP_WORLD_SIZE")));
  WorkerStart start{index,
                    RoundKey{g->coordinator, round},
                    g->world,
                    launch.global_rank,
                    launch.local_rank,
                    w.pid,
                    Env(launch.env, "RANK"),
                    Env(launch.env, "WORLD_SIZE"),
                    Env(launch.env, "GROUP_RANK")};
  hooks_.MisreportStart(index, n.spare, start);
  if (hooks_.SpawnsTwice(index, launch.local_rank)) {
    WorkerStart again = start;
    again.pid = next_pid_++;
    invariants_.WorkerStarted(std::move(again));
  }
  invariants_.WorkerStarted(std::move(start));
  PerNode& mine = per_node_[index];
  mine.running.push_back(wi);
  g->workers.push_back(wi);
  ++g->running;
  if (mine.ready_gang != g->id) {
    // The node's workers come up together (imports, CUDA init, data loaders, NCCL init).
    mine.ready_gang = g->id;
    const Duration startup = spec_.simulate.worker_startup;
    Event ready;
    ready.kind = EventKind::kWorkerReady;
    ready.node = index;
    ready.target = g->id;
    loop_.queue.Push(loop_.now() + rng_.Between(startup * 9 / 10, startup * 11 / 10), ready);
  }
  log_.SetPhase(index);
}

void Workers::Ready(uint32_t index, uint64_t gang) {
  auto it = gangs_.find(gang);
  if (!nodes_[index].up || it == gangs_.end()) return;
  std::vector<std::pair<uint32_t, uint64_t>> clients;
  for (uint32_t wi : per_node_[index].running) {
    Worker& w = workers_[wi];
    if (w.gang == gang && w.running && !w.ready) {
      w.ready = true;
      ++it->second.ready;
      // env:// init: rank 0 hosts the round's store, every other rank connects to it.
      if (w.global_rank == 0) {
        store_.OpenStore(index, w.master_port, RoundKey{w.coordinator, w.round}, w.pid);
      } else {
        clients.emplace_back(wi, w.pid);
      }
    }
  }
  if (!clients.empty()) {
    uint32_t group = 0;
    if (free_store_clients_.empty()) {
      group = static_cast<uint32_t>(store_clients_.size());
      store_clients_.emplace_back();
    } else {
      group = free_store_clients_.back();
      free_store_clients_.pop_back();
    }
    store_clients_[group] = std::move(clients);
    ScheduleStoreConnect(group, Duration(0));
  }
  // `import ddprun` ran during start-up: each worker says hello now, and beacons from here on.
  if (beacons_ && !per_node_[index].beacon_armed) ArmBeacons(index, Duration(0));
  UpdateTraining();
  log_.SetPhase(index);
}

void Workers::SignalAll(uint32_t index, int round, int signal) {
  const int64_t now = loop_.now_ns;
  for (uint32_t wi : per_node_[index].running) {
    Worker& w = workers_[wi];
    if (w.round != round || !w.running) continue;
    w.signalled = true;
    if (hooks_.IgnoresSignals(index)) continue;
    if (signal == SIGKILL) {
      Exit(wi, now + Ns(kKillDelay), 0, SIGKILL, "");
    } else if (w.hung) {
      w.term_pending = true;  // a hung process does not run its signal handlers
    } else if (ignores_sigterm_) {
      // Lightning's handler only sets a flag, read after a step that waits on the lost rank:
      // the worker stays until SIGKILL (a rank already past its last step exits by itself).
    } else {
      Exit(wi, now + Ns(rng_.Between(kTermDelayMin, kTermDelayMax)), 0, signal, "");
    }
  }
  log_.SetPhase(index);
}

int Workers::GuardianKill(uint32_t index) {
  const int64_t now = loop_.now_ns;
  int killed = 0;
  for (uint32_t wi : per_node_[index].running) {
    Worker& w = workers_[wi];
    if (!w.running) continue;
    w.signalled = true;
    if (hooks_.IgnoresSignals(index)) continue;
    Exit(wi, now + Ns(kKillDelay), 0, SIGKILL, "");
    ++killed;
  }
  log_.SetPhase(index);
  return killed;
}

void Workers::Exit(uint32_t wi, int64_t at_ns, int exit_code, int signal, std::string stderr_tail) {
  Worker& w = workers_[wi];
  if (!w.running || at_ns >= w.exit_at_ns) return;
  w.exit_at_ns = at_ns;
  ++w.exit_gen;
  w.exit_code = exit_code;
  w.signal = signal;
  w.stderr_tail = std::move(stderr_tail);
  Event event;
  event.kind = EventKind::kWorkerExit;
  event.node = w.node;
  event.target = wi;
  event.generation = w.exit_gen;
  loop_.queue.Push(TimePoint(Duration(at_ns)), event);
}

void Workers::ExitEvent(uint32_t wi, uint64_t generation) {
  if (wi < workers_.size() && workers_[wi].running && workers_[wi].exit_gen == generation) Exited(wi);
}

void Workers::Exited(uint32_t wi) {
  Worker& w = workers_[wi];
  w.running = false;
  auto& running = per_node_[w.node].running;
  running.erase(std::find(running.begin(), running.end(), wi));
  const bool ok = w.exit_code == 0 && w.signal == 0;
  invariants_.WorkerEnded(w.pid, ok);
  if (w.global_rank == 0) store_.CloseStore(w.node, w.master_port, w.pid);
  if (!ok && !w.signalled) ++stats_.worker_failures;
  auto it = gangs_.find(w.gang);
  if (it != gangs_.end()) {
    Gang& g = it->second;
    --g.running;
    if (w.ready) --g.ready;
    if (w.hung) --g.hung;
    if (!g.completed && !g.broken) {
      BreakGang(g, true,
                fmt::format("rank {} on {} {}", w.global_rank, nodes_.Label(w.node),
                            core::DescribeExit(w.exit_code, w.signal)));
    }
  }
  Notify(wi);
  UpdateTraining();
  log_.SetPhase(w.node);
}

void Workers::Notify(uint32_t wi) {
  Worker& w = workers_[wi];
  const Node& n = nodes_[w.node];
  if (!n.up || n.incarnation != w.incarnation || n.finished || !n.pevents) {
    free_workers_.push_back(wi);
    return;
  }
  if (n.Hung(loop_.now_ns)) {
    // The agent is stuck: it reaps the worker when it runs again.
    if (!n.hung_forever) {
      Event event;
      event.kind = EventKind::kWorkerNotify;
      event.node = w.node;
      event.target = wi;
      loop_.queue.Push(TimePoint(Duration(n.hung_until_ns)), event);
    }
    return;
  }
  core::WorkerExited exited;
  exited.round = w.round;
  exited.local_rank = w.local_rank;
  exited.exit_code = w.exit_code;
  exited.signal = w.signal;
  exited.stderr_tail = w.stderr_tail;
  free_workers_.push_back(wi);
  n.pevents->OnWorkerExited(exited);
}

bool Workers::Hittable(uint32_t index, int local_rank) const {
  const auto& running = per_node_[index].running;
  return std::any_of(running.begin(), running.end(), [&](uint32_t wi) {
    return workers_[wi].local_rank == local_rank && workers_[wi].running && !workers_[wi].signalled;
  });
}

void Workers::Fail(uint32_t index, int local_rank, int exit_code, const std::string& stderr_tail,
                   const std::string& what) {
  for (uint32_t wi : per_node_[index].running) {
    Worker& w = workers_[wi];
    if (w.local_rank != local_rank || !w.running) continue;
    log_.PrintSim(index, fmt::format("rank {} (local rank {}, pid {}) exits with code {} ({})", w.global_rank,
                                     local_rank, w.pid, exit_code, what));
    log_.AddMark(index, MarkKind::kFault, fmt::format("rank {} exits {}", w.global_rank, exit_code));
    Exit(wi, loop_.now_ns, exit_code, 0, stderr_tail);
    return;
  }
  log_.PrintSim(index, fmt::format("{} skipped: no worker with local rank {} is running", what, local_rank));
}

void Workers::Hang(uint32_t index, int local_rank, std::optional<Duration> duration,
                   const std::string& what) {
  for (uint32_t wi : per_node_[index].running) {
    Worker& w = workers_[wi];
    if (w.local_rank != local_rank || !w.running || w.hung) continue;
    w.hung = true;
    w.hung_for_good = !duration;
    ++stats_.worker_hangs;
    auto it = gangs_.find(w.gang);
    if (it != gangs_.end()) ++it->second.hung;
    log_.PrintSim(index,
                  fmt::format("rank {} (local rank {}, pid {}) hangs{}{}; it ignores SIGTERM", w.global_rank,
                              local_rank, w.pid, duration ? " for " + FormatDuration(*duration) : "",
                              what.empty() ? "" : " (" + what + ")"));
    log_.AddMark(index, MarkKind::kFault, fmt::format("rank {} hangs", w.global_rank),
                 duration ? loop_.now_ns + Ns(*duration) : -1);
    UpdateTraining();
    if (duration) {
      const uint64_t pid = w.pid;
      loop_.queue.PushCall(loop_.now() + *duration, [this, wi, pid] {
        Worker& v = workers_[wi];
        if (v.pid != pid || !v.running || !v.hung) return;
        v.hung = false;
        auto found = gangs_.find(v.gang);
        if (found != gangs_.end()) --found->second.hung;
        log_.PrintSim(v.node, fmt::format("rank {} (pid {}) runs again", v.global_rank, v.pid));
        if (v.term_pending && !ignores_sigterm_) {
          Exit(wi, loop_.now_ns + Ns(rng_.Between(kTermDelayMin, kTermDelayMax)), 0, SIGTERM, "");
        }
        UpdateTraining();
      });
    }
    return;
  }
  log_.PrintSim(index,
                fmt::format("worker-hang skipped: no worker with local rank {} is running", local_rank));
}

void Workers::Vanish(uint32_t index) {
  std::optional<uint64_t> hit_gang;
  for (uint32_t wi : per_node_[index].running) {
    Worker& w = workers_[wi];
    w.running = false;
    invariants_.WorkerEnded(w.pid, false);
    if (w.global_rank == 0) store_.CloseStore(w.node, w.master_port, w.pid);
    auto it = gangs_.find(w.gang);
    if (it != gangs_.end()) {
      Gang& g = it->second;
      --g.running;
      if (w.ready) --g.ready;
      if (w.hung) --g.hung;
      hit_gang = w.gang;
    }
    free_workers_.push_back(wi);
  }
  per_node_[index].running.clear();
  per_node_[index].ready_gang = 0;
  per_node_[index].beacon_armed = false;
  ++per_node_[index].beacon_gen;
  if (hit_gang) BreakGang(gangs_[*hit_gang], false, fmt::format("{} crashed", nodes_.Label(index)));
}

void Workers::ScheduleStoreConnect(uint32_t group, Duration after) {
  Event event;
  event.kind = EventKind::kStoreConnect;
  event.node = workers_[store_clients_[group].front().first].node;
  event.target = group;
  loop_.queue.Push(loop_.now() + after, event);
}

void Workers::StoreConnect(uint32_t group) {
  auto& clients = store_clients_[group];
  size_t again = 0;
  for (const auto& client : clients) {
    if (TryStore(client.first, client.second)) clients[again++] = client;
  }
  clients.resize(again);
  if (again > 0) {
    ScheduleStoreConnect(group, kStoreRetry);
  } else {
    free_store_clients_.push_back(group);
  }
}

bool Workers::TryStore(uint32_t wi, uint64_t pid) {
  if (wi >= workers_.size()) return false;
  Worker& w = workers_[wi];
  if (w.pid != pid || !w.running || w.signalled || w.hung) return false;
  const StoreNetwork::StoreReach reach = store_.ReachStore(w.node, w.master_addr, w.master_port, w.pid);
  if (reach.result == StoreNetwork::StoreReach::Result::kConnected) {
    ++stats_.store_clients;
    invariants_.StoreConnected(w.pid, RoundKey{w.coordinator, w.round}, reach.store, reach.store_port);
    return false;
  }
  return ++w.store_attempts < kStoreAttempts;
}

std::optional<NodePhase> Workers::PhaseOf(uint32_t index, int* round) const {
  const auto& running = per_node_[index].running;
  if (running.empty()) return std::nullopt;
  const Worker& w = workers_[running.front()];
  *round = w.round;
  const Gang* g = CurrentGang();
  const bool signalled =
      std::any_of(running.begin(), running.end(), [&](uint32_t wi) { return workers_[wi].signalled; });
  if (signalled) return NodePhase::kStopping;
  if (g && g->id == w.gang && g->training) return NodePhase::kTraining;
  return w.ready ? NodePhase::kStalled : NodePhase::kStarting;
}

void Workers::Finish() {
  Gang* g = CurrentGang();
  if (g && g->training) BankTraining(*g);
  stats_.useful_ns = std::min(progress_ns_, train_time_ns_);
}

}  // namespace ddprun::sim
