#pragma once
// Simulated worker processes and the training model. DDP trains in lockstep, so progress is
// job-wide: a round trains only while every rank is up and nothing stalls it; the first rank
// to die breaks the gang, and progress since the last checkpoint is lost; the gang steps at
// the pace of its slowest rank. With timeouts.progress, workers send progress beacons from
// the model (docs/simulator.md, "Hung ranks") and dump faulthandler stacks when signalled.
// It reaches the rest of the simulator only through narrow handles (sim/parts.h): the loop,
// the node table, the event log, the invariants, the store network and the Roles of the
// agents that start it; test misbehaviour comes from TestHooks. The training model is in
// training.cc, the progress contract (beacons, faulthandler stacks) in worker_progress.cc.
// Internal to sim/; the launcher port reaches it through the Cluster.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runner/core/events.h"
#include "schema/job_spec.h"
#include "sim/event_queue.h"  // before kCollectiveTimeout: EventKind has an enumerator of that name
#include "sim/parts.h"
#include "sim/prng.h"
#include "sim/simulation.h"
#include "sim/test_hooks.h"
#include "sim/timeline.h"

namespace ddprun::sim {

class StoreNetwork;

/// The NCCL watchdog's default: a collective that makes no progress this long kills its rank.
inline constexpr Duration kCollectiveTimeout = Minutes(10);

/// Where a simulated rank's main thread stands when faulthandler dumps it.
enum class StackAt {
  kDataLoader,  // stuck waiting for a batch (train.py:57): the hung rank
  kInit,        // still starting, in init_process_group
  kAllReduce,   // waiting for the other ranks in DDP's all-reduce (train.py:88)
};
/// What faulthandler writes on SIGUSR2 with all_threads=True: a data-loader thread, then the
/// main thread at `where`; thread ids from `pid`.
std::string FaulthandlerDump(StackAt where, uint64_t pid);

class Workers {
 public:
  Workers(Handles handles, StoreNetwork& store, Roles& roles, const TestHooks& hooks, const JobSpec& spec,
          uint64_t seed);

  /// The world size every round has: that of the job node 0's coordinator runs.
  void SetWorld(int world) { world_ = world; }
  int world() const { return world_; }
  void AddNode() { per_node_.emplace_back(); }

  // ---- the launcher port (SimLauncher) ----
  void Spawn(uint32_t node, int round, const core::WorkerLaunch& launch);
  void SignalAll(uint32_t node, int round, int signal);
  void SignalForStacks(uint32_t node, int round, const std::vector<std::pair<int, int>>& targets);
  std::vector<std::string> ReadStacks(uint32_t node, int round);

  // ---- events ----
  void Ready(uint32_t node, uint64_t gang);                     // EventKind::kWorkerReady
  void ExitEvent(uint32_t worker, uint64_t generation);         // kWorkerExit
  void Notify(uint32_t worker);                                 // kWorkerNotify
  void TrainingDone(uint64_t gang, uint64_t generation);        // kTrainingDone
  void PeerFailure(uint32_t node, uint64_t gang);               // kPeerFailure
  void CollectiveTimeout(uint64_t gang, uint64_t generation);   // kCollectiveTimeout
  void StoreConnect(uint32_t clients);                          // kStoreConnect
  void Beacons(uint32_t node, uint64_t generation);             // kBeacons, side 0
  void FlushSteps(uint32_t node, uint64_t gang, int64_t step);  // kBeacons, side 1

