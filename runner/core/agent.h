#pragma once
// The agent: one per node. It joins the coordinator, runs its node's workers for each round,
// reports their failures, stops them when told (or when it loses the coordinator), and exits
// with the job's code. Sans-IO: Handle(now, input, effects) and NextDeadline().

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/metrics.h"
#include "runner/core/time.h"
#include "schema/duration.h"
#include "schema/job_spec.h"

namespace ddprun::core {

namespace test {
/// The death tests' door to each machine's transition function (tests/core/edges_test.cc):
/// an edge no input can take must still be seen to stop the process.
struct Edges;
}  // namespace test

class Agent {
 public:
  enum class Phase { kConnecting, kRetryWait, kJoining, kWaiting, kRunning, kExited };

  struct Config {
    int node_rank = 0;
    std::string host;       // this node's name, for the coordinator's messages
    std::string canonical;  // CanonicalForm of the job spec
    std::string fingerprint;
    uint64_t instance = 0;  // tells a reconnect of this agent from an impostor
    std::string ddprun_version;
    std::string logs_dir;                              // where per-rank logs and error files go
    std::map<std::string, std::string> inherited_env;  // the agent's own environment
    std::string secret;                                // "" = no shared secret (the channel is open)
    // Progress beacons (worker/README.md): the host's UDP socket and the token a datagram
    // must carry; "" = this host takes no beacons. `python_dir` goes on the workers'
    // PYTHONPATH so that `import ddprun` works without installing anything.
    std::string progress_addr;
    std::string progress_token;
    std::string python_dir;
    // The interface the other nodes reach this one at, for the workers' GLOO_SOCKET_IFNAME,
    // NCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME (schema/worker_env.h); "" sets none.
    std::string socket_ifname;
    // "addr:port" where this host accepts probes from the other nodes (rendezvous.probe),
    // sent in the Join; "" for none.
    std::string probe_endpoint;
    // Node 0 whose cluster.master_addr is loopback on its own host (its name on a stock
    // /etc/hosts): the address the other nodes reach it at, where it listens, where its own
    // agent connects, and every round's MASTER_ADDR. "": cluster.master_addr. With etcd: where
    // this agent listens while it holds the coordinator role, when its own cluster.nodes entry
    // is loopback here; "": that entry.
    std::string master_at;
  };

  Agent(const JobSpec& spec, Config config);
  const Config& config() const { return config_; }

  /// rendezvous.backend = "etcd": where the coordinator is now ("host:port"), as the host
  /// looked it up; this agent's messages name it instead of cluster.master_addr.
  void SetCoordinatorEndpoint(std::string endpoint) { coordinator_endpoint_ = std::move(endpoint); }

  /// Begins the rendezvous: emits the first ConnectToMaster.
  void Start(TimePoint now, std::vector<AgentEffect>& out);

  /// Feeds one input; appends the effects to `out`. Expired deadlines are handled first.
  void Handle(TimePoint now, const AgentInput& input, std::vector<AgentEffect>& out);

  /// When Handle(now, Tick{}) must be called next; nullopt once exited.
  std::optional<TimePoint> NextDeadline() const { return next_deadline_; }

  /// Joined, with nothing under way but heartbeats (no stop, no leaving, no interrupt, no stacks
  /// being read): its beat and other deadlines; nullopt otherwise.
  std::optional<QuietState> Quiet() const;

  /// Derived from the link and the round: kRunning while this node's round is open.
  Phase phase() const;
  int round() const { return round_; }
  int running_workers() const;
  std::optional<int> exit_code() const;
  /// What this node can say about itself now, for the metrics endpoint (runner/core/metrics.cc).
  AgentMetrics Metrics(TimePoint now) const;

 private:
  friend struct test::Edges;
  /// A failed connect or join is tried again after kFirstRetry, doubling up to kMaxRetry.
  static constexpr Duration kFirstRetry = Millis(250);
  static constexpr Duration kMaxRetry = Seconds(2);

