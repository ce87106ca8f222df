// The coordinator's phases, deadlines and round lifecycle. Its parts: who is let in
// (admission.h), who plays (placement.h, with the quarantine book), the connections' liveness
// (links.h), hung ranks and stragglers (hang_watch.h), and what it says (coordinator_text.h).
#include "runner/core/coordinator.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/assert.h"
#include "base/plural.h"
#include "runner/core/admission.h"
#include "runner/core/auth.h"
#include "runner/core/coordinator_text.h"
#include "runner/core/exit_code.h"
#include "runner/core/failure.h"
#include "schema/canonical.h"
#include "schema/duration.h"

namespace ddprun::core {

std::string_view LossReasonName(LossReason reason) {
  switch (reason) {
    case LossReason::kClosed:
      return "closed";
    case LossReason::kSilent:
      return "silent";
    case LossReason::kReconnected:
      return "reconnected";
    case LossReason::kProtocolError:
      return "protocol-error";
    case LossReason::kNoStopConfirmation:
      return "no-stop-confirmation";
  }
  return "closed";
}

Coordinator::Coordinator(const JobSpec& spec, std::string canonical, TimePoint start)
    : spec_(spec),
      canonical_(std::move(canonical)),
      fingerprint_(FingerprintOfCanonical(canonical_)),
      state_(OpenRendezvous(start, spec.timeouts.rendezvous)),
      roster_(spec, start),
      placement_(spec, roster_),
      hangs_(spec, roster_),
      absence_origin_(start),
      next_heartbeat_(start + spec.timeouts.heartbeat),
      last_input_(start) {
  static_assert(std::variant_size_v<State> == static_cast<size_t>(Phase::kDone) + 1);
}

void Coordinator::AfterUncleanEnd(TimePoint now, Duration since, std::vector<CoordinatorEffect>& out,
                                  std::string_view previous) {
  DDPRUN_ASSERT(phase() == Phase::kRendezvous && round_ == 0);
  const TimePoint until = now - since + spec_.timeouts.LeaseBound();
  if (until <= now) return;
  journal_fence_ = until;
  fence_cause_ =
      fmt::format("{} ended without ending the job (its host crashed or its process was killed)", previous);
  out.push_back(LogLine{LogLevel::kWarn, fmt::format("{} did not end it ({} ago it recorded that workers may "
                                                     "run): the first round waits until {} after that record",
                                                     previous, HumanDuration(since),
                                                     HumanDuration(spec_.timeouts.LeaseBound()))});
}

void Coordinator::PlaceRankZero(int agent, std::string addr) {
  master_addr_ = std::move(addr);
  own_agent_ = agent;
  elected_ = true;
  us_ = fmt::format("the coordinator (host {})", master_addr_);
  roster_.PlaceRankZero(agent);
}

void Coordinator::TakeOver(TimePoint now, const JobRecord& record, std::vector<CoordinatorEffect>& out) {
  const std::string holder = record.holder.empty() ? "the previous coordinator" : record.holder;
  DDPRUN_ASSERT(phase() == Phase::kRendezvous && round_ == 0);
  round_ = record.next_round;
  restarts_used_ = record.restarts_used;
  // Every node of the job may have run the last round: the verdict waits for them, and any of
  // them may hear it (the earlier holder knew their instances; this one does not).
  // A job that ended and was settled (done) waits for nobody: the others heard it and left.
  if (!record.done) {
    for (int agent : roster_.holders()) roster_.at(agent).ever_joined = true;
  }
  took_over_ = true;
  if (record.exit_code) {
    out.push_back(
        LogLine{LogLevel::kWarn,
                record.done ? fmt::format("the job ended (exit code {}, recorded by {}) while this agent was "
                                          "away; telling it the verdict",
                                          *record.exit_code, holder)
                            : fmt::format("the job had ended (exit code {}) when {} was lost; telling "
                                          "every agent the verdict again",
                                          *record.exit_code, holder)});
    EndJob(now, *record.exit_code, record.summary, out);
    return;
  }
  out.push_back(
      LogLine{LogLevel::kWarn, fmt::format("taking over the job from {}: round {} next, {} of {} restarts "
                                           "used",
                                           holder, round_, restarts_used_, spec_.restart.max_restarts)});
  if (!record.round_may_run) {
    if (record.workers_may_run) {
      // The previous holder counted the failed round, but a node of it was lost and its
      // workers never confirmed stopped; that holder would have fenced their rank.
      journal_fence_ = now + spec_.timeouts.LeaseBound();
      fence_cause_ = fmt::format("round {} lost a node whose workers {} never saw stop", round_ - 1, holder);
    }
    return;
  }
  RoundFailure failure;
  failure.round = round_ - 1;
  // The agent that held the role (its logs are where to look); an old record names none.
  failure.node_rank =
      record.holder_agent >= 0 && record.holder_agent < roster_.agents() ? record.holder_agent : 0;
  failure.what = fmt::format("the coordinator ({}) was lost while round {} ran", holder, round_ - 1);
  failure.detail = fmt::format(
      "  its etcd lease (rendezvous.lease = {}) ended: its host died, its agent "
      "was killed, or it was cut off from etcd\n",
      FormatDuration(spec_.rendezvous.lease));
  failure.explains_silence = true;
  failure.kinds = {FailureKind::Of(FailureKind::Type::kLostNode)};
  // The old round's workers stop within their agents' lease of their last word from the old
  // coordinator, which was before now.
  journal_fence_ = now + spec_.timeouts.LeaseBound();
  fence_cause_ =
      fmt::format("the previous coordinator ({}) was lost while round {} ran", holder, failure.round);
  // The round may have ended before its coordinator could record how (issue 37: etcd without a
  // majority just as the job finished): its agents say so when they rejoin, and until the
  // fence passes no round could start anyway.
  unjudged_ = Unjudged{std::move(failure), record.round_nodes, {}, *journal_fence_};
  if (record.round_nodes <= 0) {
    JudgeLostRound(now, out);
    return;
  }
  out.push_back(LogLine{
      LogLevel::kInfo, fmt::format("round {} was never judged: waiting up to {} for its {} to rejoin and say "
                                   "whether their workers exited 0",
                                   round_ - 1, HumanDuration(spec_.timeouts.LeaseBound()),
                                   Counted(static_cast<size_t>(record.round_nodes), "node"))});
}

void Coordinator::OnRoundReport(TimePoint now, const wire::Join& join, std::vector<CoordinatorEffect>& out) {
  if (!unjudged_ || join.ran_round != unjudged_->failure.round) return;
  if (!join.ran_ok) {
    // Its workers were stopped, or one failed: the round did not end on its own.
    unjudged_->failure.detail += fmt::format("  {} says its workers of round {} did not all exit 0\n",
                                             roster_.NodeName(join.node_rank), unjudged_->failure.round);
    JudgeLostRound(now, out);
    return;
  }
  if (join.ran_as < 0 || join.ran_as >= unjudged_->nodes) return;
  // One node rank per agent: an agent that says it finished two (a confused or lying peer)
  // counts for the first only.
  for (const auto& [rank, agent] : unjudged_->finished) {
    if (agent == join.node_rank && rank != join.ran_as) return;
  }
  unjudged_->finished.emplace(join.ran_as, join.node_rank);
  if (static_cast<int>(unjudged_->finished.size()) < unjudged_->nodes) return;
  const int round = unjudged_->failure.round;
  const size_t nodes = static_cast<size_t>(unjudged_->nodes);
  unjudged_.reset();
  out.push_back(
      LogLine{LogLevel::kInfo,
              fmt::format("round {} ended before its coordinator could record it: every one of its {} "
                          "says its workers exited 0",
                          round, Counted(nodes, "node"))});
  EndJob(now, ToInt(ExitCode::kOk),
         fmt::format(
             "job \"{}\" succeeded: {} on {} exited 0 in round {} ({} restart{} used)\n  its coordinator "
             "was lost before it could record the end; the agents said so when they rejoined the next "
             "one{}",
             spec_.job.name, AllOf(nodes * static_cast<size_t>(spec_.cluster.nproc_per_node), "rank"),
             Counted(nodes, "node"), round, restarts_used_, restarts_used_ == 1 ? "" : "s",
             earlier_causes_.empty() ? "" : "\n" + EarlierCausesNote(earlier_causes_)),
         out);
}

void Coordinator::JudgeLostRound(TimePoint now, std::vector<CoordinatorEffect>& out) {
  RoundFailure failure = std::move(unjudged_->failure);
  unjudged_.reset();
  last_failure_ = failure;
  const std::string never = NeverRestartRule(spec_, failure);
  const bool restart = never.empty() && restarts_used_ < spec_.restart.max_restarts;
  out.push_back(Observed{observed::RoundFailed{failure.round, 0, -1, failure.kinds, failure.what, !restart}});
  if (restart) {
    ++restarts_used_;
    out.push_back(
        LogLine{LogLevel::kError, fmt::format("round {} failed: {}; restart {} of {}", failure.round,
                                              failure.what, restarts_used_, spec_.restart.max_restarts)});
    // The round that was lost was never stopped by this coordinator: no backoff of its own.
    out.push_back(Observed{observed::RestartSpent{restarts_used_, round_, Duration::zero()}});
    MaybeStartRound(now, out);
    return;
  }
  ended_by_rule_ = !never.empty();
  EndJob(
      now, ToInt(ExitCode::kJobFailed),
      FailureText(spec_, failure,
                  {0, 0, never, restarts_used_, hangs_.StragglerNote(), placement_.book().Note(last_input_),
                   roster_.NodeName(failure.node_rank), EarlierCausesNote(earlier_causes_)}),
      out);
}

void Coordinator::RequireSecret(std::string secret, uint64_t nonce_seed) {
  secret_ = std::move(secret);
  nonce_seed_ = nonce_seed;
}

void Coordinator::RestoreQuarantine(const std::vector<QuarantinedHost>& hosts,
                                    std::vector<CoordinatorEffect>& out) {
  placement_.Restore(hosts, last_input_, out);
}

bool Coordinator::WorkersMayRun(const AgentSlot& slot) const {
  return slot.plays >= 0 && (phase() == Phase::kStarting || phase() == Phase::kRunning ||
                             (phase() == Phase::kStopping && !slot.stopped));
}

void Coordinator::SetSlotConn(int agent, std::optional<ConnId> conn, TimePoint now) {
  AgentSlot& slot = roster_.at(agent);
  if (slot.conn.has_value() != conn.has_value()) ProgressChanged(now);
  if (auto* stopping = std::get_if<Stopping>(&state_); stopping && slot.stopped) {
    stopping->stopped_joined += (conn ? 1 : 0) - (slot.conn ? 1 : 0);
  }
  // Fencing: a node lost while its workers may run keeps its rank until its lease has run
  // out; its own agent stops them within that time (DESIGN.md section 10).
  if (slot.conn && !conn && WorkersMayRun(slot)) {
    const TimePoint until = now + spec_.timeouts.LeaseBound();
    if (!slot.fence) {
      slot.fence = AgentSlot::Fence{until, slot.instance};
    } else {
      // An earlier holder's fence still stands: both agents' workers may run, and only the
      // later lease's end frees the rank whoever rejoins.
      slot.fence->until = std::max(slot.fence->until, until);
      if (slot.fence->holder != slot.instance) slot.fence->holder = 0;
    }
  }
  if (slot.conn && !conn) slot.absent_since = now;
  if (conn) slot.absent_since.reset();
  roster_.SetConn(agent, conn);
}

void Coordinator::Handle(TimePoint now, const CoordinatorInput& input, std::vector<CoordinatorEffect>& out) {
  // The silence index (Links) relies on inputs in time order.
  DDPRUN_ASSERT(now >= last_input_);
  if (const auto* stretch = std::get_if<CoordinatorQuietStretch>(&input)) return SkipQuiet(*stretch, out);
  ExpireDeadlines(now, out);
  last_input_ = now;
  Apply(now, input, out);
  links_.Trim();
}

void Coordinator::Apply(TimePoint now, const CoordinatorInput& input, std::vector<CoordinatorEffect>& out) {
  // A finished coordinator still answers: an agent that lost it before the end (a pause, a
  // partition) rejoins and must learn the verdict instead of waiting for an answer.
  if (const auto* accepted = std::get_if<PeerAccepted>(&input)) {
    links_.Accept(accepted->conn, accepted->peer_addr, now);
  } else if (const auto* message = std::get_if<PeerMessage>(&input)) {
    OnMessage(now, message->conn, message->message, out);
  } else if (const auto* closed = std::get_if<PeerClosed>(&input)) {
    const Links::Conn* conn = links_.Find(closed->conn);
    if (!conn) return;
    const int agent = conn->node_rank;
    if (agent < 0 && conn->hello_rank >= 0) OnChallengeUnanswered(*conn, out);
    links_.Erase(closed->conn);
    if (agent >= 0 && roster_.at(agent).conn == closed->conn) {
      const std::string why = closed->reason.empty() ? "connection closed" : closed->reason;
      ObserveLoss(agent, LossReason::kClosed, why, out);
      SetSlotConn(agent, std::nullopt, now);
      OnNodeLost(now, agent, why, out);
    }
  } else if (const auto* port = std::get_if<StorePortReady>(&input)) {
    if (phase() != Phase::kStarting || port->round != round_) return;  // stale answer
    BeginRound(port->port, out);
  } else if (std::holds_alternative<EndRecorded>(input)) {
    auto* ending = std::get_if<Ending>(&state_);
    if (!ending || !ending->awaiting_record) return;
    ending->awaiting_record = false;
    out.push_back(Observed{observed::JobEnded{*exit_code_, restarts_used_, end_summary_, ended_by_rule_}});
    Broadcast(wire::JobEnd{*exit_code_, end_summary_}, out);
    MaybeDone(out);
  } else if (const auto* committed = std::get_if<RoundCommitted>(&input)) {
    auto* starting = std::get_if<Starting>(&state_);
    if (!starting || committed->round != round_ || !starting->awaiting_commit) return;
    starting->awaiting_commit = false;
    ReserveOrBegin(out);
  }
}

// ---- Deadlines ----------------------------------------------------------------------------

std::optional<TimePoint> Coordinator::DeadlineOf(Deadline deadline) const {
  // Done: only connections from late agents remain; a silent one is dropped like any other.
  if (phase() == Phase::kDone && deadline != Deadline::kSilence) return std::nullopt;
  const auto* rendezvous = std::get_if<Rendezvous>(&state_);
  // With every node joined only the fence gate is left to wait for.
  const bool open_rendezvous = rendezvous && !rendezvous->gate;
  switch (deadline) {
    case Deadline::kHeartbeat:
      return next_heartbeat_;
    case Deadline::kSilence: {
      // Lost once silent for more than the loss bound: the first instant past it.
      const auto oldest = links_.OldestHeard();
      if (!oldest) return std::nullopt;
      return *oldest + spec_.timeouts.LossBound() + Duration(1);
    }
    case Deadline::kRoundGate:
      return rendezvous ? rendezvous->gate : std::nullopt;
    case Deadline::kReplace:
      return open_rendezvous ? placement_.replace_at() : std::nullopt;
    case Deadline::kRendezvous:
      // The rendezvous timeout is for nodes that do not come: none is missing once every
      // node rank has a connected agent (the round may still wait for a spare or a fence).
      if (!open_rendezvous || roster_.PositionsFilled()) return std::nullopt;
      return rendezvous->deadline;
    case Deadline::kRendezvousProgress:
      return open_rendezvous ? std::optional<TimePoint>(rendezvous->next_progress) : std::nullopt;
    case Deadline::kReach: {
      const auto* starting = std::get_if<Starting>(&state_);
      return starting && starting->reach ? std::optional<TimePoint>(starting->reach->until) : std::nullopt;
    }
    case Deadline::kHangProbe:
      return phase() == Phase::kRunning ? hangs_.DeadlineOf(HangWatch::Deadline::kProbe) : std::nullopt;
    case Deadline::kStragglers:
      return phase() == Phase::kRunning ? hangs_.DeadlineOf(HangWatch::Deadline::kStragglers) : std::nullopt;
    case Deadline::kStopWait: {
      const auto* stopping = std::get_if<Stopping>(&state_);
      return stopping ? std::optional<TimePoint>(stopping->give_up) : std::nullopt;
    }
    case Deadline::kBackoff: {
      const auto* backoff = std::get_if<Backoff>(&state_);
      return backoff ? std::optional<TimePoint>(backoff->until) : std::nullopt;
    }
    case Deadline::kEndBarrier: {
      const auto* ending = std::get_if<Ending>(&state_);
      return ending ? std::optional<TimePoint>(ending->barrier) : std::nullopt;
    }
    case Deadline::kUnjudged:
      return unjudged_ ? std::optional<TimePoint>(unjudged_->until) : std::nullopt;
    case Deadline::kCount:
      break;
  }
  return std::nullopt;
}

bool Coordinator::Due(Deadline deadline, TimePoint now) const {
  const auto at = DeadlineOf(deadline);
  return at && now >= *at;
}

std::optional<TimePoint> Coordinator::NextDeadline() const {
  std::optional<TimePoint> next;
  for (int k = 0; k < static_cast<int>(Deadline::kCount); ++k) {
    const auto at = DeadlineOf(static_cast<Deadline>(k));
    if (at && (!next || *at < *next)) next = at;
  }
  return next;
}

void Coordinator::ExpireDeadlines(TimePoint now, std::vector<CoordinatorEffect>& out) {
  const Duration loss_bound = spec_.timeouts.LossBound();
  if (phase() != Phase::kDone && now - last_input_ > loss_bound) OnStalled(now, now - last_input_, out);
  // Most inputs find nothing due: one pass over the table says so.
  if (const auto next = NextDeadline(); !next || now < *next) return;
  // In the order of the Deadline enum; each one is looked up again after the actions before it.
  if (Due(Deadline::kHeartbeat, now)) {
    if (record_running_) out.push_back(RecordWorkers{true});
    Broadcast(wire::Heartbeat{}, out);
    next_heartbeat_ = now + spec_.timeouts.heartbeat;
  }
  // Checked on every input, not on a heartbeat grid: a peer is lost the moment it has been
  // silent for more than 3 heartbeats (the agent uses the same bound), not up to a beat later.
  if (Due(Deadline::kSilence, now)) {
    for (const auto& [heard, id] : links_.TakeSilent(now, loss_bound)) {
      const Links::Conn* conn = links_.Find(id);
      if (!conn) continue;
      const int agent = conn->node_rank;
      const std::string why = fmt::format("silent for {} (3 heartbeats)", HumanDuration(now - heard));
      Drop(now, id, LossReason::kSilent, why, out);
      if (agent >= 0 && phase() != Phase::kDone) OnNodeLost(now, agent, why, out);
    }
  }
  if (Due(Deadline::kRoundGate, now)) MaybeStartRound(now, out);
  if (Due(Deadline::kReplace, now)) {
    placement_.ForgetReplaceAt();
    MaybeStartRound(now, out);
  }
  if (Due(Deadline::kRendezvous, now)) {
    EndJob(now, ToInt(ExitCode::kRendezvous), RendezvousFailureText(spec_, roster_), out);
  }
  if (Due(Deadline::kRendezvousProgress, now)) {
    SendProgress(now, out);
  }
  if (Due(Deadline::kReach, now)) FinishReach(now, out);
  if (Due(Deadline::kHangProbe, now)) StopForHang(now, out);
  if (Due(Deadline::kStragglers, now)) hangs_.CheckStragglers(now, round_, out);
  if (Due(Deadline::kStopWait, now)) {
    for (int agent = 0; agent < roster_.agents(); ++agent) {
      const AgentSlot& slot = roster_.at(agent);
      if (!slot.conn || slot.stopped) continue;
      out.push_back(LogLine{
          LogLevel::kWarn,
          fmt::format("{} did not confirm that its workers stopped; dropping it", roster_.NodeName(agent))});
      Drop(now, *slot.conn, LossReason::kNoStopConfirmation,
           fmt::format("it did not confirm within {} that its workers stopped",
                       HumanDuration(spec_.timeouts.ExitBarrier())),
           out);
    }
    MaybeFinishStop(now, out);
  }
  if (Due(Deadline::kBackoff, now)) {
    Enter(OpenRendezvous(now, spec_.timeouts.rendezvous));
    absence_origin_ = now;
    MaybeStartRound(now, out);
  }
  if (Due(Deadline::kEndBarrier, now)) {
    out.push_back(LogLine{LogLevel::kWarn, "exit barrier expired before every node confirmed"});
    // The journal keeps its last record: a node that never confirmed may still run its
    // workers until its lease ends, and the next coordinator here waits for that.
    Finish(out);
  }
  if (Due(Deadline::kUnjudged, now)) JudgeLostRound(now, out);
}

// ---- What the agents say ------------------------------------------------------------------

void Coordinator::OnMessage(TimePoint now, ConnId conn_id, const wire::Message& message,
                            std::vector<CoordinatorEffect>& out) {
  const Links::Conn* conn = links_.Find(conn_id);
  if (!conn) return;  // already dropped
  links_.Heard(conn_id, now);
  const int agent = conn->node_rank;

  if (const auto* join = std::get_if<wire::Join>(&message)) {
    if (agent >= 0) return;  // a second join on one connection: ignore
    OnJoin(now, conn_id, *join, out);
    return;
  }
  if (agent < 0) {
    // Only a join may come first; anything else is a confused or hostile peer.
    out.push_back(LogLine{LogLevel::kWarn, fmt::format("dropping {}: sent {} before joining", conn->peer_addr,
                                                       wire::MessageName(message))});
    Drop(now, conn_id, LossReason::kProtocolError, "", out);
    return;
  }
  AgentSlot& slot = roster_.at(agent);
  if (phase() == Phase::kDone && !std::holds_alternative<wire::JobEndAck>(message)) return;

  if (const auto* failed = std::get_if<wire::WorkerFailed>(&message)) {
    if (failed->round != round_ || slot.plays < 0) return;  // stale, or runs nothing
    if (phase() == Phase::kRunning) {
      BeginStop(now, WorkerFailure(roster_, agent, *failed), out);
    } else if (const auto* stopping = std::get_if<Stopping>(&state_);
               stopping && stopping->failure.lost_peer) {
      // The first failure only lost a peer; a rank that raised on its own before the stop
      // reached it (agents report those too) is the better root cause.
      RoundFailure later = WorkerFailure(roster_, agent, *failed);
      if (!later.lost_peer && !later.the_stop) ReviseRootCause(std::move(later), out);
    }
  } else if (const auto* done = std::get_if<wire::NodeDone>(&message)) {
    if (phase() != Phase::kRunning || done->round != round_ || slot.plays < 0) return;
    OnNodeDone(now, slot, out);
  } else if (const auto* stopped = std::get_if<wire::RoundStopped>(&message)) {
    // The first confirmation counts: an agent whose own failure stopped its node confirms
    // unasked, then confirms the StopRound that crossed it with 0 workers left to stop.
    if (phase() != Phase::kStopping || stopped->round != round_ || slot.stopped) return;
    MarkStopped(slot, stopped->stopped);
    MaybeFinishStop(now, out);
  } else if (const auto* interrupted = std::get_if<wire::Interrupted>(&message)) {
    if (phase() == Phase::kEnding) return;
    EndJob(now, InterruptedExitCode(interrupted->signal),
           fmt::format("job \"{}\" interrupted: {} received {}; every node stops its workers "
                       "(SIGTERM, SIGKILL after stop_grace = {}) before it exits",
                       spec_.job.name, roster_.NodeName(agent), SignalName(interrupted->signal),
                       FormatDuration(spec_.timeouts.stop_grace)),
           out);
  } else if (std::holds_alternative<wire::JobEndAck>(message)) {
    SettleEnd(slot);
    MaybeDone(out);
  } else if (const auto* beat = std::get_if<wire::Heartbeat>(&message)) {
    // last_heard is already updated; an agent that ran again after a stall asks for an echo
    if (beat->echo != 0) out.push_back(SendTo{conn_id, wire::Heartbeat{beat->echo}});
  } else if (const auto* hung = std::get_if<wire::RankHung>(&message)) {
    if (phase() == Phase::kRunning && hangs_.OnRankHung(now, round_, agent, *hung, out)) {
      out.push_back(Observed{observed::HangProbed{round_}});
      Broadcast(wire::DumpStacks{round_}, out);
    }
  } else if (const auto* stacks = std::get_if<wire::RankStacks>(&message)) {
    if (hangs_.OnRankStacks(round_, agent, *stacks, roster_.connected())) {
      StopForHang(now, out);
    }
  } else if (const auto* progress = std::get_if<wire::RankProgress>(&message)) {
    if (phase() == Phase::kRunning) hangs_.OnRankProgress(now, round_, agent, *progress);
  } else if (const auto* probed = std::get_if<wire::PeersProbed>(&message)) {
    OnPeersProbed(now, agent, *probed, out);
  } else {
    out.push_back(LogLine{LogLevel::kWarn, fmt::format("dropping {}: unexpected {} from an agent",
                                                       roster_.NodeName(agent), wire::MessageName(message))});
    Drop(now, conn_id, LossReason::kProtocolError, fmt::format("it sent {}", wire::MessageName(message)),
         out);
    OnNodeLost(now, agent, "protocol error", out);
  }
}

void Coordinator::OnStalled(TimePoint now, Duration stall, std::vector<CoordinatorEffect>& out) {
  // Our own process did not run for longer than the loss bound (SIGSTOP, a VM pause, swap):
  // every peer looks silent, but the silence is ours. Give each connection a fresh loss bound
  // instead of blaming the nodes; the agents that lost us meanwhile close their connections
  // and rejoin. A running round cannot survive it: the other nodes stopped their workers.
  links_.HearAll(now);
  // Nor is anyone's absence ours: the clocks that give an absent node's rank away
  // (timeouts.replace) do not count the time we did not run.
  for (AgentSlot& slot : roster_.slots()) {
    if (slot.absent_since) slot.absent_since = std::min(*slot.absent_since + stall, now);
  }
  absence_origin_ = std::min(absence_origin_ + stall, now);
  const std::string& host = roster_.at(0).host;
  const std::string what = fmt::format(
      "node 0 ({}) stalled for {}: its agent and the coordinator did not run "
      "(the process was stopped or paused: SIGSTOP, a VM pause, swapping, a stuck "
      "file system), so every other node lost the coordinator",
      host.empty() ? "the master" : host, HumanDuration(stall));
  if (phase() == Phase::kStarting || phase() == Phase::kRunning) {
    RoundFailure failure;
    failure.round = round_;
    failure.node_rank = 0;
    failure.what = what;
    failure.detail = "  the other nodes stop their workers when they lose the coordinator\n";
    failure.explains_silence = true;
    failure.kinds = {FailureKind::Of(FailureKind::Type::kStall)};
    BeginStop(now, std::move(failure), out);
  } else {
    out.push_back(LogLine{LogLevel::kWarn, what});
  }
}

void Coordinator::OnNodeLost(TimePoint now, int agent, const std::string& why,
                             std::vector<CoordinatorEffect>& out) {
  AgentSlot& slot = roster_.at(agent);
  SetSlotConn(agent, std::nullopt, now);
  slot.left = why;
  if (auto* rendezvous = std::get_if<Rendezvous>(&state_); rendezvous && !roster_.PositionsFilled()) {
    rendezvous->gate.reset();  // the round waits for the node again, not for the gate
  }
  const auto left = [&] {
    out.push_back(LogLine{LogLevel::kWarn, fmt::format("{} left: {}", roster_.NodeName(agent), why)});
  };
  if (slot.plays < 0 && (phase() == Phase::kStarting || phase() == Phase::kRunning)) {
    // A waiting spare (or a node that sits out a smaller round) ran nothing: the round goes on.
    left();
    return;
  }
  switch (phase()) {
    case Phase::kRendezvous:
      left();
      // With spares or shrinking, the round may go on without it after timeouts.replace:
      // that deadline is set by looking again.
      MaybeStartRound(now, out);
      break;
    case Phase::kBackoff:
      left();
      break;
    case Phase::kStarting:
    case Phase::kRunning: {
      RoundFailure failure;
      failure.round = round_;
      failure.node_rank = agent;
      failure.what = fmt::format("{} was lost: {}", roster_.NodeName(agent), why);
      failure.explains_silence = true;
      failure.kinds = {FailureKind::Of(FailureKind::Type::kLostNode)};
      failure.detail =
          "  its agent stopped answering; its workers are stopped by its agent (or "
          "died with it)\n";
      BeginStop(now, std::move(failure), out);
      break;
    }
    case Phase::kStopping:
      MaybeFinishStop(now, out);
      break;
    case Phase::kEnding:
      // Told and gone: it heard the verdict (or died). One that never heard it is still away.
      if (slot.end == AgentSlot::EndState::kTold) SettleEnd(slot);
      MaybeDone(out);
      break;
    case Phase::kDone:
      break;
  }
}

void Coordinator::ObserveLoss(int agent, LossReason reason, std::string detail,
                              std::vector<CoordinatorEffect>& out) const {
  // After the end an agent that goes has heard the verdict (or never will): not a loss.
  if (phase() == Phase::kEnding || phase() == Phase::kDone) return;
  out.push_back(Observed{observed::NodeLost{agent, reason, std::move(detail)}});
}

void Coordinator::Drop(TimePoint now, ConnId conn_id, LossReason reason, std::string detail,
                       std::vector<CoordinatorEffect>& out) {
  const Links::Conn* conn = links_.Find(conn_id);
  if (!conn) return;
  const int agent = conn->node_rank;
  if (agent >= 0 && roster_.at(agent).conn == conn_id) {
    ObserveLoss(agent, reason, std::move(detail), out);
    SetSlotConn(agent, std::nullopt, now);
  }
  links_.Erase(conn_id);
  out.push_back(CloseConn{conn_id});
}

}  // namespace ddprun::core
