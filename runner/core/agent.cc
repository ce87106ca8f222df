// The agent's inputs and deadlines, its messages and its leaving. Its rounds (starting,
// ending and stopping its node's workers) are in agent_round.cc, the link to the coordinator
// (connect, join, prove the secret, lose it) in agent_link.cc, progress beacons and hung ranks
// in agent_progress.cc: methods of the same Agent, kept apart to be read on their own.
#include "runner/core/agent.h"

#include <algorithm>
#include <csignal>

#include <fmt/format.h>

#include "base/assert.h"
#include "base/plural.h"
#include "runner/core/auth.h"
#include "runner/core/exit_code.h"
#include "runner/core/failure.h"
#include "schema/worker_env.h"

namespace ddprun::core {

namespace {

// The line every waiting agent prints: who is missing (each on the host the coordinator
// expects, and why it was refused if it was) and how long is left.
std::string RendezvousProgressLine(const wire::Progress& progress, int nnodes) {
  std::vector<std::string> names;
  for (size_t i = 0; i < progress.missing.size(); ++i) {
    // The agent the coordinator expects for the rank (a spare once it holds it), named as it
    // was started, and its host (issue 37: seed 100506 named the coordinator's own host).
    const int32_t n = progress.missing[i];
    const std::string who = AgentLabel(n, nnodes);
    const std::string host = i < progress.missing_hosts.size() ? progress.missing_hosts[i] : "";
    const std::string why = i < progress.missing_why.size() ? progress.missing_why[i] : "";
    // A node refused for good does not come by itself: say so, not only that we wait.
    const std::string note = why.empty() ? "" : fmt::format("{}refused: {}", host.empty() ? "" : "; ", why);
    names.push_back(host.empty() && note.empty() ? who : fmt::format("{} ({}{})", who, host, note));
  }
  const int missing = progress.total - progress.joined;
  if (missing > static_cast<int>(names.size())) {
    names.push_back(fmt::format("{} more", missing - static_cast<int>(names.size())));
  }
  return fmt::format("{}/{} nodes joined; waiting for {}; {} of {}", progress.joined, progress.total,
                     fmt::join(names, ", "), HumanDuration(Millis(progress.elapsed_ms)),
                     FormatDuration(Millis(progress.timeout_ms)));
}

}  // namespace

Agent::Agent(const JobSpec& spec, Config config)
    : spec_(spec), config_(std::move(config)), retry_delay_(kFirstRetry) {}

void Agent::Start(TimePoint now, std::vector<AgentEffect>& out) {
  rendezvous_deadline_ = now + spec_.timeouts.rendezvous;
  DDPRUN_ASSERT(std::holds_alternative<Connecting>(link_) && !last_input_);  // once, first
  out.push_back(ConnectToMaster{});
  UpdateDeadlines();
}

bool Agent::Connected() const {
  return std::holds_alternative<Joining>(link_) || std::holds_alternative<Joined>(link_);
}

Agent::Phase Agent::phase() const {
  if (Exited()) return Phase::kExited;
  if (std::holds_alternative<Connecting>(link_)) return Phase::kConnecting;
  if (std::holds_alternative<RetryWait>(link_)) return Phase::kRetryWait;
  if (std::holds_alternative<Joining>(link_)) return Phase::kJoining;
  if (IsJoined()) return RoundOpen() ? Phase::kRunning : Phase::kWaiting;
  return running_workers() > 0 ? Phase::kRunning : Phase::kWaiting;  // leaving
}

int Agent::running_workers() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
}

std::string Agent::MasterEndpoint() const {
  if (!coordinator_endpoint_.empty()) return coordinator_endpoint_;
  const bool at = !config_.master_at.empty() && !spec_.rendezvous.Etcd();
  return fmt::format("{}:{}", at ? config_.master_at : spec_.cluster.master_addr, spec_.cluster.master_port);
}

void Agent::Log(LogLevel level, std::string text, std::vector<AgentEffect>& out) const {
  out.push_back(LogLine{level, std::move(text)});
}

void Agent::Send(wire::Message message, std::vector<AgentEffect>& out) {
  if (Connected()) out.push_back(SendToMaster{std::move(message)});
}