  /// One rank's progress beacons in this round.
  struct Beats {
    TimePoint since;           // its start, or its last step or phase beacon
    bool stepped = false;      // a step beacon came since its start or its last phase
    bool after_phase = false;  // its last beacon was a phase
    int64_t step = -1;         // its last step
    int stack_signal = 0;      // from its beacons: the signal that dumps its stacks
    int intervals = 0;         // step-to-step intervals seen
    Duration longest{0};       // the longest of them
    // The straggler window: one bucket per report period, the newest last.
    struct Bucket {
      int64_t steps = 0;       // steps the beacons covered
      int64_t busy_steps = 0;  // of those, steps whose beacons said how busy the rank was
      int64_t busy_us = 0;
    };
    std::vector<Bucket> window;
    Bucket current;
    /// The whole window's steps and busy time.
    Bucket WindowSum() const {
      Bucket sum;
      for (const Bucket& bucket : window) {
        sum.steps += bucket.steps;
        sum.busy_steps += bucket.busy_steps;
        sum.busy_us += bucket.busy_us;
      }
      return sum;
    }
  };
  struct Worker {
    int global_rank = 0;
    bool running = false;
    int exit_code = 0;
    int signal = 0;
    Beats beats;
  };

  /// Every deadline the agent acts on. NextDeadline is the earliest armed one and
  /// ExpireDeadlines acts on those due, both through DeadlineOf, so they cannot disagree (a
  /// deadline one of them ignored would spin the driver or never fire).
  enum class Deadline {
    kKill,
    kGiveUp,
    kInterrupt,
    kHeartbeat,
    kLoss,
    kRetry,
    kRendezvous,
    kProgress,
    kStacks,
    kReport,
    kCount
  };
  std::optional<TimePoint> DeadlineOf(Deadline deadline) const;
  /// The earliest of the table (next_deadline_), and the earliest but the heartbeat's and the
  /// loss's (next_other_deadline_, for Quiet): computed after each Start and Handle.
  void UpdateDeadlines();
  /// Handle without the bookkeeping of next_deadline_.
  void Apply(TimePoint now, const AgentInput& input, std::vector<AgentEffect>& out);
  /// AgentQuietStretch: not an event of its `now` but the stretch's outcome, so no deadline
  /// expires and no stall is measured.
  void SkipQuiet(const AgentQuietStretch& stretch, std::vector<AgentEffect>& out);
  bool Due(Deadline deadline, TimePoint now) const;
  void ExpireDeadlines(TimePoint now, std::vector<AgentEffect>& out);
  void OnMessage(TimePoint now, const wire::Message& message, std::vector<AgentEffect>& out);
  /// A word from the coordinator (or a connection to it): the workers' lease is renewed.
  void Heard(TimePoint now, std::vector<AgentEffect>& out);
  /// When this node's workers must be gone unless the coordinator is heard again: the last
  /// word + the loss bound + stop_grace. The agent's own SIGKILL and its guardian's both use it.
  TimePoint KillBy() const { return last_heard_ + spec_.timeouts.GuardianLease(); }
  void OnWorkerExited(TimePoint now, const WorkerExited& exited, std::vector<AgentEffect>& out);
  void OnSignal(TimePoint now, int signal, std::vector<AgentEffect>& out);
  // ---- The link to the coordinator (agent_link.cc).
  std::string ExplainConnectError(const MasterConnectFailed& failed) const;
  void SendJoin(const std::string& nonce, std::vector<AgentEffect>& out);
  void MaybeReconnect(TimePoint now, std::vector<AgentEffect>& out);
  void OnConnectFailed(TimePoint now, const MasterConnectFailed& failed, std::vector<AgentEffect>& out);
  void OnMasterLost(TimePoint now, const std::string& why, bool was_joined, std::vector<AgentEffect>& out);
  /// True unless this is a connection whose peer has not proved the shared secret yet.
  bool Proven() const;
  /// Leaves this connection and connects again after `retry`, keeping `error` for the
  /// rendezvous summary; logs it now unless the same story was told less than 10 s ago.
  void RetryLater(TimePoint now, std::string error, Duration retry, bool same_story,
                  std::vector<AgentEffect>& out);
  /// With a secret, before the peer proved it: only a Challenge with the right proof counts.
  void OnUnproven(TimePoint now, const wire::Message& message, std::vector<AgentEffect>& out);
  // ---- Progress beacons and hung ranks (agent_progress.cc).
  void OnBeacon(TimePoint now, const Beacon& beacon);
  /// How long `beats` may stay silent now; nullopt when hangs are not detected.
  Duration SilenceAllowed(const Beats& beats) const;
  /// The learnt step timeout of timeouts.progress = "auto", once enough intervals were seen.
  std::optional<Duration> LearntTimeout() const;
  bool WatchesProgress() const;
  void OnProgressExpired(TimePoint now, std::vector<AgentEffect>& out);
  void OnDumpStacks(TimePoint now, const wire::DumpStacks& dump, std::vector<AgentEffect>& out);
  void OnHangCleared(const wire::HangCleared& cleared, std::vector<AgentEffect>& out);
  void SendStacks(TimePoint now, const std::vector<std::string>& dumps, std::vector<AgentEffect>& out);
  void Report(TimePoint now, std::vector<AgentEffect>& out);
  Duration ReportPeriod() const;
  // ---- This node's workers, leaving, and what every part uses (agent.cc).
  void StartWorkers(TimePoint now, const wire::StartRound& start, std::vector<AgentEffect>& out);
  void StopWorkers(TimePoint now, std::vector<AgentEffect>& out);
  void MaybeStopped(std::vector<AgentEffect>& out);
  /// SIGKILL to every running worker now; `why` completes "N workers ...".
  void KillWorkers(TimePoint now, const std::string& why, std::vector<AgentEffect>& out);
  void Finish(TimePoint now, int code, std::vector<AgentEffect>& out);
  void Send(wire::Message message, std::vector<AgentEffect>& out);
  void Log(LogLevel level, std::string text, std::vector<AgentEffect>& out) const;
  std::string MasterEndpoint() const;

