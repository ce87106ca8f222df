#pragma once
// The coordinator: node 0's agent runs it in the same process. It admits agents, runs rounds
// with gang semantics, spends the job-wide restart budget and names the root cause.
// Sans-IO: Handle(now, input, effects) and NextDeadline(); no clock, socket or process here.

#include <cstdint>
#include <map>
#include <optional>
#include <deque>
#include <unordered_map>
#include <set>
#include <string>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/metrics.h"
#include "runner/core/time.h"
#include "schema/job_spec.h"

namespace ddprun::core {

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
  void RestoreQuarantine(const std::vector<QuarantinedHost>& hosts,
                         std::vector<CoordinatorEffect>& out);

  /// rendezvous.backend = "etcd": before each round starts, the job's store must record it
  /// (CommitRound, answered by RoundCommitted), and the budget, the end and the quarantine
  /// are recorded there too (RecordEnd, RecordQuarantine).
  void CommitRounds() { commit_rounds_ = true; }

  /// rendezvous.backend = "etcd": this coordinator runs in agent `agent`'s process, on the host
  /// `addr`. That agent plays node rank 0 (it trades places with the agent that held it), so
  /// worker rank 0, its store and the store relay live with the coordinator, and every round's
  /// MASTER_ADDR is `addr`. Before the first input.
  void PlaceRankZero(int agent, std::string addr);

  /// What an earlier holder of the coordinator role left in the job's store (etcd).
  struct Legacy {
    int next_round = 0;           // the number the next round takes
    int restarts_used = 0;
    bool round_may_run = false;   // it committed a round whose workers it never saw stop
    std::optional<int> exit_code; // it ended the job with this code...
    std::string summary;          // ...and told the agents this
    std::string holder;           // who held the role: "node 1 (gpu-02)"
    bool workers_may_run = false; // RecordRestart::workers_may_run: a lost node's workers may run
  };
  /// Takes the job over from `legacy`: the round numbers and the restart budget go on. A round
  /// that may still run lost its coordinator: that is the round's failure (a lost node), it
  /// spends a restart, and no round starts until the old workers are certainly gone (their
  /// agents' lease). A job that had ended ends again with the same verdict. Before the first
  /// input, after PlaceRankZero.
  void TakeOver(TimePoint now, const Legacy& legacy, std::vector<CoordinatorEffect>& out);

  /// Feeds one input; appends the effects to `out`. Expired deadlines are handled first.
  void Handle(TimePoint now, const CoordinatorInput& input, std::vector<CoordinatorEffect>& out);

  /// When Handle(now, Tick{}) must be called next; nullopt when done.
  std::optional<TimePoint> NextDeadline() const;