void Agent::Handle(TimePoint now, const AgentInput& input, std::vector<AgentEffect>& out) {
  // Time never moves back: the stall measure below and every deadline rely on it (the real
  // driver reads a steady clock, the simulator its virtual one).
  DDPRUN_ASSERT(!last_input_ || now >= *last_input_);
  if (const auto* stretch = std::get_if<AgentQuietStretch>(&input)) return SkipQuiet(*stretch, out);
  Apply(now, input, out);
  // Start and Handle are the only changes of state, so the table is read once per input.
  UpdateDeadlines();
}

void Agent::Apply(TimePoint now, const AgentInput& input, std::vector<AgentEffect>& out) {
  // The driver calls at least every heartbeat; a longer gap is our own stall (SIGSTOP, a VM
  // pause, swap). The workers' beacons of that time wait unread in the socket: the stall is
  // not their silence, so their progress clocks move on by it.
  if (last_input_ && now - *last_input_ > 2 * spec_.timeouts.heartbeat) {
    const Duration stall = now - *last_input_;
    for (Worker& w : workers_) w.beats.since += stall;
    // Nor is the coordinator's silence, while the workers' lease holds: its heartbeats of that
    // time wait unread in the socket too, and the loss deadline would expire before they are
    // read (issue 37: node 0 stopped for 7 s just after its join lost its own coordinator).
    // Past the lease (KillBy counts from the last word heard) the coordinator may have given
    // the workers' ranks away: then the loss stands, and the workers go, as before.
    if (Connected() && now < KillBy()) link_heard_ = std::min(link_heard_ + stall, now);
    if (IsJoined()) {
      echo_awaited_ = ++echoes_sent_;
      Send(wire::Heartbeat{echo_awaited_}, out);
    }
  }
  last_input_ = now;
  ExpireDeadlines(now, out);
  if (Exited()) return;
  if (std::holds_alternative<MasterConnected>(input)) {
    echo_awaited_ = 0;  // what waited through a stall was on the old connection
    // A connection is not a word from the coordinator: the link's silence clock starts, the
    // workers' lease does not move (anything may listen on the port).
    link_heard_ = now;
    next_heartbeat_ = now + spec_.timeouts.heartbeat;
    retry_delay_ = kFirstRetry;
    // While a refused join is retried, each new connection is the same story: said once.
    Log(refused_retrying_ ? LogLevel::kDebug : LogLevel::kInfo,
        fmt::format("connected to the coordinator at {}; joining as node {}", MasterEndpoint(),
                    config_.node_rank),
        out);
    // The first bytes on the master port must be ours, so the relay can tell us from a store
    // client: join at once; a coordinator with a secret answers with a Challenge. With a
    // secret this first join says nothing about the job until the coordinator has proved it
    // knows the secret.
    Enter(Joining{config_.secret.empty(),
                  Sha256Hex(fmt::format("{}:{}", config_.instance, ++connections_)).substr(0, 32)});
    SendJoin("", out);
  } else if (const auto* failed = std::get_if<MasterConnectFailed>(&input)) {
    OnConnectFailed(now, *failed, out);
  } else if (const auto* message = std::get_if<MasterMessage>(&input)) {
    if (!Connected()) return;
    // Only a peer that proved the secret is heard: an impostor's words renew no lease.
    link_heard_ = now;
    // A word read after our own stall may have waited in the socket through it: it keeps the
    // link, never the workers' lease, which the coordinator may have fenced meanwhile (found
    // with the link's clock moving: stale heartbeats read on resume renewed the lease past the
    // fence, sim regression seed 64641). Only the answer to the echo we sent on resuming, and
    // what follows it, is known to be newer. (A window of one heartbeat after resuming, the
    // first fix, depended on how soon a loaded machine let the agent read.)
    bool stale = false;
    if (echo_awaited_ != 0) {
      const auto* beat = std::get_if<wire::Heartbeat>(&message->message);
      stale = beat == nullptr || beat->echo != echo_awaited_;
      if (!stale) echo_awaited_ = 0;
    }
    if (Proven() && !stale) Heard(now, out);
    OnMessage(now, message->message, out);
  } else if (const auto* closed = std::get_if<MasterClosed>(&input)) {
    if (!Connected()) return;
    const bool was_joined = IsJoined();
    Enter(Disconnected{});
    if (leaving()) {
      MaybeStopped(out);
      return;
    }
    OnMasterLost(now, closed->reason.empty() ? "connection closed" : closed->reason, was_joined, out);
  } else if (const auto* exited = std::get_if<WorkerExited>(&input)) {
    OnWorkerExited(now, *exited, out);
  } else if (const auto* spawn_failed = std::get_if<WorkerSpawnFailed>(&input)) {
    OnWorkerExited(now,
                   WorkerExited{spawn_failed->round, spawn_failed->local_rank, 127, 0,
                                "ddprun could not start the worker: " + spawn_failed->error, ""},
                   out);
  } else if (const auto* signal = std::get_if<SignalReceived>(&input)) {
    OnSignal(now, signal->signal, out);
  } else if (const auto* beacon = std::get_if<BeaconReceived>(&input)) {
    OnBeacon(now, beacon->beacon);
  } else if (const auto* stacks = std::get_if<WorkerStacks>(&input)) {
    if (stacks->round == round_) SendStacks(now, stacks->dumps, out);
  } else if (const auto* probed = std::get_if<ProbesDone>(&input)) {
    // To the coordinator that asked; one that was lost meanwhile asks again if it wants to.
    if (IsJoined()) Send(wire::PeersProbed{probed->failures}, out);
  }
  MaybeReconnect(now, out);
}

