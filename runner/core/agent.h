#pragma once
// The agent: one per node. It joins the coordinator, runs its node's workers for each round,
// reports their failures, stops them when told (or when it loses the coordinator), and exits
// with the job's code. Sans-IO: Handle(now, input, effects) and NextDeadline().

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/time.h"
#include "schema/job_spec.h"

namespace ddprun::core {

class Agent {
 public:
  enum class Phase { kConnecting, kRetryWait, kJoining, kWaiting, kRunning, kExited };

  struct Config {
    int node_rank = 0;
    std::string host;                 // this node's name, for the coordinator's messages
    std::string canonical;            // CanonicalForm of the job spec
    std::string fingerprint;
    uint64_t instance = 0;            // tells a reconnect of this agent from an impostor
    std::string ddprun_version;
    std::string logs_dir;             // where per-rank logs and error files go
    std::map<std::string, std::string> inherited_env;  // the agent's own environment
    std::string secret;               // "" = no shared secret (the channel is open)
  };

  Agent(const JobSpec& spec, Config config);

  /// Begins the rendezvous: emits the first ConnectToMaster.
  void Start(TimePoint now, std::vector<AgentEffect>& out);

  /// Feeds one input; appends the effects to `out`. Expired deadlines are handled first.
  void Handle(TimePoint now, const AgentInput& input, std::vector<AgentEffect>& out);

  /// When Handle(now, Tick{}) must be called next; nullopt once exited.
  std::optional<TimePoint> NextDeadline() const;

  Phase phase() const { return phase_; }
  int round() const { return round_; }
  int running_workers() const;
  std::optional<int> exit_code() const { return exit_code_; }

 private:
  struct Worker {
    int global_rank = 0;
    bool running = false;
    int exit_code = 0;
    int signal = 0;
  };

  /// Every deadline the agent acts on. NextDeadline is the earliest armed one and
  /// ExpireDeadlines acts on those due, both through DeadlineOf, so they cannot disagree (a
  /// deadline one of them ignored would spin the driver or never fire).
  enum class Deadline { kKill, kGiveUp, kInterrupt, kHeartbeat, kLoss, kRetry, kRendezvous, kCount };
  std::optional<TimePoint> DeadlineOf(Deadline deadline) const;
  bool Due(Deadline deadline, TimePoint now) const;
  void ExpireDeadlines(TimePoint now, std::vector<AgentEffect>& out);
  void OnMessage(TimePoint now, const wire::Message& message, std::vector<AgentEffect>& out);
  void SendJoin(const std::string& nonce, std::vector<AgentEffect>& out);
  void MaybeReconnect(TimePoint now, std::vector<AgentEffect>& out);
  void OnConnectFailed(TimePoint now, const MasterConnectFailed& failed, std::vector<AgentEffect>& out);
  void OnMasterLost(TimePoint now, const std::string& why, bool was_joined,
                    std::vector<AgentEffect>& out);
  void OnWorkerExited(TimePoint now, const WorkerExited& exited, std::vector<AgentEffect>& out);
  void OnSignal(TimePoint now, int signal, std::vector<AgentEffect>& out);
  void StartWorkers(const wire::StartRound& start, std::vector<AgentEffect>& out);
  void StopWorkers(TimePoint now, std::vector<AgentEffect>& out);
  void MaybeStopped(std::vector<AgentEffect>& out);
  /// SIGKILL to every running worker now; `why` completes "N workers ...".
  void KillWorkers(TimePoint now, const std::string& why, std::vector<AgentEffect>& out);
  void Finish(TimePoint now, int code, std::vector<AgentEffect>& out);
  void Send(wire::Message message, std::vector<AgentEffect>& out);
  void Log(LogLevel level, std::string text, std::vector<AgentEffect>& out) const;
  std::string MasterEndpoint() const;
  std::string ExplainConnectError(const MasterConnectFailed& failed) const;

  const JobSpec& spec_;
  Config config_;
  Phase phase_ = Phase::kConnecting;
  bool connected_ = false;
  bool joined_ = false;
  int round_ = -1;
  std::vector<Worker> workers_;
  bool stopping_ = false;           // a round stop is in progress
  int stopped_count_ = 0;           // workers that were running when the stop began
  bool failure_reported_ = false;   // this round's first local failure was sent
  bool done_reported_ = false;
  // A StartRound since the last JoinAck. Found by the simulator: a rebooted coordinator numbers
  // rounds from 0 again, so the first StartRound after a (re)join must be taken whatever its
  // number; only repeats on the same join can be stale.
  bool started_since_join_ = false;
  std::optional<TimePoint> kill_at_;
  TimePoint sigterm_at_;  // when the current stop sent SIGTERM
  std::optional<TimePoint> give_up_at_;
  TimePoint rendezvous_deadline_;
  TimePoint retry_at_;
  Duration retry_delay_;
  std::optional<TimePoint> last_connect_log_;
  std::string last_connect_error_;
  TimePoint last_heard_;
  TimePoint next_heartbeat_;
  std::optional<int> pending_exit_;  // exit with this once no worker runs
  bool job_end_received_ = false;
  int interrupted_by_ = 0;
  std::optional<TimePoint> interrupt_deadline_;
  bool refused_retrying_ = false;  // a join was refused for now; it is being retried
  bool challenged_ = false;  // the coordinator sent a Challenge on this connection
  std::string agent_nonce_;  // this connection's nonce, with a secret
  uint64_t connections_ = 0;
  std::optional<int> exit_code_;
};

}  // namespace ddprun::core
