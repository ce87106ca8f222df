#include "runner/host/node_host.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "base/assert.h"
#include "schema/worker_env.h"

namespace ddprun::host {

namespace {

// The agents' effect buffers of every host in this process (thread): a host's inputs never
// nest, so one or two are in use at a time, and each keeps its capacity from input to input.
// A buffer per host would hold a kilobyte or more per host (an effect is 264 bytes): 16 MB in
// the simulator's 16,384 hosts.
class PooledAgentEffects {
 public:
  PooledAgentEffects() {
    std::vector<std::vector<core::AgentEffect>>& pool = Pool();
    if (!pool.empty()) {
      buffer = std::move(pool.back());
      pool.pop_back();
    }
  }
  ~PooledAgentEffects() {
    buffer.clear();
    Pool().push_back(std::move(buffer));
  }
  PooledAgentEffects(const PooledAgentEffects&) = delete;
  PooledAgentEffects& operator=(const PooledAgentEffects&) = delete;

  std::vector<core::AgentEffect> buffer;

 private:
  static std::vector<std::vector<core::AgentEffect>>& Pool() {
    thread_local std::vector<std::vector<core::AgentEffect>> pool;
    return pool;
  }
};

// The worker contract's address and token come from the launcher, which owns the socket.
core::Agent::Config WithProgress(core::Agent::Config config, const ProcessLauncher& launcher) {
  if (config.progress_addr.empty()) {
    config.progress_addr = launcher.ProgressAddress();
    config.progress_token = launcher.ProgressToken();
  }
  return config;
}

/// A failed probe in the words of the probe's summary: what the system said and what it means.
std::string ProbeError(core::ConnectError error, const std::string& detail) {
  switch (error) {
    case core::ConnectError::kRefused:
      return "connection refused (a firewall rejects it)";
    case core::ConnectError::kTimedOut:
      return "timed out (a firewall drops it)";
    case core::ConnectError::kUnreachable:
      return "unreachable (no route to it)";
    default:
      return detail;
  }
}

// What a peer that has not joined may cost node 0 (issue 36): frames no larger than a Join of
// this job can be (its canonical form twice over, for a node whose file differs, plus room for
// the rest), and all such peers' undecoded bytes together at most kUnprovenBudget; over it, the
// one holding the most is dropped. The real transport also caps their number (asio_transport).
constexpr uint32_t kUnprovenFrameBase = 64 * 1024;
constexpr size_t kUnprovenBudget = 16u << 20;

}  // namespace

NodeHost::NodeHost(const JobSpec& spec, core::Agent::Config config, Ports ports,
                   std::function<void(int)> on_exit)
    : spec_(spec),
      ports_(ports),
      on_exit_(std::move(on_exit)),
      agent_(spec, WithProgress(config, *ports.launcher)),
      recorder_(spec, config, ports.events) {
  DDPRUN_ASSERT(ports_.clock && ports_.timer && ports_.transport && ports_.launcher && ports_.console);
  unproven_frame_limit_ = static_cast<uint32_t>(
      std::min<size_t>(wire::kMaxPayload, kUnprovenFrameBase + 2 * config.canonical.size()));
  CoordinatorRole::Listener listener;
  listener.found = [this](const CoordinatorAt& at) {
    if (!awaiting_coordinator_) return;
    awaiting_coordinator_ = false;
    ConnectTo(at);
  };
  listener.lookup_failed = [this](const std::string& why) {
    if (!awaiting_coordinator_) return;
    awaiting_coordinator_ = false;
    RunAgent(core::MasterConnectFailed{core::ConnectError::kStore, why});
  };
  listener.lead = [this] { Lead(); };
  listener.step_down = [this](const std::string& why) { StepDown(why); };
  listener.committed = [this](int round) { RunCoordinator(core::RoundCommitted{round}); };
  listener.end_recorded = [this] { RunCoordinator(core::EndRecorded{}); };
  listener.flushed = [this] { MaybeFinish(); };
  // The one place the backend is chosen: with etcd whichever agent holds the role runs the
  // coordinator, on its own host's address; without, node 0 does, on master_addr.
  if (ports_.store) {
    std::string addr = config.master_at.empty() ? spec.cluster.HostOf(config.node_rank) : config.master_at;
    role_ = std::make_unique<ElectedRole>(spec, config.fingerprint, config.node_rank, std::move(addr),
                                          *ports_.store, std::move(listener));
    ports_.store->SetEvents(this);
  } else {
    role_ = std::make_unique<StaticRole>(spec, config.node_rank, config.master_at, ports_.journal,
                                         std::move(listener));
  }
  if (role_->HeldFromStart()) {
    coordinator_ = std::make_unique<core::Coordinator>(spec, config.canonical, ports_.clock->Now());
    role_->Seat(*coordinator_);
    // The instance is the driver's randomness; it seeds the challenge nonces.
    if (!config.secret.empty()) coordinator_->RequireSecret(config.secret, config.instance);
  }
  ports_.transport->SetEvents(this);
  ports_.launcher->SetEvents(this);
}

NodeHost::~NodeHost() {
  ports_.timer->Disarm();
  if (ports_.store) ports_.store->SetEvents(nullptr);
  ports_.transport->SetEvents(nullptr);
  ports_.launcher->SetEvents(nullptr);
}

Status NodeHost::Start() {
  recorder_.Started(ports_.clock->Now());
  if (coordinator_) {
    const Status listening = ports_.transport->Listen(role_->ListenAddr(), spec_.cluster.master_port);
    if (!listening) return listening;
    if (Inherit(ports_.clock->Now())) RunCoordinator(core::Tick{});
  }
  start_effects_.clear();
  agent_.Start(ports_.clock->Now(), start_effects_);
  // RunAgent executes the start effects (left in start_effects_) with those of a no-op input.
  RunAgent(core::Tick{});
  return {};
}

void NodeHost::OnTimer() {
  RunAgent(core::Tick{});
  if (coordinator_) RunCoordinator(core::Tick{});
  if (!finished_ && role_->OnTick(ports_.clock->Now()) && !finished_) Rearm();
}

void NodeHost::OnStoreResult(const StoreResult& result) {
  if (finished_) return;
  role_->OnStoreResult(ports_.clock->Now(), result);
  if (!finished_) Rearm();
}

void NodeHost::ConnectTo(const CoordinatorAt& at) {
  if (!at.endpoint.empty()) agent_.SetCoordinatorEndpoint(at.endpoint);
  if (master_conn_) ports_.transport->Close(*master_conn_);
  master_conn_ = ports_.transport->Connect(at.host, at.port);
}

void NodeHost::Lead() {
  const TimePoint now = ports_.clock->Now();
  if (!listening_) {
    const Status listening = ports_.transport->Listen(role_->ListenAddr(), spec_.cluster.master_port);
    if (!listening) {
      ports_.console->Log(core::LogLevel::kError, "coordinator",
                          fmt::format("this agent holds the coordinator role but cannot listen: {}; "
                                      "letting it go",
                                      listening.error()));
      role_->Resign(now);
      return;
    }
    listening_ = true;
  }
  // The job's canonical form and the secret are the agent's (one copy per host: the simulator
  // holds thousands of hosts).
  const core::Agent::Config& config = agent_.config();
  coordinator_ = std::make_unique<core::Coordinator>(spec_, config.canonical, now);
  coordinator_done_ = false;
  role_->Seat(*coordinator_);
  if (!config.secret.empty()) coordinator_->RequireSecret(config.secret, config.instance);
  ports_.console->Log(core::LogLevel::kInfo, "coordinator",
                      fmt::format("this agent holds the coordinator role now ({}); it plays node rank 0, "
                                  "and {} is every round's MASTER_ADDR",
                                  role_->Holding(), role_->ListenAddr()));
  Inherit(now);
  RunCoordinator(core::Tick{});
}

bool NodeHost::Inherit(TimePoint now) {
  // Whoever kept the record, the coordinator starts from it the same way.
  const Inheritance from = role_->Inherited();
  if (from.workers_may_run_since) {
    coordinator_->AfterUncleanEnd(now, *from.workers_may_run_since, coordinator_effects_, from.earlier);
  }
  if (from.job) coordinator_->TakeOver(now, *from.job, coordinator_effects_);
  if (!from.quarantined.empty()) coordinator_->RestoreQuarantine(from.quarantined, coordinator_effects_);
  return from.workers_may_run_since || from.job || !from.quarantined.empty();
}

void NodeHost::StepDown(const std::string& why) {
  if (!coordinator_) return;
  ports_.console->Log(core::LogLevel::kWarn, "coordinator",
                      fmt::format("this agent no longer holds the coordinator role: {}; closing its "
                                  "agents' connections (they stop their workers and look for the "
                                  "new holder)",
                                  why));
  std::vector<ConnId> accepted;
  for (const auto& [conn, decoder] : decoders_) {
    if (conn != master_conn_) accepted.push_back(conn);
  }
  std::sort(accepted.begin(), accepted.end());  // the simulator replays this order
  for (ConnId conn : accepted) {
    ports_.transport->Close(conn);
    decoders_.erase(conn);
    ForgetUnproven(conn);
  }
  ports_.transport->SetStoreRelay(0);
  coordinator_.reset();
  coordinator_done_ = false;
  MaybeFinish();
  if (!finished_) Rearm();
}

void NodeHost::OnSignal(int signal) { RunAgent(core::SignalReceived{signal}); }

void NodeHost::OnAccepted(ConnId conn, std::string peer_addr) {
  if (!coordinator_) {
    // Stepped down: nobody here answers; the agent looks the holder up again.
    ports_.transport->Close(conn);
    return;
  }
  decoders_[conn].SetFrameLimit(unproven_frame_limit_);
  Unproven(conn, 0);
  RunCoordinator(core::PeerAccepted{conn, std::move(peer_addr)});
}

void NodeHost::Unproven(ConnId conn, size_t buffered) {
  auto [it, added] = unproven_.try_emplace(conn, 0);
  unproven_bytes_ = unproven_bytes_ - it->second + buffered;
  it->second = buffered;
  while (unproven_bytes_ > kUnprovenBudget) {
    // The peer holding the most undecoded bytes goes first (the oldest of equals): a real
    // agent's Join is decoded as soon as it is whole, so it holds little for long.
    auto largest = unproven_.begin();
    for (auto at = unproven_.begin(); at != unproven_.end(); ++at) {
      if (at->second > largest->second) largest = at;
    }
    const ConnId dropped = largest->first;
    const std::string why = fmt::format(
        "peers that have not joined hold more than {} MiB of unfinished frames; dropping the one holding the "
        "most ({} bytes)",
        kUnprovenBudget >> 20, largest->second);
    ports_.console->Log(core::LogLevel::kWarn, "coordinator",
                        fmt::format("dropping connection {}: {}", dropped, why));
    ports_.transport->Close(dropped);
    OnClosed(dropped, why);
  }
}

void NodeHost::Proven(ConnId conn) {
  ForgetUnproven(conn);
  auto decoder = decoders_.find(conn);
  if (decoder != decoders_.end()) decoder->second.SetFrameLimit(wire::kMaxPayload);
  ports_.transport->Trust(conn);
}

void NodeHost::ForgetUnproven(ConnId conn) {
  auto it = unproven_.find(conn);
  if (it == unproven_.end()) return;
  unproven_bytes_ -= it->second;
  unproven_.erase(it);
}

void NodeHost::OnConnected(ConnId conn) {
  if (probe_conns_.count(conn) > 0) {
    ports_.transport->Close(conn);
    ProbeAnswered(conn, "");
    return;
  }
  if (conn != master_conn_) return;
  decoders_[conn] = wire::Decoder{};
  RunAgent(core::MasterConnected{});
}

void NodeHost::OnConnectFailed(ConnId conn, core::ConnectError error, std::string detail) {
  if (probe_conns_.count(conn) > 0) {
    ProbeAnswered(conn, ProbeError(error, detail));
    return;
  }
  if (conn != master_conn_) return;
  master_conn_.reset();
  RunAgent(core::MasterConnectFailed{error, std::move(detail)});
}

void NodeHost::ProbeAnswered(ConnId conn, const std::string& error) {
  auto it = probe_conns_.find(conn);
  if (!error.empty()) probe_failures_.push_back(wire::ProbeFailure{it->second, error});
  probe_conns_.erase(it);
  if (!probe_conns_.empty()) return;
  // In the order of the targets, whatever order the answers came in (the simulator replays it).
  std::sort(probe_failures_.begin(), probe_failures_.end(),
            [](const wire::ProbeFailure& a, const wire::ProbeFailure& b) {
              return a.target.node_rank < b.target.node_rank;
            });
  RunAgent(core::ProbesDone{std::exchange(probe_failures_, {})});
}

void NodeHost::OnData(ConnId conn, std::span<const uint8_t> bytes) {
  auto it = decoders_.find(conn);
  if (it == decoders_.end()) return;
  it->second.Feed(bytes);
  const bool from_master = conn == master_conn_;
  for (;;) {
    wire::Message message;
    // Look the decoder up again: handling a message may close this connection.
    it = decoders_.find(conn);
    if (it == decoders_.end()) return;
    const auto status = it->second.Next(message);
    if (status == wire::Decoder::Status::kNeedMore) {
      if (unproven_.count(conn) > 0) Unproven(conn, it->second.buffered());
      return;
    }
    if (status == wire::Decoder::Status::kError) {
      const std::string why = "protocol error: " + it->second.error();
      ports_.console->Log(core::LogLevel::kWarn, from_master ? "agent" : "coordinator",
                          fmt::format("dropping connection {}: {}", conn, why));
      ports_.transport->Close(conn);
      OnClosed(conn, why);
      return;
    }
    if (from_master) {
      RunAgent(core::MasterMessage{std::move(message)});
    } else if (coordinator_) {
      RunCoordinator(core::PeerMessage{conn, std::move(message)});
      if (unproven_.count(conn) > 0 && coordinator_ && coordinator_->Joined(conn)) Proven(conn);
    }
  }
}

void NodeHost::OnClosed(ConnId conn, std::string reason) {
  decoders_.erase(conn);
  ForgetUnproven(conn);
  if (conn == master_conn_) {
    master_conn_.reset();
    RunAgent(core::MasterClosed{std::move(reason)});
  } else if (coordinator_) {
    RunCoordinator(core::PeerClosed{conn, std::move(reason)});
  }
}

void NodeHost::OnWorkerExited(const core::WorkerExited& exited) { RunAgent(exited); }

void NodeHost::OnWorkerSpawnFailed(const core::WorkerSpawnFailed& failed) { RunAgent(failed); }

void NodeHost::OnBeacon(const core::Beacon& beacon) { RunAgent(core::BeaconReceived{beacon}); }

void NodeHost::RunAgent(const core::AgentInput& input) {
  if (finished_) return;
  // Effects left by Start() are executed first (they were produced without an input). The
  // buffer is pooled and keeps its capacity: no allocation per message at scale. Ports never
  // call back before returning, so this is never reentered.
  PooledAgentEffects pooled;
  std::vector<core::AgentEffect>& effects = pooled.buffer;
  if (!start_effects_.empty()) {
    effects = std::move(start_effects_);
    start_effects_ = {};
  }
  const TimePoint now = ports_.clock->Now();
  recorder_.AgentInput(now, input, agent_);
  agent_.Handle(now, input, effects);
  if (agent_.phase() == core::Agent::Phase::kWaiting || agent_.phase() == core::Agent::Phase::kRunning) {
    role_->TookPart(now);
  }
  for (size_t i = 0; i < effects.size(); ++i) {
    auto& effect = effects[i];
    recorder_.AgentEffect(now, effect);
    if (std::holds_alternative<core::ConnectToMaster>(effect)) {
      if (master_conn_) {
        ports_.transport->Close(*master_conn_);
        decoders_.erase(*master_conn_);
        master_conn_.reset();
      }
      // Answered by ConnectTo (at once when the address is known: the job file's, or this
      // agent holds the role), or by a connect failure the agent retries.
      awaiting_coordinator_ = true;
      role_->Lookup(now);
    } else if (auto* send = std::get_if<core::SendToMaster>(&effect)) {
      if (master_conn_) ports_.transport->Send(*master_conn_, wire::Encode(send->message));
    } else if (std::holds_alternative<core::DisconnectFromMaster>(effect)) {
      if (master_conn_) {
        ports_.transport->Close(*master_conn_);
        decoders_.erase(*master_conn_);
        master_conn_.reset();
      }
    } else if (auto* spawn = std::get_if<core::SpawnWorkers>(&effect)) {
      for (const auto& launch : spawn->workers) ports_.launcher->Spawn(spawn->round, launch);
    } else if (auto* signal = std::get_if<core::SignalWorkers>(&effect)) {
      ports_.launcher->SignalAll(signal->round, signal->signal);
    } else if (auto* ask = std::get_if<core::SignalForStacks>(&effect)) {
      ports_.launcher->SignalForStacks(ask->round, ask->targets);
    } else if (auto* read = std::get_if<core::ReadStacks>(&effect)) {
      // The answer is an input like any other; its effects join this batch (`effect` may
      // dangle after the vector grows: nothing below uses it).
      core::WorkerStacks stacks{read->round, ports_.launcher->ReadStacks(read->round)};
      recorder_.AgentInput(now, stacks, agent_);
      agent_.Handle(now, stacks, effects);
      continue;
    } else if (auto* probe = std::get_if<core::ProbeEndpoints>(&effect)) {
      // A probe still in flight (the coordinator asked again) is forgotten: its answer would
      // mix two probes.
      for (const auto& [conn, target] : probe_conns_) ports_.transport->Close(conn);
      probe_conns_.clear();
      probe_failures_.clear();
      for (const wire::ProbeTarget& target : probe->targets) {
        const auto [host, port] = SplitEndpoint(target.endpoint);
        probe_conns_.emplace(ports_.transport->Connect(host, port), target);
      }
      if (probe_conns_.empty()) {
        core::ProbesDone done;
        recorder_.AgentInput(now, done, agent_);
        agent_.Handle(now, done, effects);
      }
    } else if (auto* log = std::get_if<core::LogLine>(&effect)) {
      ports_.console->Log(log->level, "agent", log->text);
    } else if (auto* summary = std::get_if<core::PrintSummary>(&effect)) {
      ports_.console->Summary(summary->text);
    } else if (auto* exit = std::get_if<core::AgentExit>(&effect)) {
      agent_exit_ = exit->code;
    } else if (auto* lease = std::get_if<core::RenewLease>(&effect)) {
      ports_.launcher->RenewLease(lease->kill_at);
    } else if (auto* cause = std::get_if<core::RootCauseKnown>(&effect)) {
      ports_.launcher->RootCauseKnown(cause->round, cause->cause_rank, cause->provisional);
    }
  }
  effects.clear();
  recorder_.AgentDone(now);
  MaybeFinish();
  if (!finished_) Rearm();
}

void NodeHost::RunCoordinator(const core::CoordinatorInput& input) {
  if (finished_ || !coordinator_) return;
  std::vector<core::CoordinatorEffect>& effects = coordinator_effects_;  // as in RunAgent
  const TimePoint now = ports_.clock->Now();
  coordinator_->Handle(now, input, effects);
  bool give_up = false;
  for (size_t i = 0; i < effects.size(); ++i) {
    auto& effect = effects[i];
    recorder_.CoordinatorEffect(now, effect);
    if (auto* send = std::get_if<core::SendTo>(&effect)) {
      ports_.transport->Send(send->conn, wire::Encode(send->message));
    } else if (auto* close = std::get_if<core::CloseConn>(&effect)) {
      ports_.transport->Close(close->conn);
      decoders_.erase(close->conn);
      ForgetUnproven(close->conn);
    } else if (auto* reserve = std::get_if<core::ReserveStorePort>(&effect)) {
      const uint16_t port = ports_.transport->ReserveStorePort();
      ports_.transport->SetStoreRelay(port);
      // The answer is an input like any other; its effects join this batch.
      coordinator_->Handle(now, core::StorePortReady{reserve->round, port}, effects);
    } else if (auto* log = std::get_if<core::LogLine>(&effect)) {
      ports_.console->Log(log->level, "coordinator", log->text);
    } else if (auto* record = std::get_if<core::RecordWorkers>(&effect)) {
      role_->RecordWorkers(now, record->rounds_may_run);
    } else if (auto* quarantine = std::get_if<core::RecordQuarantine>(&effect)) {
      role_->RecordQuarantine(now, quarantine->hosts);
    } else if (auto* commit = std::get_if<core::CommitRound>(&effect)) {
      // A keeper that recorded it at once answers in this batch, like the store port above.
      const int round = commit->round;
      if (role_->Commit(now, *commit)) {
        coordinator_->Handle(now, core::RoundCommitted{round}, effects);
      }
    } else if (auto* restart = std::get_if<core::RecordRestart>(&effect)) {
      role_->RecordRestart(now, restart->next_round, restart->restarts_used, restart->workers_may_run);
    } else if (auto* end = std::get_if<core::RecordEnd>(&effect)) {
      if (role_->RecordEnd(now, end->exit_code, end->summary))
        coordinator_->Handle(now, core::EndRecorded{}, effects);
    } else if (auto* observed = std::get_if<core::Observed>(&effect)) {
      if (ports_.observer) ports_.observer->Observe(now, observed->what);
      // A revised root cause is the same failure: the clock counts from the round's first.
      const auto* failed = std::get_if<core::observed::RoundFailed>(&observed->what);
      if (failed && failure_round_seen_ != failed->round) {
        failure_round_seen_ = failed->round;
        failure_seen_at_ = now;
      }
    } else if (std::holds_alternative<core::GiveUpRole>(effect)) {
      give_up = true;  // once the refusals above are on their way
    } else if (std::holds_alternative<core::CoordinatorDone>(effect)) {
      coordinator_done_ = true;
      ports_.transport->SetStoreRelay(0);
      // Every agent heard the end, or the exit barrier passed: a new launch starts afresh.
      role_->RecordDone(now);
    }
  }
  effects.clear();
  if (give_up) {
    // Only an elected holder gives the role up (Coordinator::WeighOtherFile): revoked at once,
    // so that the agents it refused find no holder and campaign.
    role_->Resign(now);
    StepDown("the job file of this host is outnumbered by another one");
    return;
  }
  MaybeFinish();
  if (!finished_) Rearm();
}

NodeMetrics NodeHost::Metrics() const {
  const TimePoint now = ports_.clock->Now();
  NodeMetrics metrics;
  metrics.job = spec_.job.name;
  metrics.agent = agent_.Metrics(now);
  if (coordinator_) {
    metrics.coordinator = coordinator_->Metrics();
    if (failure_seen_at_) metrics.since_last_failure = now - *failure_seen_at_;
  }
  return metrics;
}

std::optional<NodeHost::Quiet> NodeHost::QuietNow() const {
  if (finished_ || !role_->Quiet() || agent_exit_ || !master_conn_ || !probe_conns_.empty())
    return std::nullopt;
  const auto agent = agent_.Quiet();
  if (!agent) return std::nullopt;
  Quiet quiet{*agent, *master_conn_, std::nullopt, role_->NextDeadline()};
  if (coordinator_) {
    quiet.coordinator = coordinator_->QuietNow();
    if (!quiet.coordinator) return std::nullopt;
  }
  return quiet;
}

bool NodeHost::SkipQuiet(const core::AgentQuietStretch& agent,
                         const std::optional<core::CoordinatorQuietStretch>& coordinator) {
  DDPRUN_ASSERT(coordinator.has_value() == (coordinator_ != nullptr));
  const TimePoint now = ports_.clock->Now();
  PooledAgentEffects pooled;
  std::vector<core::AgentEffect>& effects = pooled.buffer;
  agent_.Handle(now, agent, effects);
  for (const core::AgentEffect& effect : effects) {
    if (const auto* lease = std::get_if<core::RenewLease>(&effect))
      ports_.launcher->RenewLease(lease->kill_at);
  }
  effects.clear();
  bool recorded = false;
  if (coordinator) {
    std::vector<core::CoordinatorEffect>& out = coordinator_effects_;
    coordinator_->Handle(now, *coordinator, out);
    for (const core::CoordinatorEffect& effect : out) {
      if (const auto* record = std::get_if<core::RecordWorkers>(&effect)) {
        role_->RecordWorkers(now, record->rounds_may_run);
        recorded = recorded || record->rounds_may_run;
      }
    }
    out.clear();
  }
  Rearm();
  return recorded;
}

void NodeHost::Rearm() {
  std::optional<TimePoint> next = agent_.NextDeadline();
  if (coordinator_) {
    // Also after the job ended: the coordinator still answers agents that rejoin late.
    auto c = coordinator_->NextDeadline();
    if (c && (!next || *c < *next)) next = c;
  }
  if (auto r = role_->NextDeadline(); r && (!next || *r < *next)) next = r;
  if (next) {
    ports_.timer->ArmAt(*next);
  } else {
    ports_.timer->Disarm();
  }
}

void NodeHost::MaybeFinish() {
  if (finished_ || !agent_exit_) return;
  if (coordinator_ && !coordinator_done_) return;        // node 0 stays until the exit barrier passes
  if (!role_->LetGoOnExit(ports_.clock->Now())) return;  // the record, then the role, go first
  finished_ = true;
  ports_.timer->Disarm();
  if (master_conn_) {
    ports_.transport->Close(*master_conn_);
    master_conn_.reset();
  }
  on_exit_(*agent_exit_);
}

}  // namespace ddprun::host
