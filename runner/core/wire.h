#pragma once
// The control protocol's messages and their frames (DESIGN.md section 4).
//
// Frame: "DDPR" magic, version (1 byte), type (1 byte), reserved (2 bytes), payload length
// (4 bytes, little endian, at most kMaxPayload), payload. The decoder is total: any byte
// sequence yields messages, "need more", or a protocol error that drops that peer only.

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace ddprun::wire {

inline constexpr uint8_t kMagic[4] = {'D', 'D', 'P', 'R'};
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 12;
inline constexpr uint32_t kMaxPayload = 1u << 20;
/// Bounds inside a payload: no message needs more.
inline constexpr uint32_t kMaxString = 256u * 1024;
inline constexpr uint32_t kMaxListItems = 1u << 16;

/// An agent asks to join. `instance` tells a rejoin of the same agent from a second agent
/// that claims the same node rank.
struct Join {
  int32_t node_rank = 0;
  std::string host;
  int32_t nproc = 0;
  std::string ddprun_version;
  std::string fingerprint;
  std::string canonical;  // CanonicalForm, for the field-level difference
  uint64_t instance = 0;
  std::string proof;  // JoinProof over the coordinator's Challenge; "" without a secret
  /// With a secret, the agent's first Join is a hello: node_rank, version and this nonce, and
  /// nothing about the job; the coordinator must prove it knows the secret for this nonce
  /// before the agent sends the job (host, fingerprint, canonical form).
  std::string nonce;
  /// "addr:port" where this agent accepts TCP connections on a port other than master_port,
  /// at the address its workers' sockets use; the coordinator has every node probe it before
  /// the first round. "" when the agent has none (then nobody probes it).
  std::string probe_endpoint;
  /// The last round this agent ran workers in (-1: none since it started), the node rank it
  /// played there, and whether every one of them exited 0 before any stop (NodeDone). A
  /// coordinator that took over a round its predecessor never judged asks nothing else: when
  /// every node rank of that round says so, the round succeeded (issue 37: an etcd outage as
  /// the job finished turned its success into exit 1).
  int32_t ran_round = -1;
  int32_t ran_as = -1;
  bool ran_ok = false;
  bool operator==(const Join&) const = default;
};

/// The coordinator accepted the join.
struct JoinAck {
  int32_t nnodes = 0;
  /// The job has spares: a joined agent may wait for a round as long as the job runs (it is a
  /// spare, or its node rank went to one), so it keeps no rendezvous backstop of its own.
  bool standby = false;
  bool operator==(const JoinAck&) const = default;
};

/// The coordinator refused the join; the agent prints `reason` and exits 3.
struct Reject {
  std::string reason;
  bool retry = false;  // the agent may try again (until its rendezvous timeout)
  bool operator==(const Reject&) const = default;
};

/// Rendezvous progress, sent to joined agents while some are missing.
struct Progress {
  int32_t joined = 0;
  int32_t total = 0;
  /// The agents expected for the missing node ranks, as they were started (node K, or spare
  /// K - nnodes: a spare that holds a rank), at most kMaxListItems.
  std::vector<int32_t> missing;
  int64_t elapsed_ms = 0;
  int64_t timeout_ms = 0;
  /// Each missing agent's host: the agents name it, not entry K of cluster.nodes (issue 37).
  /// "" where none is known.
  std::vector<std::string> missing_hosts;
  /// Why each missing agent was refused ("it runs a different job file"); "" where
  /// it was not: an agent refused for good does not come by itself (issue 40).
  std::vector<std::string> missing_why;
  bool operator==(const Progress&) const = default;
};

/// Round `round` starts: spawn the workers. `master_port` is what worker rank 0's store uses.
struct StartRound {
  int32_t round = 0;
  uint16_t master_port = 0;
  /// timeouts.progress = "auto": the longest interval between two beacons of one rank seen
  /// so far in the job (0: none learnt yet), so that a new agent starts from the job's.
  int64_t longest_interval_ms = 0;
  /// The node rank the receiving agent takes in this round: for a spare, that of the node it
  /// replaces; -1: its own.
  int32_t node_rank = -1;
  /// How many nodes the round runs with: fewer than cluster.nnodes when it shrank
  /// (cluster.min_nodes); 0: cluster.nnodes.
  int32_t nnodes = 0;
  /// MASTER_ADDR of the round: the host of its rank 0 (rendezvous.backend = "etcd": wherever
  /// the coordinator runs); "": cluster.master_addr.
  std::string master_addr = "";
  bool operator==(const StartRound&) const = default;
};

/// A worker of `round` ended badly (or was lost). `signal` > 0 when killed by a signal.
struct WorkerFailed {
  int32_t round = 0;
  int32_t global_rank = 0;
  int32_t local_rank = 0;
  int32_t exit_code = 0;
  int32_t signal = 0;
  std::string stderr_tail;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE contents, "" when none was written
  bool operator==(const WorkerFailed&) const = default;
};

/// Every worker of `round` on the sender's node exited 0.
struct NodeDone {
  int32_t round = 0;
  bool operator==(const NodeDone&) const = default;
};

/// Stop every worker of `round`. `cause` is the job-wide root-cause summary.
struct StopRound {
  int32_t round = 0;
  std::string cause;
  /// No restart will follow (the budget is spent): the job's summary repeats the cause with
  /// its traceback, so the agent logs only its first line.
  bool last = false;
  /// The root cause's global rank; -1 when it is not one rank's failure (a lost node, a
  /// stall). Agents show the other ranks' consequence errors as one line (agent.cc).
  int32_t cause_rank = -1;
  /// The cause's own error says only that it lost a peer: the first failure heard, not yet
  /// known to be the root cause (the coordinator may name another rank in a second StopRound).
  bool cause_lost_peer = false;
  bool operator==(const StopRound&) const = default;
};

/// The sender's workers of `round` have all exited; `stopped` of them were stopped by ddprun.
struct RoundStopped {
  int32_t round = 0;
  int32_t stopped = 0;
  bool operator==(const RoundStopped&) const = default;
};

/// An agent was interrupted (SIGINT/SIGTERM): end the job everywhere with 128+signal.
struct Interrupted {
  int32_t signal = 0;
  bool operator==(const Interrupted&) const = default;
};

/// The job is over: every agent prints `summary` and exits `exit_code`.
struct JobEnd {
  int32_t exit_code = 0;
  std::string summary;
  bool operator==(const JobEnd&) const = default;
};

/// The agent got JobEnd and is about to exit: the coordinator's exit barrier.
struct JobEndAck {
  bool operator==(const JobEndAck&) const = default;
};

/// Liveness, both ways.
struct Heartbeat {
  /// Non-zero from an agent that has just run again after a stall of its own: the coordinator
  /// sends it back, and words after that answer are newer than the stall.
  uint64_t echo = 0;
  bool operator==(const Heartbeat&) const = default;
};

/// A coordinator with a shared secret asks each new connection to prove it knows it.
struct Challenge {
  std::string nonce;
  std::string proof;  // CoordinatorProof over the agent's nonce; "" when the agent sent none
  bool operator==(const Challenge&) const = default;
};

/// A rank of the sender's node sent no progress beacon within its timeout.
struct RankHung {
  int32_t round = 0;
  int32_t global_rank = 0;
  int32_t local_rank = 0;
  int64_t step = -1;        // its last step; -1 none
  int64_t silent_ms = 0;    // since its last beacon, or since it started
  int64_t timeout_ms = 0;   // the timeout it went past
  bool first_beat = false;  // no step yet (or a phase): timeouts.progress_start applied
  /// timeouts.progress = "auto" and the timeout was learnt from this job's beacons (without
  /// it, nothing was learnt yet and timeouts.progress_start applied).
  bool learnt = false;
  bool operator==(const RankHung&) const = default;
};

/// Before a hung round is stopped: every node asks its ranks for their stacks.
struct DumpStacks {
  int32_t round = 0;
  bool operator==(const DumpStacks&) const = default;
};

/// The stacks came back and no rank has been silent for its timeout any more (the one reported
/// progressed again): no verdict, the round goes on, and the agents watch their ranks again.
struct HangCleared {
  int32_t round = 0;
  bool operator==(const HangCleared&) const = default;
};

/// One rank when its stack was asked for.
struct RankState {
  int32_t global_rank = 0;
  int64_t step = -1;      // last step; -1 none
  int64_t silent_ms = 0;  // since its last beacon (or its start)
  std::string stack;      // its main thread's frames (core::FormatFrames); "" none
  bool operator==(const RankState&) const = default;
};

/// The answer to DumpStacks: every rank of the sender's node.
struct RankStacks {
  int32_t round = 0;
  std::vector<RankState> ranks;
  bool operator==(const RankStacks&) const = default;
};

/// One rank's progress over the last straggler window.
struct RankRate {
  int32_t global_rank = 0;
  int64_t step = -1;
  int64_t work_us = -1;    // its own work per step (from the beacons' busy time); -1 none
  int64_t step_us = -1;    // time per step; -1 when the window is not full yet
  int64_t longest_ms = 0;  // longest interval between two beacons, once warmed up; 0 none
  bool operator==(const RankRate&) const = default;
};

/// Periodic progress of the sender's ranks, for stragglers and the learnt timeout.
struct RankProgress {
  int32_t round = 0;
  std::vector<RankRate> ranks;
  bool operator==(const RankProgress&) const = default;
};

/// A node to probe: its node rank, host and probe endpoint ("addr:port").
struct ProbeTarget {
  int32_t node_rank = 0;
  std::string host;
  std::string endpoint;
  bool operator==(const ProbeTarget&) const = default;
};

/// Before the first round: connect to each of these and say which could not be reached.
struct ProbePeers {
  std::vector<ProbeTarget> targets;  // at most kMaxListItems
  bool operator==(const ProbePeers&) const = default;
};

/// One target the sender could not reach, and how the connect failed ("timed out", ...).
struct ProbeFailure {
  ProbeTarget target;
  std::string error;
  bool operator==(const ProbeFailure&) const = default;
};

/// The answer to ProbePeers; no failures: every target was reached.
struct PeersProbed {
  std::vector<ProbeFailure> failures;
  bool operator==(const PeersProbed&) const = default;
};

using Message = std::variant<Join, JoinAck, Reject, Progress, StartRound, WorkerFailed, NodeDone, StopRound,
                             RoundStopped, Interrupted, JobEnd, JobEndAck, Heartbeat, Challenge, RankHung,
                             DumpStacks, RankStacks, RankProgress, ProbePeers, PeersProbed, HangCleared>;

/// A short name for logs and traces ("join", "start-round", ...).
const char* MessageName(const Message& message);

/// Appends one frame holding `message` to `out`.
void Encode(const Message& message, std::vector<uint8_t>& out);
std::vector<uint8_t> Encode(const Message& message);

/// Incremental, total frame decoder for one connection.
class Decoder {
 public:
  enum class Status { kMessage, kNeedMore, kError };

  /// Appends received bytes. Never fails; the buffer is bounded by one frame.
  void Feed(std::span<const uint8_t> bytes);

  /// Decodes the next message into `out`. After kError the decoder stays in error and
  /// `error()` says why; the connection must be dropped.
  Status Next(Message& out);

  const std::string& error() const { return error_; }
  /// True when the first bytes seen are not a ddprun frame (used to tell store clients apart).
  bool LooksForeign() const;
  /// The largest payload a frame may announce from now on (at most kMaxPayload): a peer that
  /// has proved nothing yet gets a smaller one than a joined agent (NodeHost).
  void SetFrameLimit(uint32_t limit) { limit_ = limit < kMaxPayload ? limit : kMaxPayload; }
  /// Bytes received and not yet decoded: what this connection costs in memory now.
  size_t buffered() const { return buffer_.size() - offset_; }

 private:
  std::vector<uint8_t> buffer_;
  size_t offset_ = 0;
  uint32_t limit_ = kMaxPayload;
  std::string error_;
};

}  // namespace ddprun::wire
