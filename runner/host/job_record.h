#pragma once
// The job's record: what the coordinator writes so that whoever coordinates next (the same
// host after a reboot, or another agent that takes the role over) knows whether workers of the
// job may still run and where the job stands. The coordinator records the same way whatever
// keeps it (core::CommitRound, RecordWorkers, RecordRestart, RecordEnd, RecordQuarantine, and
// CoordinatorDone); NodeHost hands each to its keeper:
//   - JournalRecord: node 0's journal file (host::Journal). A local write: it answers at once.
//   - ElectedRole (runner/host/coordinator_role.h): the job's keys in etcd, written only while
//     this agent holds the coordinator role (core::Election). Commit and RecordEnd are answered
//     later, through the role's listener, or never if the role was lost.

#include <optional>
#include <string>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/time.h"

namespace ddprun::host {

class Journal;

/// What earlier coordinators of the job left in its record, as a new one reads it before its
/// first input (NodeHost applies it to the core::Coordinator).
struct Inheritance {
  /// Workers of an earlier run may still run: its last record that they may is this old
  /// (core::Coordinator::AfterUncleanEnd), and `earlier` names that run for the log.
  std::optional<Duration> workers_may_run_since;
  std::string earlier;
  /// A job to go on with (core::Coordinator::TakeOver): etcd, after another holder.
  std::optional<core::JobRecord> job;
  std::vector<core::QuarantinedHost> quarantined;
};

class JobRecordKeeper {
 public:
  virtual ~JobRecordKeeper() = default;
  /// What the record held when this keeper began to coordinate (the journal: when the agent
  /// started; etcd: when it took the role).
  virtual Inheritance Inherited() = 0;
  /// Round `round` may start (core::CommitRound). True: recorded now, the coordinator may go
  /// on; false: the answer comes later (core::RoundCommitted) or never.
  virtual bool Commit(TimePoint now, const core::CommitRound& round) = 0;
  /// Workers may run (renewed every heartbeat), or every one is confirmed stopped.
  virtual void RecordWorkers(TimePoint now, bool may_run) = 0;
  virtual void RecordRestart(TimePoint now, int next_round, int restarts_used, bool workers_may_run) = 0;
  /// The verdict (core::RecordEnd). True: recorded now; false: core::EndRecorded comes later.
  virtual bool RecordEnd(TimePoint now, int exit_code, const std::string& summary) = 0;
  virtual void RecordQuarantine(TimePoint now, const std::vector<core::QuarantinedHost>& hosts) = 0;
  /// Every agent heard the end, or the exit barrier passed: the next launch starts afresh.
  virtual void RecordDone(TimePoint now) = 0;
};

/// Node 0's journal as the job's record (rendezvous.backend = "static"). It keeps what a
/// coordinator started again on the same host needs: whether workers may run and since when,
/// and the quarantine; the round numbers, the budget and the verdict live only in the
/// coordinator's process. `journal` may be null (a host without one: unit tests).
class JournalRecord final : public JobRecordKeeper {
 public:
  explicit JournalRecord(Journal* journal) : journal_(journal) {}
  Inheritance Inherited() override;
  bool Commit(TimePoint now, const core::CommitRound& round) override;
  void RecordWorkers(TimePoint now, bool may_run) override;
  void RecordRestart(TimePoint, int, int, bool) override {}
  bool RecordEnd(TimePoint, int, const std::string&) override { return true; }
  void RecordQuarantine(TimePoint now, const std::vector<core::QuarantinedHost>& hosts) override;
  void RecordDone(TimePoint) override {}

 private:
  Journal* journal_;
};

}  // namespace ddprun::host