  Phase phase() const { return phase_; }
  int round() const { return round_; }
  int restarts_used() const { return restarts_used_; }
  int joined_count() const;
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
    int node_rank = 0;            // the node it happened on (or that was lost)
    int global_rank = -1;         // the rank that failed or hung first; -1: a node, not a rank
    std::string what;             // one line, as the summary says it
    std::vector<std::string> kinds;  // core::FailureKinds, or "hang", "lost-node", "stall"
  };
  std::optional<RootCause> last_root_cause() const {
    if (!last_failure_) return std::nullopt;
    return RootCause{last_failure_->round, last_failure_->node_rank, last_failure_->global_rank,
                     last_failure_->what, last_failure_->kinds};
  }

  /// A round this coordinator stopped because ranks hung, as it judged it. For observers (the
  /// simulator's invariants check the verdict against the ranks it hung); the protocol never
  /// reads it.
  struct HangJudgement {
    int round = 0;
    std::vector<int> culprits;    // the ranks it named, ascending
    std::vector<int> with_stack;  // the ranks whose stack it had, ascending
  };
  /// How many hung rounds it has judged, and the last judgement.
  uint64_t hang_judgements() const { return hang_judgements_; }
  const HangJudgement& last_hang_judgement() const { return last_hang_judgement_; }

 private:
  /// Where a node stands with the verdict once the job is ending.
  enum class EndState {
    kSettled,  // acknowledged, closed after being told, or never joined: not waited for
    kTold,     // JobEnd sent on its connection; waiting for the acknowledgement
    kAway,     // joined once, not connected at the end: waiting for it to rejoin
  };
  struct Slot {
    std::optional<ConnId> conn;
    std::string host;
    uint64_t instance = 0;
    bool done = false;        // NodeDone for the current round
    bool stopped = false;     // RoundStopped for the stopping round
    int stopped_ranks = 0;
    bool ever_joined = false;
    std::string refused;      // why its last join was refused, for the rendezvous summary
    std::string left;         // why it was lost after joining
    EndState end = EndState::kSettled;
    // Set when the node was lost while its workers might run: no round starts before `until`
    // unless the agent whose workers they are rejoins (it rejoins only once they are gone).
    struct Fence {
      TimePoint until;
      uint64_t holder = 0;  // that agent's instance; 0: workers of two agents (only time ends it)
    };
    std::optional<Fence> fence;
    int position = -1;        // the node rank it holds; -1: none (a waiting spare)
    int plays = -1;           // the node rank it plays in the current round; -1: none. The
                              // same as `position` unless the round shrank (cluster.min_nodes)
    std::optional<TimePoint> absent_since;  // not connected since then (for timeouts.replace)
    std::string probe_endpoint;  // from its Join: where the others probe it ("" none)
  };
  /// What the coordinator remembers of a host, for quarantine (keyed by host name: a host
  /// that reboots comes back with a new agent, and is the same host).
  struct HostRecord {
    std::deque<TimePoint> failures;    // rounds whose root cause was on it, within the window
    std::optional<TimePoint> until;    // quarantined until then
    int times = 0;                     // quarantines so far
  };
  struct Conn {
    std::string peer_addr;
    int node_rank = -1;       // -1 until joined
    TimePoint last_heard;
    std::string nonce;        // the Challenge sent to it, with a secret
    int hello_rank = -1;      // the node rank its hello claimed (unproven), with a secret
  };
  struct Failure {
    int round = 0;
    int node_rank = 0;
    int global_rank = -1;     // the failed (or first hung) rank; -1 for a lost node or a stall
    std::string what;         // one line: "rank 3 (node 1 "gpu-02", local rank 1) exited with code 1"
    std::string detail;       // error file / stderr tail, indented
    bool mentions_nccl = false;
    bool lost_peer = false;   // its error says it lost a peer: likely a consequence (failure.h)
    bool the_stop = false;    // its error is the stop's own signal (failure.h)
    bool explains_silence = false;  // a lost node or our own stall: ranks fall silent because of it
    std::vector<std::string> kinds;  // what it is known by (core::FailureKinds), for never_on
  };
  /// A round that stopped making progress: every node was asked for its ranks' stacks, and
  /// the round is stopped once all have answered or the wait is over.
  struct Probe {
    wire::RankHung first;     // the first rank reported silent
    int first_node = 0;
    TimePoint until;
    std::vector<bool> answered;  // by node rank
    int answers = 0;
    std::map<int, RankAtHang> ranks;  // by global rank
  };
  /// Before the first round (rendezvous.probe): every node of the round connects to the
  /// others' probe endpoints; the round starts once all have answered or `until` has passed.
  struct Reach {
    TimePoint until;
    std::set<int> waiting;              // agents (slots) that have not answered yet
    // One line per pair that could not connect, by (prober, target): in node order, whatever
    // order the answers came in.
    std::map<std::pair<int, int>, std::string> problems;
  };
  /// A rank's last progress report, and whether it is reported as a straggler.
  struct RankSeen {
    int node_rank = 0;
    wire::RankRate rate;
    bool straggling = false;
  };

  void Apply(TimePoint now, const CoordinatorInput& input, std::vector<CoordinatorEffect>& out);
  void Heard(ConnId id, Conn& conn, TimePoint now);
  void TrimHeard();
  void SetSlotConn(Slot& slot, std::optional<ConnId> conn, TimePoint now);
  void MarkStopped(Slot& slot, int stopped_ranks);
  void ExpireDeadlines(TimePoint now, std::vector<CoordinatorEffect>& out);
  void OnMessage(TimePoint now, ConnId conn, const wire::Message& message,
                 std::vector<CoordinatorEffect>& out);
  void OnJoin(TimePoint now, ConnId conn, const wire::Join& join, std::vector<CoordinatorEffect>& out);
  /// A connection we challenged closed before it joined: name the rank its hello claimed in
  /// the rendezvous summary as having another secret.
  void OnChallengeUnanswered(const Conn& conn, std::vector<CoordinatorEffect>& out);
  void OnStalled(TimePoint now, Duration stall, std::vector<CoordinatorEffect>& out);
  void OnNodeLost(TimePoint now, int node_rank, const std::string& why,
                  std::vector<CoordinatorEffect>& out);
  void Drop(TimePoint now, ConnId conn, std::vector<CoordinatorEffect>& out);
  bool StartReach(TimePoint now, std::vector<CoordinatorEffect>& out);
  void FinishReach(TimePoint now, std::vector<CoordinatorEffect>& out);
  void CommitOrBegin(std::vector<CoordinatorEffect>& out);
  void MaybeStartRound(TimePoint now, std::vector<CoordinatorEffect>& out);
  /// Every node rank has a connected agent; with spares, a node rank whose agent has been away
  /// for timeouts.replace goes to a waiting spare first. False: the round must wait.
  bool AssignPositions(TimePoint now, std::vector<CoordinatorEffect>& out);
  bool PositionsFilled() const;
  /// With cluster.min_nodes: the node ranks not filled are given up for this round when none
  /// can be filled any more (away longer than timeouts.replace, or quarantined) and enough are
  /// left. Fills round_slots_; false: the round must wait.
  bool ShrinkRound(TimePoint now, std::vector<CoordinatorEffect>& out);
  /// Whether the slot's host sits out now.
  bool Quarantined(const Slot& slot, TimePoint now) const;
  /// Counts the round's root cause against its host; quarantines it past quarantine.failures.
  void CountFailure(TimePoint now, const Failure& failure, std::vector<CoordinatorEffect>& out);
  void RecordQuarantineState(TimePoint now, std::vector<CoordinatorEffect>& out) const;
  /// "quarantined: ..." for summaries; "" when no host sits out.
  std::string QuarantineNote(TimePoint now) const;
  int Index(const Slot& slot) const { return static_cast<int>(&slot - slots_.data()); }
  void BeginRound(uint16_t store_port, std::vector<CoordinatorEffect>& out);
  /// The round's store port: cluster.store_port, or one the host reserves (ReserveStorePort).
  void ReserveOrBegin(std::vector<CoordinatorEffect>& out);
  Failure FailureOf(int node_rank, const wire::WorkerFailed& failed) const;
  void BeginStop(TimePoint now, Failure failure, std::vector<CoordinatorEffect>& out);
  void ReviseRootCause(Failure failure, std::vector<CoordinatorEffect>& out);
  void MaybeFinishStop(TimePoint now, std::vector<CoordinatorEffect>& out);
  // ---- Hung ranks and stragglers (progress beacons).
  void OnRankHung(TimePoint now, int node_rank, const wire::RankHung& hung,
                  std::vector<CoordinatorEffect>& out);
  void OnRankStacks(TimePoint now, int node_rank, const wire::RankStacks& stacks,
                    std::vector<CoordinatorEffect>& out);
  void OnRankProgress(TimePoint now, int node_rank, const wire::RankProgress& progress);
  /// The root cause of the probed hang, from the stacks in; ends the probe.
  Failure HangFailure();
  void CheckStragglers(TimePoint now, std::vector<CoordinatorEffect>& out);
  /// "stragglers ..." lines for a summary, without a final newline; "" when none was seen.
  std::string StragglerNote() const;
  /// "earlier rounds: round 0: rank 3 (...) exited with code 1 (RuntimeError); ...": the root
  /// causes of the rounds that were restarted, for the job's final summary; "" when none.
  std::string EarlierCausesNote() const;
  std::string RankName(int global_rank) const;
  void EndJob(TimePoint now, int exit_code, std::string summary, std::vector<CoordinatorEffect>& out);
  void SettleEnd(Slot& slot);
  void MaybeDone(std::vector<CoordinatorEffect>& out);
  void Finish(std::vector<CoordinatorEffect>& out);
  void Broadcast(const wire::Message& message, std::vector<CoordinatorEffect>& out) const;
  void SendProgress(TimePoint now, std::vector<CoordinatorEffect>& out);
  std::string NodeName(int node_rank) const;
  /// Agent `agent` by what it was started as ("node 2", "spare 0"), with its host.
  std::string AgentName(int agent) const;
  std::string RendezvousFailure() const;
  std::string FailureSummary(const Failure& failure, int stopped_ranks, int stopped_nodes,
                             const std::string& never_rule) const;
  /// The restart.never_on entry that matches `failure`; "" when none does.
  std::string NeverRestartRule(const Failure& failure) const;

  const JobSpec& spec_;
  std::string canonical_;
  std::string fingerprint_;
  Phase phase_ = Phase::kRendezvous;
  int round_ = 0;
  int restarts_used_ = 0;
  std::vector<Slot> slots_;          // every agent of the job: the nodes, then the spares
  std::vector<int> slot_at_;         // by node rank: the slot that holds it
  std::vector<int> round_slots_;     // by node rank of the current round: the slot that plays it
  std::map<std::string, HostRecord> hosts_;  // quarantine: failures and cooldowns by host
  std::string shrunk_note_;          // how the current round shrank, for the log; "" if it did not
  std::optional<TimePoint> replace_at_;  // a spare may take a node rank then
  int joined_ = 0;           // slots with a connection
  int done_count_ = 0;       // slots done in the running round
  int stopped_joined_ = 0;   // connected slots that confirmed the stop
  int awaiting_end_ = 0;     // slots not kSettled while ending
  // Looked up by id; iterated only where the order cannot matter (OnStalled renews them all),
  // so a hash map keeps decisions deterministic and lookups O(1).
  std::unordered_map<ConnId, Conn> conns_;
  // (last heard, conn) in the order heard: inputs come in time order, so it is sorted by
  // construction. An entry whose connection was heard again later, or closed, is stale and
  // skipped: O(1) per message where an ordered set cost O(log n) and an allocation.
  std::deque<std::pair<TimePoint, ConnId>> heard_;
  TimePoint rendezvous_started_;
  /// Where the absence clock of a node that has not joined this rendezvous starts: its start,
  /// moved on by every stall of our own (OnStalled).
  TimePoint absence_origin_;
  TimePoint rendezvous_deadline_;
  TimePoint next_progress_;
  TimePoint next_heartbeat_;
  TimePoint phase_deadline_;         // stopping: give up waiting; backoff: restart; ending: barrier
  std::optional<Failure> failure_;   // first failure of the current round
  std::optional<Failure> last_failure_;
  std::optional<int> exit_code_;
  std::string end_summary_;           // the JobEnd summary, for agents that rejoin after the end
  std::optional<TimePoint> round_gate_;  // every node joined; the round waits for a fence
  std::optional<TimePoint> journal_fence_;  // AfterUncleanEnd: no round before this
  bool rounds_may_run_ = false;       // a round has started and the job has not ended
  TimePoint last_input_;              // to tell our own stall from silent peers
  bool done_emitted_ = false;
  std::optional<Probe> probe_;
  std::optional<Reach> reach_;
  bool reach_checked_ = false;              // the probe before the first round has run
  std::vector<std::string> reach_problems_;  // what it found, kept under "warn" for a hang verdict
  std::unordered_map<int, RankSeen> ranks_seen_;  // this round's progress reports, by global rank
  std::optional<TimePoint> next_straggler_check_;
  std::vector<std::string> stragglers_seen_;     // every straggler reported in the job, for the summary
  std::vector<std::string> earlier_causes_;      // each restarted round's root cause, for the summary
  int64_t longest_interval_ms_ = 0;              // learnt: the job's longest beacon interval
  uint64_t hang_judgements_ = 0;
  HangJudgement last_hang_judgement_;
  std::string secret_;
  uint64_t nonce_seed_ = 0;
  bool commit_rounds_ = false;
  bool ended_by_rule_ = false;  // see ended_by_rule()
  bool awaiting_commit_ = false;      // CommitRound sent for round_, RoundCommitted not yet in
  bool took_over_ = false;            // TakeOver: the job began under another holder
  bool awaiting_end_record_ = false;  // RecordEnd sent, EndRecorded not yet in: nobody is told
  std::string fence_cause_;           // why journal_fence_ holds the first round back
  std::string master_addr_;           // PlaceRankZero: every round's MASTER_ADDR; "": the file's
};

}  // namespace ddprun::core
