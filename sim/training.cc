// The gang's training, as methods of Workers (workers.h): its pace (the slowest rank's, with
// slowed GPUs), the progress it banks between checkpoints, the end of train_time, and how a
// gang breaks: a peer process that exited (ranks notice its closed sockets), a stall that the
// NCCL watchdog ends, a hung rank. The processes themselves, signals and the store are in
// workers.cc.
#include <algorithm>

#include <fmt/format.h>

#include "base/plural.h"
#include "sim/network.h"
#include "sim/node.h"
#include "sim/sim_log.h"
#include "sim/workers.h"

namespace ddprun::sim {
namespace {

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

}  // namespace

void Workers::StopTraining(Gang& g) {
  g.training = false;
  ++g.done_gen;
  BankTraining(g);
  log_.TrainingEnds();
  if (!beacons_) return;
  // Every rank sent the step it completed last before the gang stopped (the hung one too,
  // before it hung); the node's next batch may be up to a period away, so hand it over now.
  const auto step = static_cast<uint64_t>(progress_ns_ / step_ns_);
  uint32_t last = UINT32_MAX;
  for (uint32_t wi : g.workers) {
    const Worker& w = workers_[wi];
    if (w.gang != g.id || !w.running || !w.ready || w.node == last) continue;
    last = w.node;
    Event flush;
    flush.kind = EventKind::kBeacons;
    flush.node = w.node;
    flush.side = 1;
    flush.target = g.id;
    flush.generation = step;
    loop_.queue.Push(loop_.now(), flush);
  }
}

int64_t Workers::Paced(const Gang& g, int64_t span) const {
  // A slower rank makes every step of the gang slower: progress at its pace.
  int64_t progress = g.slow_percent == 0 ? span : span * 100 / (100 + g.slow_percent);
  // Data parallelism: a smaller round (cluster.min_nodes) does the job's samples with fewer
  // ranks, at world / job world of the pace. Split so that nothing overflows.
  if (g.world > 0 && g.world < world_)
    progress = progress / world_ * g.world + progress % world_ * g.world / world_;
  return progress;
}

int64_t Workers::WallFor(const Gang& g, int64_t progress) const {
  int64_t wall = g.slow_percent == 0 ? progress
                                     : progress / 100 * (100 + g.slow_percent) +
                                           progress % 100 * (100 + g.slow_percent) / 100;
  if (g.world > 0 && g.world < world_) {
    // At most a year of virtual time: the simulation gives up long before.
    const long double scaled = static_cast<long double>(wall) * world_ / g.world;
    wall = scaled > 3.2e16L ? int64_t{32'000'000'000'000'000} : static_cast<int64_t>(scaled);
  }
  return wall;
}

void Workers::BankTraining(Gang& g) {
  const int64_t span = loop_.now_ns - g.training_since_ns;
  progress_ns_ += Paced(g, span);
  stats_.training_ns += span;
  g.training_since_ns = loop_.now_ns;
}

void Workers::ScheduleTrainingDone(Gang& g) {
  ++g.done_gen;
  Event done;
  done.kind = EventKind::kTrainingDone;
  done.target = g.id;
  done.generation = g.done_gen;
  const int64_t left = std::max<int64_t>(0, train_time_ns_ - progress_ns_);
  const int64_t wall = WallFor(g, left);
  loop_.queue.Push(TimePoint(Duration(loop_.now_ns + wall)), done);
}

int Workers::SlowPercentOf(const Gang& g) const {
  int slow = 0;
  for (const auto& [slot, value] : slow_slots_) {
    for (uint32_t wi : per_node_[slot.first].running) {
      const Worker& w = workers_[wi];
      if (w.gang == g.id && w.local_rank == slot.second) slow = std::max(slow, value.percent);
    }
  }
  return slow;
}

int64_t Workers::ProgressNow(const Gang& g) const {
  int64_t progress = progress_ns_;
  if (g.training) {
    progress += Paced(g, loop_.now_ns - g.training_since_ns);
  }
  return std::min(progress, train_time_ns_);
}

void Workers::ReportHangStall(Gang& g) {
  // Stalled because a rank hangs, and for nothing else (a partition stalls it too).
  const bool stall = !g.broken && !g.completed && g.hung > 0 && !store_.partitioned();
  if (stall == g.hang_stall) return;
  g.hang_stall = stall;
  const RoundKey key{g.coordinator, g.round};
  if (!stall) return invariants_.GangResumed(key);
  std::vector<int> hung;
  for (uint32_t wi : g.workers) {
    const Worker& w = workers_[wi];
    if (w.gang == g.id && w.running && w.hung) hung.push_back(w.global_rank);
  }
  std::sort(hung.begin(), hung.end());
  invariants_.GangHung(key, std::move(hung));
}

void Workers::UpdateTraining() {
  Gang* g = CurrentGang();
  if (!g) return;
  const int64_t now = loop_.now_ns;
  const bool stalled = g->hung > 0 || store_.partitioned();
  const bool active =
      !g->broken && !g->completed && g->running == g->world && g->ready == g->world && !stalled;
  const int slow = slow_slots_.empty() ? 0 : SlowPercentOf(*g);
  if (active && g->training && slow != g->slow_percent) {
    // A rank became slower or faster: the gang's pace changes from now.
    BankTraining(*g);
    g->slow_percent = slow;
    ScheduleTrainingDone(*g);
  }
  if (active && !g->training) {
    g->training = true;
    g->training_since_ns = now;
    g->resumed_ns = now;
    g->slow_percent = slow;
    ScheduleTrainingDone(*g);
    if (!stats_.first_training_ns) stats_.first_training_ns = now;
    log_.TrainingBegins();
    log_.PrintSim(std::nullopt, fmt::format("training: round {}: {} up; training from {} of {}", g->round,
                                            AllOf(static_cast<size_t>(g->world), "rank"),
                                            HumanDuration(Duration(progress_ns_)),
                                            HumanDuration(Duration(train_time_ns_))));
    log_.SetAllPhases();
  } else if (!active && g->training) {
    StopTraining(*g);
    if (!g->broken) {
      log_.PrintSim(std::nullopt, fmt::format("training: round {} stalls at {} ({})", g->round,
                                              HumanDuration(Duration(progress_ns_)),
                                              g->hung > 0 ? "a rank hangs" : "the network is partitioned"));
    }
    log_.SetAllPhases();
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
    loop_.queue.Push(TimePoint(Duration(now + Ns(kCollectiveTimeout))), timeout);
  } else if (!watch && g->stall_timer) {
    g->stall_timer = false;
    ++g->stall_gen;
  }
  if (watch_hangs_) ReportHangStall(*g);
}

void Workers::BreakGang(Gang& g, bool by_process_exit, const std::string& why) {
  if (g.broken || g.completed) return;
  if (g.training) StopTraining(g);
  g.broken = true;
  if (watch_hangs_) ReportHangStall(g);
  SimStats& stats = stats_;
  ++stats.interruptions;
  const int64_t kept =
      checkpoint_every_ns_ > 0 ? progress_ns_ / checkpoint_every_ns_ * checkpoint_every_ns_ : 0;
  const int64_t lost = progress_ns_ - kept;
  stats.lost_ns += lost;
  log_.PrintSim(std::nullopt,
                fmt::format("training: round {} interrupted ({}): {} trained, last checkpoint at {}, "
                            "{} of work lost",
                            g.round, why, HumanDuration(Duration(progress_ns_)),
                            HumanDuration(Duration(kept)), HumanDuration(Duration(lost))));
  progress_ns_ = kept;
  log_.AddMark(Mark::kJob, MarkKind::kFailure, fmt::format("round {} interrupted: {}", g.round, why));
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
      loop_.queue.Push(loop_.now() + rng_.Between(kPeerFailureMin, kPeerFailureMax), event);
    }
  }
  // Every failure must end with every worker of the round gone within a bound.
  invariants_.RoundFailed(RoundKey{g.coordinator, g.round});
  UpdateTraining();
}