std::optional<QuietState> Agent::Quiet() const {
  if (Exited() || !IsJoined() || std::holds_alternative<Stopping>(work_) || leaving() ||
      interrupt_deadline_ || (stacks() && stacks()->due) || !last_input_ || echo_awaited_ != 0) {
    return std::nullopt;
  }
  // Its deadlines as of its last input: nothing has moved them since.
  return QuietState{next_heartbeat_, next_other_deadline_, link_heard_};
}

void Agent::SkipQuiet(const AgentQuietStretch& stretch, std::vector<AgentEffect>& out) {
  DDPRUN_ASSERT(Quiet().has_value() && stretch.next_beat >= next_heartbeat_ &&
                stretch.last_input >= *last_input_);
  next_heartbeat_ = stretch.next_beat;
  if (stretch.heard) {
    link_heard_ = *stretch.heard;
    Heard(*stretch.heard, out);
  }
  last_input_ = stretch.last_input;
  // Only the heartbeat's and the loss's deadlines moved: the others are next_other_deadline_.
  next_deadline_ = next_other_deadline_;
  for (const Deadline moved : {Deadline::kHeartbeat, Deadline::kLoss}) {
    const auto at = DeadlineOf(moved);
    if (at && (!next_deadline_ || *at < *next_deadline_)) next_deadline_ = at;
  }
}

void Agent::Heard(TimePoint now, std::vector<AgentEffect>& out) {
  last_heard_ = now;
  // The workers' lease, renewed first: what runs when this agent does not (its guardian) must
  // never hold an older one than the workers this word may start (DESIGN.md section 10).
  out.push_back(RenewLease{KillBy()});
}

std::optional<TimePoint> Agent::DeadlineOf(Deadline deadline) const {
  if (Exited()) return std::nullopt;
  switch (deadline) {
    case Deadline::kKill:
    case Deadline::kGiveUp: {
      const auto* stopping = std::get_if<Stopping>(&work_);
      if (!stopping) return std::nullopt;
      return deadline == Deadline::kKill ? stopping->kill_at : stopping->give_up_at;
    }
    case Deadline::kInterrupt:
      return interrupt_deadline_;
    case Deadline::kHeartbeat:
      if (!Connected()) return std::nullopt;
      return next_heartbeat_;
    case Deadline::kLoss:
      // Lost once silent for more than the loss bound: the first instant past it.
      if (!Connected()) return std::nullopt;
      return link_heard_ + spec_.timeouts.LossBound() + Duration(1);
    case Deadline::kRetry:
      // A node rejoins only once its workers are gone: the coordinator counts on that.
      if (const auto* wait = std::get_if<RetryWait>(&link_); wait && !leaving() && running_workers() == 0) {
        return wait->at;
      }
      return std::nullopt;
    case Deadline::kRendezvous:
      if (leaving()) return std::nullopt;
      if (!IsJoined()) return rendezvous_deadline_;
      // The coordinator owns the rendezvous timeout once we joined; this is the backstop for
      // a coordinator that went quiet before the first round.
      // A job with spares may keep a joined agent waiting as long as it runs.
      if (!standby_ && round_ < 0 && !RoundOpen() && running_workers() == 0) {
        return rendezvous_deadline_ + spec_.timeouts.LossBound() + Seconds(10);
      }
      return std::nullopt;
    case Deadline::kProgress: {
      if (!WatchesProgress()) return std::nullopt;
      std::optional<TimePoint> next;
      for (const Worker& w : workers_) {
        if (!w.running) continue;
        // Hung once silent for longer than allowed: the first instant past it.
        const TimePoint at = w.beats.since + SilenceAllowed(w.beats) + Duration(1);
        if (!next || at < *next) next = at;
      }
      return next;
    }
    case Deadline::kStacks:
      return stacks() ? stacks()->due : std::nullopt;
    case Deadline::kReport: {
      const auto* running = std::get_if<Running>(&work_);
      if (!running || !IsJoined() || leaving()) return std::nullopt;
      return running->next_report;
    }
    case Deadline::kCount:
      break;
  }
  return std::nullopt;
}

