#pragma once
// rendezvous.backend = "etcd": who holds the coordinator role, and the job's state, in the
// job's store (host::Store). Every agent looks the holder up when it needs a coordinator; when
// there is none it campaigns (a lease, and a put that only succeeds on an absent key); the
// holder renews its lease, steps down before the lease can end, and writes the job's state only
// while it still holds the role (every write compares the role key's create revision: fencing).
// Deterministic and free of I/O: the same code runs under the real driver and the simulator.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runner/core/coordinator.h"
#include "runner/host/job_record.h"
#include "runner/host/ports.h"
#include "schema/job_spec.h"

namespace ddprun::host {

/// The job's record as the store keeps it under <prefix>/<job>/state: one field per
/// line. ParseJobRecord gives nullopt for a text this version did not write.
std::string FormatJobRecord(const core::JobRecord& record);
std::optional<core::JobRecord> ParseJobRecord(const std::string& text);

/// Also the job's record keeper with etcd (JobRecordKeeper): its writes are fenced by the role.
class Election final : public JobRecordKeeper {
 public:
  /// What the election tells its host; each is called from a Store answer or a Tick.
  struct Listener {
    /// A lookup found the coordinator at "host:port".
    std::function<void(const std::string& endpoint)> found;
    /// A lookup could not be answered (etcd unreachable, or the campaign failed): why.
    std::function<void(const std::string& why)> lookup_failed;
    /// This agent holds the role now; `state` is what the previous holder left (nullopt: none,
    /// or a job that was done).
    std::function<void(const std::optional<core::JobRecord>& state)> lead;
    /// This agent no longer holds the role (its lease may have ended, or another holds it).
    std::function<void(const std::string& why)> step_down;
    /// CommitRound(round) is in the store.
    std::function<void(int round)> committed;
    /// RecordEnd's verdict is in the store.
    std::function<void()> end_recorded;
    /// Every write is in the store (or can no longer be made), or Resign's revoke was answered.
    std::function<void()> flushed;
  };

  /// `agent` is this agent's index (nodes, then spares); `endpoint` where its coordinator would
  /// listen ("host:port"); `fingerprint` the job file's (FingerprintOf), written into the
  /// job's record. The keys are the job name's, not the file's: an agent with another file
  /// finds the same coordinator and is refused when it joins.
  Election(const JobSpec& spec, std::string fingerprint, int agent, std::string endpoint, Store& store,
           Listener listener);

  /// The agent wants its coordinator: answered by `found` or `lookup_failed` (at once when
  /// this agent holds the role).
  void Lookup(TimePoint now);
  bool leading() const { return phase_ == Phase::kLeading; }
  /// The job's state as this holder last wrote it (or read it when it took over).
  const core::JobRecord& state() const { return state_; }
  const std::string& endpoint() const { return endpoint_; }

  /// This agent was admitted to the job: a record that says the job is over is then its
  /// job's verdict (it was away when it was told), not an earlier launch to start afresh from.
  void TookPart() { took_part_ = true; }

  /// Lets the role go without a step_down (the job is over here, or this agent cannot serve
  /// it): the lease is revoked, so the next holder need not wait for it to end. A lookup
  /// waiting for its answer fails.
  void Resign(TimePoint now);

  /// While leading: the job as the previous holder left it (nullopt: a fresh start), an
  /// earlier run whose workers may still run, and the quarantine.
  Inheritance Inherited() override;
  // The coordinator's records, while leading: each rewrites the state, fenced. Commit and
  // RecordEnd are answered through the listener (committed, end_recorded), never at once.
  bool Commit(TimePoint now, const core::CommitRound& round) override;
  /// Only "every worker is confirmed stopped" is written: the lease renews the rest.
  void RecordWorkers(TimePoint now, bool may_run) override;
  void RecordRestart(TimePoint now, int next_round, int restarts_used, bool workers_may_run) override;
  bool RecordEnd(TimePoint now, int exit_code, const std::string& summary) override;
  void RecordQuarantine(TimePoint now, const std::vector<core::QuarantinedHost>& hosts) override;
  /// The job is over here (every agent heard the end, or the exit barrier passed): the next
  /// launch of the job file starts afresh.
  void RecordDone(TimePoint now) override;
  /// Leading afresh after an earlier run that may still have workers: a launch that ended
  /// without confirming that its workers stopped, or a run of another job file under the same
  /// job name that had not ended. The first round must wait for their lease; `earlier_run()`
  /// names that run for the log.
  bool earlier_workers_may_run() const { return earlier_workers_may_run_; }
  const std::string& earlier_run() const { return earlier_run_; }
  /// Writes are waiting or in flight.
  bool Writing() const { return leading() && (dirty_ || write_id_ != 0); }
  /// Resign's revoke is not answered yet (the store answers within its bound): an agent that
  /// exits waits for it, so that the role's key goes with it.
  bool Revoking() const { return revoke_id_ != 0; }

  void OnStoreResult(TimePoint now, const StoreResult& result);
  void OnTick(TimePoint now);
  std::optional<TimePoint> NextDeadline() const;

  /// The key names, for tests and the docs: <prefix>/<job>/coordinator and /state.
  const std::string& role_key() const { return role_key_; }
  const std::string& state_key() const { return state_key_; }
  /// When a holder steps down at the latest: this long before its lease can end in etcd.
  static Duration StepDownMargin(Duration lease);

 private:
  enum class Phase { kIdle, kLooking, kGranting, kCampaigning, kReading, kLeading };

  void Campaign(TimePoint now);
  void StepDown(TimePoint now, const std::string& why);
  void MaybeWrite(TimePoint now);
  void Fail(const std::string& why);

  const JobSpec& spec_;
  std::string fingerprint_;
  int agent_;
  std::string endpoint_;
  std::string value_;  // what this agent writes under the role key
  std::string role_key_;
  std::string state_key_;
  Store& store_;
  Listener listener_;
  Phase phase_ = Phase::kIdle;
  uint64_t pending_ = 0;          // the id of the lookup/campaign request in flight
  bool wanted_ = false;           // a Lookup waits for its answer
  int64_t lease_ = 0;
  int64_t role_revision_ = 0;     // the role key's create revision while leading
  uint64_t keepalive_id_ = 0;
  TimePoint keepalive_sent_{};
  TimePoint next_keepalive_{};
  TimePoint valid_until_{};       // our lease certainly lives until then (from the send times)
  core::JobRecord state_;
  bool dirty_ = false;
  uint64_t write_id_ = 0;
  std::optional<int> commit_round_;   // a CommitRound not yet answered
  std::optional<int> written_commit_; // the commit the write in flight carries
  bool end_unacked_ = false;          // RecordEnd not yet in the store
  bool written_end_ = false;          // the write in flight carries it
  std::optional<TimePoint> retry_write_at_;
  bool earlier_workers_may_run_ = false;
  std::string earlier_run_;
  std::optional<core::JobRecord> inherited_job_;  // what kReading passed to `lead`
  bool took_part_ = false;
  uint64_t revoke_id_ = 0;
};

}  // namespace ddprun::host
