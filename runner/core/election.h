#pragma once
// rendezvous.backend = "etcd": who holds the coordinator role, and the job's record, in the
// job's store. Every agent looks the holder up when it needs a coordinator; when there is none
// it campaigns (a lease, and a put that only succeeds on an absent key); the holder renews its
// lease, steps down before the lease can end, and writes the job's record only while it still
// holds the role (every write compares the role key's create revision: fencing).
//
// Sans-IO like the agent and the coordinator: Handle(now, input, effects) and NextDeadline().
// It asks the store through effects tagged with its own numbers, and the host feeds each answer
// back with its tag (host::ElectedRole runs it against host::Store, the real etcd client or the
// simulator's model).
//
// A notification the host may answer at once with another input (Lead, Committed, EndWritten)
// is the last effect of its batch but for a Continue: the host feeds Resume{step} once it has
// carried the notification out, and the machine goes on from the state that left. That keeps
// the order the host and the store see the same as a direct call would give it.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/time.h"
#include "schema/job_spec.h"

namespace ddprun::core {

namespace election {

// ---- Inputs ----------------------------------------------------------------------------
/// The agent wants its coordinator: answered by Found or LookupFailed.
struct Lookup {};
/// Let the role go without a SteppedDown (the job is over here, or this agent cannot serve it):
/// the lease is revoked, so the next holder need not wait for it to end.
struct Resign {};
/// This agent was admitted to the job: a record that says the job is over is then its job's
/// verdict (it was away when it was told), not an earlier launch to start afresh from.
struct TookPart {};
/// What the store keeps under one key.
struct Entry {
  std::string value = {};
  int64_t create_revision = 0;
  int64_t lease = 0;
};
/// The store's answer to the effect tagged `tag`. `error` is empty when the store answered;
/// otherwise why it could not, in words for the user.
struct Answer {
  uint64_t tag = 0;
  std::string error = {};
  bool succeeded = false;           // PutIf: the compare held and the put was made
  int64_t lease = 0;                // Grant: the new lease
  Duration ttl{};                   // Grant, KeepAlive: the lease's time left; 0: it is gone
  std::optional<Entry> entry = {};  // Get, and a PutIf whose compare failed: the key's entry
  int64_t revision = 0;             // the store's revision when it answered
};
/// Where a batch paused for the host (Continue): after which notification to go on.
enum class Step { kAfterLead, kAfterCommit, kAfterEnd };
struct Resume {
  Step step;
};
/// The record of the job the coordinator keeps (its record effects, fed as they come) and
/// "the job is over here": CoordinatorDone.
using Input = std::variant<Lookup, Resign, TookPart, Answer, Tick, Resume, CommitRound, RecordWorkers,
                           RecordRestart, RecordEnd, RecordQuarantine, CoordinatorDone>;

// ---- Effects: calls of the store (tag 0: the answer is not wanted) ---------------------
struct Get {
  uint64_t tag = 0;
  std::string key;
};
struct Grant {
  uint64_t tag = 0;
  Duration ttl{};
};
/// One transaction: if `compare_key`'s create revision is `create_revision` (0: absent), put
/// `key` = `value` (attached to `lease`, 0: none).
struct PutIf {
  uint64_t tag = 0;
  std::string compare_key;
  int64_t create_revision = 0;
  std::string key;
  std::string value;
  int64_t lease = 0;
};
struct KeepAlive {
  uint64_t tag = 0;
  int64_t lease = 0;
};
struct Revoke {
  uint64_t tag = 0;
  int64_t lease = 0;
};
// ---- Effects: what the host learns -----------------------------------------------------
/// The coordinator is at "host:port".
struct Found {
  std::string endpoint;
};
/// A lookup could not be answered (the store unreachable, or the campaign failed).
struct LookupFailed {
  std::string why;
};
/// This agent holds the role now: Inherited() says what the previous holder left.
struct Lead {};
/// This agent no longer holds the role (its lease may have ended, or another holds it).
struct SteppedDown {
  std::string why;
};
/// CommitRound(round) is in the store.
struct Committed {
  int round = 0;
};
/// RecordEnd's verdict is in the store.
struct EndWritten {};
/// Every write is in the store (or can no longer be made), or Resign's revoke was answered.
struct Flushed {};
/// Feed Resume{step} once the notification before this is carried out.
struct Continue {
  Step step;
};
using Effect = std::variant<Get, Grant, PutIf, KeepAlive, Revoke, Found, LookupFailed, Lead, SteppedDown,
                            Committed, EndWritten, Flushed, Continue>;

}  // namespace election

/// The job's record as the store keeps it under <prefix>/<job>/state: one field per line.
/// ParseJobRecord gives nullopt for a text this version did not write.
std::string FormatJobRecord(const JobRecord& record);
std::optional<JobRecord> ParseJobRecord(const std::string& text);

namespace test {
/// The death tests' door to each machine's transition function (tests/core/edges_test.cc):
/// an edge no input can take must still be seen to stop the process.
struct Edges;
}  // namespace test

class Election {
 public:
  /// `agent` is this agent's index (nodes, then spares); `endpoint` where its coordinator would
  /// listen ("host:port"); `fingerprint` the job file's (FingerprintOf), written into the job's
  /// record. The keys are the job name's, not the file's: an agent with another file finds the
  /// same coordinator and is refused when it joins.
  Election(const JobSpec& spec, std::string fingerprint, int agent, std::string endpoint);

