#pragma once
// The coordinator: node 0's agent runs it in the same process. It admits agents, runs rounds
// with gang semantics, spends the job-wide restart budget and names the root cause.
// Sans-IO: Handle(now, input, effects) and NextDeadline(); no clock, socket or process here.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/hang_watch.h"
#include "runner/core/links.h"
#include "runner/core/metrics.h"
#include "runner/core/placement.h"
#include "runner/core/roster.h"
#include "runner/core/round_failure.h"
#include "runner/core/time.h"
#include "schema/job_spec.h"

namespace ddprun::core {

struct JoinVerdict;

namespace test {
/// The death tests' door to each machine's transition function (tests/core/edges_test.cc):
/// an edge no input can take must still be seen to stop the process.
struct Edges;
}  // namespace test

class Coordinator {
 public:
  enum class Phase { kRendezvous, kStarting, kRunning, kStopping, kBackoff, kEnding, kDone };

  /// `canonical` is CanonicalForm(spec); joins whose fingerprint differs are refused with the
  /// field-level difference. `start` begins the rendezvous timeout.
  Coordinator(const JobSpec& spec, std::string canonical, TimePoint start);

  /// With a shared secret, every new connection gets a Challenge and a join must carry its
  /// JoinProof. `nonce_seed` must be unpredictable (the driver's randomness).
  void RequireSecret(std::string secret, uint64_t nonce_seed);

  /// Node 0's journal says that a previous coordinator of this job on this host last recorded,
  /// `since` ago, that workers may run, and never recorded the end (its host crashed, or its
  /// process was killed). Its agents stop those workers within the lease bound of that record,
  /// so no round starts before then: this coordinator cannot know who held which rank.
  /// `previous` names that coordinator in the log line (etcd: an earlier launch of the job).
  void AfterUncleanEnd(TimePoint now, Duration since, std::vector<CoordinatorEffect>& out,
                       std::string_view previous = "the previous coordinator of this job on this host");

  /// Node 0's quarantine state file lists these hosts (an earlier launch of the job kept them
  /// out): a host with time left sits out until then, and its count of quarantines goes on.
  void RestoreQuarantine(const std::vector<QuarantinedHost>& hosts, std::vector<CoordinatorEffect>& out);

  /// rendezvous.backend = "etcd": this coordinator runs in agent `agent`'s process, on the host
  /// `addr`. That agent plays node rank 0 (it trades places with the agent that held it), so
  /// worker rank 0, its store and the store relay live with the coordinator, and every round's
  /// MASTER_ADDR is `addr`. Before the first input.
  void PlaceRankZero(int agent, std::string addr);
  /// Every round's MASTER_ADDR is `addr`, not cluster.master_addr: node 0 listens there because
  /// master_addr is loopback on its own host (io::OwnAddressTowardsPeers). Before the first input.
  void SetMasterAddr(std::string addr) { master_addr_ = std::move(addr); }

  /// Takes the job over from `record`, what an earlier holder of the coordinator role left in
  /// the job's store (etcd): the round numbers and the restart budget go on. A round
  /// that may still run lost its coordinator: that is the round's failure (a lost node), it
  /// spends a restart, and no round starts until the old workers are certainly gone (their
  /// agents' lease). A job that had ended ends again with the same verdict. Before the first
  /// input, after PlaceRankZero.
  void TakeOver(TimePoint now, const JobRecord& record, std::vector<CoordinatorEffect>& out);

  /// Feeds one input; appends the effects to `out`. Expired deadlines are handled first.
  void Handle(TimePoint now, const CoordinatorInput& input, std::vector<CoordinatorEffect>& out);

  /// When Handle(now, Tick{}) must be called next; nullopt when done.
  std::optional<TimePoint> NextDeadline() const;

  /// Running a round, in a backoff or waiting for nodes, with every connection a joined
  /// agent's and nothing under way but heartbeats and deadlines: its beat, its other deadlines
  /// (the silence check aside), and the connections
  /// its heartbeat goes to, in the order it sends them; nullopt otherwise. For the simulator's
  /// quiet stretches (sim/quiet.cc), as Agent::Quiet.
  struct Quiet {
    QuietState state;
    std::vector<ConnId> broadcast;
    std::vector<TimePoint> heard;  // when each of `broadcast` was last heard from
  };
  std::optional<Quiet> QuietNow() const;

