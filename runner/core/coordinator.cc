#include "runner/core/coordinator.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/assert.h"
#include "runner/core/auth.h"
#include "runner/core/exit_code.h"
#include "runner/core/failure.h"
#include "schema/canonical.h"
#include "schema/worker_env.h"

namespace ddprun::core {
namespace {

// How often waiting agents hear who is missing. Per node this is a fixed rate, so the
// coordinator's traffic stays linear in the node count.
constexpr Duration kProgressInterval = Seconds(5);
// Progress names at most this many missing nodes; the count says the rest.
constexpr size_t kMaxMissingNamed = 16;

int64_t ToMillis(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }


// `stderr_tail` without the Python traceback that `error_text` (the error file's traceback)
// already shows: from the last "Traceback (most recent call last):" through the error's last
// line. Unchanged when the two do not share that traceback.
std::string WithoutTraceback(const std::string& stderr_tail, const std::string& error_text) {
  std::string last_line = error_text;
  while (!last_line.empty() && (last_line.back() == '\n' || last_line.back() == ' ')) last_line.pop_back();
  last_line = last_line.substr(last_line.rfind('\n') == std::string::npos ? 0 : last_line.rfind('\n') + 1);
  if (last_line.empty()) return stderr_tail;
  const size_t begin = stderr_tail.rfind("Traceback (most recent call last):");
  if (begin == std::string::npos || (begin > 0 && stderr_tail[begin - 1] != '\n')) return stderr_tail;
  const size_t end_line = stderr_tail.find(last_line, begin);
  if (end_line == std::string::npos) return stderr_tail;
  size_t end = stderr_tail.find('\n', end_line);
  end = end == std::string::npos ? stderr_tail.size() : end + 1;
  std::string rest = stderr_tail.substr(0, begin) + stderr_tail.substr(end);
  if (rest.find_first_not_of(" \n") == std::string::npos) return "";
  return rest;
}

// One "\n  key: node N has X, node 0 has Y" line per field that differs, the same for a refused
// join and a code_check warning; advisory keys are named as the user knows them ("code.…").
std::string DifferenceLines(const std::string& ours, const std::string& theirs, int node_rank) {
  std::string lines;
  for (const auto& d : DiffCanonical(ours, theirs)) {
    const bool advisory = d.key.rfind(kAdvisoryPrefix, 0) == 0;
    lines += fmt::format("\n  {}: node {} has {}, node 0 has {}",
                         advisory ? d.key.substr(kAdvisoryPrefix.size()) : d.key, node_rank,
                         d.theirs, d.ours);
  }
  return lines;
}

}  // namespace

Coordinator::Coordinator(const JobSpec& spec, std::string canonical, TimePoint start)
    : spec_(spec),
      canonical_(std::move(canonical)),
      fingerprint_(FingerprintOfCanonical(canonical_)),
      slots_(static_cast<size_t>(spec.cluster.Agents())),
      rendezvous_started_(start),
      absence_origin_(start),
      rendezvous_deadline_(start + spec.timeouts.rendezvous),
      next_progress_(start + kProgressInterval),
      next_heartbeat_(start + spec.timeouts.heartbeat),
      phase_deadline_(start) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].host = spec.cluster.HostOf(static_cast<int>(i));
  }
  for (int p = 0; p < spec.cluster.nnodes; ++p) {
    slot_at_.push_back(p);
    slots_[static_cast<size_t>(p)].position = p;
    slots_[static_cast<size_t>(p)].absent_since = start;
  }
  last_input_ = start;
}

void Coordinator::AfterUncleanEnd(TimePoint now, Duration since, std::vector<CoordinatorEffect>& out,
                                  std::string_view previous) {
  DDPRUN_ASSERT(phase_ == Phase::kRendezvous && round_ == 0);
  const TimePoint until = now - since + spec_.timeouts.LeaseBound();
  if (until <= now) return;
  journal_fence_ = until;
  fence_cause_ = fmt::format("{} ended without ending the job (its host crashed or its process was "
                             "killed)",
                             previous);
  out.push_back(LogLine{LogLevel::kWarn,
                        fmt::format("{} did not end it ({} ago it recorded that workers may "
                                    "run): the first round waits until {} after that record",
                                    previous, HumanDuration(since), HumanDuration(spec_.timeouts.LeaseBound()))});
}

void Coordinator::PlaceRankZero(int agent, std::string addr) {
  DDPRUN_ASSERT(agent >= 0 && agent < static_cast<int>(slots_.size()));
  master_addr_ = std::move(addr);
  Slot& self = slots_[static_cast<size_t>(agent)];
  if (self.position == 0) return;
  Slot& zero = slots_[static_cast<size_t>(slot_at_[0])];
  // The agent that held node rank 0 takes this agent's place: its node rank, or the bench.
  zero.position = self.position;
  if (self.position > 0) slot_at_[static_cast<size_t>(self.position)] = slot_at_[0];
  self.position = 0;
  slot_at_[0] = agent;
  self.absent_since = zero.absent_since;
  if (zero.position < 0) zero.absent_since.reset();
}

void Coordinator::TakeOver(TimePoint now, const Legacy& legacy, std::vector<CoordinatorEffect>& out) {
  DDPRUN_ASSERT(phase_ == Phase::kRendezvous && round_ == 0);
  round_ = legacy.next_round;
  restarts_used_ = legacy.restarts_used;
  // Every node of the job may have run the last round: the verdict waits for them, and any of
  // them may hear it (the earlier holder knew their instances; this one does not).
  for (int slot : slot_at_) slots_[static_cast<size_t>(slot)].ever_joined = true;
  took_over_ = true;
  if (legacy.exit_code) {
    out.push_back(LogLine{LogLevel::kWarn,
                          fmt::format("the job had ended (exit code {}) when {} was lost; telling "
                                      "every agent the verdict again",
                                      *legacy.exit_code, legacy.holder)});
    EndJob(now, *legacy.exit_code, legacy.summary, out);
    return;
  }
  out.push_back(LogLine{LogLevel::kWarn,
                        fmt::format("taking over the job from {}: round {} next, {} of {} restarts "
                                    "used",
                                    legacy.holder, round_, restarts_used_, spec_.restart.max_restarts)});
  if (!legacy.round_may_run) {
    if (legacy.workers_may_run) {
      // The previous holder counted the failed round, but a node of it was lost and its
      // workers never confirmed stopped; that holder would have fenced their rank.
      journal_fence_ = now + spec_.timeouts.LeaseBound();
      fence_cause_ = fmt::format("round {} lost a node whose workers {} never saw stop", round_ - 1,
                                 legacy.holder);
    }
    return;
  }
  Failure failure;
  failure.round = round_ - 1;
  failure.node_rank = 0;
  failure.what = fmt::format("the coordinator ({}) was lost while round {} ran", legacy.holder, round_ - 1);
  failure.detail = fmt::format("  its etcd lease (rendezvous.lease = {}) ended: its host died, its agent "
                               "was killed, or it was cut off from etcd\n",
                               FormatDuration(spec_.rendezvous.lease));
  failure.explains_silence = true;
  failure.kinds = {"lost-node"};
  last_failure_ = failure;
  // The old round's workers stop within their agents' lease of their last word from the old
  // coordinator, which was before now.
  journal_fence_ = now + spec_.timeouts.LeaseBound();
  fence_cause_ = fmt::format("the previous coordinator ({}) was lost while round {} ran", legacy.holder,
                             failure.round);
  const std::string never = NeverRestartRule(failure);
  if (never.empty() && restarts_used_ < spec_.restart.max_restarts) {
    ++restarts_used_;
    out.push_back(LogLine{LogLevel::kError,
                          fmt::format("round {} failed: {}; restart {} of {}", failure.round,
                                      failure.what, restarts_used_, spec_.restart.max_restarts)});
    return;
  }
  ended_by_rule_ = !never.empty();
  EndJob(now, ToInt(ExitCode::kJobFailed), FailureSummary(failure, 0, 0, never), out);
}

void Coordinator::RequireSecret(std::string secret, uint64_t nonce_seed) {
  secret_ = std::move(secret);
  nonce_seed_ = nonce_seed;
}

int Coordinator::joined_count() const { return joined_; }

// Counters instead of scans: at 16,384 nodes every message would otherwise cost O(nodes).
void Coordinator::SetSlotConn(Slot& slot, std::optional<ConnId> conn, TimePoint now) {
  const int before = slot.conn ? 1 : 0;
  const int after = conn ? 1 : 0;
  joined_ += after - before;
  if (slot.stopped) stopped_joined_ += after - before;
  // Fencing: a node lost while its workers may run keeps its rank until its lease has run
  // out; its own agent stops them within that time (DESIGN.md section 10).
  const bool workers_may_run = slot.plays >= 0 &&
                               (phase_ == Phase::kStarting || phase_ == Phase::kRunning ||
                                (phase_ == Phase::kStopping && !slot.stopped));
  if (slot.conn && !conn && workers_may_run) {
    const TimePoint until = now + spec_.timeouts.LeaseBound();
    if (!slot.fence) {
      slot.fence = Slot::Fence{until, slot.instance};
    } else {
      // An earlier holder's fence still stands: both agents' workers may run, and only the
      // later lease's end frees the rank whoever rejoins.
      slot.fence->until = std::max(slot.fence->until, until);
      if (slot.fence->holder != slot.instance) slot.fence->holder = 0;
    }
  }
  if (slot.conn && !conn) slot.absent_since = now;
  if (conn) slot.absent_since.reset();
  slot.conn = conn;
}

std::string Coordinator::NodeName(int node_rank) const {
  // `node_rank` is the agent's own; a spare that plays a node rank is named by that rank.
  const Slot& slot = slots_[static_cast<size_t>(node_rank)];
  const int nnodes = spec_.cluster.nnodes;
  std::string name = slot.position >= 0    ? fmt::format("node {}", slot.position)
                     : node_rank >= nnodes ? fmt::format("spare {}", node_rank - nnodes)
                                           : fmt::format("node {}", node_rank);
  if (!slot.host.empty()) name += fmt::format(" ({})", slot.host);
  return name;
}

std::string Coordinator::AgentName(int agent) const {
  const Slot& slot = slots_[static_cast<size_t>(agent)];
  const int nnodes = spec_.cluster.nnodes;
  std::string name = agent >= nnodes ? fmt::format("spare {}", agent - nnodes) : fmt::format("node {}", agent);
  if (!slot.host.empty()) name += fmt::format(" ({})", slot.host);
  return name;
}

void Coordinator::Handle(TimePoint now, const CoordinatorInput& input,
                         std::vector<CoordinatorEffect>& out) {
  // The silence index (heard_) relies on inputs in time order.
  DDPRUN_ASSERT(now >= last_input_);
  ExpireDeadlines(now, out);
  last_input_ = now;
  Apply(now, input, out);
  TrimHeard();
}

