// The workers' side of the progress contract (docs/simulator.md, "Hung ranks"): what a rank
// tells its agent through ddprun's Python module (hello, step beacons, in batches per node) and
// what faulthandler dumps when the agent signals it for its stacks. Part of the worker model
// (sim/workers.h); the training model decides when ranks step, this file how the agent hears it.
#include <algorithm>

#include <fmt/format.h>

#include "sim/invariants.h"
#include "sim/node.h"
#include "sim/workers.h"

namespace ddprun::sim {
namespace {

// faulthandler dumps on SIGUSR2 (the Python module's choice); own work per step varies by this
// much from beacon to beacon (data loading, kernel timing).
constexpr int kStackSignal = 12;
constexpr int64_t kJitterPermille = 20;

}  // namespace

void Workers::SignalForStacks(uint32_t index, int round, const std::vector<std::pair<int, int>>& targets) {
  for (const auto& [local, signal] : targets) {
    for (uint32_t wi : per_node_[index].running) {
      Worker& w = workers_[wi];
      if (w.round != round || w.local_rank != local || !w.running) continue;
      // faulthandler writes from its C signal handler, hung or not: at once, all threads. The
      // agent only signals what the worker's hello said it registered.
      if (w.hello && signal == kStackSignal) {
        w.stacks += StackDump(w);
        if (watch_hangs_) {
          // Training for long enough that every rank's beacons since reached its agent: one
          // beacon batch at the gang's pace (a straggler slows every step of it), and a margin
          // for the network. A rank that went on just before cannot have told anyone yet, and
          // a verdict then is the stacks' honest best guess (swarm-hangs seeds 2000870, 2003829,
          // 2008413: a rank 2-3.65x slower).
          const auto gang = gangs_.find(w.gang);
          const bool training = gang != gangs_.end() && gang->second.training &&
                                loop_.now_ns - gang->second.resumed_ns >=
                                    Ns(beacon_period_) * (100 + gang->second.slow_percent) / 100 +
                                        Ns(std::chrono::milliseconds(500));
          invariants_.StacksTaken(RoundKey{w.coordinator, w.round}, w.global_rank, w.hung, training);
        }
      }
      break;
    }
  }
}

std::vector<std::string> Workers::ReadStacks(uint32_t index, int round) {
  std::vector<std::string> dumps;
  for (uint32_t wi : per_node_[index].running) {
    Worker& w = workers_[wi];
    if (w.round != round || !w.running || w.local_rank < 0) continue;
    const auto local = static_cast<size_t>(w.local_rank);
    if (dumps.size() <= local) dumps.resize(local + 1);
    dumps[local] = std::move(w.stacks);
    w.stacks.clear();
  }
  return dumps;
}

std::string FaulthandlerDump(StackAt where, uint64_t pid) {
  const uint64_t id = 0x7f0000000000ULL + (pid & 0xffffff) * 0x1000000ULL;
  // The data loader's pin-memory thread, then the main thread (faulthandler lists the newest
  // thread first).
  std::string text = fmt::format(
      "Thread 0x{:016x} (most recent call first):\n"
      "  File \"/usr/lib/python3.10/threading.py\", line 324 in wait\n"
      "  File \"/usr/lib/python3.10/queue.py\", line 180 in get\n"
      "  File \"/usr/lib/python3/dist-packages/torch/utils/data/_utils/pin_memory.py\", line 31 in "
      "do_one_step\n"
      "  File \"/usr/lib/python3/dist-packages/torch/utils/data/_utils/pin_memory.py\", line 54 in "
      "_pin_memory_loop\n"
      "  File \"/usr/lib/python3.10/threading.py\", line 953 in run\n"
      "  File \"/usr/lib/python3.10/threading.py\", line 1016 in _bootstrap_inner\n"
      "  File \"/usr/lib/python3.10/threading.py\", line 973 in _bootstrap\n"
      "\n"
      "Thread 0x{:016x} (most recent call first):\n",
      id + 0x700, id + 0x740);
  switch (where) {
    case StackAt::kDataLoader:
      // Waiting for a batch that never comes (a dead data-loader worker, a hung file system).
      text +=
          "  File \"/usr/lib/python3.10/threading.py\", line 324 in wait\n"
          "  File \"/usr/lib/python3.10/queue.py\", line 180 in get\n"
          "  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 1133 in "
          "_try_get_data\n"
          "  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 1294 in _get_data\n"
          "  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 1332 in "
          "_next_data\n"
          "  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 631 in __next__\n"
          "  File \"/job/train.py\", line 57 in next_batch\n"
          "  File \"/job/train.py\", line 84 in train_step\n"
          "  File \"/job/train.py\", line 120 in <module>\n";
      break;
    case StackAt::kInit:
      // Still starting: init_process_group waits in the store for every rank.
      text +=
          "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1305 in "
          "init_process_group\n"
          "  File \"/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py\", line 79 in wrapper\n"
          "  File \"/job/train.py\", line 31 in setup\n"
          "  File \"/job/train.py\", line 118 in <module>\n";
      break;
    case StackAt::kAllReduce:
      // DDP's gradient all-reduce, waiting for the ranks that do not come.
      text +=
          "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 2501 in "
          "all_reduce\n"
          "  File \"/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py\", line 83 in wrapper\n"
          "  File \"/job/train.py\", line 88 in train_step\n"
          "  File \"/job/train.py\", line 120 in <module>\n";
      break;
  }
  return text + "\n";
}

std::string Workers::StackDump(const Worker& w) const {
  // The hung rank is stuck in the data loader (unless a test hook swaps where node 1's ranks
  // appear to be).
  const bool stuck = hooks_.LooksStuck(w.node, w.local_rank, w.hung);
  return FaulthandlerDump(stuck      ? StackAt::kDataLoader
                          : !w.ready ? StackAt::kInit
                                     : StackAt::kAllReduce,
                          w.pid);
}

// ---- progress beacons --------------------------------------------------------------------

void Workers::ArmBeacons(uint32_t index, Duration after) {
  PerNode& mine = per_node_[index];
  mine.beacon_armed = true;
  Event batch;
  batch.kind = EventKind::kBeacons;
  batch.node = index;
  batch.generation = mine.beacon_gen;
  loop_.queue.Push(loop_.now() + after, batch);
}

void Workers::Beacons(uint32_t index, uint64_t generation) {
  PerNode& mine = per_node_[index];
  if (generation != mine.beacon_gen || !mine.beacon_armed) return;
  mine.beacon_armed = false;
  if (mine.running.empty()) return;  // the chain ends; the next Ready starts it again
  const Gang* g = CurrentGang();
  const int64_t step = g ? ProgressNow(*g) / step_ns_ : -1;
  const bool from_thread = hooks_.BeaconsFromAThread();
  // Delivering a beacon runs the agent; the list is copied in case anything below changes it.
  const std::vector<uint32_t> running = mine.running;
  for (uint32_t wi : running) {
    Worker& w = workers_[wi];
    // A hung worker sends nothing (unless it beacons from a thread); a worker still starting
    // has not imported ddprun yet.
    if (!w.running || !w.ready || (w.hung && !from_thread) || w.node != index) continue;
    if (!w.hello) {
      if (!Deliver(w, core::BeaconKind::kHello, 0, -1)) continue;
      w.hello = true;
    }
    if (!g || g->id != w.gang || w.signalled) continue;
    // DDP is lockstep: ranks step only while their gang trains.
    if (g->training && step > w.last_step) {
      DeliverStep(w, step);
    } else if (from_thread && !g->broken && !g->completed && w.stepped) {
      DeliverStep(w, w.last_step + 1);
    }
  }
  if (!mine.running.empty()) ArmBeacons(index, beacon_period_);
}

void Workers::FlushSteps(uint32_t index, uint64_t gang, int64_t step) {
  const std::vector<uint32_t> running = per_node_[index].running;
  for (uint32_t wi : running) {
    Worker& w = workers_[wi];
    if (w.running && w.ready && w.gang == gang && w.node == index && step > w.last_step) DeliverStep(w, step);
  }
}

bool Workers::Deliver(Worker& w, core::BeaconKind kind, int64_t step, int64_t busy_us) {
  const Node& n = nodes_[w.node];
  if (!n.up || n.incarnation != w.incarnation || n.finished || !n.pevents) return false;
  ++stats_.beacons;
  n.pevents->OnBeacon(core::Beacon{w.round, w.local_rank, kind, step, busy_us, kStackSignal});
  return true;
}

void Workers::DeliverStep(Worker& w, int64_t step) {
  // Own work since the previous step beacon: step_time per step (more on a slow GPU), with a
  // little jitter; the agent counts one step for a rank's first beacon.
  const int64_t steps = w.stepped ? step - w.last_step : 1;
  int percent = 0;
  if (!slow_slots_.empty()) {
    auto it = slow_slots_.find({w.node, w.local_rank});
    if (it != slow_slots_.end()) percent = it->second.percent;
  }
  const int64_t per_step_us = step_ns_ / 1000 * (100 + percent) / 100;
  const auto jitter =
      1000 - kJitterPermille + static_cast<int64_t>(beacon_rng_.Below(2 * kJitterPermille + 1));
  if (!Deliver(w, core::BeaconKind::kStep, step, per_step_us * jitter / 1000 * steps)) return;
  w.last_step = step;
  w.stepped = true;
  if (watch_hangs_) invariants_.StepBeacon(w.pid, loop_.now_ns);
}

}  // namespace ddprun::sim
