#pragma once
// What NodeHost writes to a node's event log (docs/report.md): it watches the inputs it feeds
// the agent and the coordinator and the effects it executes for them, and turns the ones a
// reader of the run needs into Events (joins, rounds, workers started and exited, failures with
// their kinds and root cause, stops, restarts, hangs, spares, the end). It only observes: it
// never feeds the state machines. Node 0's coordinator says what happened in typed
// observations (core::Observed); nothing here guesses it from inputs or parses its words.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runner/core/agent.h"
#include "runner/core/coordinator.h"
#include "runner/host/ports.h"

namespace ddprun::host {

class EventRecorder {
 public:
  /// The longest text field written (a cause with its traceback, a summary); longer ones are
  /// cut, so that one record stays small and a bounded log holds many.
  static constexpr size_t kMaxText = 4096;
  /// The longest one-line field (an error line, a reason).
  static constexpr size_t kMaxLine = 512;

  /// `log` may be null: then every call returns at once.
  EventRecorder(const JobSpec& spec, const core::Agent::Config& config, EventLog* log);

  void Started(TimePoint now);
  /// The agent ends before its loop ran (node 0 cannot listen, its address is loopback, etcd
  /// cannot be used): its exit and why, so that the run's folder says so instead of holding an
  /// empty file (issue 39).
  void StartFailed(TimePoint now, int exit_code, const std::string& why);
  /// Before the agent handles `input`.
  void AgentInput(TimePoint now, const core::AgentInput& input, const core::Agent& agent);
  void AgentEffect(TimePoint now, const core::AgentEffect& effect);
  /// After the agent's effects of one input were executed.
  void AgentDone(TimePoint now);
  /// Node 0: each effect of the coordinator; its observations (core::Observed) become records.
  void CoordinatorEffect(TimePoint now, const core::CoordinatorEffect& effect);

 private:
  void Record(TimePoint now, const Event& event) { log_->Record(now, event); }
  void Observe(TimePoint now, const core::observed::NodeJoined& o);
  void Observe(TimePoint now, const core::observed::NodeRefused& o);
  void Observe(TimePoint now, const core::observed::NodeLost& o);
  void Observe(TimePoint now, const core::observed::RoundStarted& o);
  void Observe(TimePoint now, const core::observed::RoundFailed& o);
  void Observe(TimePoint now, const core::observed::RestartSpent& o);
  void Observe(TimePoint now, const core::observed::HangProbed& o);
  /// Not recorded: the round-failed record that follows carries the verdict's words.
  void Observe(TimePoint, const core::observed::HangJudged&) {}
  void Observe(TimePoint now, const core::observed::JobEnded& o);
  int GlobalRank(int round, int local_rank) const;

  const JobSpec& spec_;
  EventLog* log_;
  int node_rank_;
  std::string fingerprint_;
  std::string version_;

  // ---- The agent's side.
  bool input_is_tick_ = false;
  bool disconnect_pending_ = false;  // a DisconnectFromMaster on a tick, not for an exit
  std::string last_connect_error_;
  std::map<int, std::vector<int>> ranks_;  // by round: global rank by local rank (two rounds)
  int spawned_round_ = -1;
  int training_round_ = -1;   // the round whose first step beacon was recorded
  int signalled_round_ = -1;  // the round whose workers ddprun signalled
  int plays_ = -1;            // from the last StartRound
};

}  // namespace ddprun::host