bool Agent::Due(Deadline deadline, TimePoint now) const {
  const auto at = DeadlineOf(deadline);
  return at && now >= *at;
}

void Agent::UpdateDeadlines() {
  next_deadline_.reset();
  next_other_deadline_.reset();
  for (int k = 0; k < static_cast<int>(Deadline::kCount); ++k) {
    const auto deadline = static_cast<Deadline>(k);
    const auto at = DeadlineOf(deadline);
    if (!at) continue;
    if (!next_deadline_ || *at < *next_deadline_) next_deadline_ = at;
    const bool beat = deadline == Deadline::kHeartbeat || deadline == Deadline::kLoss;
    if (!beat && (!next_other_deadline_ || *at < *next_other_deadline_)) next_other_deadline_ = at;
  }
}

void Agent::ExpireDeadlines(TimePoint now, std::vector<AgentEffect>& out) {
  // Most inputs find nothing due: the earliest deadline as of the last input says so at once
  // (only a stall of our own moved one since, and it moves them later, never earlier).
  if (!next_deadline_ || now < *next_deadline_) return;
  // In the order of the Deadline enum; each one is looked up again after the actions before it.
  if (Due(Deadline::kKill, now)) {
    // stop_grace after SIGTERM, or sooner when the stop began late (the lease counts from the
    // last word heard): say how long it really was.
    const Duration waited = now - std::get<Stopping>(work_).sigterm_at;
    KillWorkers(
        now,
        fmt::format("still running {} after SIGTERM",
                    waited == spec_.timeouts.stop_grace ? FormatDuration(waited) : HumanDuration(waited)),
        out);
  }
  if (Due(Deadline::kGiveUp, now)) {
    std::get<Stopping>(work_).give_up_at.reset();
    if (running_workers() > 0) {
      Log(LogLevel::kError, "workers did not exit after SIGKILL (stuck in the kernel?); giving up on them",
          out);
      for (Worker& w : workers_) {
        if (w.running) {
          w.running = false;
          w.signal = SIGKILL;
        }
      }
      MaybeStopped(out);
    }
  }
  if (Due(Deadline::kInterrupt, now)) {
    interrupt_deadline_.reset();
    Log(LogLevel::kWarn, "the coordinator did not end the job after the interrupt; exiting", out);
    Enter(Leaving{InterruptedExitCode(interrupted_by_), false});
    MaybeStopped(out);
  }
  if (Due(Deadline::kHeartbeat, now)) {
    // Before the join is acknowledged a heartbeat would be a protocol error.
    if (IsJoined()) Send(wire::Heartbeat{}, out);
    next_heartbeat_ = now + spec_.timeouts.heartbeat;
  }
  if (Due(Deadline::kLoss, now)) {
    const bool was_joined = IsJoined();
    Enter(Disconnected{});
    out.push_back(DisconnectFromMaster{});
    if (leaving()) {
      MaybeStopped(out);
    } else {
      OnMasterLost(now, fmt::format("silent for {} (3 heartbeats)", HumanDuration(now - link_heard_)),
                   was_joined, out);
    }
  }
  if (Due(Deadline::kRetry, now)) MaybeReconnect(now, out);
  if (Due(Deadline::kRendezvous, now)) {
    if (round_ < 0) {
      std::string why = last_connect_error_.empty() ? "no answer from the coordinator" : last_connect_error_;
      // The coordinator refused us, then went away (the job ended without this node): the
      // refusal is why, not the port that no longer answers.
      if (!last_refusal_.empty() && last_refusal_ != why) {
        why = fmt::format("{}\n  (since then: {})", last_refusal_, why);
      }
      out.push_back(PrintSummary{
          fmt::format("rendezvous failed: node {} could not join the coordinator at {} within "
                      "timeouts.rendezvous = {}\n  last error: {}",
                      config_.node_rank, MasterEndpoint(), FormatDuration(spec_.timeouts.rendezvous), why)});
    } else {
      out.push_back(PrintSummary{fmt::format(
          "node {} lost the coordinator at {} and could not rejoin within timeouts.rendezvous = {}"
          "\n  last error: {}",
          config_.node_rank, MasterEndpoint(), FormatDuration(spec_.timeouts.rendezvous),
          last_connect_error_.empty() ? "no answer" : last_connect_error_)});
    }
    Finish(now, ToInt(ExitCode::kRendezvous), out);
  }
  if (Due(Deadline::kProgress, now)) OnProgressExpired(now, out);
  if (Due(Deadline::kStacks, now)) {
    stacks()->due.reset();
    out.push_back(ReadStacks{round_});
  }
  if (Due(Deadline::kReport, now)) Report(now, out);
}

