#include "runner/host/event_recorder.h"

#include <chrono>

#include "runner/core/failure.h"

namespace ddprun::host {

namespace {

std::string Cut(std::string_view text, size_t limit) {
  if (text.size() <= limit) return std::string(text);
  return std::string(text.substr(0, limit)) + " [cut]";
}

std::string FirstLine(std::string_view text) {
  return Cut(text.substr(0, text.find('\n')), EventRecorder::kMaxLine);
}

// The line a reader wants from a failed worker: the error file's message (its first line),
// else the last non-empty line of its stderr, where Python prints the exception.
std::string ErrorLine(const std::string& error_text, const std::string& stderr_tail) {
  if (!error_text.empty()) return FirstLine(error_text);
  size_t end = stderr_tail.size();
  while (end > 0) {
    const size_t start = stderr_tail.rfind('\n', end - 1);
    const size_t from = start == std::string::npos ? 0 : start + 1;
    std::string_view line(stderr_tail.data() + from, end - from);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) return Cut(line, EventRecorder::kMaxLine);
    if (start == std::string::npos) break;
    end = start;
  }
  return "";
}

int64_t Ms(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

}  // namespace

EventRecorder::EventRecorder(const JobSpec& spec, const core::Agent::Config& config, EventLog* log)
    : spec_(spec),
      log_(log),
      node_rank_(config.node_rank),
      fingerprint_(config.fingerprint.substr(0, 12)),
      version_(config.ddprun_version) {}

void EventRecorder::Started(TimePoint now) {
  if (!log_) return;
  Record(now, Event{"agent-start", {}}
                  .Add("job", spec_.job.name)
                  .Add("fingerprint", fingerprint_)
                  .Add("nnodes", int64_t{spec_.cluster.nnodes})
                  .Add("spares", int64_t{spec_.cluster.spares})
                  .Add("nproc", int64_t{spec_.cluster.nproc_per_node})
                  .Add("max_restarts", int64_t{spec_.restart.max_restarts})
                  .Add("spare", node_rank_ >= spec_.cluster.nnodes)
                  .Add("hang_detection", spec_.timeouts.DetectsHangs())
                  .Add("version", version_));
}

void EventRecorder::StartFailed(TimePoint now, int exit_code, const std::string& why) {
  if (!log_) return;
  Record(now, Event{"agent-exit", {}}.Add("exit_code", int64_t{exit_code}).Add("reason", Cut(why, kMaxText)));
}

int EventRecorder::GlobalRank(int round, int local_rank) const {
  auto it = ranks_.find(round);
  if (it == ranks_.end() || local_rank < 0 || static_cast<size_t>(local_rank) >= it->second.size()) return -1;
  return it->second[static_cast<size_t>(local_rank)];
}

void EventRecorder::AgentInput(TimePoint now, const core::AgentInput& input, const core::Agent& agent) {
  if (!log_) return;
  input_is_tick_ = std::holds_alternative<core::Tick>(input);
  disconnect_pending_ = false;
  if (const auto* message = std::get_if<core::MasterMessage>(&input)) {
    const wire::Message& m = message->message;
    if (const auto* ack = std::get_if<wire::JoinAck>(&m)) {
      last_connect_error_.clear();
      Record(now, Event{"joined", {}}.Add("standby", ack->standby));
    } else if (const auto* reject = std::get_if<wire::Reject>(&m)) {
      Record(
          now,
          Event{"join-refused", {}}.Add("reason", Cut(reject->reason, kMaxText)).Add("retry", reject->retry));
    } else if (const auto* start = std::get_if<wire::StartRound>(&m)) {
      plays_ = start->node_rank;
    } else if (const auto* stop = std::get_if<wire::StopRound>(&m)) {
      Record(now, Event{"stop-round", {}}
                      .Add("round", int64_t{stop->round})
                      .Add("cause", FirstLine(stop->cause))
                      .Add("last", stop->last));
    } else if (const auto* end = std::get_if<wire::JobEnd>(&m)) {
      Record(now, Event{"job-end", {}}
                      .Add("exit_code", int64_t{end->exit_code})
                      .Add("summary", Cut(end->summary, kMaxText)));
    } else if (const auto* dump = std::get_if<wire::DumpStacks>(&m)) {
      Record(now, Event{"stacks-asked", {}}.Add("round", int64_t{dump->round}));
    }
  } else if (const auto* closed = std::get_if<core::MasterClosed>(&input)) {
    Record(now, Event{"master-lost", {}}.Add("reason", FirstLine(closed->reason)));
  } else if (const auto* failed = std::get_if<core::MasterConnectFailed>(&input)) {
    // Retries repeat the same words every few seconds: a new record only when they change.
    if (failed->detail != last_connect_error_) {
      last_connect_error_ = failed->detail;
      Record(now, Event{"connect-failed", {}}.Add("error", FirstLine(failed->detail)));
    }
  } else if (const auto* exited = std::get_if<core::WorkerExited>(&input)) {
    const bool failed_exit = exited->signal != 0 || exited->exit_code != 0;
    Event event{"worker-exit", {}};
    event.Add("round", int64_t{exited->round})
        .Add("rank", int64_t{GlobalRank(exited->round, exited->local_rank)})
        .Add("local_rank", int64_t{exited->local_rank})
        .Add("exit_code", int64_t{exited->exit_code})
        .Add("signal", int64_t{exited->signal})
        .Add("stopped", exited->round == signalled_round_);
    if (failed_exit) {
      event
          .Add("kinds", core::KindTexts(core::FailureKinds(exited->exit_code, exited->signal,
                                                           exited->error_text, exited->stderr_tail)))
          .Add("error", ErrorLine(exited->error_text, exited->stderr_tail));
    }
    Record(now, event);
  } else if (const auto* spawn_failed = std::get_if<core::WorkerSpawnFailed>(&input)) {
    Record(now, Event{"spawn-failed", {}}
                    .Add("round", int64_t{spawn_failed->round})
                    .Add("rank", int64_t{GlobalRank(spawn_failed->round, spawn_failed->local_rank)})
                    .Add("local_rank", int64_t{spawn_failed->local_rank})
                    .Add("error", FirstLine(spawn_failed->error)));
  } else if (const auto* signal = std::get_if<core::SignalReceived>(&input)) {
    Record(now, Event{"interrupted", {}}.Add("signal", core::SignalName(signal->signal)));
  } else if (const auto* beacon = std::get_if<core::BeaconReceived>(&input)) {
    // The node's first step of the round: its gang trains (the agent drops stale beacons too).
    const core::Beacon& b = beacon->beacon;
    if (b.kind == core::BeaconKind::kStep && b.round == spawned_round_ && b.round == agent.round() &&
        training_round_ != b.round) {
      training_round_ = b.round;
      Record(now, Event{"training", {}}
                      .Add("round", int64_t{b.round})
                      .Add("rank", int64_t{GlobalRank(b.round, b.local_rank)})
                      .Add("step", b.step));
    }
  }
}

void EventRecorder::AgentEffect(TimePoint now, const core::AgentEffect& effect) {
  if (!log_) return;
  if (const auto* spawn = std::get_if<core::SpawnWorkers>(&effect)) {
    std::vector<int64_t> ranks;
    std::vector<int>& by_local = ranks_[spawn->round];
    by_local.clear();
    for (const core::WorkerLaunch& launch : spawn->workers) {
      ranks.push_back(launch.global_rank);
      if (launch.local_rank >= 0) {
        if (by_local.size() <= static_cast<size_t>(launch.local_rank))
          by_local.resize(static_cast<size_t>(launch.local_rank) + 1, -1);
        by_local[static_cast<size_t>(launch.local_rank)] = launch.global_rank;
      }
    }
    // Two rounds are kept: a worker of the previous round may still report its exit.
    while (ranks_.size() > 2) ranks_.erase(ranks_.begin());
    spawned_round_ = spawn->round;
    const int nproc = spec_.cluster.nproc_per_node;
    const int64_t plays =
        plays_ >= 0 ? plays_ : (!ranks.empty() && nproc > 0 ? ranks.front() / nproc : node_rank_);
    Record(now, Event{"workers-start", {}}
                    .Add("round", int64_t{spawn->round})
                    .Add("plays", plays)
                    .Add("ranks", std::move(ranks)));
  } else if (const auto* signal = std::get_if<core::SignalWorkers>(&effect)) {
    signalled_round_ = signal->round;
    Record(now, Event{"signal-workers", {}}
                    .Add("round", int64_t{signal->round})
                    .Add("signal", core::SignalName(signal->signal)));
  } else if (const auto* send = std::get_if<core::SendToMaster>(&effect)) {
    if (const auto* hung = std::get_if<wire::RankHung>(&send->message)) {
      Record(now, Event{"hang", {}}
                      .Add("round", int64_t{hung->round})
                      .Add("rank", int64_t{hung->global_rank})
                      .Add("local_rank", int64_t{hung->local_rank})
                      .Add("step", hung->step)
                      .Add("silent_ms", hung->silent_ms)
                      .Add("timeout_ms", hung->timeout_ms));
    } else if (const auto* done = std::get_if<wire::NodeDone>(&send->message)) {
      Record(now,
             Event{"round-end", {}}.Add("round", int64_t{done->round}).Add("outcome", std::string("done")));
    } else if (const auto* stopped = std::get_if<wire::RoundStopped>(&send->message)) {
      Record(now, Event{"round-end", {}}
                      .Add("round", int64_t{stopped->round})
                      .Add("outcome", std::string("stopped"))
                      .Add("stopped", int64_t{stopped->stopped}));
    }
  } else if (std::holds_alternative<core::DisconnectFromMaster>(effect)) {
    // On a tick it is the agent's own loss of the coordinator (no word for 3 heartbeats),
    // unless the agent is leaving (an AgentExit in the same batch clears it).
    if (input_is_tick_) disconnect_pending_ = true;
  } else if (const auto* summary = std::get_if<core::PrintSummary>(&effect)) {
    Record(now, Event{"summary", {}}.Add("text", Cut(summary->text, kMaxText)));
  } else if (const auto* exit = std::get_if<core::AgentExit>(&effect)) {
    disconnect_pending_ = false;
    Record(now, Event{"agent-exit", {}}.Add("exit_code", int64_t{exit->code}));
  }
}

void EventRecorder::AgentDone(TimePoint now) {
  if (!log_ || !disconnect_pending_) return;
  disconnect_pending_ = false;
  Record(now, Event{"master-lost", {}}.Add("reason",
                                           std::string("no word from the coordinator for 3 heartbeats")));
}

void EventRecorder::CoordinatorEffect(TimePoint now, const core::CoordinatorEffect& effect) {
  if (!log_) return;
  if (const auto* done = std::get_if<core::CoordinatorDone>(&effect)) {
    Record(now, Event{"coordinator-done", {}}.Add("exit_code", int64_t{done->exit_code}));
  } else if (const auto* quarantine = std::get_if<core::RecordQuarantine>(&effect)) {
    // The hosts that sit out now, and for how long.
    std::vector<std::string> hosts;
    std::vector<int64_t> left_ms;
    for (const core::QuarantinedHost& h : quarantine->hosts) {
      if (h.left <= Duration::zero()) continue;
      hosts.push_back(h.host);
      left_ms.push_back(Ms(h.left));
    }
    Record(now, Event{"quarantine", {}}.Add("hosts", std::move(hosts)).Add("left_ms", std::move(left_ms)));
  } else if (const auto* observed = std::get_if<core::Observed>(&effect)) {
    std::visit([&](const auto& o) { Observe(now, o); }, observed->what);
  }
}

void EventRecorder::Observe(TimePoint now, const core::observed::NodeJoined& o) {
  Record(now, Event{"node-joined", {}}
                  .Add("peer", int64_t{o.agent})
                  .Add("peer_host", Cut(o.host, kMaxLine))
                  .Add("spare", o.spare));
}

void EventRecorder::Observe(TimePoint now, const core::observed::NodeRefused& o) {
  Record(now, Event{"node-refused", {}}.Add("peer", int64_t{o.agent}).Add("reason", FirstLine(o.reason)));
}

void EventRecorder::Observe(TimePoint now, const core::observed::NodeLost& o) {
  Record(now, Event{"node-lost", {}}
                  .Add("peer", int64_t{o.agent})
                  .Add("cause", std::string(core::LossReasonName(o.reason)))
                  .Add("reason", FirstLine(o.detail)));
}

void EventRecorder::Observe(TimePoint now, const core::observed::RoundStarted& o) {
  Record(now, Event{"round-begin", {}}
                  .Add("round", int64_t{o.round})
                  .Add("restarts_used", int64_t{o.restarts_used})
                  .Add("nodes", int64_t{o.nodes}));
  for (const auto& [spare, plays] : o.replaced) {
    Record(now, Event{"replace", {}}
                    .Add("round", int64_t{o.round})
                    .Add("spare", int64_t{spare})
                    .Add("plays", int64_t{plays}));
  }
}

void EventRecorder::Observe(TimePoint now, const core::observed::RoundFailed& o) {
  Record(now, Event{"round-failed", {}}
                  .Add("round", int64_t{o.round})
                  .Add("peer", int64_t{o.agent})
                  .Add("rank", int64_t{o.global_rank})
                  .Add("kinds", core::KindTexts(o.kinds))
                  .Add("cause", Cut(o.what, kMaxText))
                  .Add("last", o.last));
}

void EventRecorder::Observe(TimePoint now, const core::observed::RestartSpent& o) {
  Record(now, Event{"restart", {}}
                  .Add("restart", int64_t{o.restart})
                  .Add("max_restarts", int64_t{spec_.restart.max_restarts})
                  .Add("round", int64_t{o.next_round})
                  .Add("backoff_ms", Ms(o.backoff)));
}

void EventRecorder::Observe(TimePoint now, const core::observed::HangProbed& o) {
  Record(now, Event{"hang-probe", {}}.Add("round", int64_t{o.round}));
}

void EventRecorder::Observe(TimePoint now, const core::observed::JobEnded& o) {
  Record(now, Event{"job-result", {}}
                  .Add("exit_code", int64_t{o.exit_code})
                  .Add("restarts_used", int64_t{o.restarts_used})
                  .Add("summary", Cut(o.summary, kMaxText)));
}

}  // namespace ddprun::host
