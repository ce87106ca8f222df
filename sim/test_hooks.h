#pragma once
// The simulator's test hooks: every way SimOptions::Sabotage makes the simulated world
// misbehave, in one place, so that tests/sim/invariants_test.cc can watch each invariant fire
// through the whole simulator. The model asks a hook at the one point where the misbehaviour
// happens and otherwise knows nothing of it; the CLI never sets a sabotage, so every hook
// answers "behave" in a real simulation. Internal to sim/.

#include <cstdint>
#include <string>

#include "sim/invariants.h"
#include "sim/simulation.h"

namespace ddprun::sim {

class TestHooks {
 public:
  using Sabotage = SimOptions::Sabotage;
  explicit TestHooks(Sabotage sabotage) : sabotage_(sabotage) {}

  /// What a starting worker of `node` tells the invariants: node 1's workers get WORLD_SIZE one
  /// too large (kWrongWorldSize); a spare's workers say they play node rank 0
  /// (kSparePlaysNodeZero).
  void MisreportStart(uint32_t node, bool spare, WorkerStart& start) const {
    if (spare && sabotage_ == Sabotage::kSparePlaysNodeZero) start.node_rank_env = "0";
    if (node == 1 && sabotage_ == Sabotage::kWrongWorldSize)
      start.world_env = std::to_string(start.world + 1);
  }
  /// kSpawnTwice: node 1 starts its first worker of each round twice.
  bool SpawnsTwice(uint32_t node, int local_rank) const {
    return node == 1 && sabotage_ == Sabotage::kSpawnTwice && local_rank == 0;
  }
  /// kUnkillableWorkers: node 1's workers ignore every signal (stuck in the kernel).
  bool IgnoresSignals(uint32_t node) const { return node == 1 && sabotage_ == Sabotage::kUnkillableWorkers; }
  /// kBeaconsFromAThread: every worker beacons from a thread, so steps keep coming while its
  /// gang stalls and no hang is ever seen.
  bool BeaconsFromAThread() const { return sabotage_ == Sabotage::kBeaconsFromAThread; }
  /// kHungStackLooksWaiting: node 1's hung worker dumps an all_reduce stack, and its local rank
  /// 0 the stack of a rank stuck elsewhere. Returns whether a worker of `node` looks stuck.
  bool LooksStuck(uint32_t node, int local_rank, bool hung) const {
    if (node == 1 && sabotage_ == Sabotage::kHungStackLooksWaiting) return !hung && local_rank == 0;
    return hung;
  }
  /// kStoreIgnoresFencing: the modelled etcd lets every PutIf's compare hold.
  bool StoreIgnoresFencing() const { return sabotage_ == Sabotage::kStoreIgnoresFencing; }

 private:
  Sabotage sabotage_;
};

}  // namespace ddprun::sim