  // ---- The link to the coordinator: one state at a time, each with what only it needs.
  struct Connecting {};  // a connect is under way
  struct RetryWait {     // not connected; connect again at `at`
    TimePoint at;
  };
  struct Joining {  // connected; the join is not acknowledged yet
    /// The peer proved it knows the shared secret (a Challenge with the right proof); always
    /// true without a secret, where the channel is open. Until then nothing it sends is
    /// believed, printed as fact or counted as hearing from the coordinator.
    bool proven = false;
    std::string nonce;  // this connection's nonce, with a secret
  };
  struct Joined {                // connected and joined
    bool started_round = false;  // a StartRound came on this join (see StartWorkers)
  };
  struct Disconnected {};  // not connected and not retrying: leaving
  using Link = std::variant<Connecting, RetryWait, Joining, Joined, Disconnected>;

  // ---- This node's work in a round: one state at a time, each with what only it needs. The
  // round's number (round_), the node rank it plays (node_rank_) and its workers (workers_)
  // outlast it: the metrics show them and the next join says how the round ended.
  // What this node told of the round. kHang: a rank silent past its timeout, which the
  // coordinator may clear (wire::HangCleared) when the stacks show every rank progressing.
  enum class Told { kNothing, kFailure, kHang, kDone };
  struct Stacks {                  // the coordinator asked where the ranks are (a hang)
    bool asked = false;            // this round's stacks were asked for: the round will stop
    std::optional<TimePoint> due;  // the dumps are read then
  };
  struct Idle {                  // no round open: before the first, or its stop is over
    Told told = Told::kNothing;  // what this node told of the last round
  };
  struct Running {  // the round's workers were started on this join
    Told told = Told::kNothing;
    Stacks stacks;
    std::optional<TimePoint> next_report;  // the next progress report, once a rank stepped
  };
  struct Stopping {  // a stop of the round's workers is under way
    Told told = Told::kNothing;
    Stacks stacks;
    bool open = false;  // the round ran on this join: still open until stopped
    int count = 0;      // workers running when it began
    TimePoint sigterm_at;
    std::optional<TimePoint> kill_at;     // SIGKILL then (stop_grace after SIGTERM, or sooner)
    std::optional<TimePoint> give_up_at;  // stop waiting for workers SIGKILL did not end
  };
  using Work = std::variant<Idle, Running, Stopping>;