  Phase phase() const { return static_cast<Phase>(state_.index()); }
  /// Whether `conn` is an agent that joined (its join accepted, with the secret's proof when
  /// there is one): what the driver trusts with full-size frames.
  bool Joined(ConnId conn) const {
    const Links::Conn* found = links_.Find(conn);
    return found && found->node_rank >= 0;
  }
  int round() const { return round_; }
  int restarts_used() const { return restarts_used_; }
  int joined_count() const { return roster_.connected(); }
  /// Set once the job has ended: the exit code every agent was told.
  std::optional<int> exit_code() const { return exit_code_; }
  /// The job failed on a failure that restart.never_on names: it ended with restarts left, as
  /// asked (the simulator's liveness check owes no restart then).
  bool ended_by_rule() const { return ended_by_rule_; }
  /// What the job looks like now, for node 0's metrics endpoint (runner/core/metrics.cc).
  CoordinatorMetrics Metrics() const;
  /// The round of the job's latest root cause; nullopt before any failure.
  std::optional<int> last_failure_round() const {
    return last_failure_ ? std::optional<int>(last_failure_->round) : std::nullopt;
  }

  /// The job's latest root cause as observers record it (node 0's event log); the protocol
  /// never reads it. nullopt before any failure.
  struct RootCause {
    int round = 0;
    int node_rank = 0;               // the node it happened on (or that was lost)
    int global_rank = -1;            // the rank that failed or hung first; -1: a node, not a rank
    std::string what;                // one line, as the summary says it
    std::vector<FailureKind> kinds;  // core::FailureKinds, or hang, lost-node, stall
  };
  std::optional<RootCause> last_root_cause() const {
    if (!last_failure_) return std::nullopt;
    return RootCause{last_failure_->round, last_failure_->node_rank, last_failure_->global_rank,
                     last_failure_->what, last_failure_->kinds};
  }

  using HangJudgement = core::HangJudgement;
  /// How many hung rounds it has judged, and the last judgement.
  uint64_t hang_judgements() const { return hangs_.judgements(); }
  const HangJudgement& last_hang_judgement() const { return hangs_.last_judgement(); }

 private:
  friend struct test::Edges;
  /// A phase in which the coordinator may be quiet (QuietNow).
  bool MayBeQuiet() const;
  // ---- The phases, each with what it waits for.
  struct Rendezvous {
    TimePoint started;
    TimePoint deadline;             // timeouts.rendezvous
    TimePoint next_progress;        // when waiting agents next hear who is missing
    std::optional<TimePoint> gate;  // every node joined; the round waits for a fence
    /// The progress line backs off while nothing changes (5 s, doubling to 1 min: issue 39,
    /// 2,048 nodes waiting 10 minutes printed 120 lines each); a change is said within 5 s.
    Duration progress_every{};  // OpenRendezvous sets the first
    std::optional<TimePoint> progress_sent;
    wire::Progress progress_said;  // the last line sent, its elapsed time left out
  };
  /// A rendezvous that begins at `now` (the job's start, or the end of a backoff).
  static Rendezvous OpenRendezvous(TimePoint now, Duration timeout);
  /// Before the first round (rendezvous.probe): every node of the round connects to the
  /// others' probe endpoints; the round starts once all have answered or `until` has passed.
  struct Reach {
    TimePoint until;
    std::set<int> waiting;  // agents that have not answered yet
    // One line per pair that could not connect, by (prober, target): in node order, whatever
    // order the answers came in.
    std::map<std::pair<int, int>, std::string> problems;
  };
  struct Starting {
    std::optional<Reach> reach;
    bool awaiting_commit = false;  // CommitRound sent, RoundCommitted not yet in
  };
  struct Running {
    int done = 0;  // agents whose workers all exited 0
  };
  struct Stopping {
    RoundFailure failure;    // the round's root cause so far
    TimePoint give_up;       // nodes that have not confirmed by then are dropped
    int stopped_joined = 0;  // connected agents that confirmed the stop
  };
  struct Backoff {
    TimePoint until;
  };
  struct Ending {
    TimePoint barrier;            // the exit barrier
    bool awaiting_record = true;  // RecordEnd sent, EndRecorded not yet in: nobody is told
    int awaiting = 0;             // agents not kSettled
  };
  struct Done {};
  // In Phase order.
  using State = std::variant<Rendezvous, Starting, Running, Stopping, Backoff, Ending, Done>;

  /// The one way the phase changes: asserts that `next` is an edge the coordinator takes
  /// (kEdges in coordinator.cc), so a change no test foresaw stops instead of running on.
  void Enter(State next);