void Agent::OnMessage(TimePoint now, const wire::Message& message, std::vector<AgentEffect>& out) {
  if (!Proven()) {
    OnUnproven(now, message, out);
    return;
  }
  if (std::holds_alternative<wire::Challenge>(message)) {
    // A proven peer (or any peer on an open channel) that challenges: only a coordinator with
    // a secret does that, and this node has none. Once joined it is a confused peer: ignored.
    if (!config_.secret.empty() || !std::holds_alternative<Joining>(link_)) return;
    out.push_back(
        PrintSummary{fmt::format("the coordinator at {} requires a shared secret and this node has none\n"
                                 "hint: set the same DDPRUN_SECRET (or DDPRUN_SECRET_FILE) on every node",
                                 MasterEndpoint())});
    Finish(now, ToInt(ExitCode::kRendezvous), out);
  } else if (std::holds_alternative<wire::JoinAck>(message) && !std::holds_alternative<Joining>(link_)) {
    return;  // a second JoinAck on one connection: nothing to do
  } else if (const auto* ack = std::get_if<wire::JoinAck>(&message)) {
    // Agents connect only once their workers are gone, so nothing of a round is open here.
    DDPRUN_ASSERT(std::holds_alternative<Idle>(work_) && running_workers() == 0);
    Enter(Joined{});
    refused_retrying_ = false;
    last_refusal_.clear();
    standby_ = ack->standby;
    const bool spare = config_.node_rank >= spec_.cluster.nnodes;
    Log(LogLevel::kInfo,
        spare ? fmt::format("spare {} joined; it waits to take the node rank of a node that is lost",
                            config_.node_rank - spec_.cluster.nnodes)
        : spec_.cluster.nnodes == 1
            ? fmt::format("node {} joined", config_.node_rank)
            : fmt::format("node {} joined; waiting for the other nodes", config_.node_rank),
        out);
  } else if (const auto* reject = std::get_if<wire::Reject>(&message)) {
    if (!reject->retry || IsJoined()) {
      out.push_back(PrintSummary{"the coordinator refused this node: " + reject->reason});
      Finish(now, ToInt(ExitCode::kRendezvous), out);
      return;
    }
    // Refused for now (its rank looks taken): ask again until the rendezvous timeout.
    last_refusal_ = "the coordinator refused this node: " + reject->reason;
    RetryLater(now, last_refusal_, std::max(spec_.timeouts.heartbeat, kMaxRetry), refused_retrying_, out);
    refused_retrying_ = true;
  } else if (const auto* progress = std::get_if<wire::Progress>(&message)) {
    Log(LogLevel::kInfo, RendezvousProgressLine(*progress, spec_.cluster.nnodes), out);
  } else if (const auto* probe = std::get_if<wire::ProbePeers>(&message)) {
    out.push_back(ProbeEndpoints{probe->targets});
  } else if (const auto* start = std::get_if<wire::StartRound>(&message)) {
    StartWorkers(now, *start, out);
  } else if (const auto* dump = std::get_if<wire::DumpStacks>(&message)) {
    OnDumpStacks(now, *dump, out);
  } else if (const auto* cleared = std::get_if<wire::HangCleared>(&message)) {
    OnHangCleared(*cleared, out);
  } else if (const auto* stop = std::get_if<wire::StopRound>(&message)) {
    if (stop->round != round_) return;  // stale
    std::string cause = stop->cause;
    if (stop->last) {
      // The job's summary follows with the traceback; one copy of it is enough.
      cause = cause.substr(0, cause.find('\n'));
    }
    while (!cause.empty() && cause.back() == '\n') cause.pop_back();
    Log(LogLevel::kError, fmt::format("round {} failed: {}", stop->round, cause), out);
    out.push_back(RootCauseKnown{stop->round, stop->cause_rank, stop->cause_lost_peer});
    StopWorkers(now, out);
    MaybeStopped(out);
  } else if (const auto* end = std::get_if<wire::JobEnd>(&message)) {
    out.push_back(PrintSummary{end->summary});
    interrupt_deadline_.reset();  // the coordinator did end the job, as an interrupt asked
    // The exit code comes off the network: a process can only exit with 0..255. Found by the
    // core fuzzer (an agent exited with -2105375998).
    Leaving leave{end->exit_code, /*ack=*/true};
    if (end->exit_code < 0 || end->exit_code > 255) {
      Log(LogLevel::kError,
          fmt::format("the coordinator sent exit code {}, which no process can exit with; exiting "
                      "with {} (internal error)",
                      end->exit_code, ToInt(ExitCode::kInternal)),
          out);
      leave.code = ToInt(ExitCode::kInternal);
    }
    Enter(leave);
    StopWorkers(now, out);
    MaybeStopped(out);
  }
}

