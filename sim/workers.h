#pragma once
// Simulated worker processes and the training model. DDP trains in lockstep, so progress is
// job-wide: a round trains only while every rank is up and nothing stalls it; the first rank
// to die breaks the gang, and progress since the last checkpoint is lost. Internal to sim/;
// the launcher port reaches it through the Cluster.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runner/core/events.h"
#include "schema/job_spec.h"
#include "sim/event_queue.h"  // before kCollectiveTimeout: EventKind has an enumerator of that name
#include "sim/prng.h"
#include "sim/simulation.h"
#include "sim/timeline.h"

namespace ddprun::sim {

class Cluster;

/// The NCCL watchdog's default: a collective that makes no progress this long kills its rank.
inline constexpr Duration kCollectiveTimeout = Minutes(10);

class Workers {
 public:
  Workers(Cluster& cluster, const JobSpec& spec, uint64_t seed, SimOptions::Sabotage sabotage);

  /// The world size every round has: that of the job node 0's coordinator runs.
  void SetWorld(int world) { world_ = world; }
  void AddNode() { nodes_.emplace_back(); }

  // ---- the launcher port (SimLauncher) ----
  void Spawn(uint32_t node, int round, const core::WorkerLaunch& launch);
  void SignalAll(uint32_t node, int round, int signal);
  void SignalForStacks(uint32_t node, int round, const std::vector<std::pair<int, int>>& targets);
  std::vector<std::string> ReadStacks(uint32_t node, int round);

  // ---- events ----
  void Ready(uint32_t node, uint64_t gang);                 // EventKind::kWorkerReady
  void ExitEvent(uint32_t worker, uint64_t generation);     // kWorkerExit
  void Notify(uint32_t worker);                             // kWorkerNotify
  void TrainingDone(uint64_t gang, uint64_t generation);    // kTrainingDone
  void PeerFailure(uint32_t node, uint64_t gang);           // kPeerFailure
  void CollectiveTimeout(uint64_t gang, uint64_t generation);  // kCollectiveTimeout
  void StoreConnect(uint32_t worker, uint64_t pid);         // kStoreConnect

  // ---- faults and nodes ----
  /// The worker of `local_rank` on `node` exits with `exit_code` now (a fault).
  void Fail(uint32_t node, int local_rank, int exit_code, const std::string& stderr_tail,
            const std::string& what);
  /// A running worker of `local_rank` on `node` that a fault could still hit.
  bool Hittable(uint32_t node, int local_rank) const;
  /// The worker of `local_rank` on `node` stops making progress and ignores SIGTERM.
  void Hang(uint32_t node, int local_rank, std::optional<Duration> duration);
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
    uint64_t coordinator = 0;    // with `round`: the round's key
    uint16_t master_port = 0;    // MASTER_PORT: rank 0 hosts its store there, the others dial it
    int store_attempts = 0;
    bool running = true;
    bool ready = false;
    bool hung = false;
    bool term_pending = false;   // SIGTERM arrived while hung
    bool signalled = false;
    int64_t exit_at_ns = INT64_MAX;
    uint64_t exit_gen = 0;
    int exit_code = 0;
    int signal = 0;
    std::string stderr_tail;
  };
  /// The workers of one round, job-wide (DDP trains in lockstep: all or nothing).
  struct Gang {
    uint64_t id = 0;
    uint64_t coordinator = 0;    // coordinator incarnation that started the round
    int round = 0;
    int world = 0;
    int running = 0;
    int ready = 0;
    int hung = 0;
    bool broken = false;
    bool completed = false;
    bool training = false;
    int64_t training_since_ns = 0;
    uint64_t done_gen = 0;       // invalidates a scheduled kTrainingDone
    uint64_t stall_gen = 0;      // invalidates a scheduled kCollectiveTimeout
    bool stall_timer = false;
    bool peers_notified = false; // peer-failure events were scheduled
    std::vector<uint32_t> workers;
  };
  struct PerNode {
    std::vector<uint32_t> running;  // running workers
    uint64_t ready_gang = 0;        // gang whose startup event is scheduled for this node
  };

  void Exit(uint32_t worker, int64_t at_ns, int exit_code, int signal, std::string stderr_tail);
  void Exited(uint32_t worker);
  void ScheduleStoreConnect(uint32_t worker, Duration after);
  void BreakGang(Gang& gang, bool by_process_exit, const std::string& why);
  void StopTraining(Gang& gang);
  Gang* CurrentGang();
  const Gang* CurrentGang() const;

  Cluster& cluster_;
  const JobSpec& spec_;
  Prng rng_;
  SimOptions::Sabotage sabotage_;
  int world_ = 0;
  std::vector<PerNode> nodes_;
  std::vector<Worker> workers_;
  std::vector<uint32_t> free_workers_;
  std::map<uint64_t, Gang> gangs_;     // by id; finished gangs are kept small (workers cleared)
  uint64_t current_gang_ = 0;
  uint64_t next_gang_ = 1;
  uint64_t next_pid_ = 1000;
  int64_t progress_ns_ = 0;            // training progress banked (excludes the current span)
  int64_t checkpoint_every_ns_ = 0;
  int64_t train_time_ns_ = 0;
  bool job_completed_ = false;
};

}  // namespace ddprun::sim