void Workers::TrainingDone(uint64_t id, uint64_t done_gen) {
  auto it = gangs_.find(id);
  if (it == gangs_.end() || it->second.done_gen != done_gen || !it->second.training) return;
  Gang& g = it->second;
  const int64_t now = loop_.now_ns;
  g.training = false;
  g.completed = true;
  job_completed_ = true;
  stats_.training_ns += now - g.training_since_ns;
  progress_ns_ = train_time_ns_;
  log_.TrainingEnds();
  log_.PrintSim(std::nullopt, fmt::format("training: round {} reached simulate.train_time = {}; every rank "
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
  for (uint32_t wi : per_node_[index].running) {
    const Worker& w = workers_[wi];
    if (w.gang != id || !w.running || w.signalled || w.hung) continue;
    Exit(wi, loop_.now_ns, 1, 0, fmt::format(fmt::runtime(kPeerFailureText), w.global_rank));
  }
}

void Workers::CollectiveTimeout(uint64_t id, uint64_t stall_gen) {
  auto it = gangs_.find(id);
  if (it == gangs_.end() || it->second.stall_gen != stall_gen || !it->second.stall_timer) return;
  Gang& g = it->second;
  g.stall_timer = false;
  log_.PrintSim(std::nullopt, fmt::format("training: round {}: the NCCL watchdog times out after {}", g.round,
                                          HumanDuration(kCollectiveTimeout)));
  const std::vector<uint32_t> members = g.workers;
  for (uint32_t wi : members) {
    const Worker& w = workers_[wi];
    if (w.gang != id || !w.running || w.signalled || w.hung) continue;
    Exit(wi, loop_.now_ns, 1, 0, fmt::format(fmt::runtime(kWatchdogText), w.global_rank));
  }
}

void Workers::Slow(uint32_t index, int local_rank, int percent, std::optional<Duration> duration) {
  const std::pair<uint32_t, int> slot{index, local_rank};
  const uint64_t generation = next_slow_++;
  slow_slots_[slot] = SlowSlot{percent, generation};
  log_.PrintSim(index, fmt::format("local rank {}'s GPU slows down{}: {}% more own work per step; the gang "
                                   "steps at the pace of its slowest rank",
                                   local_rank, duration ? " for " + FormatDuration(*duration) : "", percent));
  log_.AddMark(index, MarkKind::kFault, fmt::format("local rank {} slow", local_rank),
               duration ? loop_.now_ns + Ns(*duration) : -1);
  UpdateTraining();
  if (!duration) return;
  loop_.queue.PushCall(loop_.now() + *duration, [this, slot, generation] {
    auto it = slow_slots_.find(slot);
    if (it == slow_slots_.end() || it->second.generation != generation) return;
    slow_slots_.erase(it);
    log_.PrintSim(slot.first, fmt::format("local rank {}'s GPU runs at full speed again", slot.second));
    UpdateTraining();
  });
}

}  // namespace ddprun::sim
