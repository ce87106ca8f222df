#include "sim/faults.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/plural.h"
#include "schema/keys.h"
#include "sim/invariants.h"
#include "sim/network.h"
#include "sim/node.h"
#include "sim/sim_log.h"
#include "sim/sim_store.h"
#include "sim/simulation.h"
#include "sim/workers.h"

namespace ddprun::sim {
namespace {

// Random node crashes model a failed machine coming back (or its replacement taking over);
// with simulate.node_never_returns_percent, a share of them never comes back.
constexpr Duration kRandomRebootMin = Minutes(3);
constexpr Duration kRandomRebootMax = Minutes(10);
// How long a slow joiner waits when the fault gives no duration.
constexpr Duration kDefaultSlowJoin = Minutes(1);

// Random worker failures, as they show up in large training runs.
constexpr std::string_view kRandomFailures[] = {
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
    "system error (run with NCCL_DEBUG=INFO for details)",
    "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
};

}  // namespace

FaultInjector::FaultInjector(const JobSpec& spec, uint64_t seed, Handles handles, Machines& machines,
                             Network& network, Workers& workers, SimEtcd* etcd)
    : spec_(spec),
      loop_(handles.loop),
      nodes_(handles.nodes),
      log_(handles.log),
      stats_(handles.stats),
      invariants_(handles.invariants),
      machines_(machines),
      network_(network),
      workers_(workers),
      etcd_(etcd),
      agents_(spec.cluster.Agents()),
      fault_rng_(seed, 3),
      hang_rng_(seed, 6) {}

void FaultInjector::Focus(uint32_t index) {
  nodes_[index].focus = true;
  log_.FocusRow(index);
}

RunLimit FaultInjector::Schedule(int world, int min_world) {
  std::vector<int64_t> start(static_cast<size_t>(agents_), 0);
  int64_t heal_ns = 0;
  int slowest = 0;  // the most extra work per step a worker-slow fault leaves for good
  const int64_t rendezvous = Ns(spec_.timeouts.rendezvous);
  auto long_outage = [&](std::optional<Duration> d) { return !d || Ns(*d) >= rendezvous / 2; };
  for (const FaultSpec& fault : spec_.simulate.faults) {
    if (fault.node >= 0 && fault.node < agents_) nodes_[static_cast<uint32_t>(fault.node)].focus = true;
    const int64_t at = Ns(fault.at);
    switch (fault.kind) {
      case FaultKind::kSlowJoiner: {
        const int64_t s = at + Ns(fault.duration.value_or(kDefaultSlowJoin));
        outages_.emplace_back(0, s);
        auto& slot = start[static_cast<size_t>(fault.node)];
        slot = std::max(slot, s);
        heal_ns = std::max(heal_ns, s);
        if (long_outage(fault.duration.value_or(kDefaultSlowJoin))) rendezvous_fault_ = true;
        continue;
      }
      case FaultKind::kJobFileDiffers:
      case FaultKind::kDuplicateNodeRank:
        rendezvous_fault_ = true;
        break;
      case FaultKind::kNodeCrash:
        heal_ns = std::max(heal_ns, at + (fault.reboot_after ? Ns(*fault.reboot_after) : 0));
        if (!fault.reboot_after || Ns(*fault.reboot_after) + Ns(Minutes(1)) >= rendezvous / 2 ||
            fault.node == 0) {
          rendezvous_fault_ = true;
        }
        break;
      case FaultKind::kAgentHang:
      case FaultKind::kPartition:
      case FaultKind::kMasterPortBlocked:
      case FaultKind::kWorkerHang:
        heal_ns = std::max(heal_ns, at + (fault.duration ? Ns(*fault.duration) : 0));
        if (fault.kind != FaultKind::kWorkerHang)
          outages_.emplace_back(at, fault.duration ? at + Ns(*fault.duration) : -1);
        if (fault.kind != FaultKind::kWorkerHang && long_outage(fault.duration)) rendezvous_fault_ = true;
        break;
      case FaultKind::kWorkerExit:
        heal_ns = std::max(heal_ns, at);
        break;
      case FaultKind::kEtcdMemberDown:
      case FaultKind::kEtcdLeaderLost:
      case FaultKind::kEtcdPartition:
        // etcd unreachable for good (or longer than the wait for a coordinator) can end the
        // rendezvous with exit 3.
        heal_ns = std::max(heal_ns, at + (fault.duration ? Ns(*fault.duration) : 0));
        if (fault.kind != FaultKind::kEtcdLeaderLost && long_outage(fault.duration)) rendezvous_fault_ = true;
        outages_.emplace_back(at, fault.duration ? at + Ns(*fault.duration) : -1);
        break;
      case FaultKind::kWorkerSlow:
        // Slowness for good heals never: the liveness bound allows for the slower training.
        heal_ns = std::max(heal_ns, at + (fault.duration ? Ns(*fault.duration) : 0));
        if (!fault.duration) slowest = std::max(slowest, fault.percent);
        break;
    }
    ScheduleFault(fault);
  }
  // Fed in time order; equal times in the order planned, as the queue would pop them.
  std::stable_sort(planned_.begin(), planned_.end(), [](const Planned& a, const Planned& b) {
    return a.at_ns != b.at_ns ? a.at_ns < b.at_ns : a.seq < b.seq;
  });
  FeedNextFault();
  for (int rank = 0; rank < agents_; ++rank) {
    const auto index = static_cast<uint32_t>(rank);
    loop_.queue.PushCall(TimePoint(Duration(start[static_cast<size_t>(rank)])),
                         [this, index] { machines_.StartIfPending(index); });
  }
  const int64_t max_time = Ns(spec_.simulate.max_time);
  random_faults_until_ns_ = max_time / 2;
  if (spec_.simulate.node_mtbf) {
    ScheduleRandomNodeCrash(TimePoint(Duration(0)));
    heal_ns = std::max(heal_ns, random_faults_until_ns_ + Ns(kRandomRebootMax));
    // Crashes that come, across the cluster, faster than a host reboots chain their outages:
    // some host may be down at every instant of a whole rendezvous (shape swarm seed 106610:
    // 50 hosts, node_mtbf = 4h, a crash every 4.8 minutes, each host back after 3-10).
    const bool chained = Ns(*spec_.simulate.node_mtbf) / std::max(agents_, 1) < Ns(kRandomRebootMax);
    rendezvous_fault_ = rendezvous_fault_ || Ns(kRandomRebootMax) >= rendezvous / 2 ||
                        spec_.simulate.node_never_returns_percent > 0 || chained;
  }
  if (spec_.simulate.worker_mtbf) {
    ScheduleRandomWorkerExit(TimePoint(Duration(0)));
    heal_ns = std::max(heal_ns, random_faults_until_ns_);
  }
  if (spec_.simulate.worker_hang_mtbf) {
    ScheduleRandomWorkerHang(TimePoint(Duration(0)));
    heal_ns = std::max(heal_ns, random_faults_until_ns_);
  }
  return LivenessLimit(heal_ns, slowest, world, min_world);
}

RunLimit FaultInjector::LivenessLimit(int64_t heal_ns, int slowest, int world, int min_world) const {
  // Liveness: once every fault has healed, each round can take at most this long, and the
  // restart budget bounds the number of rounds.
  const int64_t rendezvous = Ns(spec_.timeouts.rendezvous);
  const int64_t max_time = Ns(spec_.simulate.max_time);
  double train_ns = static_cast<double>(Ns(spec_.simulate.train_time));
  if (slowest > 0) train_ns = train_ns * (100.0 + slowest) / 100.0;
  // A shrunk round trains at its share of the pace (sim/workers.cc): 20 minutes of a 28-rank
  // job on 3 ranks take three hours (shape swarm seed 118645).
  if (min_world > 0 && min_world < world) train_ns = train_ns * world / min_world;
  const double round_ns =
      static_cast<double>(Ns(spec_.simulate.worker_startup)) * 1.1 + train_ns +
      static_cast<double>(Ns(kCollectiveTimeout)) + static_cast<double>(Ns(spec_.timeouts.stop_grace)) +
      3.0 * static_cast<double>(Ns(spec_.timeouts.heartbeat)) +
      static_cast<double>(Ns(spec_.restart.backoff)) + static_cast<double>(Ns(Minutes(2)));
  const double deadline = static_cast<double>(heal_ns) + 2.0 * static_cast<double>(rendezvous) +
                          (spec_.restart.max_restarts + 2.0) * round_ns;
  if (deadline < static_cast<double>(max_time)) return RunLimit{static_cast<int64_t>(deadline), true};
  return RunLimit{max_time, false};
}

void FaultInjector::ScheduleRandomNodeCrash(TimePoint from) {
  // Every host may fail: the nodes and the spares.
  const Duration mean = *spec_.simulate.node_mtbf / agents_;
  const TimePoint at = from + fault_rng_.Exponential(mean);
  if (Ns(at.time_since_epoch()) >= random_faults_until_ns_) return;
  loop_.queue.PushCall(at, [this] {
    if (workers_.job_completed() || !machines_.AnyUnfinished()) return;
    const auto index = static_cast<uint32_t>(fault_rng_.Below(static_cast<uint64_t>(agents_)));
    // A machine comes back only after its old connection was declared dead (3 heartbeats):
    // a faster return is refused as a duplicate node rank (a known protocol limit).
    const Duration floor = 3 * spec_.timeouts.heartbeat + Minutes(1);
    const Duration reboot = std::chrono::duration_cast<std::chrono::seconds>(fault_rng_.Between(
        std::max(kRandomRebootMin, floor), std::max(kRandomRebootMax, floor + Minutes(7))));
    // Drawn only when the job asks for it, so that other jobs' draws stay what they were.
    const int never = spec_.simulate.node_never_returns_percent;
    const bool for_good = never > 0 && fault_rng_.Below(100) < static_cast<uint64_t>(never);
    if (nodes_[index].up && !nodes_[index].finished) {
      ++stats_.faults_injected;
      Focus(index);
      machines_.Crash(index, for_good ? std::nullopt : std::optional<Duration>(reboot),
                      for_good ? "random failure for good (simulate.node_mtbf, node_never_returns_percent)"
                               : "random failure (simulate.node_mtbf)");
    }
    ScheduleRandomNodeCrash(loop_.now());
  });
}

void FaultInjector::ScheduleRandomWorkerExit(TimePoint from) {
  const Duration mean = *spec_.simulate.worker_mtbf / spec_.WorldSize();
  const TimePoint at = from + fault_rng_.Exponential(mean);
  if (Ns(at.time_since_epoch()) >= random_faults_until_ns_) return;
  loop_.queue.PushCall(at, [this] {
    if (workers_.job_completed() || !machines_.AnyUnfinished()) return;
    const int nproc = spec_.cluster.nproc_per_node;
    const auto rank = static_cast<int>(fault_rng_.Below(static_cast<uint64_t>(spec_.WorldSize())));
    const auto text = kRandomFailures[fault_rng_.Below(std::size(kRandomFailures))];
    const uint32_t index = machines_.HolderOf(rank / nproc);  // a spare, once it took the node rank
    if (workers_.Hittable(index, rank % nproc)) {
      ++stats_.faults_injected;
      Focus(index);
      workers_.Fail(index, rank % nproc, 1, std::string(text), "random failure (simulate.worker_mtbf)");
    }
    ScheduleRandomWorkerExit(loop_.now());
  });
}

void FaultInjector::ScheduleRandomWorkerHang(TimePoint from) {
  const Duration mean = *spec_.simulate.worker_hang_mtbf / spec_.WorldSize();
  const TimePoint at = from + hang_rng_.Exponential(mean);
  if (Ns(at.time_since_epoch()) >= random_faults_until_ns_) return;
  loop_.queue.PushCall(at, [this] {
    if (workers_.job_completed() || !machines_.AnyUnfinished()) return;
    const int nproc = spec_.cluster.nproc_per_node;
    const auto rank = static_cast<int>(hang_rng_.Below(static_cast<uint64_t>(spec_.WorldSize())));
    const uint32_t index = machines_.HolderOf(rank / nproc);  // a spare, once it took the node rank
    // A real hang does not heal: the rank stays stuck until it is killed.
    if (workers_.Hittable(index, rank % nproc)) {
      ++stats_.faults_injected;
      Focus(index);
      workers_.Hang(index, rank % nproc, std::nullopt, "random hang (simulate.worker_hang_mtbf)");
    }
    ScheduleRandomWorkerHang(loop_.now());
  });
}

void FaultInjector::ScheduleFault(const FaultSpec& fault) {
  const auto index = static_cast<uint32_t>(fault.node);
  log_.FocusRow(index);
  planned_.push_back(Planned{AtOffset(fault.at).time_since_epoch().count(), loop_.queue.ReserveSeq(), fault});
}

void FaultInjector::FeedNextFault() {
  if (next_planned_ >= planned_.size()) return;
  const Planned& next = planned_[next_planned_];
  loop_.queue.PushReservedCall(TimePoint(Duration(next.at_ns)), next.seq, [this, i = next_planned_] {
    // The one after it goes into the queue first: had every fault been queued up front, it
    // would be there now.
    FeedNextFault();
    Inject(planned_[i].fault);
  });
  ++next_planned_;
}

void FaultInjector::Inject(const FaultSpec& fault) {
  ++stats_.faults_injected;
  switch (fault.kind) {
    case FaultKind::kNodeCrash:
      return InjectNodeCrash(fault);
    case FaultKind::kAgentHang:
      return InjectAgentHang(fault);
    case FaultKind::kWorkerExit:
      return InjectWorkerExit(fault);
    case FaultKind::kWorkerHang:
      return InjectWorkerHang(fault);
    case FaultKind::kWorkerSlow:
      return InjectWorkerSlow(fault);
    case FaultKind::kPartition:
      return InjectPartition(fault);
    case FaultKind::kMasterPortBlocked:
      return InjectMasterPortBlocked(fault);
    case FaultKind::kDuplicateNodeRank:
      return InjectDuplicateNodeRank(fault);
    case FaultKind::kEtcdMemberDown:
    case FaultKind::kEtcdLeaderLost:
    case FaultKind::kEtcdPartition:
      return InjectEtcdFault(fault);
    case FaultKind::kSlowJoiner:      // the node's start time (ScheduleFaults)
    case FaultKind::kJobFileDiffers:  // the node's own spec (BuildNodes)
      return;
  }
}

void FaultInjector::InjectNodeCrash(const FaultSpec& fault) {
  const auto index = static_cast<uint32_t>(fault.node);
  const Node& n = nodes_[index];
  if (n.finished || !n.up) return log_.PrintSim(index, "node-crash skipped: the node is not running");
  machines_.Crash(index, fault.reboot_after, "fault node-crash");
}

void FaultInjector::InjectAgentHang(const FaultSpec& fault) {
  const auto index = static_cast<uint32_t>(fault.node);
  Node& n = nodes_[index];
  if (!n.up || n.finished) return log_.PrintSim(index, "agent-hang skipped: the node is not running");
  if (!fault.duration) {
    n.hung_forever = true;
    n.hung_until_ns = INT64_MAX;
    ScheduleGuardianLease(index);
    invariants_.AgentHung(index, INT64_MAX);
    log_.PrintSim(index, "agent hangs for good (its workers keep running)");
    log_.AddMark(index, MarkKind::kFault, "agent hang (for good)");
    machines_.HungForGood(index);  // a crash (which ends the hang) counts it back
    return;
  }
  const uint32_t incarnation = n.incarnation;
  n.hung_until_ns = std::max(n.hung_until_ns, loop_.now_ns + Ns(*fault.duration));
  ScheduleGuardianLease(index);
  invariants_.AgentHung(index, n.hung_until_ns);
  log_.PrintSim(
      index, fmt::format("agent hangs for {} (its workers keep running)", FormatDuration(*fault.duration)));
  log_.AddMark(index, MarkKind::kFault, "agent hang", n.hung_until_ns);
  loop_.queue.PushCall(TimePoint(Duration(n.hung_until_ns)), [this, index, incarnation] {
    Node& m = nodes_[index];
    if (m.incarnation != incarnation || !m.up || m.hung_forever || m.hung_until_ns > loop_.now_ns) return;
    m.last_hang_end_ns = loop_.now_ns;
    log_.PrintSim(index, "agent resumes");
  });
}

// The guardian, a process of its own, keeps running while the agent is stopped. It holds the
// lease the agent last renewed (core::RenewLease: its last word from the coordinator + the loss
// bound + stop_grace) and SIGKILLs the workers when it ends, so the rank's lease holds even for
// a paused agent (runner/io/guardian.h). Only a hung agent needs it: one that runs SIGKILLs its
// workers itself at that time (Agent::KillBy), which the model lets it do. The lease is the one
// renewed before the hang, never the hang's start: an agent hung in the middle of its own stop
// has no more time than it had.
void FaultInjector::ScheduleGuardianLease(uint32_t index) {
  const Node& n = nodes_[index];
  if (n.lease_kill_at_ns < 0) return;  // it never heard from a coordinator: no workers
  const uint32_t incarnation = n.incarnation;
  const int64_t hung_since = loop_.now_ns;
  const int64_t kill_at = std::max(loop_.now_ns, n.lease_kill_at_ns);
  loop_.queue.PushCall(TimePoint(Duration(kill_at)), [this, index, incarnation, hung_since] {
    Node& m = nodes_[index];
    if (m.incarnation != incarnation || !m.up || !m.Hung(loop_.now_ns)) return;
    // Still hung since the fault began (a resume in between may have renewed the lease).
    if (m.last_hang_end_ns > hung_since) return;
    const int killed = workers_.GuardianKill(index);
    if (killed > 0) {
      const Duration since_word =
          Duration(loop_.now_ns - m.lease_kill_at_ns) + spec_.timeouts.GuardianLease();
      log_.PrintSim(index,
                    fmt::format("the agent is hung and its workers' lease ran out ({} after its last word "
                                "from the coordinator): its guardian SIGKILLs its {} worker{}",
                                HumanDuration(since_word), killed, killed == 1 ? "" : "s"));
    }
  });
}

void FaultInjector::InjectWorkerExit(const FaultSpec& fault) {
  workers_.Fail(
      static_cast<uint32_t>(fault.node), fault.local_rank.value_or(0), fault.exit_code,
      fmt::format("RuntimeError: simulated failure (fault worker-exit, exit code {})", fault.exit_code),
      "fault worker-exit");
}

void FaultInjector::InjectWorkerHang(const FaultSpec& fault) {
  workers_.Hang(static_cast<uint32_t>(fault.node), fault.local_rank.value_or(0), fault.duration, "");
}

void FaultInjector::InjectWorkerSlow(const FaultSpec& fault) {
  workers_.Slow(static_cast<uint32_t>(fault.node), fault.local_rank.value_or(0), fault.percent,
                fault.duration);
}

void FaultInjector::InjectPartition(const FaultSpec& fault) {
  // Without peers: a node is cut from node 0, node 0 from everyone.
  std::vector<int> peers = fault.peers;
  if (peers.empty()) {
    if (fault.node != 0) {
      peers.push_back(0);
    } else {
      for (int r = 1; r < agents_; ++r) peers.push_back(r);
    }
  }
  network_.Partition(fault.node, peers, false);
  for (int p : peers) {
    log_.FocusRow(static_cast<uint32_t>(p));
  }
  const std::string who = peers.size() <= 8 ? fmt::format("node {}", fmt::join(peers, ", node "))
                                            : fmt::format("{} nodes", peers.size());
  log_.PrintSim(std::nullopt, fmt::format("network: partition: node {} cut off from {}{}", fault.node, who,
                                          fault.duration ? " for " + FormatDuration(*fault.duration) : ""));
  const int64_t end = fault.duration ? loop_.now_ns + Ns(*fault.duration) : -1;
  log_.AddMark(static_cast<uint32_t>(fault.node), MarkKind::kFault, "partition", end);
  workers_.UpdateTraining();
  if (!fault.duration) return;
  loop_.queue.PushCall(TimePoint(Duration(end)), [this, fault, peers] {
    log_.PrintSim(std::nullopt, fmt::format("network: partition of node {} healed", fault.node));
    network_.Partition(fault.node, peers, true);
    workers_.UpdateTraining();
  });
}

void FaultInjector::InjectMasterPortBlocked(const FaultSpec& fault) {
  if (!fault.duration) {
    network_.BlockMasterPort(INT64_MAX);
    log_.PrintSim(std::nullopt, fmt::format("network: TCP port {} on {} blocked (new connections time out)",
                                            spec_.cluster.master_port, spec_.cluster.master_addr));
    log_.AddMark(Mark::kJob, MarkKind::kFault, "master port blocked");
    return;
  }
  network_.BlockMasterPort(loop_.now_ns + Ns(*fault.duration));
  const int64_t end = network_.master_port_blocked_until();
  log_.PrintSim(
      std::nullopt,
      fmt::format("network: TCP port {} on {} blocked for {} (new connections time out)",
                  spec_.cluster.master_port, spec_.cluster.master_addr, FormatDuration(*fault.duration)));
  log_.AddMark(Mark::kJob, MarkKind::kFault, "master port blocked", end);
  loop_.queue.PushCall(TimePoint(Duration(end)), [this] {
    if (network_.master_port_blocked_until() > loop_.now_ns) return;
    log_.PrintSim(std::nullopt, fmt::format("network: TCP port {} open again", spec_.cluster.master_port));
  });
}

void FaultInjector::InjectEtcdFault(const FaultSpec& fault) {
  if (!etcd_)
    return log_.PrintSim(
        std::nullopt, fmt::format("{} skipped: the job keeps no state in etcd", FaultKindName(fault.kind)));
  const int64_t end = fault.duration ? loop_.now_ns + Ns(*fault.duration) : -1;
  switch (fault.kind) {
    case FaultKind::kEtcdMemberDown:
      log_.AddMark(Mark::kJob, MarkKind::kFault, "etcd member down", end);
      return etcd_->MemberDown(fault.node, fault.duration);
    case FaultKind::kEtcdLeaderLost:
      log_.AddMark(Mark::kJob, MarkKind::kFault, "etcd leader lost", end);
      // An election takes a second or two unless the fault says how long.
      return etcd_->LeaderLost(fault.duration.value_or(Millis(1500)));
    case FaultKind::kEtcdPartition: {
      const auto index = static_cast<uint32_t>(fault.node);
      log_.AddMark(index, MarkKind::kFault, "cut off from etcd", end);
      return etcd_->Partition(index, fault.duration);
    }
    default:
      return;
  }
}

void FaultInjector::InjectDuplicateNodeRank(const FaultSpec& fault) {
  const uint32_t extra = machines_.AddExtraAgent(fault.node);
  Focus(extra);
  log_.PrintSim(extra, fmt::format("a second agent starts on {} and claims node rank {}",
                                   nodes_[extra].host_name, fault.node));
  machines_.StartIfPending(extra);
}

}  // namespace ddprun::sim
