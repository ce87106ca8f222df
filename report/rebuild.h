#pragma once
// A real run's Timeline, rebuilt from its event log (docs/report.md): one row per node rank
// (then the spares), the phases each agent went through, faults and failures marked, and the
// job-wide training spans; the same structure the simulator records, so `ddprun report` draws
// the simulator's page and trace.

#include <cstdint>
#include <string>
#include <vector>

#include "report/event_log.h"
#include "report/timeline.h"

namespace ddprun::report {

struct RebuiltRun {
  Timeline timeline;
  /// The text below the page's timeline: the job's result as node 0 said it, then what was read.
  std::string summary;
  /// What a reader should know about the records (a truncated file, a torn line, a node
  /// without a file); one sentence each.
  std::vector<std::string> notes;
  int exit_code = -1;  // the job's, when a record says it; -1 unknown
  int rounds = 0;      // rounds begun
  int restarts = 0;    // restarts used
};

/// "2026-12-03 08:15:00 UTC" for a wall-clock time in milliseconds since the epoch.
std::string FormatUtc(int64_t unix_ms);

/// Times come from each file's monotonic clock, placed on the wall clock by the file's first
/// record, so that a clock step during the run does not bend a node's row; rows of different
/// hosts are aligned as well as their wall clocks agree.
RebuiltRun RebuildTimeline(const Run& run);

}  // namespace ddprun::report
