#pragma once
// Inputs and effects of the two state machines. Drivers (runner/host under the real or the
// simulated ports) turn port callbacks into inputs and execute effects; nothing else crosses.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "runner/core/failure.h"
#include "runner/core/progress.h"
#include "runner/core/time.h"
#include "runner/core/wire.h"
#include "schema/worker_env.h"

namespace ddprun::core {

/// A connection, numbered by the transport; unique for the life of a host.
using ConnId = uint64_t;

enum class LogLevel { kDebug, kInfo, kWarn, kError };

/// Why a connect failed, as the transport saw it; the agent turns it into advice.
enum class ConnectError {
  kRefused,      // RST: nobody listens on that port (yet), or a firewall rejects
  kTimedOut,     // no answer: a firewall drops, or the host is down
  kUnreachable,  // no route to the host or network
  kNameNotResolved,
  kStore,  // rendezvous.backend = "etcd": the holder of the coordinator role could not be read
  kOther,
};

struct LogLine {
  LogLevel level = LogLevel::kInfo;
  std::string text;
};

// ---- Coordinator ----------------------------------------------------------------------

struct PeerAccepted {
  ConnId conn = 0;
  std::string peer_addr;
};
struct PeerMessage {
  ConnId conn = 0;
  wire::Message message;
};
struct PeerClosed {
  ConnId conn = 0;
  std::string reason;
};
/// The host's answer to ReserveStorePort.
struct StorePortReady {
  int round = 0;
  uint16_t port = 0;
};
/// Nothing happened but time passed (a deadline).
struct Tick {};

/// A core with nothing under way but heartbeats (the simulator's quiet stretches, sim/quiet.cc
/// and docs/performance.md): when it beats next, and its earliest deadline that is neither a
/// heartbeat nor the loss of a silent peer. Between now and that deadline the heartbeats are
/// all that happens to it, so the simulator may compute them instead of running each one.
struct QuietState {
  TimePoint next_beat;
  std::optional<TimePoint> other_deadline;
  TimePoint heard;  // an agent's last word from the coordinator: its loss deadline counts from it
};
/// A quiet stretch passed without running it (the simulator, sim/quiet.cc): the coordinator
/// broadcast a heartbeat at each beat before `next_beat` (`beat`: at least one), heard each
/// connection of `heard` last at its time (in time order) and last ran at `last_input`. Fed at
/// the stretch's start, only while QuietNow() said so; it sets exactly what those inputs would
/// have set, and renews the record as the last beat did.
struct CoordinatorQuietStretch {
  TimePoint next_beat;
  bool beat = false;
  std::vector<std::pair<TimePoint, ConnId>> heard;
  TimePoint last_input;
};
/// The host's answer to CommitRound: the job's store holds the round, and this coordinator
/// still held the coordinator role when it was written.
struct RoundCommitted {
  int round = 0;
};
/// The job's end (RecordEnd) is in its record; the agents may hear it now.
struct EndRecorded {};

using CoordinatorInput = std::variant<PeerAccepted, PeerMessage, PeerClosed, StorePortReady, RoundCommitted,
                                      EndRecorded, Tick, CoordinatorQuietStretch>;

struct SendTo {
  ConnId conn = 0;
  wire::Message message;
};
struct CloseConn {
  ConnId conn = 0;
};
/// Find a free port for round `round`'s PyTorch store; answer with StorePortReady.
struct ReserveStorePort {
  int round = 0;
};
/// The job is over and every agent has acknowledged (or the exit barrier expired).
struct CoordinatorDone {
  int exit_code = 0;
};
/// rendezvous.backend = "etcd": this coordinator's job file is outnumbered by another (more
/// agents were refused for that one than joined with its own, before any round began): the
/// host lets the role go (its agents look the new holder up); the coordinator has logged why
/// and refused its own agent with it.
struct GiveUpRole {};
// ---- The job's record ----------------------------------------------------------------------
// What outlives the coordinator: node 0's journal on its own disk, or the job's keys in etcd
// (host::JobRecordKeeper, runner/host/job_record.h). The coordinator records the same way
// with either; a keeper that writes a local file answers at once.

/// Workers of this job may run now, or every one is confirmed stopped. Repeated every
/// heartbeat while they may run, so the last record is at most one heartbeat older than the
/// coordinator's last word to its agents.
struct RecordWorkers {
  bool rounds_may_run = false;
};

/// A host kept out of the job (docs/running.md, quarantine), as node 0's state file keeps it
/// across launches of the job.
struct QuarantinedHost {
  std::string host;
  Duration left{};  // how much longer it is kept out; <= 0: free again, its count is kept
  int times = 0;    // quarantines so far: the next cooldown is quarantine.cooldown x 2^times
  bool operator==(const QuarantinedHost&) const = default;
};
/// Every host with a quarantine on record.
struct RecordQuarantine {
  std::vector<QuarantinedHost> hosts;
};

/// Before round `round` starts, the job's record must hold it and the restarts used; answer
/// with RoundCommitted. With etcd only the holder of the coordinator role can make that write
/// (fencing): a coordinator that was deposed gets no answer, and its host steps it down.
struct CommitRound {
  int round = 0;
  int restarts_used = 0;
  int nodes = 0;  // the node ranks that play it (0..nodes-1)
};
/// Every worker of the failed round is confirmed stopped and a restart is
/// spent; round `next_round` comes next. A coordinator that takes over from here spends no
/// restart for the stopped round.
struct RecordRestart {
  int next_round = 0;
  int restarts_used = 0;
  /// A node of the stopped round was lost, so its workers were never confirmed stopped: a
  /// coordinator that takes over from here must wait for their lease before its first round.
  bool workers_may_run = false;
};
/// The job has ended with `exit_code`; `summary` is what every agent will be told. The agents
/// hear it only once the record has it (EndRecorded): an end that was never recorded was never
/// told, so a coordinator that takes over cannot contradict it, and one that takes over before
/// every agent has heard it tells them the same (etcd). Node 0's journal keeps no verdict.
struct RecordEnd {
  int exit_code = 0;
  std::string summary;
};

/// The job as its store keeps it (rendezvous.backend = "etcd": written by whoever holds the
/// coordinator role, from CommitRound, RecordRestart, RecordEnd and RecordQuarantine), and what
/// a coordinator that takes the role over continues from (Coordinator::TakeOver).
struct JobRecord {
  int next_round = 0;  // the number the next round takes
  int restarts_used = 0;
  bool round_may_run = false;    // a round was committed and its workers were not seen to stop
  int round_nodes = 0;           // that round's node ranks (0: not recorded)
  bool workers_may_run = false;  // the last round was counted, but a lost node's workers may run
  bool done = false;             // the job ended and every agent heard it: a new launch starts afresh
  std::optional<int> exit_code;  // the job ended with this (done or not)...
  std::string summary;           // ...and its agents were told this
  std::string holder;            // who wrote it: "node 1 (gpu-02)"
  int holder_agent = -1;         // that agent (-1: not recorded)
  std::string fingerprint;       // the job file's (FingerprintOf) that the holder ran
  std::vector<QuarantinedHost> quarantined;
  bool operator==(const JobRecord&) const = default;
};

// ---- What the coordinator observed ------------------------------------------------------
// Facts for observers (node 0's event log, its metrics, the simulator's checks, replay), typed so
// that nobody downstream parses a sentence the coordinator wrote. No driver acts on them.

/// Why the coordinator counts a joined agent as lost.
enum class LossReason {
  kClosed,              // its connection closed (reset, refused, end of stream)
  kSilent,              // no word for longer than the loss bound (3 heartbeats)
  kReconnected,         // the same agent joined again on a new connection
  kProtocolError,       // it sent a message an agent must not send
  kNoStopConfirmation,  // it did not confirm that its workers stopped within the exit barrier
};
/// "closed", "silent", "reconnected", "protocol-error", "no-stop-confirmation": the event log's
/// `cause` of a node-lost record.
std::string_view LossReasonName(LossReason reason);

namespace observed {
struct NodeJoined {
  int agent = 0;  // the node rank it was started with (spares after the nodes)
  std::string host;
  bool spare = false;
};
struct NodeRefused {
  int agent = -1;  // the node rank its join claimed; -1 unknown
  std::string reason;
};
struct NodeLost {
  int agent = 0;
  LossReason reason = LossReason::kClosed;
  std::string detail;  // one line: the connection's error, how long it was silent
};
struct RoundStarted {
  int round = 0;
  int restarts_used = 0;
  int nodes = 0;  // the nodes that play it
  /// Spares that play a node rank in place of its holder: (agent, node rank).
  std::vector<std::pair<int, int>> replaced;
};
/// A round's root cause, or a better one for the same round (a revision).
struct RoundFailed {
  int round = 0;
  int agent = 0;         // where it happened, or the agent that was lost
  int global_rank = -1;  // -1: a node, not a rank
  std::vector<FailureKind> kinds;
  std::string what;
  bool last = false;  // no restart is left
};
struct RestartSpent {
  int restart = 0;  // 1 for the first
  int next_round = 0;
  Duration backoff{};
};
struct HangProbed {
  int round = 0;
};
/// The ranks a hang verdict named, and whose stacks it had (each ascending). For observers that
/// check the verdict against the ranks that hung (the simulator); its text is in RoundFailed.
struct HangJudged {
  int round = 0;
  std::vector<int> culprits;
  std::vector<int> with_stack;
};
/// The verdict the agents are told (with etcd, once the job's store holds it).
struct JobEnded {
  int exit_code = 0;
  int restarts_used = 0;
  std::string summary;
  bool by_rule = false;  // restart.never_on ended it with restarts left
};
}  // namespace observed

using Observation = std::variant<observed::NodeJoined, observed::NodeRefused, observed::NodeLost,
                                 observed::RoundStarted, observed::RoundFailed, observed::RestartSpent,
                                 observed::HangProbed, observed::HangJudged, observed::JobEnded>;
struct Observed {
  Observation what;
};

using CoordinatorEffect =
    std::variant<SendTo, CloseConn, ReserveStorePort, LogLine, CoordinatorDone, GiveUpRole, RecordWorkers,
                 RecordQuarantine, CommitRound, RecordRestart, RecordEnd, Observed>;

// ---- Agent ----------------------------------------------------------------------------

struct MasterConnected {};
struct MasterConnectFailed {
  ConnectError error = ConnectError::kOther;
  std::string detail;  // the system's words, e.g. "Connection refused"
};
struct MasterMessage {
  wire::Message message;
};
struct MasterClosed {
  std::string reason;
};
struct WorkerExited {
  int round = 0;
  int local_rank = 0;
  int exit_code = 0;        // meaningful when signal == 0
  int signal = 0;           // > 0: killed by this signal
  std::string stderr_tail;  // last lines of the worker's stderr
  std::string error_text;   // readable TORCHELASTIC_ERROR_FILE contents, "" if none
};
struct WorkerSpawnFailed {
  int round = 0;
  int local_rank = 0;
  std::string error;
};
struct SignalReceived {
  int signal = 0;
};
/// A progress beacon from a worker of this node, already checked against the token.
struct BeaconReceived {
  Beacon beacon;
};
/// The host's answer to ReadStacks: what each worker's stacks file got since SignalForStacks,
/// by local rank ("" when nothing came).
struct WorkerStacks {
  int round = 0;
  std::vector<std::string> dumps;
};

/// The host's answer to ProbeEndpoints: the targets it could not connect to, and how.
struct ProbesDone {
  std::vector<wire::ProbeFailure> failures;
};

/// A quiet stretch passed without running it (the simulator, sim/quiet.cc): the agent sent a
/// heartbeat at each beat before `next_beat`, last heard the coordinator's at `heard` (nullopt:
/// not at all) and last ran at `last_input`. Fed at the stretch's start, only while Quiet() said
/// so; it sets exactly what those inputs would have set, and renews the workers' lease as the
/// last word did.
struct AgentQuietStretch {
  TimePoint next_beat;
  std::optional<TimePoint> heard;
  TimePoint last_input;
};
using AgentInput = std::variant<MasterConnected, MasterConnectFailed, MasterMessage, MasterClosed,
                                WorkerExited, WorkerSpawnFailed, SignalReceived, BeaconReceived, WorkerStacks,
                                ProbesDone, Tick, AgentQuietStretch>;

struct ConnectToMaster {};
struct SendToMaster {
  wire::Message message;
};
struct DisconnectFromMaster {};

struct WorkerLaunch {
  int local_rank = 0;
  int global_rank = 0;
  EnvList env;             // what ddprun adds; the host merges it over the inherited env
  std::string log_path;    // relative to the run's folder, as is error_path
  std::string error_path;  // TORCHELASTIC_ERROR_FILE, which the host reads when the worker exits
};
struct SpawnWorkers {
  int round = 0;
  std::vector<WorkerLaunch> workers;
};
/// Send `signal` to the process group of every still-running worker of `round`.
struct SignalWorkers {
  int round = 0;
  int signal = 0;
};
/// Ask workers of `round` for their stacks: `signal` to the worker's own pid (never its process
/// group: its children have no handler), for each (local rank, signal). The host notes where
/// each rank's stacks file ends first, so that ReadStacks returns only this dump.
struct SignalForStacks {
  int round = 0;
  std::vector<std::pair<int, int>> targets;
};
/// Read what the stacks files of `round` got since SignalForStacks; answer with WorkerStacks.
struct ReadStacks {
  int round = 0;
};
/// Round `round` is stopping because of `cause_rank` (its root cause; -1 when that is not one
/// rank, e.g. a lost node): what the other ranks of this node print from now on, and the
/// errors they printed because they lost that peer, are consequences. The host's console
/// shows them as one line per node; the log files keep every byte. May come again for the
/// same round when the coordinator revises the root cause.
struct RootCauseKnown {
  int round = 0;
  int cause_rank = -1;
  /// `cause_rank`'s own error says only that it lost a peer: the first failure heard, which a
  /// later RootCauseKnown may replace. Its held error is not shown yet (consequence_filter.h).
  bool provisional = false;
};
/// Print the job's final summary (or a round's root cause) for the user.
struct PrintSummary {
  std::string text;
};
/// The agent is finished; the process exits with `code` once the coordinator (if any) is done.
struct AgentExit {
  int code = 0;
};
/// The lease of this node's workers now ends at `kill_at`: the last word from the coordinator
/// + the loss bound + stop_grace (JobSpec::Timeouts::GuardianLease), when the agent SIGKILLs
/// whatever still runs of them unless it hears from the coordinator again. The host hands it to
/// what runs when the agent does not (the guardian, runner/io/guardian.h), which SIGKILLs them
/// then unless renewed. Emitted whenever the agent hears from the coordinator, before anything
/// that word makes it do (a spawn included).
struct RenewLease {
  TimePoint kill_at;
};

/// Connect to each target's probe endpoint (each within the connect timeout), close what
/// connects, and answer with ProbesDone once every target has answered or timed out.
struct ProbeEndpoints {
  std::vector<wire::ProbeTarget> targets;
};

using AgentEffect = std::variant<ConnectToMaster, SendToMaster, DisconnectFromMaster, SpawnWorkers,
                                 SignalWorkers, SignalForStacks, ReadStacks, ProbeEndpoints, LogLine,
                                 PrintSummary, AgentExit, RenewLease, RootCauseKnown>;

}  // namespace ddprun::core
