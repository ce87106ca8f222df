#include "sim/cluster.h"

#include <algorithm>
#include <csignal>
#include <limits>

#include <fmt/format.h>

#include "base/plural.h"
#include "ddprun_version.h"
#include "schema/canonical.h"
#include "schema/loader.h"

namespace ddprun::sim {

TimePoint SimClock::Now() const { return cluster_->now(); }

Cluster::Cluster(const JobSpec& spec, const SimOptions& options, std::ostream* out, Timeline* timeline)
    : spec_(spec),
      options_(options),
      hooks_(options.sabotage),
      instance_rng_(options.seed, 4),
      clock_(this),
      invariants_(InvariantBounds{spec.restart.max_restarts, spec.WorldSize(),
                                  spec.timeouts.stop_grace + 3 * spec.timeouts.heartbeat + kStopSlack,
                                  3 * spec.timeouts.heartbeat + spec.timeouts.stop_grace + kStopSlack,
                                  HangBoundsOf(spec), 0, 0, spec.timeouts.heartbeat + Seconds(1)},
                  [this](int64_t at_ns) {
                    Event check;
                    check.kind = EventKind::kCheck;
                    loop_.queue.Push(TimePoint(Duration(at_ns)), check);
                  }),
      log_(options.quiet ? nullptr : out, timeline, loop_, nodes_, *this,
           spec.cluster.Agents() > options.condense_above),
      network_(handles(), spec, options.network, options.seed),
      workers_(handles(), network_, *this, hooks_, spec, options.seed),
      etcd_(spec.rendezvous.Etcd() ? MakeEtcd() : nullptr),
      faults_(spec, options.seed, handles(), *this, network_, workers_, etcd_.get()),
      coordinators_(handles(), etcd_.get()) {
  job_nodes_ = spec_.cluster.nnodes;
  agents_ = spec_.cluster.Agents();
  for (int rank = 0; rank < job_nodes_; ++rank) holders_.push_back(static_cast<uint32_t>(rank));
  stats_.train_target_ns = spec_.simulate.train_time.count();
  stats_.max_restarts = spec_.restart.max_restarts;
  stats_.messages_by_node.assign(static_cast<size_t>(job_nodes_), 0);
}

std::unique_ptr<SimEtcd> Cluster::MakeEtcd() {
  SimEtcd::Hooks hooks;
  hooks.now_ns = [this] { return loop_.now_ns; };
  hooks.deliver = [this](uint32_t node, uint32_t incarnation, host::StoreResult result) {
    DeliverStore(node, incarnation, std::move(result));
  };
  hooks.print = [this](std::optional<uint32_t> node, const std::string& text) { log_.PrintSim(node, text); };
  return std::make_unique<SimEtcd>(loop_.queue, std::move(hooks), spec_, options_.network, options_.seed,
                                   hooks_.StoreIgnoresFencing());
}

std::optional<HangBounds> HangBoundsOf(const JobSpec& spec) {
  const auto& t = spec.timeouts;
  if (!t.DetectsHangs()) return std::nullopt;
  HangBounds bounds;
  bounds.progress = t.progress;
  bounds.progress_start = t.progress_start;
  bounds.auto_factor = JobSpec::Timeouts::kAutoProgressFactor;
  bounds.auto_floor = JobSpec::Timeouts::kAutoProgressFloor;
  // After the silence: the coordinator's wait for every node's stacks, then the stop. The
  // slack: a node may learn of the stop only by losing the coordinator (node 0 crashed, or a
  // partition, while the stacks were collected): the loss bound and a heartbeat in flight;
  // and kStopSlack for signal delays and retransmissions, as in the stop bound.
  bounds.after_silence = t.StacksWait() + t.StopBound() + t.LossBound() + t.heartbeat + kStopSlack;
  return bounds;
}

Cluster::~Cluster() {
  // NodeHost's destructor talks to its ports; destroy hosts while the nodes still exist.
  for (const auto& node : nodes_) node->host.reset();
}

// ---------------------------------------------------------------------------------------
// Setup

uint32_t Cluster::AddNode(int rank, const JobSpec* spec, bool extra) {
  const auto index = static_cast<uint32_t>(nodes_.size());
  auto node = std::make_unique<Node>(this, index);
  node->index = index;
  node->rank = rank;
  node->extra = extra;
  node->spare = !extra && rank >= job_nodes_;
  node->spec = spec;
  node->host = nullptr;
  node->pending_start = true;
  const std::string listed = extra ? std::string() : spec_.cluster.HostOf(rank);
  node->host_name = !listed.empty() ? listed : fmt::format("node-{:04}", index);
  const uint32_t ip = index + 1;
  node->addr = fmt::format("10.{}.{}.{}", (ip >> 16) & 255, (ip >> 8) & 255, ip & 255);
  const std::string own =
      rank >= job_nodes_ ? fmt::format("spare {}", rank - job_nodes_) : fmt::format("node {}", rank);
  node->label = extra ? fmt::format("{} (extra agent on {})", own, node->host_name) : own;
  Node& added = nodes_.Add(std::move(node));
  ++unfinished_;
  invariants_.AddNode(index, added.label, added.spare);
  network_.AddNode();
  workers_.AddNode();
  if (log_.timeline())
    log_.AddRow(extra ? added.label : fmt::format("{} ({})", added.label, added.host_name));
  return index;
}

void Cluster::BuildNodes() {
  // A node with a different job file gets its own spec (the pointer must outlive its host).
  std::vector<const JobSpec*> specs(static_cast<size_t>(agents_), &spec_);
  std::vector<std::unique_ptr<JobSpec>> own(static_cast<size_t>(agents_));
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
  // Node 0's coordinator decides what the job is: when every node runs the same changed file,
  // no node differs, and the job they agree on is the one to check against.
  workers_.SetWorld(specs[0]->WorldSize());
  int min_world = specs[0]->cluster.min_nodes * specs[0]->cluster.nproc_per_node;
  int max_world = specs[0]->WorldSize();
  if (coordinators_.AnyAgentLeads()) {
    // Whichever agent takes the coordinator role first decides what the job is.
    for (const JobSpec* s : specs) {
      min_world = std::min(min_world, s->cluster.min_nodes * s->cluster.nproc_per_node);
      max_world = std::max(max_world, s->WorldSize());
    }
  }
  invariants_.SetWorldBounds(min_world, max_world);
  min_world_ = min_world;
  // One agent per JobSpec::Cluster::Agents(): the nodes, then the spares, each running the
  // same NodeHost. Node 0's lines (and its coordinator's) are always shown, whatever the
  // cluster's size.
  for (int rank = 0; rank < agents_; ++rank) {
    const uint32_t index = AddNode(rank, specs[static_cast<size_t>(rank)], false);
    nodes_[index].own_spec = std::move(own[static_cast<size_t>(rank)]);
  }
  nodes_[0].focus = true;
}

// ---------------------------------------------------------------------------------------
// Nodes

void Cluster::StartNode(uint32_t index) {
  Node& n = nodes_[index];
  const bool reboot = n.started_once;
  n.pending_start = false;
  n.up = true;
  n.started_once = true;
  n.started_ns = loop_.now_ns;
  if (reboot && n.down_entry >= 0) down_[static_cast<size_t>(n.down_entry)].second = loop_.now_ns;
  n.down_entry = -1;
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
  host::Ports ports{&clock_,
                    &n.timer,
                    &n.transport,
                    &n.launcher,
                    &n.console,
                    &n.journal,
                    index == 0 ? options_.node0_events : options_.other_events,
                    etcd_ ? &n.store : nullptr,
                    coordinators_.ObserverOf(index)};
  if (reboot) log_.PrintSim(index, fmt::format("rebooted; the agent starts again as {}", n.host_name));
  n.host = std::make_unique<host::NodeHost>(*n.spec, std::move(config), ports,
                                            [this, index](int code) { OnNodeExit(index, code); });
  const Status started = n.host->Start();
  coordinators_.HostStarted(index, started && n.host->coordinator());
  log_.SetPhase(index);
  if (!started) {
    log_.PrintSim(index, started.error());  // the transport's words name the address, as the real one's do
    OnNodeExit(index, 3);
  }
}

void Cluster::Crash(uint32_t index, std::optional<Duration> reboot_after, const std::string& why) {
  Node& n = nodes_[index];
  ++stats_.node_crashes;
  n.down_entry = static_cast<int64_t>(down_.size());
  down_.emplace_back(loop_.now_ns, -1);
  log_.PrintSim(index,
                fmt::format("crashed ({}){}", why,
                            reboot_after ? "; reboots in " + HumanDuration(*reboot_after) : "; stays down"));
  log_.AddMark(index, MarkKind::kFault, "crash");
  // Its sockets go silent: no FIN, no RST, until the machine is back.
  network_.Silence(index);
  coordinators_.Touched(index);  // a coordinator on it is gone
  n.host.reset();
  n.tevents = nullptr;
  n.pevents = nullptr;
  n.up = false;
  ++n.incarnation;
  ++n.timer_gen;
  n.armed_ns.reset();
  n.queued_ns.reset();
  n.hung_until_ns = 0;
  n.lease_kill_at_ns = -1;  // its guardian died with it, and its workers
  invariants_.AgentGone(index);
  if (n.hung_forever) {
    n.hung_forever = false;
    ++unfinished_;
  }
  // Its workers vanish with it: no exit codes, no notification.
  workers_.Vanish(index);
  if (reboot_after) {
    n.pending_start = true;
    loop_.queue.PushCall(now() + *reboot_after, [this, index] { StartIfPending(index); });
  } else {
    --unfinished_;
    // Down for good ends this node's part of the run as an exit would (the run's wall time,
    // for goodput: seed 100996 of the shape swarm read 48,149,262%).
    stats_.end_ns = std::max(stats_.end_ns, loop_.now_ns);
  }
  workers_.UpdateTraining();
  log_.SetPhase(index);
}

void Cluster::OnNodeExit(uint32_t index, int code) {
  Node& n = nodes_[index];
  if (n.finished) return;
  n.finished = true;
  n.exit_code = code;
  --unfinished_;
  stats_.end_ns = std::max(stats_.end_ns, loop_.now_ns);
  log_.PrintSim(index, fmt::format("agent exited with code {}", code));
  log_.AddMark(index, MarkKind::kExit, fmt::format("exit {}", code));
  std::optional<RoundKey> round;
  if (n.host && n.host->agent().round() >= 0) round = RoundKey{RoundEpochOf(index), n.host->agent().round()};
  invariants_.AgentExited(index, code, round);
  // The process is gone: the kernel closes its sockets (FIN) once this event is over.
  loop_.queue.PushCall(now(), [this, index] { ReleaseNode(index); });
  log_.SetPhase(index);
}

void Cluster::NodePlays(uint32_t index, int node_rank, int round_nodes) {
  Node& n = nodes_[index];
  n.plays = node_rank;
  // Duplicate-node-rank impostors are the invariants' business, not a replacement; in a smaller
  // round (cluster.min_nodes) the nodes close ranks, which replaces no one.
  if (n.extra || node_rank < 0 || node_rank >= job_nodes_ || round_nodes != job_nodes_) return;
  uint32_t& holder = holders_[static_cast<size_t>(node_rank)];
  if (holder == index) return;
  const uint32_t old = holder;
  holder = index;
  const Node& o = nodes_[old];
  const std::string text = fmt::format("{} ({}) replaces {} ({}) as node rank {}", n.label, n.host_name,
                                       o.label, o.host_name, node_rank);
  n.focus = true;
  log_.FocusRow(index);
  log_.PrintSim(index, text);
  replacements_.push_back(fmt::format("at {}: {}", HumanDuration(Duration(loop_.now_ns)), text));
  log_.AddMark(index, MarkKind::kHeal, text);
  log_.AddMark(old, MarkKind::kHeal, text);
}

void Cluster::ReleaseNode(uint32_t index) {
  const Node& n = nodes_[index];
  if (n.up && n.finished) network_.Release(index);
}

// ---------------------------------------------------------------------------------------
// Event loop

// The events that run a node's host (its agent, and the coordinator it may hold): after them
// the coordinator watch looks at that node. The others reach a host only through these, or
// through StartNode, Crash and DeliverStore, which tell the watch themselves.
bool Cluster::DrivesHost(EventKind kind) {
  switch (kind) {
    case EventKind::kTimer:
    case EventKind::kPump:
    case EventKind::kConnectDone:
    case EventKind::kAccept:
    case EventKind::kWorkerExit:
    case EventKind::kWorkerNotify:
    case EventKind::kBeacons:
      return true;
    case EventKind::kWorkerReady:
    case EventKind::kTrainingDone:
    case EventKind::kPeerFailure:
    case EventKind::kCollectiveTimeout:
    case EventKind::kStoreConnect:
    case EventKind::kCheck:
    case EventKind::kCall:
      return false;
  }
  return false;
}

bool Cluster::DeferIfHung(uint32_t index, const Event& event) {
  Node& n = nodes_[index];
  if (n.hung_until_ns <= loop_.now_ns) return false;
  if (!n.hung_forever) {
    Event again = event;
    loop_.queue.Push(TimePoint(Duration(n.hung_until_ns)), again);
    if (event.kind == EventKind::kTimer) n.queued_ns = n.hung_until_ns;
  }
  return true;
}

void Cluster::Dispatch(const Event& event) {
  switch (event.kind) {
    case EventKind::kTimer: {
      Node& n = nodes_[event.node];
      if (event.generation != n.timer_gen) return;
      if (DeferIfHung(event.node, event)) return;
      n.queued_ns.reset();
      if (!n.armed_ns) return;
      if (*n.armed_ns > loop_.now_ns) {
        ++n.timer_gen;
        n.queued_ns = n.armed_ns;
        Event again = event;
        again.generation = n.timer_gen;
        loop_.queue.Push(TimePoint(Duration(*n.armed_ns)), again);
        return;
      }
      n.armed_ns.reset();
      if (n.host && !n.finished) n.host->OnTimer();
      log_.SetPhase(event.node);
      return;
    }
    case EventKind::kPump:
      if (DeferIfHung(event.node, event)) return;
      network_.Pump(event.target, event.side);
      log_.SetPhase(event.node);
      return;
    case EventKind::kConnectDone:
      if (DeferIfHung(event.node, event)) return;
      network_.ConnectDone(event.target);
      return;
    case EventKind::kAccept:
      if (DeferIfHung(event.node, event)) return;
      network_.Accept(event.target);
      return;
    case EventKind::kWorkerReady:
      workers_.Ready(event.node, event.target);
      return;
    case EventKind::kWorkerExit:
      workers_.ExitEvent(static_cast<uint32_t>(event.target), event.generation);
      return;
    case EventKind::kWorkerNotify:
      if (DeferIfHung(event.node, event)) return;
      workers_.Notify(static_cast<uint32_t>(event.target));
      return;
    case EventKind::kTrainingDone:
      workers_.TrainingDone(event.target, event.generation);
      return;
    case EventKind::kPeerFailure:
      workers_.PeerFailure(event.node, event.target);
      return;
    case EventKind::kCollectiveTimeout:
      workers_.CollectiveTimeout(event.target, event.generation);
      return;
    case EventKind::kStoreConnect:
      workers_.StoreConnect(static_cast<uint32_t>(event.target));
      return;
    case EventKind::kBeacons:
      // Datagrams wait in the agent's socket while it is stopped; it reads them when it runs.
      if (DeferIfHung(event.node, event)) return;
      if (event.side == 0) {
        workers_.Beacons(event.node, event.generation);
      } else {
        workers_.FlushSteps(event.node, event.target, static_cast<int64_t>(event.generation));
      }
      return;
    case EventKind::kCheck:
      return;  // Run checks the invariants after every event
    case EventKind::kCall: {
      auto call = loop_.queue.TakeCall(event.target);
      call();
      return;
    }
  }
}

void Cluster::DeliverStore(uint32_t index, uint32_t incarnation, host::StoreResult result) {
  Node& n = nodes_[index];
  if (!n.up || n.incarnation != incarnation || !n.host) return;
  if (n.hung_until_ns > loop_.now_ns) {
    // The answer waits in the agent's socket until it runs again.
    if (n.hung_forever) return;
    loop_.queue.PushCall(TimePoint(Duration(n.hung_until_ns)),
                         [this, index, incarnation, result] { DeliverStore(index, incarnation, result); });
    return;
  }
  if (host::StoreEvents* events = n.store.events()) events->OnStoreResult(result);
  coordinators_.Touched(index);  // an answer may hand it the coordinator role, or take it
  log_.SetPhase(index);
}

uint64_t Cluster::RoundEpochOf(uint32_t index) const { return coordinators_.RoundEpochOf(index); }

SimResult Cluster::Run() {
  BuildNodes();
  const RunLimit limit = faults_.Schedule(workers_.world(), min_world_);
  limit_ns_ = limit.limit_ns;
  liveness_limit_ = limit.liveness;
  if (Timeline* timeline = log_.timeline()) {
    timeline->title = fmt::format(
        "{}: {} x {}{}, seed {}", spec_.job.name, Counted(static_cast<size_t>(job_nodes_), "node"),
        Counted(static_cast<size_t>(spec_.cluster.nproc_per_node), "worker"),
        agents_ > job_nodes_ ? ", " + Counted(static_cast<size_t>(agents_ - job_nodes_), "spare") : "",
        options_.seed);
  }
  bool deadlock = false;
  while (!invariants_.violation()) {
    if (loop_.now_ns >= next_quiet_try_ns_) SkipQuietStretch();
    if (loop_.queue.Empty()) {
      deadlock = unfinished_ > 0;
      break;
    }
    if (loop_.queue.NextTime().time_since_epoch().count() > limit_ns_) break;
    const Event event = loop_.queue.Pop();
    loop_.now_ns = event.time_ns;
    Dispatch(event);
    ++stats_.events;
    switch (event.kind) {
      case EventKind::kTimer:
        ++stats_.timer_events;
        break;
      case EventKind::kPump:
        ++stats_.delivery_events;
        break;
      case EventKind::kWorkerReady:
      case EventKind::kWorkerExit:
      case EventKind::kWorkerNotify:
      case EventKind::kTrainingDone:
      case EventKind::kPeerFailure:
      case EventKind::kCollectiveTimeout:
      case EventKind::kStoreConnect:
      case EventKind::kBeacons:
        ++stats_.worker_events;
        break;
      default:
        break;
    }
    if (event.time_ns < stretch_until_ns_ && event.kind != EventKind::kCheck)
      ++stats_.events_inside_stretches;
    if (DrivesHost(event.kind)) coordinators_.Touched(event.node);
    coordinators_.AfterEvent();
    invariants_.AfterEvent(loop_.now_ns);
    if (invariants_.violation()) log_.ReportViolation(invariants_.what());
    stats_.peak_queue = std::max<uint64_t>(stats_.peak_queue, loop_.queue.size());
    if (unfinished_ == 0) break;
  }
  // A computed stretch that reached the run's limit stood for events up to its last beat: the
  // run ends there, as it would have beat by beat.
  loop_.now_ns = std::max(loop_.now_ns, quiet_end_ns_);
  RunEnd end;
  end.deadlock = deadlock;
  end.liveness_limit = liveness_limit_;
  end.limit_ns = limit_ns_;
  end.max_time = spec_.simulate.max_time;
  // A rendezvous that timed out while some node was away owes no start, whatever each fault's
  // length: outages chain (shape swarm seed 114037: eight random crashes of 23 hosts overlapped
  // from 1m46s to 34m04s, through the whole 30-minute rendezvous; seed 115307: an agent hang of
  // 2m17s, then master_port blocked for 1m59s, kept node 46 away to the 5-minute deadline).
  // Away means down or under a fault at the deadline, or so shortly before that a rejoin (a
  // connect retry and the loss bound) could not have made it.
  const int64_t verdict_ns = coordinators_.first_verdict_ns().value_or(stats_.end_ns);
  const int64_t rejoin_ns = (spec_.timeouts.LossBound() + std::chrono::seconds(30)).count();
  end.rendezvous_fault = faults_.rendezvous_fault() || SomeOutageDuring(verdict_ns - rejoin_ns, verdict_ns);
  end.unfinished_count = unfinished_;
  end.stuck_for_good = workers_.RoundStuckForGood();
  end.ended_by_rule = coordinators_.ended_by_rule();
  for (const auto& n : nodes_) {
    if (unfinished_ == 0 || end.unfinished.size() >= 8) break;
    if (n->finished || n->hung_forever || (!n->up && !n->pending_start)) continue;
    end.unfinished.push_back(n->label);
  }
  return Finish(end);
}

bool Cluster::SomeOutageDuring(int64_t from, int64_t to) const {
  auto overlaps = [&](const std::pair<int64_t, int64_t>& span) {
    const int64_t until = span.second < 0 ? std::numeric_limits<int64_t>::max() : span.second;
    return span.first <= to && until >= from;
  };
  return std::any_of(down_.begin(), down_.end(), overlaps) ||
         std::any_of(faults_.outages().begin(), faults_.outages().end(), overlaps);
}

SimResult Cluster::Finish(RunEnd& end) {
  SimResult result;
  // A run cut short (a node still running at the liveness bound) lasted until now, not until
  // the last exit: goodput is over the whole of it (it read 138% once, shape seed 118645).
  if (stats_.end_ns == 0 || unfinished_ > 0) stats_.end_ns = loop_.now_ns;
  workers_.Finish();
  for (const auto& n : nodes_) {
    NodeOutcome outcome;
    outcome.node_rank = n->rank;
    outcome.host = n->host_name;
    outcome.extra = n->extra;
    outcome.spare = n->spare;
    outcome.plays = n->plays;
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
  // The job's outcome is node 0's exit code; without it, what the other nodes agreed on. When
  // any agent may lead node 0 is not the coordinator's, and an agent that started again after
  // the verdict was told (its host rebooted once the job was over) ran a launch of its own,
  // alone: the outcome is what the agents of the job were told.
  const NodeOutcome& first = result.nodes[0];
  const std::optional<int64_t> verdict_ns = coordinators_.first_verdict_ns();
  auto of_the_job = [&](size_t i) {
    return !verdict_ns || nodes_[static_cast<uint32_t>(i)].started_ns < *verdict_ns;
  };
  if (first.state == NodeOutcome::State::kExited && (!coordinators_.AnyAgentLeads() || of_the_job(0))) {
    result.exit_code = first.exit_code;
  } else {
    std::map<int, int> votes;
    for (size_t i = 0; i < result.nodes.size(); ++i) {
      const NodeOutcome& o = result.nodes[i];
      // A spare votes once it played a node rank.
      if (!o.extra && (!o.spare || o.plays >= 0) && o.state == NodeOutcome::State::kExited && of_the_job(i)) {
        ++votes[o.exit_code];
      }
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
  end.exit_code = result.exit_code;
  end.restarts_used = stats_.restarts_used;
  invariants_.AtEnd(loop_.now_ns, end);
  if (invariants_.violation()) log_.ReportViolation(invariants_.what());
  result.violation = invariants_.violation();
  if (result.violation) result.exit_code = 70;
  result.repro = ReproCommand(options_);
  result.replacements = replacements_;
  result.stuck_for_good = end.stuck_for_good && end.unfinished_count > 0;
  if (Timeline* timeline = log_.timeline()) {
    timeline->end_ns = std::max(stats_.end_ns, loop_.now_ns);
    for (auto& row : timeline->segments) {
      if (!row.empty() && row.back().end_ns < 0) row.back().end_ns = timeline->end_ns;
    }
    if (!timeline->training.empty() && timeline->training.back().second < 0) {
      timeline->training.back().second = timeline->end_ns;
    }
  }
  result.stats = stats_;
  return result;
}

// ---------------------------------------------------------------------------------------
// The timeline's phases

NodePhase Cluster::PhaseOf(uint32_t index, int* round) const {
  const Node& n = nodes_[index];
  if (!n.up) return n.started_once ? NodePhase::kDown : NodePhase::kOff;
  if (n.finished) return NodePhase::kDone;
  if (auto working = workers_.PhaseOf(index, round)) return *working;
  if (n.host && n.host->agent().phase() == core::Agent::Phase::kWaiting &&
      (n.host->agent().round() >= 0 || n.spare)) {
    // Between rounds; a spare that joined waits here until it takes a node rank.
    *round = n.host->agent().round();
    return NodePhase::kWaiting;
  }
  return NodePhase::kRendezvous;
}

// ---------------------------------------------------------------------------------------
// Ports

void SimTimer::ArmAt(TimePoint when) { cluster_->ArmTimer(node_, when); }
void SimTimer::Disarm() { cluster_->DisarmTimer(node_); }
void SimTransport::SetEvents(host::TransportEvents* events) { cluster_->SetTransportEvents(node_, events); }
Status SimTransport::Listen(const std::string& addr, uint16_t port) {
  return cluster_->network().Listen(node_, addr, port);
}
ConnId SimTransport::Connect(const std::string& addr, uint16_t port) {
  return cluster_->network().Connect(node_, addr, port);
}
void SimTransport::Send(ConnId conn, std::vector<uint8_t> bytes) {
  cluster_->network().Send(node_, conn, std::move(bytes));
}
void SimTransport::Close(ConnId conn) { cluster_->network().Close(conn); }
uint16_t SimTransport::ReserveStorePort() { return cluster_->network().ReserveStorePort(); }
void SimTransport::SetStoreRelay(uint16_t port) { cluster_->network().SetStoreRelay(node_, port); }
void SimLauncher::SetEvents(host::ProcessEvents* events) { cluster_->SetProcessEvents(node_, events); }
void SimLauncher::Spawn(int round, const core::WorkerLaunch& launch) {
  cluster_->workers().Spawn(node_, round, launch);
}
void SimLauncher::SignalAll(int round, int signal) { cluster_->workers().SignalAll(node_, round, signal); }
void SimLauncher::SignalForStacks(int round, const std::vector<std::pair<int, int>>& targets) {
  cluster_->workers().SignalForStacks(node_, round, targets);
}
std::vector<std::string> SimLauncher::ReadStacks(int round) {
  return cluster_->workers().ReadStacks(node_, round);
}
void SimLauncher::RenewLease(TimePoint kill_at) {
  cluster_->node(node_).lease_kill_at_ns = kill_at.time_since_epoch().count();
}
// Simulated workers beacon straight into the agent (Workers::Beacon); the address only has
// to be non-empty for the agent to set up the contract.
std::string SimLauncher::ProgressAddress() const { return "sim"; }
std::string SimLauncher::ProgressToken() const { return "sim"; }
void SimConsole::Log(core::LogLevel level, std::string_view source, std::string_view text) {
  cluster_->log().ConsoleLog(node_, level, source, text);
}
void SimConsole::Summary(std::string_view text) { cluster_->log().ConsoleSummary(node_, text); }
std::optional<Duration> SimJournal::SinceRoundsMayRun() {
  if (!may_run_since_ns_) return std::nullopt;
  return Duration(cluster_->now_ns() - *may_run_since_ns_);
}
void SimJournal::Record(bool rounds_may_run) {
  if (rounds_may_run) {
    may_run_since_ns_ = cluster_->now_ns();
  } else {
    may_run_since_ns_.reset();
  }
}

std::vector<core::QuarantinedHost> SimJournal::Quarantined() {
  std::vector<core::QuarantinedHost> hosts = quarantined_;
  for (auto& h : hosts) h.left -= Duration(cluster_->now_ns() - quarantined_at_ns_);
  return hosts;
}
void SimJournal::RecordQuarantine(const std::vector<core::QuarantinedHost>& hosts) {
  quarantined_ = hosts;
  quarantined_at_ns_ = cluster_->now_ns();
}

void Cluster::ArmTimer(uint32_t index, TimePoint when) {
  Node& n = nodes_[index];
  // A deadline already due fires now, as a real timer armed in the past does; queued at its own
  // time it would turn virtual time back.
  const int64_t t = std::max(when.time_since_epoch().count(), loop_.now_ns);
  when = TimePoint(Duration(t));
  n.armed_ns = t;
  if (n.queued_ns && *n.queued_ns <= t) return;  // the queued entry fires first and re-arms
  ++n.timer_gen;
  n.queued_ns = t;
  Event event;
  event.kind = EventKind::kTimer;
  event.node = index;
  event.generation = n.timer_gen;
  loop_.queue.Push(when, event);
}

void Cluster::DisarmTimer(uint32_t index) { nodes_[index].armed_ns.reset(); }

}  // namespace ddprun::sim