  /// Feeds one input; appends the effects to `out`. Deadlines are acted on at a Tick only: an
  /// answer that arrives late is judged as it is (a renewal may still save the role).
  void Handle(TimePoint now, const election::Input& input, std::vector<election::Effect>& out);
  std::optional<TimePoint> NextDeadline() const;

  bool leading() const { return std::holds_alternative<Leading>(state_); }
  /// The job's record as this holder last wrote it (or read it when it took over).
  const JobRecord& record() const { return record_; }
  const std::string& endpoint() const { return endpoint_; }
  /// While leading: the job as the previous holder left it (nullopt: a fresh start).
  const std::optional<JobRecord>& inherited_job() const { return inherited_job_; }
  /// Leading afresh after an earlier run that may still have workers: a launch that ended
  /// without confirming that its workers stopped, or a run of another job file under the same
  /// job name that had not ended. `earlier_run()` names that run for the log.
  bool earlier_workers_may_run() const { return earlier_workers_may_run_; }
  const std::string& earlier_run() const { return earlier_run_; }
  /// Writes are waiting or in flight.
  bool Writing() const;
  /// Nothing under way but waiting for its own deadlines (NextDeadline): it took part, and no
  /// lookup waits and no store call is in flight or due to be retried. A simulator's quiet
  /// stretch may then pass up to NextDeadline without feeding it (its Ticks before it act on
  /// nothing).
  bool Quiet() const;
  /// The time of the latest input (nullopt before the first): a Resume comes no earlier, for
  /// the host took inputs at later times while it carried the notification out.
  std::optional<TimePoint> last_input() const { return last_input_; }
  /// TookPart was fed (once is enough: the host need not feed it again).
  bool took_part() const { return took_part_; }
  /// Resign's revoke is not answered yet.
  bool Revoking() const { return revoke_tag_ != 0; }

  /// The key names: <prefix>/<job>/coordinator and /state.
  const std::string& role_key() const { return role_key_; }
  const std::string& state_key() const { return state_key_; }
  /// When a holder steps down at the latest: this long before its lease can end in the store.
  static Duration StepDownMargin(Duration lease);

