#pragma once
// The fault injector: the plan of a run's faults (from the job file, the command line and the
// failure rates) and one function per fault kind that applies it to the model. It acts on the
// machines through the Machines handle and on the network and workers directly; it decides
// nothing about the protocol. Internal to sim/.

#include <cstdint>
#include <optional>

#include "schema/job_spec.h"
#include "sim/parts.h"
#include "sim/prng.h"

namespace ddprun::sim {

class Network;
class SimEtcd;
class Workers;

/// How long the run may go: the liveness deadline (every fault healed, then the restart
/// budget's worth of rounds) when it comes before simulate.max_time.
struct RunLimit {
  int64_t limit_ns = 0;
  bool liveness = false;  // limit_ns is the liveness deadline, not max_time
};

class FaultInjector {
 public:
  /// `etcd` is null unless rendezvous.backend = "etcd".
  FaultInjector(const JobSpec& spec, uint64_t seed, Handles handles, Machines& machines, Network& network,
                Workers& workers, SimEtcd* etcd);

  /// Schedules every node's start and every fault; returns how long the run may go.
  /// `world` is the job's world as the training model counts it, `min_world` the smallest
  /// world a round of it may run with (cluster.min_nodes, and with etcd a node's other file):
  /// such a round trains at min_world / world of the pace, and the liveness bound allows it.
  RunLimit Schedule(int world, int min_world);
  /// Some fault may keep a node away long enough to justify exit 3.
  bool rendezvous_fault() const { return rendezvous_fault_; }
  /// When the planned faults kept some node away or unable to (re)join: [start, end) in
  /// virtual ns, -1 for an outage without end (crashes are the cluster's: Cluster::down_).
  const std::vector<std::pair<int64_t, int64_t>>& outages() const { return outages_; }

 private:
  /// The bound on the run past which it counts as not live: every fault healed by `heal_ns`,
  /// then each round at most its longest, as many as the restart budget allows.
  RunLimit LivenessLimit(int64_t heal_ns, int slowest, int world, int min_world) const;
  void ScheduleFault(const FaultSpec& fault);
  /// Puts the next planned fault into the queue (ScheduleFault reserved its place).
  void FeedNextFault();
  void Inject(const FaultSpec& fault);
  void InjectNodeCrash(const FaultSpec& fault);
  void InjectAgentHang(const FaultSpec& fault);
  void ScheduleGuardianLease(uint32_t index);
  void InjectWorkerExit(const FaultSpec& fault);
  void InjectWorkerHang(const FaultSpec& fault);
  void InjectWorkerSlow(const FaultSpec& fault);
  void InjectPartition(const FaultSpec& fault);
  void InjectMasterPortBlocked(const FaultSpec& fault);
  void InjectDuplicateNodeRank(const FaultSpec& fault);
  void InjectEtcdFault(const FaultSpec& fault);
  void ScheduleRandomNodeCrash(TimePoint from);
  void ScheduleRandomWorkerExit(TimePoint from);
  void ScheduleRandomWorkerHang(TimePoint from);
  /// A random fault hit `index`: its lines are shown at scale and its row stays expanded.
  void Focus(uint32_t index);

  const JobSpec& spec_;
  Loop& loop_;
  Nodes& nodes_;
  SimLog& log_;
  SimStats& stats_;
  Invariants& invariants_;
  Machines& machines_;
  Network& network_;
  Workers& workers_;
  SimEtcd* etcd_;
  int agents_ = 0;  // the nodes, then the spares (JobSpec::Cluster::Agents)
  Prng fault_rng_;
  Prng hang_rng_;  // simulate.worker_hang_mtbf: never shifts the other draws
  int64_t random_faults_until_ns_ = 0;
  bool rendezvous_fault_ = false;
  std::vector<std::pair<int64_t, int64_t>> outages_;
  // The planned faults (simulate.faults, a replay's thousands), in the order they fire; only
  // the next one is in the queue, with the sequence number reserved when it was planned.
  struct Planned {
    int64_t at_ns = 0;
    uint64_t seq = 0;
    FaultSpec fault;
  };
  std::vector<Planned> planned_;
  size_t next_planned_ = 0;
};

}  // namespace ddprun::sim