  // ---- faults and nodes ----
  /// The worker of `local_rank` on `node` exits with `exit_code` now (a fault).
  void Fail(uint32_t node, int local_rank, int exit_code, const std::string& stderr_tail,
            const std::string& what);
  /// A running worker of `local_rank` on `node` that a fault could still hit.
  bool Hittable(uint32_t node, int local_rank) const;
  /// The worker of `local_rank` on `node` stops making progress and ignores SIGTERM.
  void Hang(uint32_t node, int local_rank, std::optional<Duration> duration, const std::string& what);
  /// The GPU of `local_rank` on `node` needs `percent` more work per step (for `duration`, or
  /// for good), whichever worker runs on it; the gang steps at the pace of its slowest rank.
  void Slow(uint32_t node, int local_rank, int percent, std::optional<Duration> duration);
  /// A crashed machine: its workers vanish without exit codes.
  void Vanish(uint32_t node);
  /// The guardian's lease ran out while the agent did not run: every worker of `node` is
  /// SIGKILLed, whatever its round (runner/io/guardian.h). Returns how many.
  int GuardianKill(uint32_t node);
  /// Re-evaluates whether the gang trains (after a partition starts or heals).
  void UpdateTraining();

  // ---- for the timeline and the summary ----
  /// What `node`'s workers are doing; nullopt when it has none. `round` is set with a phase.
  std::optional<NodePhase> PhaseOf(uint32_t node, int* round) const;
  bool job_completed() const { return job_completed_; }
  /// Every rank still running in the current round hangs for good (a worker-hang without a
  /// duration) and nothing watches progress: no mechanism can end that round.
  bool RoundStuckForGood() const;
  /// Whether workers send progress beacons: only when the job can use them (timeouts.progress,
  /// or a worker-slow fault to report), so that other jobs run exactly as before beacons.
  bool beacons() const { return beacons_; }
  /// The gang of the latest round (0: none yet): a node's workers getting ready for it may
  /// start its training.
  uint64_t current_gang() const { return current_gang_; }
  /// Banks the training still in progress at the end of the run into the stats.
  void Finish();

 private:
  struct Worker {
    uint32_t node = 0;
    uint32_t incarnation = 0;
    uint64_t gang = 0;
    int round = 0;
    int local_rank = 0;
    int global_rank = 0;
    uint64_t pid = 0;
    uint64_t coordinator = 0;  // with `round`: the round's key
    std::string master_addr;   // MASTER_ADDR: the machine rank 0's store is on
    uint16_t master_port = 0;  // MASTER_PORT: rank 0 hosts its store there, the others dial it
    int store_attempts = 0;
    bool running = true;
    bool ready = false;
    bool hung = false;
    bool hung_for_good = false;  // hung by a worker-hang without a duration
    bool term_pending = false;   // SIGTERM arrived while hung
    bool signalled = false;
    int64_t exit_at_ns = INT64_MAX;
    uint64_t exit_gen = 0;
    int exit_code = 0;
    int signal = 0;
    std::string stderr_tail;
    // Progress beacons.
    bool hello = false;     // its `hello` reached the agent
    bool stepped = false;   // a step beacon of it reached the agent
    int64_t last_step = 0;  // the last step it sent (at start: the step it resumes from)
    std::string stacks;     // what its stacks file got since the agent last signalled it
  };
  /// The workers of one round, job-wide (DDP trains in lockstep: all or nothing).
  struct Gang {
    uint64_t id = 0;
    uint64_t coordinator = 0;  // coordinator incarnation that started the round
    int round = 0;
    int world = 0;
    int running = 0;
    int ready = 0;
    int hung = 0;
    bool broken = false;
    bool completed = false;
    bool training = false;
    int64_t training_since_ns = 0;
    int64_t resumed_ns = 0;  // when it last went from stalled (or starting) to training
    uint64_t done_gen = 0;   // invalidates a scheduled kTrainingDone
    uint64_t stall_gen = 0;  // invalidates a scheduled kCollectiveTimeout
    bool stall_timer = false;
    bool peers_notified = false;  // peer-failure events were scheduled
    int slow_percent = 0;         // the slowest rank's extra work per step, while training
    bool hang_stall = false;      // reported to the invariants: stalled because a rank hangs
    std::vector<uint32_t> workers;
  };
  struct PerNode {
    std::vector<uint32_t> running;  // running workers
    uint64_t ready_gang = 0;        // gang whose startup event is scheduled for this node
    uint64_t beacon_gen = 0;        // the node's beacon chain (kBeacons, side 0)
    bool beacon_armed = false;      // a batch of the chain is queued
  };
  /// worker-slow on one GPU (node, local rank).
  struct SlowSlot {
    int percent = 0;
    uint64_t generation = 0;  // the fault that set it (its end only clears its own)
  };