void Coordinator::Apply(TimePoint now, const CoordinatorInput& input, std::vector<CoordinatorEffect>& out) {
  // A finished coordinator still answers: an agent that lost it before the end (a pause, a
  // partition) rejoins and must learn the verdict instead of waiting for an answer.
  if (const auto* accepted = std::get_if<PeerAccepted>(&input)) {
    conns_[accepted->conn] = Conn{accepted->peer_addr, -1, now, ""};
    heard_.emplace_back(now, accepted->conn);
  } else if (const auto* message = std::get_if<PeerMessage>(&input)) {
    OnMessage(now, message->conn, message->message, out);
  } else if (const auto* closed = std::get_if<PeerClosed>(&input)) {
    auto it = conns_.find(closed->conn);
    if (it == conns_.end()) return;
    const int node_rank = it->second.node_rank;
    if (node_rank < 0 && it->second.hello_rank >= 0) OnChallengeUnanswered(it->second, out);
    conns_.erase(it);
    if (node_rank >= 0 && slots_[static_cast<size_t>(node_rank)].conn == closed->conn) {
      SetSlotConn(slots_[static_cast<size_t>(node_rank)], std::nullopt, now);
      OnNodeLost(now, node_rank, closed->reason.empty() ? "connection closed" : closed->reason, out);
    }
  } else if (const auto* port = std::get_if<StorePortReady>(&input)) {
    if (phase_ != Phase::kStarting || port->round != round_) return;  // stale answer
    BeginRound(port->port, out);
  } else if (std::holds_alternative<EndRecorded>(input)) {
    if (phase_ != Phase::kEnding || !awaiting_end_record_) return;
    awaiting_end_record_ = false;
    Broadcast(wire::JobEnd{*exit_code_, end_summary_}, out);
    MaybeDone(out);
  } else if (const auto* committed = std::get_if<RoundCommitted>(&input)) {
    if (phase_ != Phase::kStarting || committed->round != round_ || !awaiting_commit_) return;
    awaiting_commit_ = false;
    ReserveOrBegin(out);
  }
}

void Coordinator::ExpireDeadlines(TimePoint now, std::vector<CoordinatorEffect>& out) {
  const Duration loss_bound = spec_.timeouts.LossBound();
  if (phase_ != Phase::kDone && now - last_input_ > loss_bound) {
    OnStalled(now, now - last_input_, out);
  }
  if (phase_ != Phase::kDone && now >= next_heartbeat_) {
    if (rounds_may_run_) out.push_back(RecordJournal{true});
    Broadcast(wire::Heartbeat{}, out);
    next_heartbeat_ = now + spec_.timeouts.heartbeat;
  }
  // Checked on every input, not on a heartbeat grid: a peer is lost the moment it has been
  // silent for more than 3 heartbeats (the agent uses the same bound), not up to a beat later.
  // heard_ keeps this O(1) amortised per input at 16,384 nodes.
  {
    std::vector<std::pair<TimePoint, ConnId>> silent;
    while (!heard_.empty() && now - heard_.front().first > loss_bound) {
      const auto [heard, id] = heard_.front();
      heard_.pop_front();
      auto it = conns_.find(id);
      if (it != conns_.end() && it->second.last_heard == heard) silent.emplace_back(heard, id);
    }
    // Oldest first, then by connection: the order does not depend on the hash map's.
    std::sort(silent.begin(), silent.end());
    for (const auto& [heard, id] : silent) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      const int node_rank = it->second.node_rank;
      const Duration quiet = now - heard;
      Drop(now, id, out);
      if (node_rank >= 0 && phase_ != Phase::kDone) {
        OnNodeLost(now, node_rank, fmt::format("silent for {} (3 heartbeats)", HumanDuration(quiet)), out);
      }
    }
  }
  switch (phase_) {
    case Phase::kRendezvous:
      if (round_gate_ && now >= *round_gate_) {
        MaybeStartRound(now, out);
        break;
      }
      if (replace_at_ && now >= *replace_at_) {
        replace_at_.reset();
        MaybeStartRound(now, out);
        if (phase_ != Phase::kRendezvous) break;
      }
      // A round held only by a fence (round_gate_) starts when it ends: the rendezvous
      // timeout is for nodes that do not come.
      if (now >= rendezvous_deadline_ && !round_gate_ && !PositionsFilled()) {
        EndJob(now, ToInt(ExitCode::kRendezvous), RendezvousFailure(), out);
      } else if (now >= next_progress_ && !round_gate_) {
        SendProgress(now, out);
        next_progress_ = now + kProgressInterval;
      }
      break;
    case Phase::kStopping:
      if (now >= phase_deadline_) {
        for (size_t i = 0; i < slots_.size(); ++i) {
          Slot& slot = slots_[i];
          if (slot.conn && !slot.stopped) {
            out.push_back(LogLine{LogLevel::kWarn,
                                  fmt::format("{} did not confirm that its workers stopped; "
                                              "dropping it",
                                              NodeName(static_cast<int>(i)))});
            Drop(now, *slot.conn, out);
          }
        }
        MaybeFinishStop(now, out);
      }
      break;
    case Phase::kBackoff:
      if (now >= phase_deadline_) {
        phase_ = Phase::kRendezvous;
        rendezvous_started_ = now;
        absence_origin_ = now;
        rendezvous_deadline_ = now + spec_.timeouts.rendezvous;
        next_progress_ = now + kProgressInterval;
        MaybeStartRound(now, out);
      }
      break;
    case Phase::kEnding:
      if (now >= phase_deadline_) {
        out.push_back(LogLine{LogLevel::kWarn, "exit barrier expired before every node confirmed"});
        // The journal keeps its last record: a node that never confirmed may still run its
        // workers until its lease ends, and the next coordinator here waits for that.
        Finish(out);
      }
      break;
    case Phase::kRunning:
      if (probe_ && now >= probe_->until) {
        BeginStop(now, HangFailure(), out);
      } else if (next_straggler_check_ && now >= *next_straggler_check_) {
        CheckStragglers(now, out);
      }
      break;
    case Phase::kStarting:
      if (reach_ && now >= reach_->until) FinishReach(now, out);
      break;
    case Phase::kDone:
      break;
  }
}

std::optional<TimePoint> Coordinator::NextDeadline() const {
  if (phase_ == Phase::kDone) {
    // Only connections from late agents remain; a silent one is dropped like any other.
    if (heard_.empty()) return std::nullopt;
    return heard_.front().first + spec_.timeouts.LossBound() + Duration(1);
  }
  TimePoint next = next_heartbeat_;
  if (!heard_.empty()) {
    next = std::min(next, heard_.front().first + spec_.timeouts.LossBound() + Duration(1));
  }
  switch (phase_) {
    case Phase::kRendezvous:
      // With every node joined only the fence gate is left to wait for: a rendezvous
      // deadline that ExpireDeadlines ignores would stay in the past and spin the driver.
      if (round_gate_) {
        next = std::min(next, *round_gate_);
      } else {
        next = std::min({next, rendezvous_deadline_, next_progress_});
        if (replace_at_) next = std::min(next, *replace_at_);
      }
      break;
    case Phase::kStopping:
    case Phase::kBackoff:
    case Phase::kEnding:
      next = std::min(next, phase_deadline_);
      break;
    case Phase::kRunning:
      if (probe_) next = std::min(next, probe_->until);
      if (next_straggler_check_) next = std::min(next, *next_straggler_check_);
      break;
    case Phase::kStarting:
      if (reach_) next = std::min(next, reach_->until);
      break;
    default:
      break;
  }
  return next;
}

void Coordinator::OnMessage(TimePoint now, ConnId conn_id, const wire::Message& message,
                            std::vector<CoordinatorEffect>& out) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;  // already dropped
  Heard(conn_id, it->second, now);
  const int node_rank = it->second.node_rank;

  if (const auto* join = std::get_if<wire::Join>(&message)) {
    if (node_rank >= 0) return;  // a second join on one connection: ignore
    OnJoin(now, conn_id, *join, out);
    return;
  }
  if (node_rank < 0) {
    // Only a join may come first; anything else is a confused or hostile peer.
    out.push_back(LogLine{LogLevel::kWarn,
                          fmt::format("dropping {}: sent {} before joining", it->second.peer_addr,
                                      wire::MessageName(message))});
    Drop(now, conn_id, out);
    return;
  }
  Slot& slot = slots_[static_cast<size_t>(node_rank)];
  if (phase_ == Phase::kDone && !std::holds_alternative<wire::JobEndAck>(message)) return;

  if (const auto* failed = std::get_if<wire::WorkerFailed>(&message)) {
    if (failed->round != round_ || slot.plays < 0) return;  // stale, or runs nothing
    if (phase_ == Phase::kRunning) {
      BeginStop(now, FailureOf(node_rank, *failed), out);
    } else if (phase_ == Phase::kStopping && failure_ && failure_->lost_peer) {
      // The first failure only lost a peer; a rank that raised on its own before the stop
      // reached it (agents report those too) is the better root cause.
      Failure later = FailureOf(node_rank, *failed);
      if (!later.lost_peer && !later.the_stop) ReviseRootCause(std::move(later), out);
    }
  } else if (const auto* done = std::get_if<wire::NodeDone>(&message)) {
    if (phase_ != Phase::kRunning || done->round != round_ || slot.plays < 0) return;
    if (slot.done) return;
    slot.done = true;
    if (++done_count_ == static_cast<int>(round_slots_.size())) {
      const size_t nodes = round_slots_.size();
      const std::string quarantined = QuarantineNote(now);
      EndJob(now, ToInt(ExitCode::kOk),
             fmt::format("job \"{}\" succeeded: all {} ranks on {} nodes exited 0 in round {} "
                         "({} restart{} used){}{}{}{}",
                         spec_.job.name, static_cast<int>(nodes) * spec_.cluster.nproc_per_node,
                         nodes, round_, restarts_used_, restarts_used_ == 1 ? "" : "s",
                         nodes < slot_at_.size()
                             ? fmt::format("\n  the round ran with {} of the job's {} nodes "
                                           "(cluster.min_nodes = {}): {}",
                                           nodes, slot_at_.size(), spec_.cluster.min_nodes,
                                           shrunk_note_)
                             : "",
                         stragglers_seen_.empty() ? "" : "\n" + StragglerNote(),
                         quarantined.empty() ? "" : "\n" + quarantined,
                         earlier_causes_.empty() ? "" : "\n" + EarlierCausesNote()),
             out);
    }
  } else if (const auto* stopped = std::get_if<wire::RoundStopped>(&message)) {
    // The first confirmation counts: an agent whose own failure stopped its node confirms
    // unasked, then confirms the StopRound that crossed it with 0 workers left to stop.
    if (phase_ != Phase::kStopping || stopped->round != round_ || slot.stopped) return;
    MarkStopped(slot, stopped->stopped);
    MaybeFinishStop(now, out);
  } else if (const auto* interrupted = std::get_if<wire::Interrupted>(&message)) {
    if (phase_ == Phase::kEnding) return;
    EndJob(now, InterruptedExitCode(interrupted->signal),
           fmt::format("job \"{}\" interrupted: {} received {}; every node stops its workers "
                       "(SIGTERM, SIGKILL after stop_grace = {}) before it exits",
                       spec_.job.name, NodeName(node_rank), SignalName(interrupted->signal),
                       FormatDuration(spec_.timeouts.stop_grace)),
           out);
  } else if (std::holds_alternative<wire::JobEndAck>(message)) {
    SettleEnd(slot);
    MaybeDone(out);
  } else if (std::holds_alternative<wire::Heartbeat>(message)) {
    // last_heard is already updated
  } else if (const auto* hung = std::get_if<wire::RankHung>(&message)) {
    OnRankHung(now, node_rank, *hung, out);
  } else if (const auto* stacks = std::get_if<wire::RankStacks>(&message)) {
    OnRankStacks(now, node_rank, *stacks, out);
  } else if (const auto* progress = std::get_if<wire::RankProgress>(&message)) {
    OnRankProgress(now, node_rank, *progress);
  } else if (const auto* probed = std::get_if<wire::PeersProbed>(&message)) {
    // Stale (a probe that ended, a node that rejoined): nobody waits for it.
    if (!reach_ || reach_->waiting.erase(node_rank) == 0) return;
    for (const wire::ProbeFailure& failure : probed->failures) {
      reach_->problems[{node_rank, failure.target.node_rank}] =
          fmt::format("{} cannot connect to {} at {}: {}", NodeName(node_rank), NodeName(failure.target.node_rank),
                      failure.target.endpoint, failure.error);
    }
    if (reach_->waiting.empty()) FinishReach(now, out);
  } else {
    out.push_back(LogLine{LogLevel::kWarn, fmt::format("dropping {}: unexpected {} from an agent",
                                                       NodeName(node_rank), wire::MessageName(message))});
    Drop(now, conn_id, out);
    OnNodeLost(now, node_rank, "protocol error", out);
  }
}

