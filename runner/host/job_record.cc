#include "runner/host/job_record.h"

#include "runner/host/ports.h"

namespace ddprun::host {

Inheritance JournalRecord::Inherited() {
  Inheritance from;
  if (!journal_) return from;
  from.workers_may_run_since = journal_->SinceRoundsMayRun();
  from.earlier = "the previous coordinator of this job on this host";
  from.quarantined = journal_->Quarantined();
  return from;
}

bool JournalRecord::Commit(TimePoint now, const core::CommitRound& /*round*/) {
  // The round's workers may run from now on; the journal says so before any of them starts.
  RecordWorkers(now, true);
  return true;
}

void JournalRecord::RecordWorkers(TimePoint /*now*/, bool may_run) {
  if (journal_) journal_->Record(may_run);
}

void JournalRecord::RecordQuarantine(TimePoint /*now*/, const std::vector<core::QuarantinedHost>& hosts) {
  if (journal_) journal_->RecordQuarantine(hosts);
}

}  // namespace ddprun::host