  void Exit(uint32_t worker, int64_t at_ns, int exit_code, int signal, std::string stderr_tail);
  void Exited(uint32_t worker);
  void ScheduleStoreConnect(uint32_t clients, Duration after);
  /// Worker `wi` (if it is still `pid`) tries to reach the store now; true when it will try again.
  bool TryStore(uint32_t wi, uint64_t pid);
  void BreakGang(Gang& gang, bool by_process_exit, const std::string& why);
  void StopTraining(Gang& gang);
  /// Banks the training since the gang's span began (at its slowest rank's pace).
  /// The job's progress in `span` of training by gang `g` (its slowest rank's pace, and its
  /// share of the job's world), and the training time that makes `progress`.
  int64_t Paced(const Gang& g, int64_t span) const;
  int64_t WallFor(const Gang& g, int64_t progress) const;
  void BankTraining(Gang& gang);
  void ScheduleTrainingDone(Gang& gang);
  /// The extra work per step of the gang's slowest running rank, in percent.
  int SlowPercentOf(const Gang& gang) const;
  /// Training progress now (banked plus the current span), at most train_time.
  int64_t ProgressNow(const Gang& gang) const;
  void ReportHangStall(Gang& gang);
  // Progress beacons.
  void ArmBeacons(uint32_t node, Duration after);
  /// Hands `kind` from worker `w` to its agent; false when its agent cannot take it now.
  bool Deliver(Worker& w, core::BeaconKind kind, int64_t step, int64_t busy_us);
  void DeliverStep(Worker& w, int64_t step);
  /// What faulthandler writes for `w` now (all threads; the main one where the rank stands).
  std::string StackDump(const Worker& w) const;
  Gang* CurrentGang();
  const Gang* CurrentGang() const;

  Loop& loop_;
  Nodes& nodes_;
  SimLog& log_;
  SimStats& stats_;
  Invariants& invariants_;
  StoreNetwork& store_;
  Roles& roles_;
  const TestHooks& hooks_;
  const bool ignores_sigterm_;  // simulate.sigterm, resolved
  const JobSpec& spec_;
  Prng rng_;
  int world_ = 0;
  std::vector<PerNode> per_node_;
  std::vector<Worker> workers_;
  std::vector<uint32_t> free_workers_;
  // A node's store clients get ready together and retry on one clock: one event per attempt
  // for all of them, in their order, as their own events would have run one after the other.
  std::vector<std::vector<std::pair<uint32_t, uint64_t>>> store_clients_;  // (worker, pid) groups
  std::vector<uint32_t> free_store_clients_;
  std::map<uint64_t, Gang> gangs_;  // by id; finished gangs are kept small (workers cleared)
  uint64_t current_gang_ = 0;
  uint64_t next_gang_ = 1;
  uint64_t next_pid_ = 1000;
  int64_t progress_ns_ = 0;  // training progress banked (excludes the current span)
  int64_t checkpoint_every_ns_ = 0;
  int64_t train_time_ns_ = 0;
  bool job_completed_ = false;
  bool beacons_ = false;
  bool watch_hangs_ = false;  // timeouts.progress: the invariants watch hung gangs
  int64_t step_ns_ = 0;
  Duration beacon_period_{};
  Prng beacon_rng_;  // its own stream: beacons never shift the other draws
  std::map<std::pair<uint32_t, int>, SlowSlot> slow_slots_;
  uint64_t next_slow_ = 1;
};

}  // namespace ddprun::sim