  /// Every deadline, in the order ExpireDeadlines acts on them. NextDeadline is the earliest
  /// of DeadlineOf; ExpireDeadlines acts on those due, each looked up again after the actions
  /// before it, so the two cannot disagree (a deadline one of them ignored would spin the
  /// driver or never fire).
  enum class Deadline {
    kHeartbeat,
    kSilence,
    kRoundGate,
    kReplace,
    kRendezvous,
    kRendezvousProgress,
    kReach,
    kHangProbe,
    kStragglers,
    kStopWait,
    kBackoff,
    kEndBarrier,
    kUnjudged,
    kCount
  };
  std::optional<TimePoint> DeadlineOf(Deadline deadline) const;
  bool Due(Deadline deadline, TimePoint now) const;
  void ExpireDeadlines(TimePoint now, std::vector<CoordinatorEffect>& out);

  void Apply(TimePoint now, const CoordinatorInput& input, std::vector<CoordinatorEffect>& out);
  /// CoordinatorQuietStretch: not an event of its `now` but the stretch's outcome, so no
  /// deadline expires (coordinator_quiet.cc).
  void SkipQuiet(const CoordinatorQuietStretch& stretch, std::vector<CoordinatorEffect>& out);
  void SetSlotConn(int agent, std::optional<ConnId> conn, TimePoint now);
  void MarkStopped(AgentSlot& slot, int stopped_ranks);
  void OnMessage(TimePoint now, ConnId conn, const wire::Message& message,
                 std::vector<CoordinatorEffect>& out);
  void OnJoin(TimePoint now, ConnId conn, const wire::Join& join, std::vector<CoordinatorEffect>& out);
  /// Under etcd, a join refused for another job file before any round: true when that file's
  /// agents now outnumber this one's and the role was given up (GiveUpRole); a tie makes the
  /// refusal one to retry (`verdict.retry`), so that no correct node gives up on the job.
  bool WeighOtherFile(TimePoint now, ConnId conn, const wire::Join& join, JoinVerdict& verdict,
                      std::vector<CoordinatorEffect>& out);
  /// Carries out JudgeJoin's kAdmit.
  void Admit(TimePoint now, ConnId conn, const wire::Join& join, const std::string& differences,
             std::vector<CoordinatorEffect>& out);
  /// A connection we challenged closed before it joined: name the rank its hello claimed in
  /// the rendezvous summary as having another secret.
  void OnChallengeUnanswered(const Links::Conn& conn, std::vector<CoordinatorEffect>& out);
  /// After TakeOver: a rejoining agent's word on the round nobody judged (wire::Join's
  /// ran_round): every node rank of it finished, and the job succeeded; one did not, and the
  /// round failed.
  void OnRoundReport(TimePoint now, const wire::Join& join, std::vector<CoordinatorEffect>& out);
  /// The round TakeOver found is judged lost: a restart, or the job's end.
  void JudgeLostRound(TimePoint now, std::vector<CoordinatorEffect>& out);
  void OnStalled(TimePoint now, Duration stall, std::vector<CoordinatorEffect>& out);
  void OnNodeLost(TimePoint now, int agent, const std::string& why, std::vector<CoordinatorEffect>& out);
  /// Closes `conn`; for an agent's current connection that is its loss, for `reason`.
  void Drop(TimePoint now, ConnId conn, LossReason reason, std::string detail,
            std::vector<CoordinatorEffect>& out);
  void ObserveLoss(int agent, LossReason reason, std::string detail,
                   std::vector<CoordinatorEffect>& out) const;
  void MaybeStartRound(TimePoint now, std::vector<CoordinatorEffect>& out);
  /// The latest end of a fence that holds the round back (lifting those that ended); nullopt:
  /// none does.
  std::optional<TimePoint> RoundGate(TimePoint now, std::vector<int>& fenced);
  bool StartReach(TimePoint now, std::vector<CoordinatorEffect>& out);
  void OnPeersProbed(TimePoint now, int agent, const wire::PeersProbed& probed,
                     std::vector<CoordinatorEffect>& out);
  void FinishReach(TimePoint now, std::vector<CoordinatorEffect>& out);
  void CommitOrBegin(std::vector<CoordinatorEffect>& out);
  /// The round's store port: cluster.store_port, or one the host reserves (ReserveStorePort).
  void ReserveOrBegin(std::vector<CoordinatorEffect>& out);
  void BeginRound(uint16_t store_port, std::vector<CoordinatorEffect>& out);
  void OnNodeDone(TimePoint now, AgentSlot& slot, std::vector<CoordinatorEffect>& out);
  void BeginStop(TimePoint now, RoundFailure failure, std::vector<CoordinatorEffect>& out);
  /// The hang probe's verdict stops the round (observed as HangJudged, then the failure).
  void StopForHang(TimePoint now, std::vector<CoordinatorEffect>& out);
  void ReviseRootCause(RoundFailure failure, std::vector<CoordinatorEffect>& out);
  void MaybeFinishStop(TimePoint now, std::vector<CoordinatorEffect>& out);
  /// The restart budget after a failed round: a restart if one is left (and no never_on
  /// rule forbids it), else the job's end.
  void SpendRestartOrEnd(TimePoint now, const RoundFailure& failure, int stopped_ranks, int stopped_nodes,
                         std::vector<CoordinatorEffect>& out);
  void EndJob(TimePoint now, int exit_code, std::string summary, std::vector<CoordinatorEffect>& out);
  void SettleEnd(AgentSlot& slot);
  void MaybeDone(std::vector<CoordinatorEffect>& out);
  void Finish(std::vector<CoordinatorEffect>& out);
  void Broadcast(const wire::Message& message, std::vector<CoordinatorEffect>& out) const;
  void SendProgress(TimePoint now, std::vector<CoordinatorEffect>& out);
  /// Who is missing changed (a join, a loss, a refusal): the next progress line comes within
  /// the first interval of the last one, not after the backed-off one.
  void ProgressChanged(TimePoint now);
  /// Whether agent `slot`'s workers may be running now (a round it plays has started and it
  /// has not confirmed their stop).
  bool WorkersMayRun(const AgentSlot& slot) const;