void Coordinator::OnJoin(TimePoint now, ConnId conn_id, const wire::Join& join,
                         std::vector<CoordinatorEffect>& out) {
  const std::string& from = conns_[conn_id].peer_addr;
  // `why` is the short form kept for the rendezvous summary.
  auto refuse = [&](const std::string& reason, bool retry = false, std::string why = "") {
    if (!why.empty() && join.node_rank >= 0 && join.node_rank < static_cast<int>(slots_.size())) {
      slots_[static_cast<size_t>(join.node_rank)].refused = std::move(why);
    }
    out.push_back(LogLine{LogLevel::kError, "refused a node: " + reason});
    out.push_back(SendTo{conn_id, wire::Reject{reason, retry}});
    Drop(now, conn_id, out);
  };
  const int nnodes = spec_.cluster.nnodes;
  const int agents = static_cast<int>(slots_.size());
  // Authentication first: a peer without the secret learns nothing about the job. The first
  // join on a connection is answered with a Challenge (the agent speaks first so the relay can
  // tell it from a store client); the second must carry the proof for that nonce.
  Conn& conn = conns_[conn_id];
  if (secret_.empty() && !join.nonce.empty()) {
    // Said here and to the agent, before it is counted: nobody mistakes it for a lost node.
    refuse(fmt::format("node {} (from {}) has a shared secret (DDPRUN_SECRET or "
                       "DDPRUN_SECRET_FILE) and node 0 has none\nhint: set the same secret on "
                       "every node, or on none",
                       join.node_rank, from),
           false, "it has a shared secret and node 0 has none");
    return;
  }
  if (!secret_.empty() && conn.nonce.empty()) {
    if (join.nonce.empty()) {
      refuse(fmt::format("node {} (host {}, from {}) has no shared secret and node 0 requires "
                         "one\nhint: set DDPRUN_SECRET or DDPRUN_SECRET_FILE to the same secret "
                         "on every node",
                         join.node_rank, join.host, from),
             false, "it has no shared secret and node 0 requires one");
      return;
    }
    conn.nonce = Sha256Hex(fmt::format("{}:{}", nonce_seed_, conn_id)).substr(0, 32);
    conn.hello_rank = join.node_rank;
    out.push_back(SendTo{conn_id, wire::Challenge{conn.nonce, CoordinatorProof(secret_, join.nonce, conn.nonce)}});
    return;
  }
  if (!secret_.empty() &&
      !ConstantTimeEqual(join.proof, JoinProof(secret_, conn.nonce, join.node_rank, join.fingerprint))) {
    refuse(join.proof.empty()
               ? fmt::format("a node from {} (claiming node rank {}) sent no proof of the shared "
                             "secret\nhint: set DDPRUN_SECRET or DDPRUN_SECRET_FILE to the same "
                             "secret on every node",
                             from, join.node_rank)
               : fmt::format("a node from {} (claiming node rank {}) failed the shared-secret "
                             "challenge: its secret differs from node 0's",
                             from, join.node_rank),
           false, fmt::format("a peer from {} claiming this rank failed the shared-secret challenge", from));
    return;
  }
  if (join.node_rank < 0 || join.node_rank >= agents) {
    refuse(agents > nnodes
               ? fmt::format("node rank {} (host {}, from {}) is out of range: the job has {} node{} "
                             "(ranks 0..{}) and {} spare{} (ranks {}..{})",
                             join.node_rank, join.host, from, nnodes, nnodes == 1 ? "" : "s",
                             nnodes - 1, agents - nnodes, agents - nnodes == 1 ? "" : "s", nnodes,
                             agents - 1)
               : fmt::format("node rank {} (host {}, from {}) is out of range: the job has {} node{} "
                             "(ranks 0..{})",
                             join.node_rank, join.host, from, nnodes, nnodes == 1 ? "" : "s", nnodes - 1));
    return;
  }
  if (join.fingerprint != fingerprint_) {
    std::string lines = DifferenceLines(canonical_, join.canonical, join.node_rank);
    if (lines.empty()) lines = "\n  (the canonical forms agree; the fingerprints do not)";
    refuse(fmt::format("node {} (host {}) runs a different job file than node 0:{}\n"
                       "hint: use the same job file on every node (ddprun check prints its "
                       "fingerprint)",
                       join.node_rank, join.host, lines),
           false, "it runs a different job file");
    return;
  }
  Slot& slot = slots_[static_cast<size_t>(join.node_rank)];
  if (slot.conn && phase_ != Phase::kDone) {
    if (slot.instance == join.instance) {
      // The same agent reconnecting before we noticed its old connection died. It stopped its
      // workers when it lost us, so a round it plays in has lost this node. Otherwise the
      // connection was only replaced (an agent that gave up on a join we were too slow to
      // answer): no loss, nothing to blame it for.
      const bool round_lost = slot.plays >= 0 && (phase_ == Phase::kStarting ||
                                                  phase_ == Phase::kRunning ||
                                                  phase_ == Phase::kStopping);
      Drop(now, *slot.conn, out);
      if (round_lost) OnNodeLost(now, join.node_rank, "its connection dropped and it reconnected", out);
    } else {
      // Retryable: a host that rebooted faster than its old connection was declared dead
      // looks exactly like this, and its slot frees after 3 silent heartbeats. A real
      // duplicate keeps being refused until its rendezvous timeout.
      refuse(fmt::format("node rank {} is claimed twice: by host {} (already joined) and by host "
                         "{} from {}\nhint: every node needs its own rank; check --node-rank, "
                         "DDPRUN_NODE_RANK or cluster.nodes",
                         join.node_rank, slot.host, join.host, from),
             /*retry=*/true);
      return;
    }
  }
  if ((phase_ == Phase::kEnding || phase_ == Phase::kDone) &&
      !(slot.ever_joined && (took_over_ || slot.instance == join.instance))) {
    // Only the agents that took part hear the verdict; one that arrives after the end (a
    // second agent for a rank, a node started too late) did not run this job.
    refuse(fmt::format("node {} (host {}) joined after the job ended", join.node_rank, join.host));
    return;
  }
  if (phase_ == Phase::kEnding || phase_ == Phase::kDone) {
    // An agent that lost us before the end (a pause, a partition) rejoins to hear the verdict;
    // it exits with the job's code once it has acknowledged.
    SetSlotConn(slot, conn_id, now);
    conns_[conn_id].node_rank = join.node_rank;
    out.push_back(LogLine{LogLevel::kInfo, fmt::format("{} rejoined after the end of the job; "
                                                       "telling it the outcome",
                                                       NodeName(join.node_rank))});
    if (awaiting_end_record_) return;  // it hears the verdict with the others, once etcd has it
    out.push_back(SendTo{conn_id, wire::JobEnd{*exit_code_, end_summary_}});
    if (slot.end == EndState::kAway) slot.end = EndState::kTold;
    return;
  }
  // The fence is the fenced agent's: only that agent rejoining lifts it (agents rejoin only
  // once their workers are gone). Any other agent that takes the rank (a rebooted host, a
  // second agent started for it), however often it joins and leaves, waits until the fenced
  // agent's lease has run out.
  if (slot.fence && slot.fence->holder == join.instance) slot.fence.reset();
  slot.instance = join.instance;
  if (join.canonical != canonical_) {
    // Same fingerprint, other advisory lines (job.code_check = "warn"): say what differs.
    const std::string lines = DifferenceLines(canonical_, join.canonical, join.node_rank);
    if (!lines.empty()) {
      out.push_back(LogLine{LogLevel::kWarn,
                            fmt::format("node {} (host {}) runs different code than node 0 "
                                        "(job.code_check = \"warn\" lets it join):{}",
                                        join.node_rank, join.host, lines)});
    }
  }
  slot.host = join.host;
  slot.probe_endpoint = join.probe_endpoint;
  slot.done = slot.stopped = false;
  slot.ever_joined = true;
  slot.refused.clear();
  SetSlotConn(slot, conn_id, now);
  conns_[conn_id].node_rank = join.node_rank;
  // Standby: a joined agent may wait as long as the job runs (a spare, a node that sits out
  // a smaller round), so its own rendezvous backstop is off.
  out.push_back(SendTo{conn_id, wire::JoinAck{nnodes, spec_.cluster.CanReplace()}});
  std::string joined_line =
      slot.position < 0
          ? fmt::format("{} joined from {}; it waits to take the node rank of a node that is lost",
                        NodeName(join.node_rank), from)
      : slot.position != join.node_rank && join.node_rank < nnodes
          // etcd: the coordinator's agent plays node rank 0, and node 0's agent its place.
          ? fmt::format("{} joined from {} ({}/{}); it plays node rank {}{}", AgentName(join.node_rank), from,
                        joined_count(), agents, slot.position, slot.position == 0 ? ", the coordinator's" : "")
          : fmt::format("{} joined from {} ({}/{})", NodeName(join.node_rank), from, joined_count(), agents);
  if (slot.position >= 0 && (phase_ == Phase::kStarting || phase_ == Phase::kRunning)) {
    joined_line += fmt::format("; round {} runs without it, it takes part from the next round", round_);
  }
  if (Quarantined(slot, now)) {
    joined_line += fmt::format("; its host is quarantined for {} more",
                               HumanDuration(*hosts_.at(slot.host).until - now));
  }
  out.push_back(LogLine{LogLevel::kInfo, std::move(joined_line)});
  if (phase_ == Phase::kStopping || (phase_ != Phase::kRendezvous && slot.plays < 0)) {
    // Agents join only without running workers, so this node has nothing left to stop; a
    // spare has nothing to stop in any round.
    MarkStopped(slot, 0);
    MaybeFinishStop(now, out);
  }
  MaybeStartRound(now, out);
}

