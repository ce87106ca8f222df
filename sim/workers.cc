// Simulated worker processes and the training model. DDP trains in lockstep, so progress is
// job-wide: a round trains only while every rank is up and nothing stalls it; the first rank
// to die breaks the gang, and progress since the last checkpoint is lost.
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

Cluster::Gang* Cluster::CurrentGang() {
  if (current_gang_ == 0) return nullptr;
  auto it = gangs_.find(current_gang_);
  return it == gangs_.end() ? nullptr : &it->second;
}

int64_t Cluster::Progress() const {
  auto it = gangs_.find(current_gang_);
  if (it != gangs_.end() && it->second.training) return progress_ns_ + now_ns_ - it->second.training_since_ns;
  return progress_ns_;
}

void Cluster::Spawn(uint32_t index, int round, const core::WorkerLaunch& launch) {
  Node& n = *nodes_[index];
  const int world = coordinator_world_;
  Gang* g = CurrentGang();
  if (!g || g->coordinator != coordinator_incarnation_ || g->round != round) {
    if (g) g->workers.clear();
    Gang fresh;
    fresh.id = next_gang_++;
    fresh.coordinator = coordinator_incarnation_;
    fresh.round = round;
    fresh.world = world;
    fresh.rank_state.assign(static_cast<size_t>(world), 0);
    current_gang_ = fresh.id;
    gangs_.emplace(fresh.id, std::move(fresh));
    // Older gangs are only needed for their counts; keep the map small on long runs.
    while (gangs_.size() > 4) gangs_.erase(gangs_.begin());
    g = CurrentGang();
    ++stats_.rounds_started;
    AddMark(Mark::kJob, MarkKind::kRestart, fmt::format("round {}", round));
  }
  const int rank = ToInt(Env(launch.env, "RANK"));
  if (rank >= 0 && rank < world) g->rank_state[static_cast<size_t>(rank)] = 1;
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
  invariants_.WorkerStarted(WorkerStart{index, RoundKey{g->coordinator, round}, world, launch.global_rank,
                                        launch.local_rank, w.pid, Env(launch.env, "RANK"),
                                        Env(launch.env, "WORLD_SIZE")});
  n.workers.push_back(wi);
  g->workers.push_back(wi);
  ++g->running;
  if (n.ready_gang != g->id) {
    // The node's workers come up together (imports, CUDA init, data loaders, NCCL init).
    n.ready_gang = g->id;
    const Duration startup = spec_.simulate.worker_startup;
    Event ready;
    ready.kind = EventKind::kWorkerReady;
    ready.node = index;
    ready.target = g->id;
    queue_.Push(now() + worker_rng_.Between(startup * 9 / 10, startup * 11 / 10), ready);
  }
  SetPhase(index);
}

void Cluster::WorkersReady(uint32_t index, uint64_t gang) {
  Node& n = *nodes_[index];
  auto it = gangs_.find(gang);
  if (!n.up || it == gangs_.end()) return;
  for (uint32_t wi : n.workers) {
    Worker& w = workers_[wi];
    if (w.gang == gang && w.running && !w.ready) {
      w.ready = true;
      ++it->second.ready;
    }
  }
  UpdateTraining();
  SetPhase(index);
}

void Cluster::SignalAll(uint32_t index, int round, int signal) {
  Node& n = *nodes_[index];
  for (uint32_t wi : n.workers) {
    Worker& w = workers_[wi];
    if (w.round != round || !w.running) continue;
    w.signalled = true;
    if (signal == SIGKILL) {
      Exit(wi, now_ns_ + Ns(kKillDelay), 0, SIGKILL, "");
    } else if (w.hung) {
      w.term_pending = true;  // a hung process does not run its signal handlers
    } else {
      Exit(wi, now_ns_ + Ns(worker_rng_.Between(kTermDelayMin, kTermDelayMax)), 0, signal, "");
    }
  }
  SetPhase(index);
}

void Cluster::Exit(uint32_t wi, int64_t at_ns, int exit_code, int signal, std::string stderr_tail) {
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
  queue_.Push(TimePoint(Duration(at_ns)), event);
}

void Cluster::WorkerExited(uint32_t wi) {
  Worker& w = workers_[wi];
  w.running = false;
  Node& n = *nodes_[w.node];
  n.workers.erase(std::find(n.workers.begin(), n.workers.end(), wi));
  const bool ok = w.exit_code == 0 && w.signal == 0;
  invariants_.WorkerEnded(w.pid, ok);
  if (!ok && !w.signalled) ++stats_.worker_failures;
  auto it = gangs_.find(w.gang);
  if (it != gangs_.end()) {
    Gang& g = it->second;
    --g.running;
    if (w.ready) --g.ready;
    if (w.hung) --g.hung;
    auto& state = g.rank_state[static_cast<size_t>(w.global_rank)];
    state = ok ? 2 : 3;
    if (ok) ++g.exited_zero;
    if (!g.completed && !g.broken) {
      BreakGang(g, true, fmt::format("rank {} on {} {}", w.global_rank, NodeLabel(w.node),
                                     core::DescribeExit(w.exit_code, w.signal)));
    }
  }
  NotifyExit(wi);
  UpdateTraining();
  SetPhase(w.node);
}