 private:
  friend struct test::Edges;
  // The phases, each with what it alone needs. `sent` is when the lease was asked for (Grant):
  // the lease certainly lives until sent + its TTL.
  struct Idle {};
  struct Looking {
    uint64_t tag = 0;
  };
  struct Granting {
    uint64_t tag = 0;
    TimePoint sent;
  };
  struct Campaigning {
    uint64_t tag = 0;
    TimePoint sent;
    int64_t lease = 0;
    TimePoint valid_until;
  };
  struct Reading {
    uint64_t tag = 0;
    TimePoint sent;
    int64_t lease = 0;
    TimePoint valid_until;
    int64_t role_revision = 0;  // the role key's create revision: every write compares it
  };
  struct Leading {
    int64_t lease = 0;
    TimePoint valid_until;  // the lease certainly lives until then (from the send times)
    int64_t role_revision = 0;
    uint64_t keepalive_tag = 0;
    TimePoint keepalive_sent;
    TimePoint next_keepalive;
    bool dirty = false;                 // the record changed since the last write
    uint64_t write_tag = 0;             // the write in flight
    std::optional<int> commit_round;    // a CommitRound not yet answered
    std::optional<int> written_commit;  // the commit the write in flight carries
    bool end_unacked = false;           // RecordEnd not yet in the store
    bool written_end = false;           // the write in flight carries it
    std::optional<TimePoint> retry_write_at;
  };
  using State = std::variant<Idle, Looking, Granting, Campaigning, Reading, Leading>;

  /// The deadlines (while leading): NextDeadline is the earliest, Tick acts on those due in
  /// this order.
  enum class Deadline { kStepDown, kKeepAlive, kRetryWrite, kCount };
  std::optional<TimePoint> DeadlineOf(Deadline deadline) const;

  uint64_t NewTag() { return next_tag_++; }
  /// The edges, asserted: Idle -> Looking -> Granting -> Campaigning -> Reading -> Leading,
  /// a lookup that finds a holder back to Idle, and any phase back to Idle.
  void Enter(State next);

  void OnLookup(std::vector<election::Effect>& out);
  void OnAnswer(TimePoint now, const election::Answer& answer, std::vector<election::Effect>& out);
  void OnLookingAnswer(TimePoint now, const election::Answer& answer, std::vector<election::Effect>& out);
  void OnGrantAnswer(const election::Answer& answer, std::vector<election::Effect>& out);
  void OnCampaignAnswer(const election::Answer& answer, std::vector<election::Effect>& out);
  void OnRecordRead(const election::Answer& answer, std::vector<election::Effect>& out);
  void OnKeepAliveAnswer(TimePoint now, const election::Answer& answer, std::vector<election::Effect>& out);
  void OnWriteAnswer(TimePoint now, const election::Answer& answer, std::vector<election::Effect>& out);
  void OnResume(TimePoint now, election::Step step, std::vector<election::Effect>& out);
  void OnTick(TimePoint now, std::vector<election::Effect>& out);
  /// The record changed: written when no write is in flight (while leading).
  void Changed(TimePoint now, std::vector<election::Effect>& out);
  /// What the previous holder's record means for this one (kReading's answer).
  std::optional<JobRecord> Adopt(std::optional<JobRecord> previous);

  /// The holder found, or a campaign lost to one: answers the lookup that waits.
  void FoundHolder(const std::string& role_value, const std::string& missing,
                   std::vector<election::Effect>& out);
  void Campaign(TimePoint now, std::vector<election::Effect>& out);
  void StepDown(const std::string& why, std::vector<election::Effect>& out);
  void LetGo(std::vector<election::Effect>& out);
  void MaybeWrite(TimePoint now, std::vector<election::Effect>& out);
  void Fail(const std::string& why, std::vector<election::Effect>& out);
  std::string LeaseEnding() const;

  const JobSpec& spec_;
  std::string fingerprint_;
  int agent_;
  std::string endpoint_;
  std::string value_;  // what this agent writes under the role key
  std::string role_key_;
  std::string state_key_;
  State state_;
  uint64_t next_tag_ = 1;
  std::optional<TimePoint> last_input_;
  bool wanted_ = false;      // a Lookup waits for its answer
  uint64_t revoke_tag_ = 0;  // Resign's revoke, until answered
  JobRecord record_;
  bool earlier_workers_may_run_ = false;
  std::string earlier_run_;
  std::optional<JobRecord> inherited_job_;  // what the read before Lead found to go on with
  bool took_part_ = false;
};

}  // namespace ddprun::core