void Coordinator::OnChallengeUnanswered(const Conn& conn, std::vector<CoordinatorEffect>& out) {
  // An agent closes the connection after our Challenge when our proof does not match its
  // secret. Its hello is unproven, so the rank it claimed is only named, never acted on.
  if (conn.hello_rank >= static_cast<int>(slots_.size())) return;
  Slot& slot = slots_[static_cast<size_t>(conn.hello_rank)];
  if (slot.conn) return;
  // Each retry comes from a new source port: the story is told per address, not per port.
  const std::string_view addr = std::string_view(conn.peer_addr).substr(0, conn.peer_addr.rfind(':'));
  std::string why = fmt::format("a peer from {} claiming this rank left without answering the "
                                "shared-secret challenge: its secret differs from node 0's",
                                addr);
  if (slot.refused == why) return;  // said once; its retries tell the same story
  out.push_back(LogLine{
      LogLevel::kError,
      fmt::format("a peer from {} claiming node rank {} closed the connection without answering "
                  "the shared-secret challenge: its DDPRUN_SECRET (or DDPRUN_SECRET_FILE) differs "
                  "from node 0's, or it is not this job's agent\nhint: set the same secret on "
                  "every node",
                  addr, conn.hello_rank)});
  slot.refused = std::move(why);
}

void Coordinator::OnStalled(TimePoint now, Duration stall, std::vector<CoordinatorEffect>& out) {
  // Our own process did not run for longer than the loss bound (SIGSTOP, a VM pause, swap):
  // every peer looks silent, but the silence is ours. Give each connection a fresh loss bound
  // instead of blaming the nodes; the agents that lost us meanwhile close their connections
  // and rejoin. A running round cannot survive it: the other nodes stopped their workers.
  for (auto& [id, conn] : conns_) Heard(id, conn, now);
  // Nor is anyone's absence ours: the clocks that give an absent node's rank away
  // (timeouts.replace) do not count the time we did not run.
  for (Slot& slot : slots_) {
    if (slot.absent_since) slot.absent_since = std::min(*slot.absent_since + stall, now);
  }
  absence_origin_ = std::min(absence_origin_ + stall, now);
  const std::string what =
      fmt::format("node 0 ({}) stalled for {}: its agent and the coordinator did not run "
                  "(the process was stopped or paused: SIGSTOP, a VM pause, swapping, a stuck "
                  "file system), so every other node lost the coordinator",
                  slots_.empty() || slots_[0].host.empty() ? "the master" : slots_[0].host,
                  HumanDuration(stall));
  if (phase_ == Phase::kStarting || phase_ == Phase::kRunning) {
    Failure failure;
    failure.round = round_;
    failure.node_rank = 0;
    failure.what = what;
    failure.detail = "  the other nodes stop their workers when they lose the coordinator\n";
    failure.explains_silence = true;
    failure.kinds = {"stall"};
    BeginStop(now, std::move(failure), out);
  } else {
    out.push_back(LogLine{LogLevel::kWarn, what});
  }
}

void Coordinator::OnNodeLost(TimePoint now, int node_rank, const std::string& why,
                             std::vector<CoordinatorEffect>& out) {
  Slot& slot = slots_[static_cast<size_t>(node_rank)];
  SetSlotConn(slot, std::nullopt, now);
  slot.left = why;
  if (phase_ == Phase::kRendezvous && !PositionsFilled()) {
    round_gate_.reset();  // the round waits for the node again, not for the gate
  }
  if (slot.plays < 0 && (phase_ == Phase::kStarting || phase_ == Phase::kRunning)) {
    // A waiting spare (or a node that sits out a smaller round) ran nothing: the round goes on.
    out.push_back(LogLine{LogLevel::kWarn, fmt::format("{} left: {}", NodeName(node_rank), why)});
    return;
  }
  switch (phase_) {
    case Phase::kRendezvous:
      out.push_back(LogLine{LogLevel::kWarn, fmt::format("{} left: {}", NodeName(node_rank), why)});
      // With spares or shrinking, the round may go on without it after timeouts.replace:
      // that deadline is set by looking again.
      MaybeStartRound(now, out);
      break;
    case Phase::kBackoff:
      out.push_back(LogLine{LogLevel::kWarn, fmt::format("{} left: {}", NodeName(node_rank), why)});
      break;
    case Phase::kStarting:
    case Phase::kRunning: {
      Failure failure;
      failure.round = round_;
      failure.node_rank = node_rank;
      failure.what = fmt::format("{} was lost: {}", NodeName(node_rank), why);
      failure.explains_silence = true;
      failure.kinds = {"lost-node"};
      failure.detail = "  its agent stopped answering; its workers are stopped by its agent (or "
                       "died with it)\n";
      BeginStop(now, std::move(failure), out);
      break;
    }
    case Phase::kStopping:
      MaybeFinishStop(now, out);
      break;
    case Phase::kEnding:
      // Told and gone: it heard the verdict (or died). One that never heard it is still away.
      if (slot.end == EndState::kTold) SettleEnd(slot);
      MaybeDone(out);
      break;
    case Phase::kDone:
      break;
  }
}

void Coordinator::Drop(TimePoint now, ConnId conn_id, std::vector<CoordinatorEffect>& out) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  const int node_rank = it->second.node_rank;
  if (node_rank >= 0 && slots_[static_cast<size_t>(node_rank)].conn == conn_id) {
    SetSlotConn(slots_[static_cast<size_t>(node_rank)], std::nullopt, now);
  }
  conns_.erase(it);
  out.push_back(CloseConn{conn_id});
}

void Coordinator::Heard(ConnId id, Conn& conn, TimePoint now) {
  if (conn.last_heard == now) return;  // its entry for `now` is already there
  conn.last_heard = now;
  heard_.emplace_back(now, id);
}

void Coordinator::TrimHeard() {
  // Entries of connections heard again later, or closed, are stale; NextDeadline reads the
  // front, so the front must be a live one.
  while (!heard_.empty()) {
    const auto& [heard, id] = heard_.front();
    auto it = conns_.find(id);
    if (it != conns_.end() && it->second.last_heard == heard) return;
    heard_.pop_front();
  }
}

void Coordinator::MaybeStartRound(TimePoint now, std::vector<CoordinatorEffect>& out) {
  if (phase_ != Phase::kRendezvous) return;
  if (!AssignPositions(now, out)) return;
  // Fencing: no round starts while the previous holder of a rank may still run its workers.
  // Only checked once every node has joined, so the scan is once per round, not per join.
  std::optional<TimePoint> gate;
  std::vector<int> fenced;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const auto& fence = slots_[i].fence;
    if (!fence) continue;
    if (fence->until <= now) {
      slots_[i].fence.reset();
      continue;
    }
    fenced.push_back(static_cast<int>(i));
    if (!gate || fence->until > *gate) gate = fence->until;
  }
  if (journal_fence_ && *journal_fence_ <= now) journal_fence_.reset();
  if (journal_fence_ && (!gate || *journal_fence_ > *gate)) gate = journal_fence_;
  if (gate) {
    // Rounded up: "waiting 10s" must not precede a wait of 10.9 s.
    const Duration wait = std::chrono::ceil<std::chrono::seconds>(*gate - now);
    if (round_gate_ != gate) {
      if (gate == journal_fence_) {
        out.push_back(LogLine{
            LogLevel::kWarn,
            fmt::format("round {}: all {} nodes joined; waiting {} before starting it: {}, so "
                        "workers of its rounds may still run until their agents' lease ends (loss "
                        "bound + stop_grace + SIGKILL after its last record)",
                        round_, round_slots_.size(), HumanDuration(wait), fence_cause_)});
      } else {
        // Its rank went to another agent (a new agent of its host, or a spare), or a smaller
        // round (cluster.min_nodes) simply goes on without it.
        std::vector<std::string> replaced, left_out;
        for (int n : fenced) {
          const Slot& slot = slots_[static_cast<size_t>(n)];
          const bool in_round = std::find(round_slots_.begin(), round_slots_.end(), n) != round_slots_.end();
          (in_round || slot.position < 0 ? replaced : left_out).push_back(NodeName(n));
        }
        std::vector<std::string> why;
        if (!replaced.empty()) {
          why.push_back(fmt::format("{} was lost while its workers ran and a different agent now holds its rank",
                                    fmt::join(replaced, ", ")));
        }
        if (!left_out.empty()) {
          why.push_back(fmt::format("{} was lost while its workers ran and the round goes on without it",
                                    fmt::join(left_out, ", ")));
        }
        out.push_back(LogLine{
            LogLevel::kWarn,
            fmt::format("round {}: all {} nodes joined; waiting {} before starting it: {}, so the "
                        "old workers may still run until their agent's lease ends (loss bound + "
                        "stop_grace + SIGKILL)",
                        round_, round_slots_.size(), HumanDuration(wait), fmt::join(why, "; "))});
      }
    }
    round_gate_ = gate;
    return;
  }
  round_gate_.reset();
  for (Slot& slot : slots_) slot.plays = -1;
  for (size_t p = 0; p < round_slots_.size(); ++p) {
    slots_[static_cast<size_t>(round_slots_[p])].plays = static_cast<int>(p);
  }
  phase_ = Phase::kStarting;
  if (StartReach(now, out)) return;
  CommitOrBegin(out);
}

void Coordinator::CommitOrBegin(std::vector<CoordinatorEffect>& out) {
  if (commit_rounds_) {
    // Fencing (etcd): only the holder of the coordinator role can record the round; a deposed
    // coordinator never hears RoundCommitted, so it never starts one.
    awaiting_commit_ = true;
    out.push_back(CommitRound{round_, restarts_used_});
    return;
  }
  ReserveOrBegin(out);
}

// gloo and NCCL connect between all nodes on ports they pick, and a firewall that lets only
// master_port through makes them wait in init_process_group for their own timeout (30 minutes
// for gloo) without a word. So before the first round every node connects to every other one on
// a port other than master_port: milliseconds when the way is open, and one connect timeout
// when a firewall drops it.
bool Coordinator::StartReach(TimePoint now, std::vector<CoordinatorEffect>& out) {
  if (reach_checked_ || spec_.rendezvous.probe == JobSpec::Rendezvous::Probe::kOff) return false;
  std::vector<wire::ProbeTarget> targets;
  for (int slot_index : round_slots_) {
    const Slot& slot = slots_[static_cast<size_t>(slot_index)];
    if (slot.conn && !slot.probe_endpoint.empty()) {
      targets.push_back(wire::ProbeTarget{slot_index, slot.host, slot.probe_endpoint});
    }
  }
  if (targets.size() < 2) {
    reach_checked_ = true;  // nothing to probe: one node, or agents without an endpoint
    return false;
  }
  Reach reach;
  reach.until = now + spec_.timeouts.ProbeWait();
  for (int slot_index : round_slots_) {
    const Slot& slot = slots_[static_cast<size_t>(slot_index)];
    if (!slot.conn) continue;
    wire::ProbePeers probe;
    for (const wire::ProbeTarget& target : targets) {
      if (target.node_rank != slot_index) probe.targets.push_back(target);
    }
    out.push_back(SendTo{*slot.conn, std::move(probe)});
    reach.waiting.insert(slot_index);
  }
  out.push_back(LogLine{LogLevel::kInfo,
                        fmt::format("round {}: all {} nodes joined; checking that each reaches every other "
                                    "one on a port other than master_port (rendezvous.probe)",
                                    round_, round_slots_.size())});
  reach_ = std::move(reach);
  return true;
}

