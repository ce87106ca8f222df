#include "sim/cluster.h"

#include <algorithm>
#include <cassert>
#include <csignal>

#include <fmt/format.h>

#include "ddprun_version.h"
#include "schema/canonical.h"
#include "schema/loader.h"

namespace ddprun::sim {
namespace {

// Random node crashes model a failed machine coming back (or its replacement taking over).
constexpr Duration kRandomRebootMin = Minutes(3);
constexpr Duration kRandomRebootMax = Minutes(10);
// How long a slow joiner waits when the fault gives no duration.
constexpr Duration kDefaultSlowJoin = Minutes(1);

int64_t Ns(Duration d) { return d.count(); }

// Random worker failures, as they show up in large training runs.
constexpr std::string_view kRandomFailures[] = {
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
    "system error (run with NCCL_DEBUG=INFO for details)",
    "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
};

}  // namespace

TimePoint SimClock::Now() const { return cluster_->now(); }

Cluster::Cluster(const JobSpec& spec, const SimOptions& options, std::ostream* out,
                 Timeline* timeline)
    : spec_(spec),
      options_(options),
      out_(options.quiet ? nullptr : out),
      timeline_(timeline),
      net_rng_(options.seed, 1),
      worker_rng_(options.seed, 2),
      fault_rng_(options.seed, 3),
      instance_rng_(options.seed, 4),
      clock_(this) {
  job_nodes_ = spec_.cluster.nnodes;
  condense_ = job_nodes_ > options_.condense_above;
  checkpoint_every_ns_ = Ns(spec_.simulate.checkpoint_every);
  train_time_ns_ = Ns(spec_.simulate.train_time);
  stats_.train_target_ns = train_time_ns_;
  stats_.max_restarts = spec_.restart.max_restarts;
  stats_.messages_by_node.assign(static_cast<size_t>(job_nodes_), 0);
  conn_of_id_.push_back(0);  // ConnId 0 is never used
}

Cluster::~Cluster() {
  // NodeHost's destructor talks to its ports; destroy hosts while the nodes still exist.
  for (auto& node : nodes_) node->host.reset();
}

// ---------------------------------------------------------------------------------------
// Setup

uint32_t Cluster::AddNode(int rank, const JobSpec* spec, bool extra) {
  const auto index = static_cast<uint32_t>(nodes_.size());
  auto node = std::make_unique<Node>(this, index);
  node->index = index;
  node->rank = rank;
  node->extra = extra;
  node->spec = spec;
  const auto r = static_cast<size_t>(rank);
  node->host = nullptr;
  node->pending_start = true;
  std::string host_name = !extra && r < spec_.cluster.nodes.size() ? spec_.cluster.nodes[r]
                                                                    : fmt::format("node-{:04}", index);
  const uint32_t ip = index + 1;
  node->addr = fmt::format("10.{}.{}.{}", (ip >> 16) & 255, (ip >> 8) & 255, ip & 255);
  node->label = extra ? fmt::format("node {} (extra agent on {})", rank, host_name)
                      : fmt::format("node {}", rank);
  nodes_.push_back(std::move(node));
  nodes_.back()->spec = spec;
  // The Node owns no host name field separately from the config; keep it for labels.
  nodes_.back()->label.reserve(nodes_.back()->label.size());
  nodes_.back()->host_name = std::move(host_name);
  ++unfinished_;
  if (timeline_) {
    timeline_->labels.push_back(extra ? nodes_.back()->label
                                      : fmt::format("node {} ({})", rank, nodes_.back()->host_name));
    timeline_->segments.emplace_back();
    timeline_->focus.push_back(false);
  }
  return index;
}

void Cluster::BuildNodes() {
  // A node with a different job file gets its own spec (the pointer must outlive its host).
  std::vector<const JobSpec*> specs(static_cast<size_t>(job_nodes_), &spec_);
  std::vector<std::unique_ptr<JobSpec>> own(static_cast<size_t>(job_nodes_));
  for (const FaultSpec& fault : spec_.simulate.faults) {
    if (fault.kind != FaultKind::kJobFileDiffers) continue;
    const auto r = static_cast<size_t>(fault.node);
    if (own[r]) continue;
    own[r] = std::make_unique<JobSpec>(spec_);
    // The classic mistake: one node's copy of the file asks for a different GPU count.
    const int nproc = spec_.cluster.nproc_per_node;
    own[r]->cluster.nproc_per_node = nproc > 1 ? nproc / 2 : nproc + 1;
    specs[r] = own[r].get();
  }
  for (int rank = 0; rank < job_nodes_; ++rank) {
    const uint32_t index = AddNode(rank, specs[static_cast<size_t>(rank)], false);
    nodes_[index]->own_spec = std::move(own[static_cast<size_t>(rank)]);
  }
}

void Cluster::ScheduleFaults() {
  std::vector<int64_t> start(static_cast<size_t>(job_nodes_), 0);
  int64_t heal_ns = 0;
  bool permanent = false;
  const int64_t rendezvous = Ns(spec_.timeouts.rendezvous);
  auto long_outage = [&](std::optional<Duration> d) {
    return !d || Ns(*d) >= rendezvous / 2;
  };
  for (const FaultSpec& fault : spec_.simulate.faults) {
    if (fault.node >= 0 && fault.node < job_nodes_) nodes_[static_cast<size_t>(fault.node)]->focus = true;
    const int64_t at = Ns(fault.at);
    switch (fault.kind) {
      case FaultKind::kSlowJoiner: {
        const int64_t s = at + Ns(fault.duration.value_or(kDefaultSlowJoin));
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
        if (!fault.reboot_after) permanent = true;
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
        if (!fault.duration) permanent = true;
        heal_ns = std::max(heal_ns, at + (fault.duration ? Ns(*fault.duration) : 0));
        if (fault.kind != FaultKind::kWorkerHang && long_outage(fault.duration)) rendezvous_fault_ = true;
        break;
      case FaultKind::kWorkerExit:
        heal_ns = std::max(heal_ns, at);
        break;
    }
    ScheduleFault(fault, false);
  }
  for (int rank = 0; rank < job_nodes_; ++rank) {
    const auto index = static_cast<uint32_t>(rank);
    queue_.PushCall(TimePoint(Duration(start[static_cast<size_t>(rank)])), [this, index] {
      if (nodes_[index]->pending_start) StartNode(index);
    });
  }
  const int64_t max_time = Ns(spec_.simulate.max_time);
  random_faults_until_ns_ = max_time / 2;
  if (spec_.simulate.node_mtbf) {
    ScheduleRandomNodeCrash(TimePoint(Duration(0)));
    heal_ns = std::max(heal_ns, random_faults_until_ns_ + Ns(kRandomRebootMax));
    rendezvous_fault_ = rendezvous_fault_ || Ns(kRandomRebootMax) >= rendezvous / 2;
  }
  if (spec_.simulate.worker_mtbf) {
    ScheduleRandomWorkerExit(TimePoint(Duration(0)));
    heal_ns = std::max(heal_ns, random_faults_until_ns_);
  }
  // Liveness: once every fault has healed, each round can take at most this long, and the
  // restart budget bounds the number of rounds.
  const double round_ns = static_cast<double>(Ns(spec_.simulate.worker_startup)) * 1.1 +
                          static_cast<double>(train_time_ns_) +
                          static_cast<double>(Ns(kCollectiveTimeout)) +
                          static_cast<double>(Ns(spec_.timeouts.stop_grace)) +
                          3.0 * static_cast<double>(Ns(spec_.timeouts.heartbeat)) +
                          static_cast<double>(Ns(spec_.restart.backoff)) +
                          static_cast<double>(Ns(Minutes(2)));
  const double deadline = static_cast<double>(heal_ns) + 2.0 * static_cast<double>(rendezvous) +
                          (spec_.restart.max_restarts + 2.0) * round_ns;
  (void)permanent;
  if (deadline < static_cast<double>(max_time)) {
    limit_ns_ = static_cast<int64_t>(deadline);
    liveness_limit_ = true;
  } else {
    limit_ns_ = max_time;
  }
}

void Cluster::ScheduleRandomNodeCrash(TimePoint from) {
  const Duration mean = *spec_.simulate.node_mtbf / job_nodes_;
  const TimePoint at = from + fault_rng_.Exponential(mean);
  if (Ns(at.time_since_epoch()) >= random_faults_until_ns_) return;
  queue_.PushCall(at, [this] {
    if (job_completed_ || unfinished_ == 0) return;
    const auto index = static_cast<uint32_t>(fault_rng_.Below(static_cast<uint64_t>(job_nodes_)));
    // A machine comes back only after its old connection was declared dead (3 heartbeats):
    // a faster return is refused as a duplicate node rank (a known protocol limit).
    const Duration floor = 3 * spec_.timeouts.heartbeat + Minutes(1);
    const Duration reboot = std::chrono::duration_cast<std::chrono::seconds>(
        fault_rng_.Between(std::max(kRandomRebootMin, floor), std::max(kRandomRebootMax, floor + Minutes(7))));
    if (nodes_[index]->up && !nodes_[index]->finished) {
      ++stats_.faults_injected;
      nodes_[index]->focus = true;
      if (timeline_) timeline_->focus[index] = true;
      CrashNode(index, reboot, "random failure (simulate.node_mtbf)");
    }
    ScheduleRandomNodeCrash(now());
  });
}

void Cluster::ScheduleRandomWorkerExit(TimePoint from) {
  const Duration mean = *spec_.simulate.worker_mtbf / spec_.WorldSize();
  const TimePoint at = from + fault_rng_.Exponential(mean);
  if (Ns(at.time_since_epoch()) >= random_faults_until_ns_) return;
  queue_.PushCall(at, [this] {
    if (job_completed_ || unfinished_ == 0) return;
    const int nproc = spec_.cluster.nproc_per_node;
    const auto rank = static_cast<int>(fault_rng_.Below(static_cast<uint64_t>(spec_.WorldSize())));
    const auto text = kRandomFailures[fault_rng_.Below(std::size(kRandomFailures))];
    const auto index = static_cast<uint32_t>(rank / nproc);
    Node& n = *nodes_[index];
    const bool any = std::any_of(n.workers.begin(), n.workers.end(), [&](uint32_t w) {
      return workers_[w].local_rank == rank % nproc && workers_[w].running && !workers_[w].signalled;
    });
    if (any) {
      ++stats_.faults_injected;
      n.focus = true;
      if (timeline_) timeline_->focus[index] = true;
      FailWorker(index, rank % nproc, 1, std::string(text), "random failure (simulate.worker_mtbf)");
    }
    ScheduleRandomWorkerExit(now());
  });
}

void Cluster::ScheduleFault(const FaultSpec& fault, bool random) {
  (void)random;
  const TimePoint at = AtOffset(fault.at);
  const auto index = static_cast<uint32_t>(fault.node);
  if (timeline_ && index < timeline_->focus.size()) timeline_->focus[index] = true;
  queue_.PushCall(at, [this, fault, index] {
    ++stats_.faults_injected;
    Node& n = *nodes_[index];
    const std::string name(FaultKindName(fault.kind));
    switch (fault.kind) {
      case FaultKind::kNodeCrash:
        if (n.finished || !n.up) {
          PrintSim(index, "node-crash skipped: the node is not running");
          return;
        }
        CrashNode(index, fault.reboot_after, "fault node-crash");
        return;
      case FaultKind::kAgentHang: {
        if (!n.up || n.finished) {
          PrintSim(index, "agent-hang skipped: the node is not running");
          return;
        }
        const uint32_t incarnation = n.incarnation;
        if (fault.duration) {
          n.hung_until_ns = std::max(n.hung_until_ns, now_ns_ + Ns(*fault.duration));
          PrintSim(index, fmt::format("agent hangs for {} (its workers keep running)",
                                      FormatDuration(*fault.duration)));
          AddMark(index, MarkKind::kFault, "agent hang", n.hung_until_ns);
          queue_.PushCall(TimePoint(Duration(n.hung_until_ns)), [this, index, incarnation] {
            Node& m = *nodes_[index];
            if (m.incarnation != incarnation || !m.up || m.hung_forever || m.hung_until_ns > now_ns_) return;
            m.last_hang_end_ns = now_ns_;
            PrintSim(index, "agent resumes");
          });
        } else {
          n.hung_forever = true;
          n.hung_until_ns = INT64_MAX;
          PrintSim(index, "agent hangs for good (its workers keep running)");
          AddMark(index, MarkKind::kFault, "agent hang (for good)");
          if (!n.finished) {
            n.finished = true;  // terminal for the run: it will never act again
            --unfinished_;
            n.finished = false;
          }
        }
        return;
      }
      case FaultKind::kWorkerExit:
        FailWorker(index, fault.local_rank.value_or(0), fault.exit_code,
                   fmt::format("RuntimeError: simulated failure (fault worker-exit, exit code {})",
                               fault.exit_code),
                   "fault worker-exit");
        return;
      case FaultKind::kWorkerHang:
        HangWorker(index, fault.local_rank.value_or(0), fault.duration);
        return;
      case FaultKind::kPartition: {
        std::vector<int> peers = fault.peers;
        if (peers.empty()) {
          if (fault.node != 0) {
            peers.push_back(0);
          } else {
            for (int r = 1; r < job_nodes_; ++r) peers.push_back(r);
          }
        }
        for (int p : peers) {
          const auto a = static_cast<uint32_t>(std::min(fault.node, p));
          const auto b = static_cast<uint32_t>(std::max(fault.node, p));
          ++cuts_[{a, b}];
          if (timeline_) timeline_->focus[static_cast<size_t>(p)] = true;
        }
        ++active_partitions_;
        const std::string who =
            peers.size() <= 8 ? fmt::format("node {}", fmt::join(peers, ", node "))
                              : fmt::format("{} nodes", peers.size());
        PrintSim(std::nullopt,
                 fmt::format("network: partition: node {} cut off from {}{}", fault.node, who,
                             fault.duration ? " for " + FormatDuration(*fault.duration) : ""));
        const int64_t end = fault.duration ? now_ns_ + Ns(*fault.duration) : -1;
        AddMark(index, MarkKind::kFault, "partition", end);
        UpdateTraining();
        if (fault.duration) {
          queue_.PushCall(TimePoint(Duration(end)), [this, fault, peers] {
            for (int p : peers) {
              const auto a = static_cast<uint32_t>(std::min(fault.node, p));
              const auto b = static_cast<uint32_t>(std::max(fault.node, p));
              auto it = cuts_.find({a, b});
              if (it != cuts_.end() && --it->second == 0) cuts_.erase(it);
            }
            --active_partitions_;
            PrintSim(std::nullopt, fmt::format("network: partition of node {} healed", fault.node));
            HealPaths();
            UpdateTraining();
          });
        }
        return;
      }
      case FaultKind::kMasterPortBlocked:
        if (fault.duration) {
          port_blocked_until_ns_ = std::max(port_blocked_until_ns_, now_ns_ + Ns(*fault.duration));
          const int64_t end = port_blocked_until_ns_;
          PrintSim(std::nullopt,
                   fmt::format("network: TCP port {} on {} blocked for {} (new connections time out)",
                               spec_.cluster.master_port, spec_.cluster.master_addr,
                               FormatDuration(*fault.duration)));
          AddMark(Mark::kJob, MarkKind::kFault, "master port blocked", end);
          queue_.PushCall(TimePoint(Duration(end)), [this] {
            if (port_blocked_until_ns_ > now_ns_ || port_blocked_forever_) return;
            PrintSim(std::nullopt, fmt::format("network: TCP port {} open again", spec_.cluster.master_port));
          });
        } else {
          port_blocked_forever_ = true;
          PrintSim(std::nullopt, fmt::format("network: TCP port {} on {} blocked (new connections "
                                             "time out)",
                                             spec_.cluster.master_port, spec_.cluster.master_addr));
          AddMark(Mark::kJob, MarkKind::kFault, "master port blocked");
        }
        return;
      case FaultKind::kSlowJoiner:
        return;  // handled by the node's start time
      case FaultKind::kJobFileDiffers:
        return;  // handled by the node's own spec
      case FaultKind::kDuplicateNodeRank: {
        const uint32_t extra = AddNode(fault.node, &spec_, true);
        nodes_[extra]->focus = true;
        if (timeline_) timeline_->focus[extra] = true;
        PrintSim(extra, fmt::format("a second agent starts on {} and claims node rank {}",
                                    nodes_[extra]->host_name, fault.node));
        StartNode(extra);
        return;
      }
    }
    (void)name;
  });
}

// ---------------------------------------------------------------------------------------
// Nodes

void Cluster::StartNode(uint32_t index) {
  Node& n = *nodes_[index];
  const bool reboot = n.started_once;
  n.pending_start = false;
  n.up = true;
  n.started_once = true;
  n.finished = false;
  n.exit_code.reset();
  core::Agent::Config config;
  config.node_rank = n.rank;
  config.host = n.host_name;
  config.canonical = CanonicalForm(*n.spec);
  config.fingerprint = FingerprintOfCanonical(config.canonical);
  config.instance = instance_rng_.Next();
  config.ddprun_version = DDPRUN_VERSION;
  config.logs_dir = n.spec->logs.dir;
  config.inherited_env = {{"HOME", "/home/ddp"}, {"PATH", "/usr/local/bin:/usr/bin:/bin"}};
  if (n.rank == 0 && !n.extra) ++coordinator_incarnation_;
  host::Ports ports{&clock_, &n.timer, &n.transport, &n.launcher, &n.console};
  if (reboot) PrintSim(index, fmt::format("rebooted; the agent starts again as {}", n.host_name));
  n.host = std::make_unique<host::NodeHost>(*n.spec, std::move(config), ports,
                                            [this, index](int code) { OnNodeExit(index, code); });
  const std::string error = n.host->Start();
  SetPhase(index);
  if (!error.empty()) {
    PrintSim(index, fmt::format("cannot listen on {}:{}: {}", spec_.cluster.master_addr,
                                spec_.cluster.master_port, error));
    OnNodeExit(index, 3);
  }
}

void Cluster::CrashNode(uint32_t index, std::optional<Duration> reboot_after, const std::string& why) {
  Node& n = *nodes_[index];
  ++stats_.node_crashes;
  PrintSim(index, fmt::format("crashed ({}){}", why,
                              reboot_after ? "; reboots in " + HumanDuration(*reboot_after)
                                           : "; stays down"));
  AddMark(index, MarkKind::kFault, "crash");
  // Its workers vanish with it: no exit codes, no notification.
  std::optional<uint64_t> hit_gang;
  for (uint32_t wi : n.workers) {
    Worker& w = workers_[wi];
    w.running = false;
    auto it = gangs_.find(w.gang);
    if (it != gangs_.end()) {
      Gang& g = it->second;
      --g.running;
      if (w.ready) --g.ready;
      if (w.hung) --g.hung;
      g.rank_state[static_cast<size_t>(w.global_rank)] = 3;
      hit_gang = w.gang;
    }
    free_workers_.push_back(wi);
  }
  n.workers.clear();
  // Its sockets go silent: no FIN, no RST, until the machine is back.
  for (uint64_t c : n.conns) {
    for (Side& side : conns_[c].side) {
      if (side.node == index && side.incarnation == n.incarnation) side.open = false;
    }
  }
  n.conns.clear();
  for (auto it = listeners_.begin(); it != listeners_.end();) {
    it = it->second == index ? listeners_.erase(it) : std::next(it);
  }
  n.host.reset();
  n.tevents = nullptr;
  n.pevents = nullptr;
  n.up = false;
  ++n.incarnation;
  ++n.timer_gen;
  n.armed_ns.reset();
  n.queued_ns.reset();
  n.hung_until_ns = 0;
  if (n.hung_forever) {
    n.hung_forever = false;
    ++unfinished_;
  }
  n.ready_gang = 0;
  if (hit_gang) {
    Gang& g = gangs_[*hit_gang];
    BreakGang(g, false, fmt::format("{} crashed", NodeLabel(index)));
  }
  if (reboot_after) {
    n.pending_start = true;
    queue_.PushCall(now() + *reboot_after, [this, index] {
      if (nodes_[index]->pending_start) StartNode(index);
    });
  } else {
    --unfinished_;
  }
  UpdateTraining();
  SetPhase(index);
}

void Cluster::OnNodeExit(uint32_t index, int code) {
  Node& n = *nodes_[index];
  if (n.finished) return;
  n.finished = true;
  n.exit_code = code;
  --unfinished_;
  stats_.end_ns = std::max(stats_.end_ns, now_ns_);
  PrintSim(index, fmt::format("agent exited with code {}", code));
  AddMark(index, MarkKind::kExit, fmt::format("exit {}", code));
  if (!n.workers.empty()) {
    Violation(fmt::format("{}'s agent exited with {} worker(s) still running", NodeLabel(index),
                          n.workers.size()));
  }
  if (code == 0 && n.host) {
    const int round = n.host->agent().round();
    const Gang* found = nullptr;
    for (const auto& [id, g] : gangs_) {
      if (g.coordinator == coordinator_incarnation_ && g.round == round) found = &g;
    }
    if (!found || found->exited_zero != found->world) {
      Violation(fmt::format("{} exited 0 but only {} of {} ranks of round {} exited 0",
                            NodeLabel(index), found ? found->exited_zero : 0, spec_.WorldSize(),
                            round));
    }
  }
  // The process is gone: the kernel closes its sockets (FIN) once this event is over.
  queue_.PushCall(now(), [this, index] { ReleaseNode(index); });
  SetPhase(index);
}

void Cluster::ReleaseNode(uint32_t index) {
  Node& n = *nodes_[index];
  if (!n.up || !n.finished) return;
  for (uint64_t c : n.conns) {
    for (int s = 0; s < 2; ++s) {
      const Side& side = conns_[c].side[s];
      if (side.node == index && side.incarnation == n.incarnation && side.open) CloseSide(c, s, true);
    }
  }
  for (auto it = listeners_.begin(); it != listeners_.end();) {
    it = it->second == index ? listeners_.erase(it) : std::next(it);
  }
}

// ---------------------------------------------------------------------------------------
// Event loop

bool Cluster::DeferIfHung(uint32_t index, const Event& event) {
  Node& n = *nodes_[index];
  if (n.hung_until_ns <= now_ns_) return false;
  if (!n.hung_forever) {
    Event again = event;
    queue_.Push(TimePoint(Duration(n.hung_until_ns)), again);
    if (event.kind == EventKind::kTimer) n.queued_ns = n.hung_until_ns;
  }
  return true;
}

void Cluster::Dispatch(const Event& event) {
  switch (event.kind) {
    case EventKind::kTimer: {
      Node& n = *nodes_[event.node];
      if (event.a != n.timer_gen) return;
      if (DeferIfHung(event.node, event)) return;
      n.queued_ns.reset();
      if (!n.armed_ns) return;
      if (*n.armed_ns > now_ns_) {
        ++n.timer_gen;
        n.queued_ns = n.armed_ns;
        Event again = event;
        again.a = n.timer_gen;
        queue_.Push(TimePoint(Duration(*n.armed_ns)), again);
        return;
      }
      n.armed_ns.reset();
      if (n.host && !n.finished) n.host->OnTimer();
      SetPhase(event.node);
      return;
    }
    case EventKind::kPump:
      if (DeferIfHung(event.node, event)) return;
      Pump(event.a, static_cast<int>(event.b));
      SetPhase(event.node);
      return;
    case EventKind::kConnectDone:
      if (DeferIfHung(event.node, event)) return;
      ConnectDone(event.a);
      return;
    case EventKind::kAccept:
      if (DeferIfHung(event.node, event)) return;
      Accept(event.a);
      return;
    case EventKind::kWorkerReady:
      WorkersReady(event.node, event.a);
      return;
    case EventKind::kWorkerExit: {
      const auto wi = static_cast<uint32_t>(event.a);
      if (wi < workers_.size() && workers_[wi].running && workers_[wi].exit_gen == event.b) {
        WorkerExited(wi);
      }
      return;
    }
    case EventKind::kWorkerNotify:
      if (DeferIfHung(event.node, event)) return;
      NotifyExit(static_cast<uint32_t>(event.a));
      return;
    case EventKind::kTrainingDone:
      TrainingDone(event.a, event.b);
      return;
    case EventKind::kPeerFailure:
      PeerFailure(event.node, event.a);
      return;
    case EventKind::kCollectiveTimeout:
      CollectiveTimeout(event.a, event.b);
      return;
    case EventKind::kCall: {
      auto call = queue_.TakeCall(event.a);
      call();
      return;
    }
  }
}

void Cluster::ObserveCoordinator() {
  if (nodes_.empty() || !nodes_[0]->host) return;
  const core::Coordinator* coordinator = nodes_[0]->host->coordinator();
  if (!coordinator) return;
  const int restarts = coordinator->restarts_used();
  if (restarts > spec_.restart.max_restarts) {
    Violation(fmt::format("the coordinator used {} restarts; restart.max_restarts = {}", restarts,
                          spec_.restart.max_restarts));
  }
  if (coordinator_incarnation_ != observed_incarnation_) {
    observed_incarnation_ = coordinator_incarnation_;
    last_coordinator_restarts_ = 0;
  }
  if (restarts > last_coordinator_restarts_) {
    stats_.restarts_used += restarts - last_coordinator_restarts_;
    last_coordinator_restarts_ = restarts;
    AddMark(Mark::kJob, MarkKind::kRestart, fmt::format("restart {}", restarts));
  }
}

SimResult Cluster::Run() {
  BuildNodes();
  ScheduleFaults();
  if (timeline_) {
    timeline_->title = fmt::format("{}: {} nodes x {} workers, seed {}", spec_.job.name, job_nodes_,
                                   spec_.cluster.nproc_per_node, options_.seed);
  }
  bool deadlock = false;
  while (!violation_) {
    if (queue_.Empty()) {
      deadlock = unfinished_ > 0;
      break;
    }
    if (queue_.NextTime().time_since_epoch().count() > limit_ns_) break;
    const Event event = queue_.Pop();
    now_ns_ = event.time_ns;
    Dispatch(event);
    ++stats_.events;
    if (event.node == 0 || event.kind == EventKind::kCall) ObserveCoordinator();
    stats_.peak_queue = std::max<uint64_t>(stats_.peak_queue, queue_.size());
    if (unfinished_ == 0) break;
  }
  if (!violation_ && unfinished_ > 0) {
    std::vector<std::string> names;
    for (const auto& n : nodes_) {
      if (n->finished || n->hung_forever || (!n->up && !n->pending_start)) continue;
      if (names.size() < 8) names.push_back(n->label);
    }
    const std::string who = fmt::format("{}{}", fmt::join(names, ", "),
                                        unfinished_ > 8 ? fmt::format(" and {} more", unfinished_ - 8) : "");
    if (deadlock) {
      Violation(fmt::format("hang: nothing left to happen but {} never finished", who));
    } else if (liveness_limit_) {
      Violation(fmt::format("hang: {} still running {} after the start, past the liveness bound "
                            "(all faults healed; the restart budget bounds the rounds)",
                            who, HumanDuration(Duration(limit_ns_))));
    } else {
      Violation(fmt::format("hang: {} still running when simulate.max_time = {} was reached", who,
                            FormatDuration(spec_.simulate.max_time)));
    }
  }
  return Finish();
}

SimResult Cluster::Finish() {
  SimResult result;
  if (stats_.end_ns == 0) stats_.end_ns = now_ns_;
  Gang* g = CurrentGang();
  if (g && g->training) {
    progress_ns_ += now_ns_ - g->training_since_ns;
    stats_.training_ns += now_ns_ - g->training_since_ns;
  }
  stats_.useful_ns = std::min(progress_ns_, train_time_ns_);
  for (const auto& n : nodes_) {
    NodeOutcome outcome;
    outcome.node_rank = n->rank;
    outcome.host = n->host_name;
    outcome.extra = n->extra;
    if (n->finished && n->exit_code) {
      outcome.state = NodeOutcome::State::kExited;
      outcome.exit_code = *n->exit_code;
    } else if (n->hung_forever) {
      outcome.state = NodeOutcome::State::kHung;
    } else if (!n->up) {
      outcome.state = NodeOutcome::State::kDown;
    }
    result.nodes.push_back(outcome);
  }
  // The job's outcome is node 0's exit code; without it, what the other nodes agreed on.
  const NodeOutcome& first = result.nodes[0];
  if (first.state == NodeOutcome::State::kExited) {
    result.exit_code = first.exit_code;
  } else {
    std::map<int, int> votes;
    for (const auto& o : result.nodes) {
      if (!o.extra && o.state == NodeOutcome::State::kExited) ++votes[o.exit_code];
    }
    result.exit_code = 3;
    int best = 0;
    for (const auto& [code, count] : votes) {
      if (count > best) {
        best = count;
        result.exit_code = code;
      }
    }
  }
  if (!violation_ && result.exit_code == 1) {
    const bool spent = stats_.restarts_used >= spec_.restart.max_restarts;
    if (!spent) {
      Violation(fmt::format("the job failed (exit 1) with restarts left ({} of {} used)",
                            stats_.restarts_used, spec_.restart.max_restarts));
    }
  }
  if (!violation_ && result.exit_code == 3 && !rendezvous_fault_) {
    Violation("the rendezvous failed (exit 3) although no fault kept a node away long enough");
  }
  result.violation = violation_;
  if (violation_) result.exit_code = 70;
  result.repro = ReproCommand(options_);
  if (timeline_) {
    timeline_->end_ns = std::max(stats_.end_ns, now_ns_);
    for (auto& row : timeline_->segments) {
      if (!row.empty() && row.back().end_ns < 0) row.back().end_ns = timeline_->end_ns;
    }
    if (!timeline_->training.empty() && timeline_->training.back().second < 0) {
      timeline_->training.back().second = timeline_->end_ns;
    }
  }
  result.stats = stats_;
  return result;
}

// ---------------------------------------------------------------------------------------
// Output and checks

void Cluster::Violation(const std::string& what) {
  if (violation_) return;
  violation_ = fmt::format("{} (at {})", what, HumanDuration(Duration(now_ns_)));
  if (out_) *out_ << FormatSimTime(now_ns_) << " INVARIANT VIOLATED: " << what << "\n";
}

void Cluster::Print(uint32_t index, std::string_view who, std::string_view text) {
  if (!out_) return;
  if (condense_ && !nodes_[index]->focus) {
    ++condensed_lines_;
    if (nodes_[index]->condensed_stamp != condense_epoch_) {
      nodes_[index]->condensed_stamp = condense_epoch_;
      ++condensed_nodes_;
    }
    return;
  }
  const std::string stamp = FormatSimTime(now_ns_);
  if (condensed_lines_ > 0) {
    *out_ << stamp << " (" << condensed_lines_ << " line" << (condensed_lines_ == 1 ? "" : "s")
          << " from " << condensed_nodes_ << " other node" << (condensed_nodes_ == 1 ? "" : "s")
          << " not shown)\n";
    condensed_lines_ = 0;
    condensed_nodes_ = 0;
    ++condense_epoch_;
  }
  // Continuation lines line up under the text.
  const std::string indent(stamp.size() + 3, ' ');
  size_t start = 0;
  bool first = true;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    if (first) {
      *out_ << stamp << ' ' << who << ": " << line << '\n';
      first = false;
    } else {
      *out_ << indent << line << '\n';
    }
    start = end + 1;
  }
}

void Cluster::PrintSim(std::optional<uint32_t> index, std::string_view text) {
  if (!out_) return;
  if (index) {
    Print(*index, NodeLabel(*index), text);
  } else {
    const bool saved = condense_;
    condense_ = false;
    Print(0, "sim", text);
    condense_ = saved;
  }
}

void Cluster::ConsoleLog(uint32_t index, core::LogLevel level, std::string_view source,
                         std::string_view text) {
  if (!out_) return;
  (void)level;
  if (source == "coordinator") {
    // At scale, lines about one ordinary node ("node 17 (node-0017) joined ...") are condensed.
    uint32_t subject = 0;
    if (condense_ && text.starts_with("node ")) {
      size_t i = 5;
      int64_t rank = 0;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') rank = rank * 10 + (text[i++] - '0');
      if (i > 5 && rank < job_nodes_) subject = static_cast<uint32_t>(rank);
    }
    Print(subject, "coordinator", text);
    return;
  }
  Print(index, NodeLabel(index), text);
}

void Cluster::ConsoleSummary(uint32_t index, std::string_view text) {
  if (!out_) return;
  auto [it, inserted] = summaries_seen_.emplace(std::string(text), index);
  if (!inserted) {
    Print(index, NodeLabel(index), fmt::format("printed the same summary as {}", NodeLabel(it->second)));
    return;
  }
  Print(index, NodeLabel(index), fmt::format("summary:\n  {}", fmt::join(Split(text), "\n  ")));
}

void Cluster::SetPhase(uint32_t index) {
  if (!timeline_) return;
  Node& n = *nodes_[index];
  NodePhase phase = NodePhase::kRendezvous;
  int round = -1;
  if (!n.up) {
    phase = n.started_once ? NodePhase::kDown : NodePhase::kOff;
  } else if (n.finished) {
    phase = NodePhase::kDone;
  } else if (!n.workers.empty()) {
    const Worker& w = workers_[n.workers.front()];
    round = w.round;
    const Gang* g = CurrentGang();
    const bool signalled = std::any_of(n.workers.begin(), n.workers.end(),
                                       [&](uint32_t wi) { return workers_[wi].signalled; });
    if (signalled) {
      phase = NodePhase::kStopping;
    } else if (g && g->id == w.gang && g->training) {
      phase = NodePhase::kTraining;
    } else if (w.ready) {
      phase = NodePhase::kStalled;
    } else {
      phase = NodePhase::kStarting;
    }
  } else if (n.host && n.host->agent().phase() == core::Agent::Phase::kWaiting &&
             n.host->agent().round() >= 0) {
    phase = NodePhase::kWaiting;
    round = n.host->agent().round();
  }
  if (phase == n.phase && !timeline_->segments[index].empty()) return;
  n.phase = phase;
  auto& row = timeline_->segments[index];
  if (!row.empty() && row.back().end_ns < 0) row.back().end_ns = now_ns_;
  row.push_back(Segment{now_ns_, -1, phase, round});
}

void Cluster::AddMark(uint32_t node, MarkKind kind, std::string text, int64_t end_ns) {
  if (!timeline_) return;
  timeline_->marks.push_back(Mark{now_ns_, end_ns < 0 ? now_ns_ : end_ns, node, kind, std::move(text)});
}

std::vector<std::string> Split(std::string_view text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// ---------------------------------------------------------------------------------------
// Ports

void SimTimer::ArmAt(TimePoint when) { cluster_->ArmTimer(node_, when); }
void SimTimer::Disarm() { cluster_->DisarmTimer(node_); }
void SimTransport::SetEvents(host::TransportEvents* events) { cluster_->SetTransportEvents(node_, events); }
std::string SimTransport::Listen(const std::string& addr, uint16_t port) { return cluster_->Listen(node_, addr, port); }
ConnId SimTransport::Connect(const std::string& addr, uint16_t port) { return cluster_->Connect(node_, addr, port); }
void SimTransport::Send(ConnId conn, std::vector<uint8_t> bytes) { cluster_->Send(node_, conn, std::move(bytes)); }
void SimTransport::Close(ConnId conn) { cluster_->Close(node_, conn); }
uint16_t SimTransport::ReserveStorePort() { return cluster_->ReserveStorePort(node_); }
void SimLauncher::SetEvents(host::ProcessEvents* events) { cluster_->SetProcessEvents(node_, events); }
void SimLauncher::Spawn(int round, const core::WorkerLaunch& launch) { cluster_->Spawn(node_, round, launch); }
void SimLauncher::SignalAll(int round, int signal) { cluster_->SignalAll(node_, round, signal); }
void SimConsole::Log(core::LogLevel level, std::string_view source, std::string_view text) {
  cluster_->ConsoleLog(node_, level, source, text);
}
void SimConsole::Summary(std::string_view text) { cluster_->ConsoleSummary(node_, text); }

void Cluster::ArmTimer(uint32_t index, TimePoint when) {
  Node& n = *nodes_[index];
  const int64_t t = when.time_since_epoch().count();
  n.armed_ns = t;
  if (n.queued_ns && *n.queued_ns <= t) return;  // the queued entry fires first and re-arms
  ++n.timer_gen;
  n.queued_ns = t;
  Event event;
  event.kind = EventKind::kTimer;
  event.node = index;
  event.a = n.timer_gen;
  queue_.Push(when, event);
}

void Cluster::DisarmTimer(uint32_t index) { nodes_[index]->armed_ns.reset(); }

void Cluster::SetTransportEvents(uint32_t index, host::TransportEvents* events) {
  nodes_[index]->tevents = events;
}

void Cluster::SetProcessEvents(uint32_t index, host::ProcessEvents* events) {
  nodes_[index]->pevents = events;
}

}  // namespace ddprun::sim