  // ---- The agent's life: it stays, leaves (exits with `code` once no worker runs,
  // acknowledging the JobEnd first), and has exited.
  struct Staying {};
  struct Leaving {
    int code = 0;
    bool ack = false;
  };
  struct Gone {
    int code = 0;
  };
  using Life = std::variant<Staying, Leaving, Gone>;

  /// The one way the link changes: asserts that `next` is an edge the agent takes
  /// (kLinkEdges in agent.cc).
  void Enter(Link next);
  /// The one way the work changes (kWorkEdges in agent.cc): a round starts from Idle (or after
  /// its workers all ended by themselves, the next one), a stop begins, and ends in Idle.
  void Enter(Work next);
  /// The one way the life changes (kLifeEdges in agent.cc): stay, leave (again, with another
  /// code, as Finish may), be gone.
  void Enter(Life next);
  /// Leaving, not gone yet; nullptr otherwise.
  const Leaving* leaving() const { return std::get_if<Leaving>(&life_); }
  /// Joined, with its round open: its workers run, or their stop is not over yet.
  bool RoundOpen() const;
  Told told() const {
    return std::visit([](const auto& work) { return work.told; }, work_);
  }
  /// The stacks asked for in the open round; nullptr in Idle.
  Stacks* stacks();
  const Stacks* stacks() const { return const_cast<Agent*>(this)->stacks(); }
  bool Connected() const;
  bool IsJoined() const { return std::holds_alternative<Joined>(link_); }
  bool Exited() const { return std::holds_alternative<Gone>(life_); }

  const JobSpec& spec_;
  Config config_;
  Link link_ = Connecting{};
  int round_ = -1;
  std::vector<Worker> workers_;
  Work work_ = Idle{};
  Life life_ = Staying{};
  TimePoint rendezvous_deadline_;
  Duration retry_delay_;
  std::optional<TimePoint> last_connect_log_;
  std::string last_connect_error_;
  std::string coordinator_endpoint_;  // "": cluster.master_addr:master_port
  bool refused_retrying_ = false;     // a join was refused for now; it is being retried
  /// The last refusal of this wait (""none): the summary names it even when the coordinator
  /// was gone by the end (issue 40: a rank started twice blamed "connection refused").
  std::string last_refusal_;
  TimePoint last_heard_;  // the coordinator's last (proven) word: the workers' lease counts from it
  TimePoint link_heard_;  // the connection's last sign of life (a connect, any message): its silence
  TimePoint next_heartbeat_;
  int interrupted_by_ = 0;
  std::optional<TimePoint> interrupt_deadline_;
  uint64_t connections_ = 0;
  // Progress: the longest interval between two beacons of one rank in this job (learnt here,
  // or from the coordinator's StartRound).
  Duration longest_interval_{0};
  // The node rank this agent plays in the current round: its own, or a replaced node's.
  int node_rank_ = -1;
  bool standby_ = false;                 // the job has spares: wait for a round as long as it runs
  std::optional<TimePoint> last_input_;  // to tell our own stall from the workers' silence
  /// After a stall of our own, the words waiting in the socket may be older than a fence the
  /// coordinator set meanwhile: none renews the workers' lease until the coordinator answers
  /// the Heartbeat echo sent on resuming (TCP keeps the order: what follows it is fresh).
  /// 0: none awaited.
  uint64_t echo_awaited_ = 0;
  uint64_t echoes_sent_ = 0;
  std::optional<TimePoint> next_deadline_;        // UpdateDeadlines() as of the last Start or
  std::optional<TimePoint> next_other_deadline_;  // Handle (or SkipQuiet)
};

}  // namespace ddprun::core