void Coordinator::FinishReach(TimePoint now, std::vector<CoordinatorEffect>& out) {
  DDPRUN_ASSERT(reach_.has_value() && phase_ == Phase::kStarting);
  Reach reach = std::move(*reach_);
  reach_.reset();
  reach_checked_ = true;
  for (int slot_index : reach.waiting) {
    out.push_back(LogLine{LogLevel::kWarn, fmt::format("{} did not report its probe of the other nodes "
                                                       "within {}; starting without it",
                                                       NodeName(slot_index),
                                                       HumanDuration(spec_.timeouts.ProbeWait()))});
  }
  if (reach.problems.empty()) {
    CommitOrBegin(out);
    return;
  }
  std::vector<std::string> problems;
  for (auto& [pair, line] : reach.problems) problems.push_back(std::move(line));
  const std::string pairs = fmt::format("  {}", fmt::join(problems, "\n  "));
  const std::string fix =
      "fix: gloo and NCCL connect between all nodes on ports they pick, not only master_port: let "
      "TCP from the job's nodes through the firewall of each node named above (e.g. iptables -I "
      "INPUT -s <the nodes' subnet> -p tcp -j ACCEPT); `ddprun preflight` checks it";
  if (spec_.rendezvous.probe == JobSpec::Rendezvous::Probe::kRefuse) {
    EndJob(now, ToInt(ExitCode::kRendezvous),
           fmt::format("round {} not started: {} cannot connect on a port other than master_port, as gloo and "
                       "NCCL must (they would wait in init_process_group until their timeout):\n{}\n{}\n"
                       "(rendezvous.probe = \"warn\" starts the job anyway)",
                       round_, problems.size() == 1 ? "a pair of nodes" : "pairs of nodes", pairs, fix),
           out);
    return;
  }
  out.push_back(LogLine{LogLevel::kWarn,
                        fmt::format("some nodes cannot connect on a port other than master_port; gloo and NCCL "
                                    "will likely hang in init_process_group (rendezvous.probe = \"warn\" starts "
                                    "round {} anyway):\n{}\n{}",
                                    round_, pairs, fix)});
  reach_problems_ = std::move(problems);
  CommitOrBegin(out);
}

void Coordinator::ReserveOrBegin(std::vector<CoordinatorEffect>& out) {
  if (spec_.cluster.store_port) {
    BeginRound(*spec_.cluster.store_port, out);
  } else {
    out.push_back(ReserveStorePort{round_});
  }
}

bool Coordinator::PositionsFilled() const {
  for (int slot : slot_at_) {
    if (!slots_[static_cast<size_t>(slot)].conn) return false;
  }
  return true;
}

bool Coordinator::AssignPositions(TimePoint now, std::vector<CoordinatorEffect>& out) {
  replace_at_.reset();
  shrunk_note_.clear();
  auto playable = [&](const Slot& slot) { return slot.conn && !Quarantined(slot, now); };
  bool all = true;
  for (int slot : slot_at_) all = all && playable(slots_[static_cast<size_t>(slot)]);
  if (!all && spec_.cluster.spares > 0) {
    // Waiting spares, lowest agent first (a returned node whose rank went to a spare is one).
    std::vector<int> waiting;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].position < 0 && playable(slots_[i])) waiting.push_back(static_cast<int>(i));
    }
    size_t next = 0;
    // Node 0 hosts the coordinator and rank 0's store: it is never replaced.
    for (size_t p = 1; p < slot_at_.size(); ++p) {
      Slot& away = slots_[static_cast<size_t>(slot_at_[p])];
      if (playable(away)) continue;
      // A quarantined host gives its rank up at once; an absent one after timeouts.replace.
      const bool quarantined = away.conn.has_value();
      const TimePoint since = away.absent_since.value_or(absence_origin_);
      const TimePoint due = quarantined ? now : since + spec_.timeouts.replace;
      if (next >= waiting.size()) break;
      if (now < due) {
        if (!replace_at_ || due < *replace_at_) replace_at_ = due;
        continue;
      }
      const int spare = waiting[next++];
      Slot& taker = slots_[static_cast<size_t>(spare)];
      const std::string before = AgentName(slot_at_[p]);
      const std::string taker_name = AgentName(spare);
      away.position = -1;
      taker.position = static_cast<int>(p);
      slot_at_[p] = spare;
      out.push_back(LogLine{
          LogLevel::kWarn,
          quarantined ? fmt::format("{} takes node rank {} in place of {}, whose host is quarantined",
                                    taker_name, p, before)
                      : fmt::format("{} takes node rank {} in place of {}, away for {} (more than "
                                    "timeouts.replace = {})",
                                    taker_name, p, before, HumanDuration(now - since),
                                    FormatDuration(spec_.timeouts.replace))});
    }
  }
  round_slots_.clear();
  for (int slot : slot_at_) {
    if (playable(slots_[static_cast<size_t>(slot)])) round_slots_.push_back(slot);
  }
  if (round_slots_.size() == slot_at_.size()) return true;
  return ShrinkRound(now, out);
}

bool Coordinator::ShrinkRound(TimePoint now, std::vector<CoordinatorEffect>& out) {
  const int nnodes = spec_.cluster.nnodes;
  const bool can_shrink = spec_.cluster.min_nodes < nnodes;
  std::vector<std::string> without;  // the node ranks given up, and why
  bool kept_out = false;             // a connected node is left out (quarantined)
  bool pending = false;              // an absent node may still come back in time
  for (size_t p = 0; p < slot_at_.size(); ++p) {
    const int index = slot_at_[p];
    const Slot& slot = slots_[static_cast<size_t>(index)];
    if (slot.conn && !Quarantined(slot, now)) continue;
    if (slot.conn) {
      // A spare may still be on its way (agents start in any order): wait for one as long
      // as for an absent node, from the start of this rendezvous.
      const TimePoint spare_due = absence_origin_ + spec_.timeouts.replace;
      if (spec_.cluster.spares > 0 && now < spare_due) {
        if (!replace_at_ || spare_due < *replace_at_) replace_at_ = spare_due;
        pending = true;
        continue;
      }
      kept_out = true;
      without.push_back(fmt::format("{}: its host is quarantined", NodeName(index)));
      continue;
    }
    if (p == 0) {
      // Rank 0 is the coordinator's own agent (it hosts rank 0's store): it is never left
      // out, however late it joins (a slow start of its own process is not an absence).
      pending = true;
      continue;
    }
    const TimePoint since = slot.absent_since.value_or(absence_origin_);
    const TimePoint due = since + spec_.timeouts.replace;
    if (!can_shrink || now < due) {
      if (can_shrink && (!replace_at_ || due < *replace_at_)) replace_at_ = due;
      pending = true;
      continue;
    }
    without.push_back(fmt::format("{}: away for {} (more than timeouts.replace = {})",
                                  NodeName(index), HumanDuration(now - since),
                                  FormatDuration(spec_.timeouts.replace)));
  }
  if (pending) return false;
  const auto enough = [&] { return static_cast<int>(round_slots_.size()) >= spec_.cluster.min_nodes; };
  const char* no_spare = spec_.cluster.spares > 0 ? ", and no spare waits" : "";
  if (can_shrink && enough()) {
    shrunk_note_ = fmt::format("without {}{}", fmt::join(without, "; "), no_spare);
    return true;
  }
  if (!kept_out) return false;
  // Nothing can take the quarantined hosts' places: they play after all.
  round_slots_.clear();
  for (int slot : slot_at_) {
    if (slots_[static_cast<size_t>(slot)].conn) round_slots_.push_back(slot);
  }
  out.push_back(LogLine{LogLevel::kWarn,
                        fmt::format("round {}: quarantined hosts take part after all: no spare "
                                    "waits{} to run without them",
                                    round_,
                                    can_shrink ? fmt::format(" and cluster.min_nodes = {} needs them",
                                                             spec_.cluster.min_nodes)
                                               : "")});
  if (round_slots_.size() == slot_at_.size()) return true;
  if (!can_shrink || !enough()) return false;
  without.clear();
  for (int slot : slot_at_) {
    if (!slots_[static_cast<size_t>(slot)].conn) without.push_back(NodeName(slot) + ": away");
  }
  shrunk_note_ = fmt::format("without {}{}", fmt::join(without, "; "), no_spare);
  return true;
}

bool Coordinator::Quarantined(const Slot& slot, TimePoint now) const {
  if (slot.host.empty() || &slot == slots_.data()) return false;  // node 0 never is
  auto it = hosts_.find(slot.host);
  return it != hosts_.end() && it->second.until && *it->second.until > now;
}

void Coordinator::CountFailure(TimePoint now, const Failure& failure, std::vector<CoordinatorEffect>& out) {
  const auto& q = spec_.quarantine;
  if (q.failures <= 0 || !spec_.cluster.CanReplace()) return;
  if (failure.node_rank <= 0 || failure.node_rank >= static_cast<int>(slots_.size())) return;
  const Slot& slot = slots_[static_cast<size_t>(failure.node_rank)];
  if (slot.host.empty() || Quarantined(slot, now)) return;
  HostRecord& record = hosts_[slot.host];
  record.failures.push_back(now);
  while (!record.failures.empty() && now - record.failures.front() > q.window) record.failures.pop_front();
  if (static_cast<int>(record.failures.size()) < q.failures) return;
  record.failures.clear();
  Duration cooldown = q.cooldown;  // doubled per earlier quarantine, up to a year
  for (int i = 0; i < record.times && cooldown < Hours(24 * 365); ++i) cooldown *= 2;
  record.until = now + cooldown;
  ++record.times;
  out.push_back(LogLine{LogLevel::kWarn,
                        fmt::format("quarantine: host {} ({}) sits out for {}: {} rounds failed "
                                    "because of it within quarantine.window = {}, the last with "
                                    "{}; quarantine {} of this host (each lasts twice as long as "
                                    "the one before)",
                                    slot.host, NodeName(failure.node_rank), HumanDuration(cooldown),
                                    q.failures, FormatDuration(q.window), failure.what, record.times)});
  RecordQuarantineState(now, out);
}

void Coordinator::RecordQuarantineState(TimePoint now, std::vector<CoordinatorEffect>& out) const {
  RecordQuarantine record;
  for (const auto& [host, h] : hosts_) {
    if (h.times == 0) continue;
    record.hosts.push_back({host, h.until ? *h.until - now : Duration::zero(), h.times});
  }
  out.push_back(std::move(record));
}

