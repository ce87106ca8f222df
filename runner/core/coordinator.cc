#include "runner/core/coordinator.h"

#include <algorithm>
#include <cassert>

#include <fmt/format.h>

#include "runner/core/auth.h"
#include "runner/core/failure.h"
#include "schema/canonical.h"

namespace ddprun::core {
namespace {

// How often waiting agents hear who is missing. Per node this is a fixed rate, so the
// coordinator's traffic stays linear in the node count.
constexpr Duration kProgressInterval = Seconds(5);
// Progress names at most this many missing nodes; the count says the rest.
constexpr size_t kMaxMissingNamed = 16;

int64_t ToMillis(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

// What NCCL and PyTorch's NCCL process group print when a collective fails; advice that merely
// names NCCL (preflight's "NCCL's socket transport needs these ports") is not an NCCL error.
bool MentionsNccl(const std::string& text) {
  for (const char* marker : {"NCCL WARN", "NCCL error", "NCCL Error", "ProcessGroupNCCL",
                             "NCCL communicator", "ncclInternalError", "ncclSystemError",
                             "ncclUnhandledCudaError", "ncclRemoteError", "ncclInvalidUsage"}) {
    if (text.find(marker) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

Coordinator::Coordinator(const JobSpec& spec, std::string canonical, TimePoint start)
    : spec_(spec),
      canonical_(std::move(canonical)),
      fingerprint_(FingerprintOfCanonical(canonical_)),
      slots_(static_cast<size_t>(spec.cluster.nnodes)),
      rendezvous_started_(start),
      rendezvous_deadline_(start + spec.timeouts.rendezvous),
      next_progress_(start + kProgressInterval),
      next_heartbeat_(start + spec.timeouts.heartbeat),
      phase_deadline_(start) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (i < spec.cluster.nodes.size()) slots_[i].host = spec.cluster.nodes[i];
  }
}

void Coordinator::RequireSecret(std::string secret, uint64_t nonce_seed) {
  secret_ = std::move(secret);
  nonce_seed_ = nonce_seed;
}

int Coordinator::joined_count() const { return joined_; }

// Counters instead of scans: at 16,384 nodes every message would otherwise cost O(nodes).
void Coordinator::SetSlotConn(Slot& slot, std::optional<ConnId> conn) {
  const int before = slot.conn ? 1 : 0;
  const int after = conn ? 1 : 0;
  joined_ += after - before;
  if (slot.stopped) stopped_joined_ += after - before;
  if (slot.acked_end) acked_joined_ += after - before;
  slot.conn = conn;
}

std::string Coordinator::NodeName(int node_rank) const {
  const Slot& slot = slots_[static_cast<size_t>(node_rank)];
  if (slot.host.empty()) return fmt::format("node {}", node_rank);
  return fmt::format("node {} ({})", node_rank, slot.host);
}

void Coordinator::Handle(TimePoint now, const CoordinatorInput& input,
                         std::vector<CoordinatorEffect>& out) {
  ExpireDeadlines(now, out);
  if (phase_ == Phase::kDone) return;
  if (const auto* accepted = std::get_if<PeerAccepted>(&input)) {
    conns_[accepted->conn] = Conn{accepted->peer_addr, -1, now, ""};
    by_last_heard_.emplace(now, accepted->conn);
  } else if (const auto* message = std::get_if<PeerMessage>(&input)) {
    OnMessage(now, message->conn, message->message, out);
  } else if (const auto* closed = std::get_if<PeerClosed>(&input)) {
    auto it = conns_.find(closed->conn);
    if (it == conns_.end()) return;
    const int node_rank = it->second.node_rank;
    by_last_heard_.erase({it->second.last_heard, it->first});
    conns_.erase(it);
    if (node_rank >= 0 && slots_[static_cast<size_t>(node_rank)].conn == closed->conn) {
      SetSlotConn(slots_[static_cast<size_t>(node_rank)], std::nullopt);
      OnNodeLost(now, node_rank, closed->reason.empty() ? "connection closed" : closed->reason, out);
    }
  } else if (const auto* port = std::get_if<StorePortReady>(&input)) {
    if (phase_ != Phase::kStarting || port->round != round_) return;  // stale answer
    BeginRound(port->port, out);
  }
}

void Coordinator::ExpireDeadlines(TimePoint now, std::vector<CoordinatorEffect>& out) {
  if (phase_ == Phase::kDone) return;
  const Duration heartbeat = spec_.timeouts.heartbeat;
  if (now >= next_heartbeat_) {
    Broadcast(wire::Heartbeat{}, out);
    next_heartbeat_ = now + heartbeat;
  }
  // Checked on every input, not on a heartbeat grid: a peer is lost the moment it has been
  // silent for more than 3 heartbeats (the agent uses the same bound), not up to a beat later.
  // by_last_heard_ keeps this O(log n) per input at 16,384 nodes.
  {
    std::vector<ConnId> silent;
    for (const auto& [last_heard, id] : by_last_heard_) {
      if (now - last_heard <= 3 * heartbeat) break;
      silent.push_back(id);
    }
    for (ConnId id : silent) {
      const int node_rank = conns_[id].node_rank;
      const Duration quiet = now - conns_[id].last_heard;
      Drop(id, out);
      if (node_rank >= 0) {
        OnNodeLost(now, node_rank, fmt::format("silent for {} (3 heartbeats)", HumanDuration(quiet)), out);
      }
      if (phase_ == Phase::kDone) return;
    }
  }
  switch (phase_) {
    case Phase::kRendezvous:
      if (now >= rendezvous_deadline_) {
        std::vector<std::string> missing;
        for (size_t i = 0; i < slots_.size(); ++i) {
          if (!slots_[i].conn) missing.push_back(NodeName(static_cast<int>(i)));
        }
        const std::string names =
            missing.size() <= kMaxMissingNamed
                ? fmt::format("{}", fmt::join(missing, ", "))
                : fmt::format("{} and {} more",
                              fmt::join(missing.begin(), missing.begin() + kMaxMissingNamed, ", "),
                              missing.size() - kMaxMissingNamed);
        EndJob(now, 3,
               fmt::format("rendezvous failed: {}/{} nodes joined within timeouts.rendezvous = {}; "
                           "never joined: {}\n"
                           "hint: start `ddprun {}` on the missing nodes, and check that they can "
                           "reach {}:{} (the firewall must let TCP port {} through)",
                           joined_count(), slots_.size(), FormatDuration(spec_.timeouts.rendezvous),
                           names, spec_.source_name.empty() ? "job.toml" : spec_.source_name,
                           spec_.cluster.master_addr, spec_.cluster.master_port,
                           spec_.cluster.master_port),
               out);
      } else if (now >= next_progress_) {
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
            Drop(*slot.conn, out);
          }
        }
        MaybeFinishStop(now, out);
      }
      break;
    case Phase::kBackoff:
      if (now >= phase_deadline_) {
        phase_ = Phase::kRendezvous;
        rendezvous_started_ = now;
        rendezvous_deadline_ = now + spec_.timeouts.rendezvous;
        next_progress_ = now + kProgressInterval;
        MaybeStartRound(now, out);
      }
      break;
    case Phase::kEnding:
      if (now >= phase_deadline_) {
        out.push_back(LogLine{LogLevel::kWarn, "exit barrier expired before every node confirmed"});
        phase_ = Phase::kDone;
        if (!done_emitted_) {
          done_emitted_ = true;
          out.push_back(CoordinatorDone{*exit_code_});
        }
      }
      break;
    case Phase::kStarting:
    case Phase::kRunning:
    case Phase::kDone:
      break;
  }
}

std::optional<TimePoint> Coordinator::NextDeadline() const {
  if (phase_ == Phase::kDone) return std::nullopt;
  TimePoint next = next_heartbeat_;
  if (!by_last_heard_.empty()) {
    next = std::min(next, by_last_heard_.begin()->first + 3 * spec_.timeouts.heartbeat + Duration(1));
  }
  switch (phase_) {
    case Phase::kRendezvous:
      next = std::min({next, rendezvous_deadline_, next_progress_});
      break;
    case Phase::kStopping:
    case Phase::kBackoff:
    case Phase::kEnding:
      next = std::min(next, phase_deadline_);
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
  by_last_heard_.erase({it->second.last_heard, conn_id});
  it->second.last_heard = now;
  by_last_heard_.emplace(now, conn_id);
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
    Drop(conn_id, out);
    return;
  }
  Slot& slot = slots_[static_cast<size_t>(node_rank)];

  if (const auto* failed = std::get_if<wire::WorkerFailed>(&message)) {
    if (phase_ != Phase::kRunning || failed->round != round_) return;  // stale or already stopping
    Failure failure;
    failure.round = failed->round;
    failure.node_rank = node_rank;
    failure.what = fmt::format("rank {} ({}, local rank {}) {}", failed->global_rank,
                               NodeName(node_rank), failed->local_rank,
                               DescribeExit(failed->exit_code, failed->signal));
    if (!failed->error_file.empty()) {
      failure.detail = "  error (from TORCHELASTIC_ERROR_FILE):\n" + Indent(failed->error_file, "    | ");
    }
    if (!failed->stderr_tail.empty()) {
      failure.detail += "  last lines of its stderr:\n" + Indent(failed->stderr_tail, "    | ");
    } else if (failed->error_file.empty()) {
      failure.detail = "  (it wrote nothing to stderr)\n";
    }
    failure.mentions_nccl = MentionsNccl(failed->stderr_tail) || MentionsNccl(failed->error_file);
    BeginStop(now, std::move(failure), out);
  } else if (const auto* done = std::get_if<wire::NodeDone>(&message)) {
    if (phase_ != Phase::kRunning || done->round != round_) return;
    if (slot.done) return;
    slot.done = true;
    if (++done_count_ == static_cast<int>(slots_.size())) {
      EndJob(now, 0,
             fmt::format("job \"{}\" succeeded: all {} ranks on {} nodes exited 0 in round {} "
                         "({} restart{} used)",
                         spec_.job.name, spec_.WorldSize(), slots_.size(), round_, restarts_used_,
                         restarts_used_ == 1 ? "" : "s"),
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
    EndJob(now, 128 + interrupted->signal,
           fmt::format("job \"{}\" interrupted: {} received {}; every node stopped its workers",
                       spec_.job.name, NodeName(node_rank), SignalName(interrupted->signal)),
           out);
  } else if (std::holds_alternative<wire::JobEndAck>(message)) {
    if (!slot.acked_end) {
      slot.acked_end = true;
      ++acked_joined_;
    }
    MaybeDone(out);
  } else if (std::holds_alternative<wire::Heartbeat>(message)) {
    // last_heard is already updated
  } else {
    out.push_back(LogLine{LogLevel::kWarn, fmt::format("dropping {}: unexpected {} from an agent",
                                                       NodeName(node_rank), wire::MessageName(message))});
    Drop(conn_id, out);
    OnNodeLost(now, node_rank, "protocol error", out);
  }
}

void Coordinator::OnJoin(TimePoint now, ConnId conn_id, const wire::Join& join,
                         std::vector<CoordinatorEffect>& out) {
  const std::string& from = conns_[conn_id].peer_addr;
  auto refuse = [&](const std::string& reason, bool retry = false) {
    out.push_back(LogLine{LogLevel::kError, "refused a node: " + reason});
    out.push_back(SendTo{conn_id, wire::Reject{reason, retry}});
    Drop(conn_id, out);
  };
  const int nnodes = static_cast<int>(slots_.size());
  // Authentication first: a peer without the secret learns nothing about the job. The first
  // join on a connection is answered with a Challenge (the agent speaks first so the relay can
  // tell it from a store client); the second must carry the proof for that nonce.
  Conn& conn = conns_[conn_id];
  if (!secret_.empty() && conn.nonce.empty()) {
    conn.nonce = Sha256Hex(fmt::format("{}:{}", nonce_seed_, conn_id)).substr(0, 32);
    out.push_back(SendTo{conn_id, wire::Challenge{conn.nonce}});
    return;
  }
  if (!secret_.empty() &&
      !ConstantTimeEqual(join.proof, JoinProof(secret_, conn.nonce, join.node_rank, join.fingerprint))) {
    refuse(join.proof.empty()
               ? fmt::format("a node from {} (claiming node rank {}) sent no proof of the shared "
                             "secret\nhint: set DDPRUN_SECRET or DDPRUN_SECRET_FILE to the same "
                             "secret on every node",
                             from, join.node_rank)
               : fmt::format("a node from {} (claiming node rank {}) failed authentication: its "
                             "shared secret differs from node 0's",
                             from, join.node_rank));
    return;
  }
  if (join.node_rank < 0 || join.node_rank >= nnodes) {
    refuse(fmt::format("node rank {} (host {}, from {}) is out of range: the job has {} node{} "
                       "(ranks 0..{})",
                       join.node_rank, join.host, from, nnodes, nnodes == 1 ? "" : "s", nnodes - 1));
    return;
  }
  if (join.fingerprint != fingerprint_) {
    const auto diffs = DiffCanonical(canonical_, join.canonical);
    std::string lines;
    for (const auto& d : diffs) {
      lines += fmt::format("\n  {}: node {} has {}, node 0 has {}", d.key, join.node_rank, d.theirs,
                           d.ours);
    }
    if (diffs.empty()) lines = "\n  (the canonical forms agree; the fingerprints do not)";
    refuse(fmt::format("node {} (host {}) runs a different job file than node 0:{}\n"
                       "hint: use the same job file on every node (ddprun check prints its "
                       "fingerprint)",
                       join.node_rank, join.host, lines));
    return;
  }
  Slot& slot = slots_[static_cast<size_t>(join.node_rank)];
  if (slot.conn) {
    if (slot.instance == join.instance) {
      // The same agent reconnecting before we noticed its old connection died. It stopped its
      // workers when it lost us, so a running round has lost this node.
      Drop(*slot.conn, out);
      OnNodeLost(now, join.node_rank, "its connection dropped and it reconnected", out);
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
  if (phase_ == Phase::kEnding || phase_ == Phase::kDone) {
    refuse(fmt::format("node {} joined while the job is ending", join.node_rank));
    return;
  }
  slot.host = join.host;
  slot.instance = join.instance;
  slot.done = slot.stopped = slot.acked_end = false;
  SetSlotConn(slot, conn_id);
  conns_[conn_id].node_rank = join.node_rank;
  out.push_back(SendTo{conn_id, wire::JoinAck{nnodes}});
  out.push_back(LogLine{LogLevel::kInfo, fmt::format("{} joined from {} ({}/{})",
                                                     NodeName(join.node_rank), from,
                                                     joined_count(), nnodes)});
  if (phase_ == Phase::kStopping) {
    // Agents join only without running workers, so this node has nothing left to stop.
    MarkStopped(slot, 0);
    MaybeFinishStop(now, out);
  }
  MaybeStartRound(now, out);
}

void Coordinator::OnNodeLost(TimePoint now, int node_rank, const std::string& why,
                             std::vector<CoordinatorEffect>& out) {
  Slot& slot = slots_[static_cast<size_t>(node_rank)];
  SetSlotConn(slot, std::nullopt);
  switch (phase_) {
    case Phase::kRendezvous:
    case Phase::kBackoff:
      out.push_back(LogLine{LogLevel::kWarn, fmt::format("{} left: {}", NodeName(node_rank), why)});
      break;
    case Phase::kStarting:
    case Phase::kRunning: {
      Failure failure;
      failure.round = round_;
      failure.node_rank = node_rank;
      failure.what = fmt::format("{} was lost: {}", NodeName(node_rank), why);
      failure.detail = "  its agent stopped answering; its workers are stopped by its agent (or "
                       "died with it)\n";
      BeginStop(now, std::move(failure), out);
      break;
    }
    case Phase::kStopping:
      MaybeFinishStop(now, out);
      break;
    case Phase::kEnding:
      MaybeDone(out);
      break;
    case Phase::kDone:
      break;
  }
}

void Coordinator::Drop(ConnId conn_id, std::vector<CoordinatorEffect>& out) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  const int node_rank = it->second.node_rank;
  if (node_rank >= 0 && slots_[static_cast<size_t>(node_rank)].conn == conn_id) {
    SetSlotConn(slots_[static_cast<size_t>(node_rank)], std::nullopt);
  }
  by_last_heard_.erase({it->second.last_heard, conn_id});
  conns_.erase(it);
  out.push_back(CloseConn{conn_id});
}

void Coordinator::MaybeStartRound(TimePoint /*now*/, std::vector<CoordinatorEffect>& out) {
  if (phase_ != Phase::kRendezvous) return;
  if (joined_count() != static_cast<int>(slots_.size())) return;
  phase_ = Phase::kStarting;
  if (spec_.cluster.store_port) {
    BeginRound(*spec_.cluster.store_port, out);
  } else {
    out.push_back(ReserveStorePort{round_});
  }
}

void Coordinator::BeginRound(uint16_t store_port, std::vector<CoordinatorEffect>& out) {
  phase_ = Phase::kRunning;
  failure_.reset();
  for (Slot& slot : slots_) slot.done = false;
  done_count_ = 0;
  out.push_back(LogLine{LogLevel::kInfo,
                        fmt::format("round {}: all {} nodes joined; starting {} workers", round_,
                                    slots_.size(), spec_.WorldSize())});
  Broadcast(wire::StartRound{round_, store_port}, out);
}

void Coordinator::BeginStop(TimePoint now, Failure failure, std::vector<CoordinatorEffect>& out) {
  assert(phase_ == Phase::kRunning || phase_ == Phase::kStarting);
  out.push_back(LogLine{LogLevel::kError, fmt::format("round {} failed: {}; stopping every worker "
                                                      "on every node", round_, failure.what)});
  failure_ = failure;
  last_failure_ = std::move(failure);
  phase_ = Phase::kStopping;
  phase_deadline_ = now + spec_.timeouts.stop_grace + 3 * spec_.timeouts.heartbeat + Seconds(5);
  for (Slot& slot : slots_) {
    slot.stopped = false;
    slot.stopped_ranks = 0;
  }
  stopped_joined_ = 0;
  // Every node hears the root cause with its traceback, also when a restart follows.
  Broadcast(wire::StopRound{round_, failure_->what + "\n" + failure_->detail}, out);
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
  for (const Slot& slot : slots_) stopped_ranks += slot.stopped_ranks;
  const Failure& failure = *failure_;
  if (restarts_used_ < spec_.restart.max_restarts) {
    ++restarts_used_;
    ++round_;
    out.push_back(LogLine{LogLevel::kWarn,
                          fmt::format("all workers stopped ({} stopped by ddprun); restart {} of {} "
                                      "in {}",
                                      stopped_ranks, restarts_used_, spec_.restart.max_restarts,
                                      FormatDuration(spec_.RestartBackoff(restarts_used_)))});
    phase_ = Phase::kBackoff;
    phase_deadline_ = now + spec_.RestartBackoff(restarts_used_);
    return;
  }
  EndJob(now, 1, FailureSummary(failure, stopped_ranks), out);
}

std::string Coordinator::FailureSummary(const Failure& failure, int stopped_ranks) const {
  std::string text = fmt::format("job \"{}\" FAILED in round {}", spec_.job.name, failure.round);
  if (spec_.restart.max_restarts > 0) {
    text += fmt::format(" after using all {} restart{}", spec_.restart.max_restarts,
                        spec_.restart.max_restarts == 1 ? "" : "s");
  } else {
    text += " (restart.max_restarts = 0)";
  }
  text += fmt::format("\nroot cause (first failure anywhere in the job): {}\n", failure.what);
  text += failure.detail;
  text += fmt::format("ddprun then stopped {} other running rank{} on {} node{}.\n", stopped_ranks,
                      stopped_ranks == 1 ? "" : "s", slots_.size(), slots_.size() == 1 ? "" : "s");
  if (failure.mentions_nccl) {
    text += "hint: the error mentions NCCL; rerun with NCCL_DEBUG=INFO in job.env to see why.\n";
  }
  text += fmt::format("logs: {}/{}/attempt-{}/", spec_.logs.dir, spec_.job.name, failure.round);
  return text;
}

void Coordinator::EndJob(TimePoint now, int exit_code, std::string summary,
                         std::vector<CoordinatorEffect>& out) {
  exit_code_ = exit_code;
  phase_ = Phase::kEnding;
  phase_deadline_ = now + spec_.timeouts.stop_grace + 3 * spec_.timeouts.heartbeat + Seconds(5);
  for (Slot& slot : slots_) slot.acked_end = false;
  acked_joined_ = 0;
  Broadcast(wire::JobEnd{exit_code, std::move(summary)}, out);
  MaybeDone(out);
}

void Coordinator::MaybeDone(std::vector<CoordinatorEffect>& out) {
  if (phase_ != Phase::kEnding || acked_joined_ < joined_) return;
  phase_ = Phase::kDone;
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
  progress.total = static_cast<int32_t>(slots_.size());
  progress.joined = joined_count();
  for (size_t i = 0; i < slots_.size() && progress.missing.size() < kMaxMissingNamed; ++i) {
    if (!slots_[i].conn) progress.missing.push_back(static_cast<int32_t>(i));
  }
  progress.elapsed_ms = ToMillis(now - rendezvous_started_);
  progress.timeout_ms = ToMillis(spec_.timeouts.rendezvous);
  Broadcast(progress, out);
}

}  // namespace ddprun::core
