#pragma once
// `ddprun --simulate job.toml --sweep key=v1,v2 [--sweep key=...] --seeds N`: the grid of
// settings, each run over the same N seeds with only the job's own faults and failure rates,
// summarised per setting (goodput, finished runs, restarts, time lost) as a table and a chart
// (SVG, or a self-contained HTML page around it). For planning: how many spares, how often to
// checkpoint, which timeouts (docs/simulator.md, "Planning with --sweep").

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "sim/job_overrides.h"
#include "sim/simulation.h"

namespace ddprun::sim {

/// One --sweep: a key and the values it takes.
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
};

/// `key=v1,v2,...` (a bare key that names one section's key is resolved: "spares").
Result<SweepAxis> ParseSweepFlag(std::string_view text);

/// What the seeds of one setting gave.
struct SweepRow {
  std::vector<std::string> values;  // one per axis, in the axes' order
  int runs = 0;
  int finished = 0;  // exit 0
  std::map<int, int> exit_codes;
  int violations = 0;       // runs that broke an invariant (exit 70)
  double goodput_mean = 0;  // useful training / wall time, as each run's summary has it
  double goodput_p10 = 0;
  double goodput_median = 0;
  double goodput_p90 = 0;
  double restarts_mean = 0;
  int64_t lost_mean_ns = 0;      // work since the last checkpoint, lost on failures
  int64_t downtime_mean_ns = 0;  // wall time without training (rendezvous, start-up, backoff)
  double kept_mean = 0;          // training kept at the end over simulate.train_time
};

struct SweepResult {
  std::string job_path;
  std::vector<std::string> keys;
  std::vector<std::string> fixed;  // --set changes every setting has ("key=value")
  uint64_t first_seed = 1;
  int seeds = 0;
  std::vector<SweepRow> rows;
  int violations = 0;
};

/// Runs every setting of the grid (the first axis varies slowest) over seeds first_seed ..
/// first_seed + seeds - 1. `fixed` (--set) applies to every setting. A setting the loader
/// refuses is an error with its diagnostics.
Result<SweepResult> RunSweep(std::string_view job_text, const std::string& job_path,
                             const std::vector<JobOverride>& fixed, const std::vector<SweepAxis>& axes,
                             uint64_t first_seed, int seeds);

/// The table, one row per setting (Markdown: readable in a terminal, pastes into docs).
std::string FormatSweepTable(const SweepResult& sweep);

/// The chart: per setting, mean goodput (a bar on an axis from 0, else a dot), p10-p90 as a
/// whisker, the median as a tick.
std::string SweepChartSvg(const SweepResult& sweep);

/// A self-contained page: the chart and the table, no scripts, nothing fetched.
std::string SweepChartHtml(const SweepResult& sweep);

}  // namespace ddprun::sim