void Coordinator::RestoreQuarantine(const std::vector<QuarantinedHost>& hosts,
                                    std::vector<CoordinatorEffect>& out) {
  const TimePoint now = last_input_;
  std::vector<std::string> names;
  for (const QuarantinedHost& q : hosts) {
    if (q.host.empty() || q.times <= 0) continue;
    HostRecord& record = hosts_[q.host];
    record.times = std::max(record.times, q.times);
    if (q.left > Duration::zero()) {
      record.until = now + q.left;
      names.push_back(fmt::format("{} for {} more", q.host, HumanDuration(q.left)));
    }
  }
  if (names.empty()) return;
  out.push_back(LogLine{LogLevel::kWarn,
                        fmt::format("quarantine (kept from an earlier launch of this job): {}{}",
                                    fmt::join(names, ", "),
                                    spec_.cluster.CanReplace()
                                        ? ""
                                        : "; without spares or cluster.min_nodes they take part "
                                          "anyway")});
}

std::string Coordinator::QuarantineNote(TimePoint now) const {
  std::vector<std::string> names;
  for (const auto& [host, h] : hosts_) {
    if (h.until && *h.until > now) {
      names.push_back(fmt::format("{} for {} more", host, HumanDuration(*h.until - now)));
    }
  }
  if (names.empty()) return "";
  return fmt::format("quarantined: {}", fmt::join(names, ", "));
}

void Coordinator::BeginRound(uint16_t store_port, std::vector<CoordinatorEffect>& out) {
  phase_ = Phase::kRunning;
  rounds_may_run_ = true;
  out.push_back(RecordJournal{true});
  failure_.reset();
  for (Slot& slot : slots_) slot.done = false;
  done_count_ = 0;
  const size_t nodes = round_slots_.size();
  const int world = static_cast<int>(nodes) * spec_.cluster.nproc_per_node;
  if (nodes < slot_at_.size()) {
    std::vector<std::string> moved;
    for (size_t p = 0; p < nodes; ++p) {
      const Slot& slot = slots_[static_cast<size_t>(round_slots_[p])];
      if (slot.position != static_cast<int>(p)) {
        moved.push_back(fmt::format("{} plays node rank {}", NodeName(round_slots_[p]), p));
      }
    }
    out.push_back(LogLine{LogLevel::kWarn,
                          fmt::format("round {}: starting {} workers on {} of the job's {} nodes "
                                      "(cluster.min_nodes = {}): {}{}",
                                      round_, world, nodes, slot_at_.size(), spec_.cluster.min_nodes,
                                      shrunk_note_,
                                      moved.empty() ? "" : fmt::format("; {}", fmt::join(moved, ", ")))});
  } else {
    out.push_back(LogLine{LogLevel::kInfo,
                          nodes == 1 ? fmt::format("round {}: starting {} workers", round_, world)
                                     : fmt::format("round {}: all {} nodes joined; starting {} workers",
                                                   round_, nodes, world)});
  }
  probe_.reset();
  ranks_seen_.clear();
  next_straggler_check_.reset();
  // Each agent hears the node rank it plays: its own, for a spare the one it replaces, in a
  // smaller round its place among the nodes that take part.
  const auto round_nodes = static_cast<int32_t>(nodes < slot_at_.size() ? nodes : 0);
  for (size_t p = 0; p < nodes; ++p) {
    const Slot& slot = slots_[static_cast<size_t>(round_slots_[p])];
    if (slot.conn) {
      out.push_back(SendTo{*slot.conn, wire::StartRound{round_, store_port, longest_interval_ms_,
                                                        static_cast<int32_t>(p), round_nodes,
                                                        master_addr_}});
    }
  }
}

Coordinator::Failure Coordinator::FailureOf(int node_rank, const wire::WorkerFailed& failed) const {
  Failure failure;
  failure.round = failed.round;
  failure.node_rank = node_rank;
  failure.global_rank = failed.global_rank;
  failure.what = fmt::format("rank {} ({}, local rank {}) {}", failed.global_rank,
                             NodeName(node_rank), failed.local_rank,
                             DescribeExit(failed.exit_code, failed.signal));
  if (!failed.error_file.empty()) {
    failure.detail = "  error (from TORCHELASTIC_ERROR_FILE):\n" + Indent(failed.error_file, "    | ");
  }
  // Python prints the traceback that the error file already holds to stderr too: show it once.
  const std::string tail = WithoutTraceback(failed.stderr_tail, failed.error_file);
  if (!tail.empty()) {
    failure.detail += fmt::format("  last lines of its stderr{}:\n",
                                  tail.size() < failed.stderr_tail.size()
                                      ? " (without the traceback shown above)"
                                      : "") +
                      Indent(tail, "    | ");
  } else if (failed.error_file.empty()) {
    failure.detail = "  (it wrote nothing to stderr)\n";
  }
  failure.mentions_nccl = MentionsNccl(failed.stderr_tail) || MentionsNccl(failed.error_file);
  failure.kinds = FailureKinds(failed.exit_code, failed.signal, failed.error_file, failed.stderr_tail);
  failure.lost_peer = LooksLikeALostPeer(failed.error_file, failed.stderr_tail);
  failure.the_stop = LooksLikeTheStop(failed.error_file, failed.stderr_tail);
  return failure;
}

void Coordinator::ReviseRootCause(Failure failure, std::vector<CoordinatorEffect>& out) {
  DDPRUN_ASSERT(phase_ == Phase::kStopping && failure_ && failure_->lost_peer && !failure.lost_peer);
  const std::string first = failure_->what;
  failure.detail += fmt::format("  ({} failed before it, with an error that says it lost a peer: "
                                "a consequence, not the cause)\n",
                                first.substr(0, first.find(" (")));
  out.push_back(LogLine{LogLevel::kWarn,
                        fmt::format("round {}: the root cause is {}; {} failed first, but its error "
                                    "says only that it lost a peer",
                                    round_, failure.what, first)});
  failure_ = std::move(failure);
  last_failure_ = failure_;
  // Every node hears the root cause again, so no node is left with the consequence.
  const bool last = restarts_used_ >= spec_.restart.max_restarts;
  Broadcast(wire::StopRound{round_, failure_->what + "\n" + failure_->detail, last, failure_->global_rank}, out);
}

void Coordinator::BeginStop(TimePoint now, Failure failure, std::vector<CoordinatorEffect>& out) {
  DDPRUN_ASSERT(phase_ == Phase::kRunning || phase_ == Phase::kStarting);
  reach_.reset();  // a node lost while the others probed: the next round probes again
  if (probe_) {
    // The round had stopped making progress before this. A lost node or our own stall
    // explains the silence; anything else came after the hang and is not its cause.
    if (failure.explains_silence) {
      failure.detail += fmt::format("  (before that, {} had sent no progress beacon for {}: the "
                                    "ranks waited for the lost ones)\n",
                                    RankName(probe_->first.global_rank),
                                    HumanDuration(Millis(probe_->first.silent_ms)));
      probe_.reset();
    } else {
      const std::string meanwhile = failure.what;
      failure = HangFailure();
      failure.detail += fmt::format("  meanwhile, while the stacks were collected: {}\n", meanwhile);
    }
  }
  out.push_back(LogLine{LogLevel::kError, fmt::format("round {} failed: {}; stopping every worker "
                                                      "on every node", round_, failure.what)});
  failure_ = failure;
  last_failure_ = std::move(failure);
  phase_ = Phase::kStopping;
  phase_deadline_ = now + spec_.timeouts.ExitBarrier();
  for (Slot& slot : slots_) {
    slot.stopped = false;
    slot.stopped_ranks = 0;
  }
  stopped_joined_ = 0;
  // Waiting spares run nothing: they have nothing to stop.
  for (Slot& slot : slots_) {
    if (slot.plays < 0 && slot.conn) MarkStopped(slot, 0);
  }
  // Every node hears the root cause with its traceback, also when a restart follows.
  const bool last = restarts_used_ >= spec_.restart.max_restarts;
  Broadcast(wire::StopRound{round_, failure_->what + "\n" + failure_->detail, last, failure_->global_rank}, out);
  MaybeFinishStop(now, out);
}

void Coordinator::MarkStopped(Slot& slot, int stopped_ranks) {
  if (slot.stopped) return;
  slot.stopped = true;
  slot.stopped_ranks = stopped_ranks;
  if (slot.conn) ++stopped_joined_;
}

void Coordinator::MaybeFinishStop(TimePoint now, std::vector<CoordinatorEffect>& out) {
  if (phase_ != Phase::kStopping || stopped_joined_ < joined_) return;
  int stopped_ranks = 0;
  int stopped_nodes = 0;
  for (const Slot& slot : slots_) {
    stopped_ranks += slot.stopped_ranks;
    if (slot.stopped_ranks > 0) ++stopped_nodes;
  }
  const Failure& failure = *failure_;
  CountFailure(now, failure, out);
  const std::string never = NeverRestartRule(failure);
  if (!never.empty()) {
    out.push_back(LogLine{LogLevel::kError,
                          fmt::format("restart.never_on has \"{}\": the job ends without a restart "
                                      "({} of {} restarts left)",
                                      never, spec_.restart.max_restarts - restarts_used_,
                                      spec_.restart.max_restarts)});
  } else if (restarts_used_ < spec_.restart.max_restarts) {
    earlier_causes_.push_back(fmt::format("round {}: {}{}", failure.round, failure.what,
                                          failure.kinds.empty() ? "" : " (" + failure.kinds.front() + ")"));
    ++restarts_used_;
    ++round_;
    out.push_back(LogLine{LogLevel::kWarn,
                          fmt::format("all workers stopped ({} stopped by ddprun); restart {} of {} "
                                      "in {}",
                                      stopped_ranks, restarts_used_, spec_.restart.max_restarts,
                                      FormatDuration(spec_.RestartBackoff(restarts_used_)))});
    phase_ = Phase::kBackoff;
    phase_deadline_ = now + spec_.RestartBackoff(restarts_used_);
    if (commit_rounds_) {
      const bool unconfirmed = std::any_of(slots_.begin(), slots_.end(), [now](const Slot& s) {
        return s.fence && s.fence->until > now;
      });
      out.push_back(RecordRestart{round_, restarts_used_, unconfirmed});
    }
    return;
  }
  ended_by_rule_ = !never.empty();
  EndJob(now, ToInt(ExitCode::kJobFailed), FailureSummary(failure, stopped_ranks, stopped_nodes, never), out);
}