void Agent::OnSignal(TimePoint now, int signal, std::vector<AgentEffect>& out) {
  if (interrupted_by_ != 0) {
    Log(LogLevel::kWarn, fmt::format("second {}: killing workers now", SignalName(signal)), out);
    if (running_workers() > 0) out.push_back(SignalWorkers{round_, SIGKILL});
    return;
  }
  interrupted_by_ = signal;
  Log(LogLevel::kWarn, fmt::format("received {}; stopping the job on every node", SignalName(signal)), out);
  StopWorkers(now, out);
  if (IsJoined()) {
    Send(wire::Interrupted{signal}, out);
    interrupt_deadline_ = now + spec_.timeouts.ExitBarrier();
  } else {
    Enter(Leaving{InterruptedExitCode(signal), false});
  }
  MaybeStopped(out);
}

namespace {

// The link's changes, from (row) to (column), in Link order: a connect joins or fails and is
// retried; a join is acknowledged, refused (retried) or lost; whatever the link, the agent may
// leave (Disconnected), and a lost link waits to connect again.
constexpr bool kLinkEdges[5][5] = {
    // Connecting RetryWait Joining Joined Disconnected
    {false, true, true, false, true},   // Connecting
    {true, false, false, false, true},  // RetryWait
    {false, true, false, true, true},   // Joining
    {false, true, false, false, true},  // Joined
    {false, true, false, false, true},  // Disconnected
};

}  // namespace

void Agent::Enter(Link next) {
  static_assert(std::variant_size_v<Link> == 5);
  DDPRUN_ASSERT(kLinkEdges[link_.index()][next.index()]);
  link_ = std::move(next);
}

namespace {

// The life's changes, in Life order: an agent leaves, may leave again (with the code of what
// made it leave last: Finish after a JobEnd), and is gone once no worker runs.
constexpr bool kLifeEdges[3][3] = {
    // Staying Leaving Gone
    {false, true, false},   // Staying
    {false, true, true},    // Leaving
    {false, false, false},  // Gone
};

}  // namespace

void Agent::Enter(Life next) {
  static_assert(std::variant_size_v<Life> == 3);
  DDPRUN_ASSERT(kLifeEdges[life_.index()][next.index()]);
  life_ = std::move(next);
}

std::optional<int> Agent::exit_code() const {
  if (const auto* gone = std::get_if<Gone>(&life_)) return gone->code;
  return std::nullopt;
}

void Agent::Finish(TimePoint now, int code, std::vector<AgentEffect>& out) {
  Enter(Leaving{code, leaving() && leaving()->ack});  // a JobEnd heard is still acknowledged
  if (Connected()) out.push_back(DisconnectFromMaster{});
  Enter(Disconnected{});
  StopWorkers(now, out);  // a no-op when a stop is already under way or nothing runs
  MaybeStopped(out);
}

}  // namespace ddprun::core