  const JobSpec& spec_;
  std::string canonical_;
  std::string fingerprint_;
  State state_;
  int round_ = 0;
  int restarts_used_ = 0;
  Roster roster_;        // every agent of the job: the nodes, then the spares
  Placement placement_;  // who plays the next round; the quarantine book
  HangWatch hangs_;      // hung ranks and stragglers of the running round
  Links links_;
  /// Where the absence clock of a node that has not joined this rendezvous starts: its start,
  /// moved on by every stall of our own (OnStalled).
  TimePoint absence_origin_;
  TimePoint next_heartbeat_;
  TimePoint last_input_;  // to tell our own stall from silent peers
  std::optional<RoundFailure> last_failure_;
  std::optional<int> exit_code_;
  std::string end_summary_;                 // the JobEnd summary, for agents that rejoin after the end
  std::optional<TimePoint> journal_fence_;  // AfterUncleanEnd, TakeOver: no round before this
  /// TakeOver found a round that may have run and was never judged: its failure unless every
  /// node rank of it says, rejoining before `until`, that its workers exited 0.
  struct Unjudged {
    RoundFailure failure;
    int nodes = 0;                // the round's node ranks, from the job's record
    std::map<int, int> finished;  // node rank -> the agent that said it finished it
    TimePoint until;
  };
  std::optional<Unjudged> unjudged_;
  std::string fence_cause_;  // why journal_fence_ holds the first round back
  /// The job's record last said that workers may run: a round began, and the job has not
  /// finished. The heartbeat renews that record.
  bool record_running_ = false;
  bool reach_checked_ = false;               // the probe before the first round has run
  std::vector<std::string> reach_problems_;  // what it found, kept under "warn" for a hang verdict
  // Configuration and history.
  std::string secret_;
  uint64_t nonce_seed_ = 0;
  bool took_over_ = false;                   // TakeOver: the job began under another holder
  bool ended_by_rule_ = false;               // see ended_by_rule()
  std::vector<std::string> earlier_causes_;  // the restarted rounds' root causes, for the summaries
  std::string master_addr_;    // every round's MASTER_ADDR (PlaceRankZero, SetMasterAddr); "": the file's
  int own_agent_ = 0;          // the agent in this coordinator's process (PlaceRankZero)
  bool elected_ = false;       // PlaceRankZero: the role was won in a campaign (etcd)
  std::string us_ = "node 0";  // this coordinator as refusals name it
  /// Under etcd before the first round: the agents refused for each other job file (by
  /// fingerprint), to tell a holder whose own file is the odd one out (WeighOtherFile).
  std::map<std::string, std::set<int>> refused_files_;
};

}  // namespace ddprun::core