std::string Coordinator::RendezvousFailure() const {
  // Say what happened to each missing node: it never came, it was refused (and why), or it
  // joined and left. Only the first kMaxMissingNamed of each kind are named.
  std::vector<std::string> never, refused, left;
  size_t never_count = 0, refused_count = 0, left_count = 0;
  auto add = [](std::vector<std::string>& names, size_t& count, std::string name) {
    if (names.size() < kMaxMissingNamed) names.push_back(std::move(name));
    ++count;
  };
  // The node ranks that had no agent; waiting spares are not missing.
  int filled = 0;
  for (size_t p = 0; p < slot_at_.size(); ++p) {
    const auto i = static_cast<size_t>(slot_at_[p]);
    const Slot& slot = slots_[i];
    if (slot.conn) {
      ++filled;
      continue;
    }
    const std::string name = NodeName(static_cast<int>(i));
    if (!slot.refused.empty()) {
      add(refused, refused_count, fmt::format("{}: {}", name, slot.refused));
    } else if (slot.ever_joined) {
      add(left, left_count, fmt::format("{}: {}", name, slot.left));
    } else {
      add(never, never_count, name);
    }
  }
  auto list = [](const std::vector<std::string>& names, size_t count, const char* separator = ", ") {
    std::string text = fmt::format("{}", fmt::join(names, separator));
    if (count > names.size()) text += fmt::format(" and {} more", count - names.size());
    return text;
  };
  std::string text = fmt::format("rendezvous failed: {}/{} nodes joined within timeouts.rendezvous = {}",
                                 filled, slot_at_.size(), FormatDuration(spec_.timeouts.rendezvous));
  if (!refused.empty()) text += "; refused: " + list(refused, refused_count, "; ");
  if (!left.empty()) text += "; joined, then left: " + list(left, left_count, "; ");
  if (!never.empty()) text += "; never joined: " + list(never, never_count);
  if (spec_.cluster.min_nodes < spec_.cluster.nnodes) {
    text += fmt::format("; cluster.min_nodes = {} needs at least that many", spec_.cluster.min_nodes);
  }
  const std::string file = spec_.source_name.empty() ? "job.toml" : spec_.source_name;
  if (!never.empty()) {
    // With `nnodes` (no host list) a node cannot find its rank by itself.
    const std::string command = spec_.cluster.nodes.empty()
                                    ? fmt::format("ddprun {} --node-rank N", file)
                                    : fmt::format("ddprun {}", file);
    text += fmt::format("\nhint: start `{}` on the missing nodes, and check that they can reach "
                        "{}:{} (the firewall must let TCP port {} through)",
                        command, spec_.cluster.master_addr, spec_.cluster.master_port,
                        spec_.cluster.master_port);
  }
  if (!refused.empty()) {
    text += "\nhint: the refused nodes printed the reason too; fix it and start them again";
  }
  return text;
}

std::string Coordinator::NeverRestartRule(const Failure& failure) const {
  for (const std::string& rule : spec_.restart.never_on) {
    if (RuleMatches(rule, failure.kinds)) return rule;
  }
  return "";
}

std::string Coordinator::EarlierCausesNote() const {
  // The newest few; a job restarted a hundred times says how many more there were.
  constexpr size_t kShown = 5;
  const size_t skipped = earlier_causes_.size() > kShown ? earlier_causes_.size() - kShown : 0;
  std::string text = "earlier rounds' root causes:";
  if (skipped > 0) text += fmt::format("\n  ({} earlier ones in the event log)", skipped);
  for (size_t i = skipped; i < earlier_causes_.size(); ++i) text += "\n  " + earlier_causes_[i];
  return text;
}

std::string Coordinator::FailureSummary(const Failure& failure, int stopped_ranks,
                                        int stopped_nodes, const std::string& never_rule) const {
  if (spec_.job.is_preflight) {
    // The preflight's verdict is its rank's report (quoted below), not a training failure.
    return fmt::format("preflight FAILED: {}\n{}logs: {}/{}/{}/attempt-{}/", failure.what, failure.detail,
                       spec_.logs.dir, spec_.job.name, NodeLatestLink(failure.node_rank), failure.round);
  }
  std::string text = fmt::format("job \"{}\" FAILED in round {}", spec_.job.name, failure.round);
  if (!never_rule.empty()) {
    text += fmt::format(", not restarted: restart.never_on has \"{}\" ({} of {} restart{} left)",
                        never_rule, spec_.restart.max_restarts - restarts_used_,
                        spec_.restart.max_restarts, spec_.restart.max_restarts == 1 ? "" : "s");
  } else if (spec_.restart.max_restarts > 0) {
    text += fmt::format(" after using all {} restart{}", spec_.restart.max_restarts,
                        spec_.restart.max_restarts == 1 ? "" : "s");
  } else {
    text += " (restart.max_restarts = 0)";
  }
  text += fmt::format("\nroot cause (first failure anywhere in the job): {}\n", failure.what);
  if (!failure.kinds.empty()) text += fmt::format("  kind: {}\n", fmt::join(failure.kinds, ", "));
  text += failure.detail;
  const bool hang = std::find(failure.kinds.begin(), failure.kinds.end(), "hang") != failure.kinds.end();
  text += fmt::format("ddprun then stopped {} {}running rank{} on {} node{}{}.\n", stopped_ranks,
                      hang ? "" : "other ", stopped_ranks == 1 ? "" : "s", stopped_nodes,
                      stopped_nodes == 1 ? "" : "s", hang ? ", the hung ones included" : "");
  if (failure.mentions_nccl) {
    text += "hint: the error mentions NCCL; rerun with NCCL_DEBUG=INFO in job.env to see why.\n";
  }
  if (!stragglers_seen_.empty()) text += StragglerNote() + "\n";
  if (const std::string q = QuarantineNote(last_input_); !q.empty()) text += q + "\n";
  if (!earlier_causes_.empty()) text += EarlierCausesNote() + "\n";
  // Each node writes its own run folder (schema/worker_env.h): the root cause's node's, by a
  // link that names the same folder on a logs.dir that the nodes share.
  text += fmt::format("logs: {}/{}/{}/attempt-{}/ (on node {}; each node keeps its own runs under {}/{}/latest-n<node>)",
                      spec_.logs.dir, spec_.job.name, NodeLatestLink(failure.node_rank), failure.round,
                      failure.node_rank, spec_.logs.dir, spec_.job.name);
  return text;
}

void Coordinator::EndJob(TimePoint now, int exit_code, std::string summary,
                         std::vector<CoordinatorEffect>& out) {
  exit_code_ = exit_code;
  end_summary_ = std::move(summary);
  phase_ = Phase::kEnding;
  reach_.reset();
  phase_deadline_ = now + spec_.timeouts.ExitBarrier();
  // Who must hear the verdict before we exit: every connected node (it acknowledges, or its
  // connection closes after we told it), and every node that joined once and is away now (lost
  // to a pause or a partition, it stops its workers and rejoins to hear it). A node that never
  // joined is not waited for.
  awaiting_end_ = 0;
  for (Slot& slot : slots_) {
    // A node whose rank went to a spare is not waited for: its workers were gone before the
    // spare's round started (its lease), and it takes no part in the job any more.
    // Nor is one that sat out the last round (cluster.min_nodes): it runs nothing either.
    const bool took_part = slot.position >= 0 && (slot.plays >= 0 || round_slots_.empty());
    slot.end = slot.conn                           ? EndState::kTold
               : slot.ever_joined && took_part ? EndState::kAway
                                               : EndState::kSettled;
    if (slot.end != EndState::kSettled) ++awaiting_end_;
  }
  if (commit_rounds_) {
    // etcd: the verdict is told once the store has it (EndRecorded).
    awaiting_end_record_ = true;
    out.push_back(RecordEnd{exit_code, end_summary_});
    return;
  }
  Broadcast(wire::JobEnd{exit_code, end_summary_}, out);
  MaybeDone(out);
}

void Coordinator::SettleEnd(Slot& slot) {
  if (phase_ != Phase::kEnding || slot.end == EndState::kSettled) return;
  slot.end = EndState::kSettled;
  --awaiting_end_;
}

void Coordinator::MaybeDone(std::vector<CoordinatorEffect>& out) {
  // Every node, not only the connected ones: one that lost us (a pause, a partition) is
  // stopping its workers and will rejoin to hear the verdict, within the exit barrier.
  if (phase_ != Phase::kEnding || awaiting_end_ > 0) return;
  // Every node confirmed its workers stopped: the next coordinator here need not wait.
  if (rounds_may_run_) out.push_back(RecordJournal{false});
  Finish(out);
}

void Coordinator::Finish(std::vector<CoordinatorEffect>& out) {
  phase_ = Phase::kDone;
  rounds_may_run_ = false;
  if (!done_emitted_) {
    done_emitted_ = true;
    out.push_back(CoordinatorDone{*exit_code_});
  }
}

void Coordinator::Broadcast(const wire::Message& message, std::vector<CoordinatorEffect>& out) const {
  for (const Slot& slot : slots_) {
    if (slot.conn) out.push_back(SendTo{*slot.conn, message});
  }
}

void Coordinator::SendProgress(TimePoint now, std::vector<CoordinatorEffect>& out) {
  wire::Progress progress;
  progress.total = static_cast<int32_t>(slot_at_.size());
  progress.joined = 0;
  for (size_t p = 0; p < slot_at_.size(); ++p) {
    if (slots_[static_cast<size_t>(slot_at_[p])].conn) {
      ++progress.joined;
    } else if (progress.missing.size() < kMaxMissingNamed) {
      progress.missing.push_back(static_cast<int32_t>(p));
    }
  }
  progress.elapsed_ms = ToMillis(now - rendezvous_started_);
  progress.timeout_ms = ToMillis(spec_.timeouts.rendezvous);
  Broadcast(progress, out);
}

}  // namespace ddprun::core

// ---- Hung ranks and stragglers ---------------------------------------------------------