void Cluster::NotifyExit(uint32_t wi) {
  Worker& w = workers_[wi];
  Node& n = *nodes_[w.node];
  if (!n.up || n.incarnation != w.incarnation || n.finished || !n.pevents) {
    free_workers_.push_back(wi);
    return;
  }
  if (n.hung_until_ns > now_ns_) {
    // The agent is stuck: it reaps the worker when it runs again.
    if (!n.hung_forever) {
      Event event;
      event.kind = EventKind::kWorkerNotify;
      event.node = w.node;
      event.target = wi;
      queue_.Push(TimePoint(Duration(n.hung_until_ns)), event);
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

void Cluster::FailWorker(uint32_t index, int local_rank, int exit_code, const std::string& stderr_tail,
                         const std::string& what) {
  Node& n = *nodes_[index];
  for (uint32_t wi : n.workers) {
    Worker& w = workers_[wi];
    if (w.local_rank != local_rank || !w.running) continue;
    PrintSim(index, fmt::format("rank {} (local rank {}, pid {}) exits with code {} ({})",
                                w.global_rank, local_rank, w.pid, exit_code, what));
    AddMark(index, MarkKind::kFault, fmt::format("rank {} exits {}", w.global_rank, exit_code));
    Exit(wi, now_ns_, exit_code, 0, stderr_tail);
    return;
  }
  PrintSim(index, fmt::format("{} skipped: no worker with local rank {} is running", what, local_rank));
}

void Cluster::HangWorker(uint32_t index, int local_rank, std::optional<Duration> duration) {
  Node& n = *nodes_[index];
  for (uint32_t wi : n.workers) {
    Worker& w = workers_[wi];
    if (w.local_rank != local_rank || !w.running || w.hung) continue;
    w.hung = true;
    auto it = gangs_.find(w.gang);
    if (it != gangs_.end()) ++it->second.hung;
    PrintSim(index, fmt::format("rank {} (local rank {}, pid {}) hangs{}; it ignores SIGTERM",
                                w.global_rank, local_rank, w.pid,
                                duration ? " for " + FormatDuration(*duration) : ""));
    AddMark(index, MarkKind::kFault, fmt::format("rank {} hangs", w.global_rank),
            duration ? now_ns_ + Ns(*duration) : -1);
    UpdateTraining();
    if (duration) {
      const uint64_t pid = w.pid;
      queue_.PushCall(now() + *duration, [this, wi, pid] {
        Worker& v = workers_[wi];
        if (v.pid != pid || !v.running || !v.hung) return;
        v.hung = false;
        auto found = gangs_.find(v.gang);
        if (found != gangs_.end()) --found->second.hung;
        PrintSim(v.node, fmt::format("rank {} (pid {}) runs again", v.global_rank, v.pid));
        if (v.term_pending) {
          Exit(wi, now_ns_ + Ns(worker_rng_.Between(kTermDelayMin, kTermDelayMax)), 0, SIGTERM, "");
        }
        UpdateTraining();
      });
    }
    return;
  }
  PrintSim(index, fmt::format("worker-hang skipped: no worker with local rank {} is running", local_rank));
}

void Cluster::UpdateTraining() {
  Gang* g = CurrentGang();
  if (!g) return;
  const bool stalled = g->hung > 0 || active_partitions_ > 0;
  const bool active = !g->broken && !g->completed && g->running == g->world &&
                      g->ready == g->world && !stalled;
  if (active && !g->training) {
    g->training = true;
    g->training_since_ns = now_ns_;
    ++g->done_gen;
    Event done;
    done.kind = EventKind::kTrainingDone;
    done.target = g->id;
    done.generation = g->done_gen;
    queue_.Push(TimePoint(Duration(now_ns_ + std::max<int64_t>(0, train_time_ns_ - progress_ns_))), done);
    if (!stats_.first_training_ns) stats_.first_training_ns = now_ns_;
    if (timeline_) timeline_->training.emplace_back(now_ns_, -1);
    PrintSim(std::nullopt,
             fmt::format("training: round {}: all {} ranks up; training from {} of {}", g->round,
                         g->world, HumanDuration(Duration(progress_ns_)),
                         HumanDuration(Duration(train_time_ns_))));
    for (uint32_t i = 0; timeline_ && i < nodes_.size(); ++i) SetPhase(i);
  } else if (!active && g->training) {
    g->training = false;
    ++g->done_gen;
    progress_ns_ += now_ns_ - g->training_since_ns;
    stats_.training_ns += now_ns_ - g->training_since_ns;
    if (timeline_ && !timeline_->training.empty()) timeline_->training.back().second = now_ns_;
    if (!g->broken) {
      PrintSim(std::nullopt, fmt::format("training: round {} stalls at {} ({})", g->round,
                                         HumanDuration(Duration(progress_ns_)),
                                         g->hung > 0 ? "a rank hangs" : "the network is partitioned"));
    }
    for (uint32_t i = 0; timeline_ && i < nodes_.size(); ++i) SetPhase(i);
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
    queue_.Push(TimePoint(Duration(now_ns_ + Ns(kCollectiveTimeout))), timeout);
  } else if (!watch && g->stall_timer) {
    g->stall_timer = false;
    ++g->stall_gen;
  }
}

void Cluster::BreakGang(Gang& g, bool by_process_exit, const std::string& why) {
  if (g.broken || g.completed) return;
  if (g.training) {
    g.training = false;
    ++g.done_gen;
    progress_ns_ += now_ns_ - g.training_since_ns;
    stats_.training_ns += now_ns_ - g.training_since_ns;
    if (timeline_ && !timeline_->training.empty()) timeline_->training.back().second = now_ns_;
  }
  g.broken = true;
  g.broken_at_ns = now_ns_;
  ++stats_.interruptions;
  const int64_t kept = checkpoint_every_ns_ > 0 ? progress_ns_ / checkpoint_every_ns_ * checkpoint_every_ns_ : 0;
  const int64_t lost = progress_ns_ - kept;
  stats_.lost_ns += lost;
  PrintSim(std::nullopt,
           fmt::format("training: round {} interrupted ({}): {} trained, last checkpoint at {}, "
                       "{} of work lost",
                       g.round, why, HumanDuration(Duration(progress_ns_)), HumanDuration(Duration(kept)),
                       HumanDuration(Duration(lost))));
  progress_ns_ = kept;
  AddMark(Mark::kJob, MarkKind::kFailure, fmt::format("round {} interrupted: {}", g.round, why));
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
      queue_.Push(now() + worker_rng_.Between(kPeerFailureMin, kPeerFailureMax), event);
    }
  }
  // Every failure must end with every worker of the round gone within a bound.
  invariants_.RoundFailed(RoundKey{g.coordinator, g.round});
  UpdateTraining();
}

void Cluster::TrainingDone(uint64_t id, uint64_t done_gen) {
  auto it = gangs_.find(id);
  if (it == gangs_.end() || it->second.done_gen != done_gen || !it->second.training) return;
  Gang& g = it->second;
  g.training = false;
  g.completed = true;
  job_completed_ = true;
  stats_.training_ns += now_ns_ - g.training_since_ns;
  progress_ns_ = train_time_ns_;
  if (timeline_ && !timeline_->training.empty()) timeline_->training.back().second = now_ns_;
  PrintSim(std::nullopt, fmt::format("training: round {} reached simulate.train_time = {}; every rank "
                                     "exits 0",
                                     g.round, HumanDuration(Duration(train_time_ns_))));
  uint32_t last = UINT32_MAX;
  int64_t at = now_ns_;
  for (uint32_t wi : g.workers) {
    const Worker& w = workers_[wi];
    if (w.gang != id || !w.running) continue;
    if (w.node != last) {
      last = w.node;
      at = now_ns_ + Ns(worker_rng_.Between(Duration(0), kCompletionSpread));
    }
    Exit(wi, at, 0, 0, "");
  }
  UpdateTraining();
}

void Cluster::PeerFailure(uint32_t index, uint64_t id) {
  Node& n = *nodes_[index];
  for (uint32_t wi : n.workers) {
    const Worker& w = workers_[wi];
    if (w.gang != id || !w.running || w.signalled || w.hung) continue;
    Exit(wi, now_ns_, 1, 0, fmt::format(fmt::runtime(kPeerFailureText), w.global_rank));
  }
}

void Cluster::CollectiveTimeout(uint64_t id, uint64_t stall_gen) {
  auto it = gangs_.find(id);
  if (it == gangs_.end() || it->second.stall_gen != stall_gen || !it->second.stall_timer) return;
  Gang& g = it->second;
  g.stall_timer = false;
  PrintSim(std::nullopt, fmt::format("training: round {}: the NCCL watchdog times out after {}",
                                     g.round, HumanDuration(kCollectiveTimeout)));
  const std::vector<uint32_t> members = g.workers;
  for (uint32_t wi : members) {
    const Worker& w = workers_[wi];
    if (w.gang != id || !w.running || w.signalled || w.hung) continue;
    Exit(wi, now_ns_, 1, 0, fmt::format(fmt::runtime(kWatchdogText), w.global_rank));
  }
}

}  // namespace ddprun::sim
