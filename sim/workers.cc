#include "sim/workers.h"

#include <algorithm>
#include <csignal>

#include <fmt/format.h>

#include "runner/core/failure.h"
#include "sim/cluster.h"

namespace ddprun::sim {
namespace {

// A worker that gets SIGTERM exits after this long (Python unwinds, the process group ends).
constexpr Duration kTermDelayMin = Millis(200);
constexpr Duration kTermDelayMax = Seconds(2);
constexpr Duration kKillDelay = Millis(5);
// Ranks notice that a peer process exited (its sockets close) after this long.
constexpr Duration kPeerFailureMin = Seconds(1);
constexpr Duration kPeerFailureMax = Seconds(5);
// Ranks of a finished round leave within this spread.
constexpr Duration kCompletionSpread = Seconds(2);
// A store client that finds no store (rank 0 not up yet, the relay unreachable) tries again
// this often, for about PyTorch's default store timeout (5 minutes).
constexpr Duration kStoreRetry = Seconds(2);
constexpr int kStoreAttempts = 150;

const std::string kPeerFailureText =
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process "
    "exited or there was a network error\nNCCL communicator was aborted on rank {}";
const std::string kWatchdogText =
    "[Rank {}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4711, "
    "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600000 milliseconds before timing out.";

int64_t Ns(Duration d) { return d.count(); }

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

}  // namespace

Workers::Workers(Cluster& cluster, const JobSpec& spec, uint64_t seed, SimOptions::Sabotage sabotage)
    : cluster_(cluster),
      spec_(spec),
      rng_(seed, 2),
      sabotage_(sabotage),
      checkpoint_every_ns_(Ns(spec.simulate.checkpoint_every)),
      train_time_ns_(Ns(spec.simulate.train_time)) {}

Workers::Gang* Workers::CurrentGang() {
  if (current_gang_ == 0) return nullptr;
  auto it = gangs_.find(current_gang_);
  return it == gangs_.end() ? nullptr : &it->second;
}

const Workers::Gang* Workers::CurrentGang() const {
  auto it = gangs_.find(current_gang_);
  return it == gangs_.end() ? nullptr : &it->second;
}

void Workers::Spawn(uint32_t index, int round, const core::WorkerLaunch& launch) {
  const Node& n = cluster_.node(index);
  const uint64_t coordinator = cluster_.coordinator_incarnation();
  Gang* g = CurrentGang();
  if (!g || g->coordinator != coordinator || g->round != round) {
    if (g) g->workers.clear();
    Gang fresh;
    fresh.id = next_gang_++;
    fresh.coordinator = coordinator;
    fresh.round = round;
    fresh.world = world_;
    current_gang_ = fresh.id;
    gangs_.emplace(fresh.id, std::move(fresh));
    // Older gangs are only needed for their counts; keep the map small on long runs.
    while (gangs_.size() > 4) gangs_.erase(gangs_.begin());
    g = CurrentGang();
    ++cluster_.stats().rounds_started;
    cluster_.AddMark(Mark::kJob, MarkKind::kRestart, fmt::format("round {}", round));
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
  WorkerStart start{index, RoundKey{g->coordinator, round}, world_, launch.global_rank, launch.local_rank,
                    w.pid, Env(launch.env, "RANK"), Env(launch.env, "WORLD_SIZE")};
  if (index == 1 && sabotage_ == SimOptions::Sabotage::kWrongWorldSize) {
    start.world_env = std::to_string(world_ + 1);
  }
  const bool twice = index == 1 && sabotage_ == SimOptions::Sabotage::kSpawnTwice && launch.local_rank == 0;
  if (twice) {
    WorkerStart again = start;
    again.pid = next_pid_++;
    cluster_.invariants().WorkerStarted(std::move(again));
  }
  cluster_.invariants().WorkerStarted(std::move(start));
  PerNode& mine = nodes_[index];
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
    cluster_.queue().Push(cluster_.now() + rng_.Between(startup * 9 / 10, startup * 11 / 10), ready);
  }
  cluster_.SetPhase(index);
}

void Workers::Ready(uint32_t index, uint64_t gang) {
  auto it = gangs_.find(gang);
  if (!cluster_.node(index).up || it == gangs_.end()) return;
  for (uint32_t wi : nodes_[index].running) {
    Worker& w = workers_[wi];
    if (w.gang == gang && w.running && !w.ready) {
      w.ready = true;
      ++it->second.ready;
      // env:// init: rank 0 hosts the round's store, every other rank connects to it.
      if (w.global_rank == 0) {
        cluster_.network().OpenStore(index, w.master_port, RoundKey{w.coordinator, w.round}, w.pid);
      } else {
        ScheduleStoreConnect(wi, Duration(0));
      }
    }
  }
  UpdateTraining();
  cluster_.SetPhase(index);
}

void Workers::SignalAll(uint32_t index, int round, int signal) {
  const int64_t now = cluster_.now_ns();
  for (uint32_t wi : nodes_[index].running) {
    Worker& w = workers_[wi];
    if (w.round != round || !w.running) continue;
    w.signalled = true;
    if (index == 1 && sabotage_ == SimOptions::Sabotage::kUnkillableWorkers) continue;
    if (signal == SIGKILL) {
      Exit(wi, now + Ns(kKillDelay), 0, SIGKILL, "");
    } else if (w.hung) {
      w.term_pending = true;  // a hung process does not run its signal handlers
    } else {
      Exit(wi, now + Ns(rng_.Between(kTermDelayMin, kTermDelayMax)), 0, signal, "");
    }
  }
  cluster_.SetPhase(index);
}

void Workers::SignalForStacks(uint32_t, int, const std::vector<std::pair<int, int>>&) {}

std::vector<std::string> Workers::ReadStacks(uint32_t, int) { return {}; }

int Workers::GuardianKill(uint32_t index) {
  const int64_t now = cluster_.now_ns();
  int killed = 0;
  for (uint32_t wi : nodes_[index].running) {
    Worker& w = workers_[wi];
    if (!w.running) continue;
    w.signalled = true;
    if (index == 1 && sabotage_ == SimOptions::Sabotage::kUnkillableWorkers) continue;
    Exit(wi, now + Ns(kKillDelay), 0, SIGKILL, "");
    ++killed;
  }
  cluster_.SetPhase(index);
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
  cluster_.queue().Push(TimePoint(Duration(at_ns)), event);
}

void Workers::ExitEvent(uint32_t wi, uint64_t generation) {
  if (wi < workers_.size() && workers_[wi].running && workers_[wi].exit_gen == generation) Exited(wi);
}

void Workers::Exited(uint32_t wi) {
  Worker& w = workers_[wi];
  w.running = false;
  auto& running = nodes_[w.node].running;
  running.erase(std::find(running.begin(), running.end(), wi));
  const bool ok = w.exit_code == 0 && w.signal == 0;
  cluster_.invariants().WorkerEnded(w.pid, ok);
  if (w.global_rank == 0) cluster_.network().CloseStore(w.node, w.master_port, w.pid);
  if (!ok && !w.signalled) ++cluster_.stats().worker_failures;
  auto it = gangs_.find(w.gang);
  if (it != gangs_.end()) {
    Gang& g = it->second;
    --g.running;
    if (w.ready) --g.ready;
    if (w.hung) --g.hung;
    if (!g.completed && !g.broken) {
      BreakGang(g, true, fmt::format("rank {} on {} {}", w.global_rank, cluster_.NodeLabel(w.node),
                                     core::DescribeExit(w.exit_code, w.signal)));
    }
  }
  Notify(wi);
  UpdateTraining();
  cluster_.SetPhase(w.node);
}

void Workers::Notify(uint32_t wi) {
  Worker& w = workers_[wi];
  const Node& n = cluster_.node(w.node);
  if (!n.up || n.incarnation != w.incarnation || n.finished || !n.pevents) {
    free_workers_.push_back(wi);
    return;
  }
  if (n.Hung(cluster_.now_ns())) {
    // The agent is stuck: it reaps the worker when it runs again.
    if (!n.hung_forever) {
      Event event;
      event.kind = EventKind::kWorkerNotify;
      event.node = w.node;
      event.target = wi;
      cluster_.queue().Push(TimePoint(Duration(n.hung_until_ns)), event);
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
  const auto& running = nodes_[index].running;
  return std::any_of(running.begin(), running.end(), [&](uint32_t wi) {
    return workers_[wi].local_rank == local_rank && workers_[wi].running && !workers_[wi].signalled;
  });
}

void Workers::Fail(uint32_t index, int local_rank, int exit_code, const std::string& stderr_tail,
                   const std::string& what) {
  for (uint32_t wi : nodes_[index].running) {
    Worker& w = workers_[wi];
    if (w.local_rank != local_rank || !w.running) continue;
    cluster_.PrintSim(index, fmt::format("rank {} (local rank {}, pid {}) exits with code {} ({})",
                                         w.global_rank, local_rank, w.pid, exit_code, what));
    cluster_.AddMark(index, MarkKind::kFault, fmt::format("rank {} exits {}", w.global_rank, exit_code));
    Exit(wi, cluster_.now_ns(), exit_code, 0, stderr_tail);
    return;
  }
  cluster_.PrintSim(index, fmt::format("{} skipped: no worker with local rank {} is running", what, local_rank));
}

void Workers::Hang(uint32_t index, int local_rank, std::optional<Duration> duration) {
  for (uint32_t wi : nodes_[index].running) {
    Worker& w = workers_[wi];
    if (w.local_rank != local_rank || !w.running || w.hung) continue;
    w.hung = true;
    auto it = gangs_.find(w.gang);
    if (it != gangs_.end()) ++it->second.hung;
    cluster_.PrintSim(index, fmt::format("rank {} (local rank {}, pid {}) hangs{}; it ignores SIGTERM",
                                         w.global_rank, local_rank, w.pid,
                                         duration ? " for " + FormatDuration(*duration) : ""));
    cluster_.AddMark(index, MarkKind::kFault, fmt::format("rank {} hangs", w.global_rank),
                     duration ? cluster_.now_ns() + Ns(*duration) : -1);
    UpdateTraining();
    if (duration) {
      const uint64_t pid = w.pid;
      cluster_.queue().PushCall(cluster_.now() + *duration, [this, wi, pid] {
        Worker& v = workers_[wi];
        if (v.pid != pid || !v.running || !v.hung) return;
        v.hung = false;
        auto found = gangs_.find(v.gang);
        if (found != gangs_.end()) --found->second.hung;
        cluster_.PrintSim(v.node, fmt::format("rank {} (pid {}) runs again", v.global_rank, v.pid));
        if (v.term_pending) {
          Exit(wi, cluster_.now_ns() + Ns(rng_.Between(kTermDelayMin, kTermDelayMax)), 0, SIGTERM, "");
        }
        UpdateTraining();
      });
    }
    return;
  }
  cluster_.PrintSim(index, fmt::format("worker-hang skipped: no worker with local rank {} is running", local_rank));
}

void Workers::Vanish(uint32_t index) {
  std::optional<uint64_t> hit_gang;
  for (uint32_t wi : nodes_[index].running) {
    Worker& w = workers_[wi];
    w.running = false;
    cluster_.invariants().WorkerEnded(w.pid, false);
    if (w.global_rank == 0) cluster_.network().CloseStore(w.node, w.master_port, w.pid);
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
  nodes_[index].running.clear();
  nodes_[index].ready_gang = 0;
  if (hit_gang) BreakGang(gangs_[*hit_gang], false, fmt::format("{} crashed", cluster_.NodeLabel(index)));
}

void Workers::StopTraining(Gang& g) {
  const int64_t now = cluster_.now_ns();
  g.training = false;
  ++g.done_gen;
  progress_ns_ += now - g.training_since_ns;
  cluster_.stats().training_ns += now - g.training_since_ns;
  Timeline* timeline = cluster_.timeline();
  if (timeline && !timeline->training.empty()) timeline->training.back().second = now;
}

void Workers::UpdateTraining() {
  Gang* g = CurrentGang();
  if (!g) return;
  const int64_t now = cluster_.now_ns();
  Timeline* timeline = cluster_.timeline();
  const bool stalled = g->hung > 0 || cluster_.network().partitioned();
  const bool active = !g->broken && !g->completed && g->running == g->world && g->ready == g->world && !stalled;
  if (active && !g->training) {
    g->training = true;
    g->training_since_ns = now;
    ++g->done_gen;
    Event done;
    done.kind = EventKind::kTrainingDone;
    done.target = g->id;
    done.generation = g->done_gen;
    cluster_.queue().Push(TimePoint(Duration(now + std::max<int64_t>(0, train_time_ns_ - progress_ns_))), done);
    if (!cluster_.stats().first_training_ns) cluster_.stats().first_training_ns = now;
    if (timeline) timeline->training.emplace_back(now, -1);
    cluster_.PrintSim(std::nullopt,
                      fmt::format("training: round {}: all {} ranks up; training from {} of {}", g->round,
                                  g->world, HumanDuration(Duration(progress_ns_)),
                                  HumanDuration(Duration(train_time_ns_))));
    cluster_.SetAllPhases();
  } else if (!active && g->training) {
    StopTraining(*g);
    if (!g->broken) {
      cluster_.PrintSim(std::nullopt, fmt::format("training: round {} stalls at {} ({})", g->round,
                                                  HumanDuration(Duration(progress_ns_)),
                                                  g->hung > 0 ? "a rank hangs" : "the network is partitioned"));
    }
    cluster_.SetAllPhases();
  }
  // The NCCL watchdog: a collective that makes no progress for its timeout kills the ranks.
  const bool watch = !g->completed && g->running > 0 && (stalled || (g->broken && !g->peers_notified));
  if (watch && !g->stall_timer) {
    g->stall_timer = true;
    ++g->stall_gen;
    Event timeout;
    timeout.kind = EventKind::kCollectiveTimeout;
    timeout.target = g->id;
    timeout.generation = g->stall_gen;
    cluster_.queue().Push(TimePoint(Duration(now + Ns(kCollectiveTimeout))), timeout);
  } else if (!watch && g->stall_timer) {
    g->stall_timer = false;
    ++g->stall_gen;
  }
}

void Workers::BreakGang(Gang& g, bool by_process_exit, const std::string& why) {
  if (g.broken || g.completed) return;
  if (g.training) StopTraining(g);
  g.broken = true;
  SimStats& stats = cluster_.stats();
  ++stats.interruptions;
  const int64_t kept = checkpoint_every_ns_ > 0 ? progress_ns_ / checkpoint_every_ns_ * checkpoint_every_ns_ : 0;
  const int64_t lost = progress_ns_ - kept;
  stats.lost_ns += lost;
  cluster_.PrintSim(std::nullopt,
                    fmt::format("training: round {} interrupted ({}): {} trained, last checkpoint at {}, "
                                "{} of work lost",
                                g.round, why, HumanDuration(Duration(progress_ns_)),
                                HumanDuration(Duration(kept)), HumanDuration(Duration(lost))));
  progress_ns_ = kept;
  cluster_.AddMark(Mark::kJob, MarkKind::kFailure, fmt::format("round {} interrupted: {}", g.round, why));
  if (by_process_exit) {
    // The other ranks' NCCL connections to the dead process close: they fail within seconds.
    g.peers_notified = true;
    uint32_t last = UINT32_MAX;
    for (uint32_t wi : g.workers) {
      const Worker& w = workers_[wi];
      if (w.gang != g.id || !w.running || w.node == last) continue;
      last = w.node;
      Event event;
      event.kind = EventKind::kPeerFailure;
      event.node = w.node;
      event.target = g.id;
      cluster_.queue().Push(cluster_.now() + rng_.Between(kPeerFailureMin, kPeerFailureMax), event);
    }
  }
  // Every failure must end with every worker of the round gone within a bound.
  cluster_.invariants().RoundFailed(RoundKey{g.coordinator, g.round});
  UpdateTraining();
}

void Workers::TrainingDone(uint64_t id, uint64_t done_gen) {
  auto it = gangs_.find(id);
  if (it == gangs_.end() || it->second.done_gen != done_gen || !it->second.training) return;
  Gang& g = it->second;
  const int64_t now = cluster_.now_ns();
  g.training = false;
  g.completed = true;
  job_completed_ = true;
  cluster_.stats().training_ns += now - g.training_since_ns;
  progress_ns_ = train_time_ns_;
  Timeline* timeline = cluster_.timeline();
  if (timeline && !timeline->training.empty()) timeline->training.back().second = now;
  cluster_.PrintSim(std::nullopt, fmt::format("training: round {} reached simulate.train_time = {}; every rank "
                                              "exits 0",
                                              g.round, HumanDuration(Duration(train_time_ns_))));
  uint32_t last = UINT32_MAX;
  int64_t at = now;
  for (uint32_t wi : g.workers) {
    const Worker& w = workers_[wi];
    if (w.gang != id || !w.running) continue;
    if (w.node != last) {
      last = w.node;
      at = now + Ns(rng_.Between(Duration(0), kCompletionSpread));
    }
    Exit(wi, at, 0, 0, "");
  }
  UpdateTraining();
}

void Workers::PeerFailure(uint32_t index, uint64_t id) {
  for (uint32_t wi : nodes_[index].running) {
    const Worker& w = workers_[wi];
    if (w.gang != id || !w.running || w.signalled || w.hung) continue;
    Exit(wi, cluster_.now_ns(), 1, 0, fmt::format(fmt::runtime(kPeerFailureText), w.global_rank));
  }
}

void Workers::CollectiveTimeout(uint64_t id, uint64_t stall_gen) {
  auto it = gangs_.find(id);
  if (it == gangs_.end() || it->second.stall_gen != stall_gen || !it->second.stall_timer) return;
  Gang& g = it->second;
  g.stall_timer = false;
  cluster_.PrintSim(std::nullopt, fmt::format("training: round {}: the NCCL watchdog times out after {}",
                                              g.round, HumanDuration(kCollectiveTimeout)));
  const std::vector<uint32_t> members = g.workers;
  for (uint32_t wi : members) {
    const Worker& w = workers_[wi];
    if (w.gang != id || !w.running || w.signalled || w.hung) continue;
    Exit(wi, cluster_.now_ns(), 1, 0, fmt::format(fmt::runtime(kWatchdogText), w.global_rank));
  }
}

void Workers::ScheduleStoreConnect(uint32_t wi, Duration after) {
  Event event;
  event.kind = EventKind::kStoreConnect;
  event.node = workers_[wi].node;
  event.target = wi;
  event.generation = workers_[wi].pid;
  cluster_.queue().Push(cluster_.now() + after, event);
}

void Workers::StoreConnect(uint32_t wi, uint64_t pid) {
  if (wi >= workers_.size()) return;
  Worker& w = workers_[wi];
  if (w.pid != pid || !w.running || w.signalled || w.hung) return;
  const Network::StoreReach reach = cluster_.network().ReachStore(w.node, w.master_port, w.pid);
  if (reach.result == Network::StoreReach::Result::kConnected) {
    ++cluster_.stats().store_clients;
    cluster_.invariants().StoreConnected(w.pid, RoundKey{w.coordinator, w.round}, reach.store, reach.store_port);
    return;
  }
  if (++w.store_attempts < kStoreAttempts) ScheduleStoreConnect(wi, kStoreRetry);
}

std::optional<NodePhase> Workers::PhaseOf(uint32_t index, int* round) const {
  const auto& running = nodes_[index].running;
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
  const Gang* g = CurrentGang();
  if (g && g->training) {
    const int64_t span = cluster_.now_ns() - g->training_since_ns;
    progress_ns_ += span;
    cluster_.stats().training_ns += span;
  }
  cluster_.stats().useful_ns = std::min(progress_ns_, train_time_ns_);
}

}  // namespace ddprun::sim