namespace ddprun::core {
namespace {

// How long the coordinator waits for every node's stacks (JobSpec::Timeouts::StacksWait).
Duration StacksWait(const JobSpec& spec) { return spec.timeouts.StacksWait(); }

// The most groups of identical stacks a hang summary lists, and culprits shown with a stack.
constexpr size_t kMaxGroups = 12;
constexpr size_t kMaxCulpritStacks = 4;
constexpr size_t kMaxStragglersNamed = 16;

std::string Seconds3(int64_t us) { return fmt::format("{:.3g}s", static_cast<double>(us) / 1e6); }

std::string StepRange(int64_t low, int64_t high) {
  if (high < 0) return "no step yet";
  if (low == high) return fmt::format("last step {}", low);
  return fmt::format("last steps {}..{}", std::max<int64_t>(low, 0), high);
}

}  // namespace

std::string Coordinator::RankName(int global_rank) const {
  const int nproc = spec_.cluster.nproc_per_node;
  const auto position = static_cast<size_t>(global_rank / nproc);
  const int slot = position < round_slots_.size() ? round_slots_[position] : static_cast<int>(position);
  return fmt::format("rank {} ({}, local rank {})", global_rank,
                     slot < static_cast<int>(slots_.size()) ? NodeName(slot)
                                                            : fmt::format("node {}", position),
                     global_rank % nproc);
}

void Coordinator::OnRankHung(TimePoint now, int node_rank, const wire::RankHung& hung,
                             std::vector<CoordinatorEffect>& out) {
  const int nproc = spec_.cluster.nproc_per_node;
  if (phase_ != Phase::kRunning || hung.round != round_ || probe_ ||
      hung.global_rank / nproc != slots_[static_cast<size_t>(node_rank)].plays || hung.global_rank < 0) {
    return;  // stale, already probing, or not a rank of that node
  }
  probe_ = Probe{hung, node_rank, now + StacksWait(spec_), std::vector<bool>(slots_.size()), 0, {}};
  out.push_back(LogLine{LogLevel::kError,
                        fmt::format("round {}: {} sent no progress beacon for {}; asking every "
                                    "node where its ranks are before stopping the round",
                                    round_, RankName(hung.global_rank),
                                    HumanDuration(Millis(hung.silent_ms)))});
  Broadcast(wire::DumpStacks{round_}, out);
}

void Coordinator::OnRankStacks(TimePoint now, int node_rank, const wire::RankStacks& stacks,
                               std::vector<CoordinatorEffect>& out) {
  if (!probe_ || stacks.round != round_ || probe_->answered[static_cast<size_t>(node_rank)]) return;
  probe_->answered[static_cast<size_t>(node_rank)] = true;
  ++probe_->answers;
  const int nproc = spec_.cluster.nproc_per_node;
  const int position = slots_[static_cast<size_t>(node_rank)].plays;
  for (const wire::RankState& state : stacks.ranks) {
    if (state.global_rank < 0 || state.global_rank / nproc != position) continue;
    probe_->ranks[state.global_rank] = RankAtHang{state.global_rank, node_rank,
                                                  state.global_rank % nproc, state.step,
                                                  state.silent_ms, ParseFrames(state.stack)};
  }
  if (probe_->answers >= joined_) BeginStop(now, HangFailure(), out);
}

Coordinator::Failure Coordinator::HangFailure() {
  DDPRUN_ASSERT(probe_.has_value());
  Probe probe = std::move(*probe_);
  probe_.reset();
  const int nproc = spec_.cluster.nproc_per_node;
  if (!probe.ranks.count(probe.first.global_rank)) {
    // Its node did not answer: what it said when it reported the silence.
    probe.ranks[probe.first.global_rank] =
        RankAtHang{probe.first.global_rank, probe.first_node, probe.first.local_rank,
                   probe.first.step, probe.first.silent_ms, {}};
  }
  std::vector<RankAtHang> ranks;
  for (auto& [rank, state] : probe.ranks) ranks.push_back(state);
  const HangVerdict verdict = FindHungRanks(ranks, probe.first.global_rank);
  ++hang_judgements_;
  last_hang_judgement_ = HangJudgement{round_, verdict.culprits, {}};
  for (const RankAtHang& r : ranks) {
    if (!r.stack.empty()) last_hang_judgement_.with_stack.push_back(r.global_rank);
  }
  const RankAtHang& culprit = probe.ranks.at(verdict.culprits.front());

  const auto& t = spec_.timeouts;
  std::string limit;
  if (probe.first.first_beat) {
    limit = fmt::format("timeouts.progress_start = {}", FormatDuration(t.progress_start));
  } else if (t.progress) {
    limit = fmt::format("timeouts.progress = {}", FormatDuration(*t.progress));
  } else if (probe.first.learnt) {
    limit = fmt::format("timeouts.progress = \"auto\", {} learnt from this job",
                        HumanDuration(Millis(probe.first.timeout_ms)));
  } else {
    limit = fmt::format("timeouts.progress = \"auto\", nothing learnt yet: timeouts.progress_start = {}",
                        FormatDuration(t.progress_start));
  }
  Failure failure;
  failure.round = round_;
  failure.node_rank = culprit.node_rank;
  failure.global_rank = culprit.global_rank;
  failure.kinds = {"hang"};
  const std::string who =
      verdict.culprits.size() == 1
          ? RankName(culprit.global_rank)
          : fmt::format("ranks {} ({} first)", RankRanges(verdict.culprits), RankName(culprit.global_rank));
  failure.what = fmt::format(
      "{} hung: no progress for {} {} ({})", who,
      HumanDuration(Millis(std::max<int64_t>(culprit.silent_ms, 0))),
      culprit.step >= 0 ? fmt::format("after step {}", culprit.step) : std::string("since it started"),
      limit);

  // Where everyone was: the culprits with their stacks, then the others grouped by stack.
  std::string detail = fmt::format("  why {}: {}\n", verdict.culprits.size() == 1
                                                         ? fmt::format("rank {}", culprit.global_rank)
                                                         : fmt::format("ranks {}", RankRanges(verdict.culprits)),
                                    verdict.reason);
  detail += fmt::format("  where each rank was (its main thread, innermost call first; all threads "
                        "in {}/{}/latest-n<node>/attempt-{}/rank-<r>.stacks on the rank's node):\n",
                        spec_.logs.dir, spec_.job.name, round_);
  const std::vector<int> with_stacks(
      verdict.culprits.begin(),
      verdict.culprits.begin() + static_cast<std::ptrdiff_t>(std::min(verdict.culprits.size(), kMaxCulpritStacks)));
  for (int rank : with_stacks) {
    const RankAtHang& r = probe.ranks.at(rank);
    detail += fmt::format("    rank {}, {}, silent {}: {}\n", rank, StepRange(r.step, r.step),
                          r.silent_ms >= 0 ? HumanDuration(Millis(r.silent_ms)) : "?",
                          r.stack.empty() ? "no stack" : DescribeStack(r.stack));
    for (const Frame& f : r.stack) {
      detail += fmt::format("      File \"{}\", line {} in {}\n", f.file, f.line, f.function);
    }
  }
  struct Group {
    std::vector<int> ranks;
    int64_t low = INT64_MAX, high = -1;
    std::string where;
  };
  std::map<std::string, Group> groups;
  for (const auto& [rank, r] : probe.ranks) {
    if (std::find(with_stacks.begin(), with_stacks.end(), rank) != with_stacks.end()) continue;
    const std::string key = r.stack.empty() ? std::string() : FormatFrames(r.stack);
    Group& g = groups[key];
    g.ranks.push_back(rank);
    g.low = std::min(g.low, r.step);
    g.high = std::max(g.high, r.step);
    g.where = r.stack.empty() ? "no stack (the worker does not `import ddprun`, or sent no hello)"
                              : DescribeStack(r.stack);
  }
  std::vector<const Group*> ordered;
  for (const auto& [key, g] : groups) ordered.push_back(&g);
  std::stable_sort(ordered.begin(), ordered.end(), [](const Group* a, const Group* b) {
    return a->ranks.size() > b->ranks.size();
  });
  for (size_t i = 0; i < ordered.size() && i < kMaxGroups; ++i) {
    const Group& g = *ordered[i];
    detail += fmt::format("    {} {}, {}: {}\n", g.ranks.size() == 1 ? "rank" : fmt::format("{} ranks", g.ranks.size()),
                          RankRanges(g.ranks), StepRange(g.low, g.high), g.where);
  }
  if (ordered.size() > kMaxGroups) {
    detail += fmt::format("    ... and {} more groups of ranks\n", ordered.size() - kMaxGroups);
  }
  std::vector<int> unanswered;  // node ranks
  for (size_t p = 0; p < round_slots_.size(); ++p) {
    if (!probe.answered[static_cast<size_t>(round_slots_[p])]) unanswered.push_back(static_cast<int>(p));
  }
  if (!unanswered.empty()) {
    detail += fmt::format("    node{} {} did not answer in time: {} ranks unknown\n",
                          unanswered.size() == 1 ? "" : "s", RankRanges(unanswered),
                          unanswered.size() * static_cast<size_t>(nproc));
  }
  if (!reach_problems_.empty()) {
    detail += fmt::format("  likely cause: before round 0 some nodes could not connect on a port other than "
                          "master_port (rendezvous.probe = \"warn\" started the job anyway), so gloo and NCCL "
                          "cannot connect either:\n    {}\n",
                          fmt::join(reach_problems_, "\n    "));
  }
  failure.detail = std::move(detail);
  return failure;
}

void Coordinator::OnRankProgress(TimePoint now, int node_rank, const wire::RankProgress& progress) {
  if (phase_ != Phase::kRunning || progress.round != round_) return;
  const int nproc = spec_.cluster.nproc_per_node;
  const int position = slots_[static_cast<size_t>(node_rank)].plays;
  for (const wire::RankRate& rate : progress.ranks) {
    if (rate.global_rank < 0 || rate.global_rank / nproc != position) continue;
    RankSeen& seen = ranks_seen_[rate.global_rank];
    seen.node_rank = node_rank;
    seen.rate = rate;
    // Bounded by what a rank can be silent for: a year.
    longest_interval_ms_ = std::max(longest_interval_ms_, std::clamp<int64_t>(rate.longest_ms, 0, 365LL * 86'400'000));
  }
  if (!next_straggler_check_ && spec_.stragglers.slower_percent > 0) {
    next_straggler_check_ = now + spec_.ProgressReportPeriod();
  }
}

void Coordinator::CheckStragglers(TimePoint now, std::vector<CoordinatorEffect>& out) {
  next_straggler_check_ = now + spec_.ProgressReportPeriod();
  // Like with like: the ranks' own work per step when every rank reports it (DDP ranks wait
  // for each other, so their step times are equal), else the time per step.
  std::vector<std::pair<int, RankSeen*>> ranks;
  bool all_work = true;
  for (auto& [rank, seen] : ranks_seen_) {
    if (seen.rate.step_us <= 0) continue;
    ranks.emplace_back(rank, &seen);
    if (seen.rate.work_us <= 0) all_work = false;
  }
  if (ranks.size() < 2) return;
  std::sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  auto metric = [&](const RankSeen& s) { return all_work ? s.rate.work_us : s.rate.step_us; };
  std::vector<int64_t> values;
  for (const auto& [rank, seen] : ranks) values.push_back(metric(*seen));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2), values.end());
  const int64_t median = values[values.size() / 2];
  if (median <= 0) return;
  const int percent = spec_.stragglers.slower_percent;
  const char* what = all_work ? "its own work per step" : "its time per step";
  for (auto& [rank, seen] : ranks) {
    const int64_t value = metric(*seen);
    const bool slow = value * 100 > median * (100 + percent);
    if (slow == seen->straggling) continue;
    seen->straggling = slow;
    const double factor = static_cast<double>(value) / static_cast<double>(median);
    if (slow) {
      out.push_back(LogLine{LogLevel::kWarn,
                            fmt::format("{} is a straggler: {} is {}, {:.2g}x the median {} of {} "
                                        "ranks over the last {} (stragglers.slower_percent = {})",
                                        RankName(rank), what, Seconds3(value), factor,
                                        Seconds3(median), ranks.size(),
                                        FormatDuration(spec_.stragglers.window), percent)});
      if (stragglers_seen_.size() < kMaxStragglersNamed) {
        stragglers_seen_.push_back(fmt::format("{} in round {}: {} {}, {:.2g}x the median {}",
                                               RankName(rank), round_, what, Seconds3(value),
                                               factor, Seconds3(median)));
      }
    } else {
      out.push_back(LogLine{LogLevel::kInfo,
                            fmt::format("{} is no longer a straggler: {} is {}, the median {}",
                                        RankName(rank), what, Seconds3(value), Seconds3(median))});
    }
  }
}

std::string Coordinator::StragglerNote() const {
  if (stragglers_seen_.empty()) return "";
  std::string text = fmt::format("stragglers (more than {}% slower than the median rank for {}):",
                                 spec_.stragglers.slower_percent,
                                 FormatDuration(spec_.stragglers.window));
  for (const std::string& s : stragglers_seen_) text += "\n  " + s;
  return text;
}

}  // namespace ddprun::core
