#pragma once
// The job's record: what the coordinator writes so that whoever coordinates next (the same
// host after a reboot, or another agent that takes the role over) knows whether workers of the
// job may still run and where the job stands. The coordinator records the same way whatever
// keeps it (core::CommitRound, RecordWorkers, RecordRestart, RecordEnd, RecordQuarantine, and
// CoordinatorDone); NodeHost hands each to its keeper:
//   - JournalRecord: node 0's journal file (host::Journal). A local write: it answers at once.
//   - Election (runner/host/election.h): the job's keys in etcd, written only while this agent
//     holds the coordinator role. Commit and RecordEnd are answered later, through the
//     election's listener, or never if the role was lost.

#include <string>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/time.h"

namespace ddprun::host {

class Journal;

class JobRecordKeeper {
 public:
  virtual ~JobRecordKeeper() = default;
  /// Round `round` may start (core::CommitRound). True: recorded now, the coordinator may go
  /// on; false: the answer comes later (core::RoundCommitted) or never.
  virtual bool Commit(TimePoint now, int round, int restarts_used) = 0;
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
  bool Commit(TimePoint now, int round, int restarts_used) override;
  void RecordWorkers(TimePoint now, bool may_run) override;
  void RecordRestart(TimePoint, int, int, bool) override {}
  bool RecordEnd(TimePoint, int, const std::string&) override { return true; }
  void RecordQuarantine(TimePoint now, const std::vector<core::QuarantinedHost>& hosts) override;
  void RecordDone(TimePoint) override {}

 private:
  Journal* journal_;
};

}  // namespace ddprun::host
