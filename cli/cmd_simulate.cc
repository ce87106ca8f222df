// `ddprun --simulate job.toml`: the whole cluster of a job file, with faults, in virtual time.
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <variant>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/event_files.h"
#include "report/render.h"
#include "report/replay.h"
#include "runner/host/ports.h"
#include "schema/canonical.h"
#include "schema/diagnostics.h"
#include "schema/loader.h"
#include "sim/job_overrides.h"
#include "sim/simulation.h"
#include "sim/swarm.h"
#include "sim/sweep.h"

namespace ddprun::cli {
namespace {

// The simulator's own bound on --nodes: far beyond any job file (the loader allows 10,000
// nodes), enough for scale rehearsals.
constexpr int kMaxSimulatedNodes = 65'536;

bool WriteFile(const std::string& path, const std::string& what,
               const std::function<void(std::ostream&)>& write) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    fmt::print(stderr, "ddprun simulate: cannot write the {} to {}\n", what, path);
    return false;
  }
  write(file);
  file.close();
  if (!file) {
    fmt::print(stderr, "ddprun simulate: writing the {} to {} failed\n", what, path);
    return false;
  }
  fmt::print(stderr, "ddprun simulate: wrote the {} to {}\n", what, path);
  return true;
}

// Node 0's events in the simulation, with the coordinator's records of the other nodes (with
// etcd the role moves), kept as a real node's file would hold them (virtual time for both
// clocks), for RoundSequence.
class RecordedEvents final : public host::EventLog {
 public:
  void Record(TimePoint now, const host::Event& event) override {
    report::EventRecord record;
    record.line = static_cast<int>(records_.size()) + 1;
    record.type = std::string(event.type);
    record.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
    record.mono_ms = record.unix_ms;
    for (const auto& [key, value] : event.fields) {
      record.Set(key, std::visit([](const auto& v) { return report::EventRecord::Value(v); }, value));
    }
    records_.push_back(std::move(record));
  }
  /// Another node's events: only its coordinator's records (with etcd it may hold the role).
  class OtherNode final : public host::EventLog {
   public:
    explicit OtherNode(RecordedEvents& into) : into_(into) {}
    void Record(TimePoint now, const host::Event& event) override {
      if (report::IsCoordinatorRecord(event.type)) into_.Record(now, event);
    }

   private:
    RecordedEvents& into_;
  };

  std::vector<const report::EventRecord*> records() const {
    std::vector<const report::EventRecord*> all;
    for (const auto& r : records_) all.push_back(&r);
    return all;
  }

 private:
  std::vector<report::EventRecord> records_;
};

// `--replay LOGDIR`: the real run's failures as faults, and both sequences side by side.
// --trace and --report of one simulated run; false when a file could not be written (said).
bool WriteTimeline(const SimulateOptions& options, const JobSpec& spec, const sim::SimOptions& sim_options,
                   const sim::SimResult& result, const sim::Timeline& timeline) {
  bool written = true;
  if (!options.trace_path.empty()) {
    written &= WriteFile(options.trace_path, "trace",
                         [&](std::ostream& out) { report::WriteChromeTrace(timeline, out); });
  }
  if (!options.report_path.empty()) {
    const std::string summary = sim::FormatSummary(spec, sim_options, result);
    written &= WriteFile(options.report_path, "report",
                         [&](std::ostream& out) { report::WriteHtmlReport(timeline, summary, out); });
  }
  return written;
}

int Replay(JobSpec spec, sim::SimOptions sim_options, const SimulateOptions& options) {
  constexpr std::string_view kTool = "ddprun simulate --replay";
  auto files = LoadEventFiles(options.replay_dir);
  if (!files) {
    fmt::print(stderr, "{}: error: {}\n", kTool, files.error());
    return kExitUsage;
  }
  auto runs = report::GroupRuns(*files);
  if (!runs) {
    fmt::print(stderr, "{}: error: {}\n", kTool, runs.error());
    return kExitUsage;
  }
  const auto chosen = ChooseRun(*runs, options.run, options.replay_dir, kTool, "replaying");
  if (!chosen) return kExitUsage;
  const report::Run& run = (*runs)[*chosen];
  const std::string fingerprint = Fingerprint(spec).substr(0, run.fingerprint.size());
  if (fingerprint != run.fingerprint) {
    fmt::print(
        "note: {} is not the run's job file (fingerprint {}, the run's {}): the simulation models "
        "this file\n",
        options.job_path, fingerprint, run.fingerprint);
  }
  const report::ReplayPlan plan = report::PlanReplay(run, spec);
  // The run's own failures only: no random ones, none of the file's scheduled faults.
  spec.simulate.faults = plan.faults;
  for (const std::string& text : options.faults) {
    auto fault = ParseFaultFlag(text);
    if (fault) spec.simulate.faults.push_back(*fault);
  }
  spec.simulate.node_mtbf.reset();
  spec.simulate.worker_mtbf.reset();
  spec.simulate.worker_hang_mtbf.reset();
  spec.simulate.train_time = plan.train_time;
  spec.simulate.worker_startup = plan.worker_startup;
  if (plan.sigterm) spec.simulate.sigterm = *plan.sigterm;
  for (const FaultSpec& fault : spec.simulate.faults) {
    if (auto fits = FaultFitsJob(fault, spec); !fits) {
      fmt::print(stderr, "{}: the run does not fit {}: {}\n", kTool, options.job_path, fits.error());
      return kExitUsage;
    }
  }
  sim_options.flag_faults = spec.simulate.faults;
  RecordedEvents recorded;
  RecordedEvents::OtherNode others(recorded);
  sim_options.node0_events = &recorded;
  sim_options.other_events = &others;
  std::ostringstream lines;
  sim_options.record_timeline = !options.trace_path.empty() || !options.report_path.empty();
  sim::Timeline timeline;
  const sim::SimResult result = sim::RunSimulation(spec, sim_options, options.quiet ? nullptr : &lines,
                                                   sim_options.record_timeline ? &timeline : nullptr);
  if (!options.quiet) fmt::print("{}\n", lines.str());
  // What the run's event files say (job name, notes, root causes) is escaped for the terminal.
  fmt::print("replay of job \"{}\" from {} ({} event file{}): training {}, worker start-up {}\n",
             EscapeLinesForTerminal(run.job), report::FormatUtc(run.first_unix_ms), run.files.size(),
             run.files.size() == 1 ? "" : "s", FormatDuration(plan.train_time),
             FormatDuration(plan.worker_startup));
  if (plan.sigterm) {
    fmt::print("stopped workers: {} (as in the run)\n", *plan.sigterm == JobSpec::Simulate::Sigterm::kIgnored
                                                            ? "stay until SIGKILL after stop_grace"
                                                            : "end on SIGTERM");
  }
  if (plan.faults.empty()) fmt::print("faults: none (the run had no failure)\n");
  for (const FaultSpec& fault : plan.faults) fmt::print("fault: --fault {}\n", sim::FormatFaultFlag(fault));
  for (const std::string& note : plan.notes) fmt::print("note: {}\n", EscapeLinesForTerminal(note));
  const auto comparison = report::CompareSequences(report::RoundSequence(report::CoordinatorRecords(run)),
                                                   report::RoundSequence(recorded.records()));
  fmt::print("{}", EscapeLinesForTerminal(comparison.text));
  const auto durations = report::CompareDurations(report::RoundDurations(report::CoordinatorRecords(run)),
                                                  report::RoundDurations(recorded.records()));
  fmt::print("{}", EscapeLinesForTerminal(durations.text));
  if (result.violation) fmt::print("the simulation broke an invariant: {}\n", *result.violation);
  std::fflush(stdout);
  if (result.violation) return kExitInternal;
  if (!WriteTimeline(options, spec, sim_options, result, timeline)) return kExitUsage;
  return comparison.match && durations.within ? kExitOk : kExitJobFailed;
}

// `--sweep`: the grid over the same seeds, a table on stdout and the chart in a file.
int Sweep(const std::string& job_text, const JobSpec& spec, const std::vector<sim::JobOverride>& fixed,
          uint64_t first_seed, const SimulateOptions& options) {
  std::vector<sim::SweepAxis> axes;
  for (const std::string& text : options.sweeps) {
    auto axis = sim::ParseSweepFlag(text);
    if (!axis) {
      fmt::print(stderr, "ddprun simulate: --sweep {}: {}\n", text, axis.error());
      return kExitUsage;
    }
    axes.push_back(std::move(*axis));
  }
  // A job with nothing that fails runs the same under every restart or spare setting: say so
  // before the identical rows do (issue 40: the README's sweep on examples/lightning-2x8.toml).
  bool varies_failures = false;
  for (const sim::SweepAxis& axis : axes) varies_failures |= axis.key.starts_with("simulate.");
  const JobSpec::Simulate& sim = spec.simulate;
  if (!varies_failures && sim.faults.empty() && !sim.node_mtbf && !sim.worker_mtbf && !sim.worker_hang_mtbf) {
    fmt::print(
        stderr,
        "ddprun simulate: note: {} has nothing that fails (no [[simulate.faults]], no simulate.node_mtbf, "
        "worker_mtbf or worker_hang_mtbf): settings that act on failures give equal rows; add a rate with "
        "--set simulate.worker_mtbf=6h, or sweep one\n",
        options.job_path);
  }
  const int seeds = options.seeds.value_or(20);
  if (seeds > 1'000'000) {
    fmt::print(stderr, "ddprun simulate: --seeds {} is out of range (1..1000000)\n", seeds);
    return kExitUsage;
  }
  const std::string& chart = options.chart_path;
  const bool svg = chart.size() >= 4 && chart.compare(chart.size() - 4, 4, ".svg") == 0;
  const bool html = chart.size() >= 5 && chart.compare(chart.size() - 5, 5, ".html") == 0;
  if (!chart.empty() && !svg && !html) {
    fmt::print(stderr,
               "ddprun simulate: --chart {}: name the file .svg (the chart) or .html (chart and table)\n",
               chart);
    return kExitUsage;
  }
  auto sweep = sim::RunSweep(job_text, options.job_path, fixed, axes, first_seed, seeds);
  if (!sweep) {
    fmt::print(stderr, "ddprun simulate: --sweep: {}", sweep.error());
    return kExitUsage;
  }
  fmt::print("{}", sim::FormatSweepTable(*sweep));
  std::fflush(stdout);
  if (!chart.empty() && !WriteFile(chart, "chart", [&](std::ostream& out) {
        out << (svg ? sim::SweepChartSvg(*sweep) : sim::SweepChartHtml(*sweep));
      })) {
    return kExitUsage;
  }
  return sweep->violations > 0 ? kExitInternal : kExitOk;
}

}  // namespace

int SimulateCommand(const SimulateOptions& options) {
  // --report and --trace draw one run; a swarm, a sweep or a replay would drop them unsaid.
  const char* many = options.swarm ? "--swarm" : !options.sweeps.empty() ? "--sweep" : nullptr;
  const char* drawing = !options.report_path.empty()  ? "--report"
                        : !options.trace_path.empty() ? "--trace"
                                                      : nullptr;
  if (many && drawing) {
    fmt::print(stderr,
               "ddprun simulate: {} draws one run and {} runs many: run one of them again with {} (a failing "
               "seed's command line is printed as `reproduce with:`; any other is `--seed S` with the same "
               "options)\n",
               drawing, many, drawing);
    return kExitUsage;
  }
  LoadResult loaded = LoadJobFile(options.job_path);
  std::vector<sim::JobOverride> sets;
  for (const std::string& text : options.sets) {
    auto change = sim::ParseJobOverride(text);
    if (!change) {
      fmt::print(stderr, "ddprun simulate: --set {}: {}\n", text, change.error());
      return kExitUsage;
    }
    sets.push_back(std::move(*change));
  }
  // --set edits the file's text and the loader checks the result like any job file.
  const std::string job_text =
      sets.empty() || !loaded.spec ? loaded.source_text : sim::ApplyJobOverrides(loaded.source_text, sets);
  if (!sets.empty() && loaded.spec) loaded = ParseJobText(job_text, options.job_path);
  std::fputs(RenderDiagnostics(loaded.diagnostics, options.job_path, loaded.source_text, false).c_str(),
             stderr);
  if (!loaded.spec) return kExitUsage;
  JobSpec spec = std::move(*loaded.spec);

  sim::SimOptions sim_options;
  sim_options.seed = options.seed.value_or(spec.simulate.seed);
  sim_options.quiet = options.quiet;
  sim_options.lazy_heartbeats = !options.beat_by_beat;
  sim_options.job_path = options.job_path;
  for (const sim::JobOverride& change : sets) sim_options.overrides.push_back(sim::FormatJobOverride(change));
  sim_options.record_timeline = !options.trace_path.empty() || !options.report_path.empty();
  if (options.nodes) {
    const int n = *options.nodes;
    if (n < 1 || n > kMaxSimulatedNodes) {
      fmt::print(stderr, "ddprun simulate: --nodes {} is out of range (1..{})\n", n, kMaxSimulatedNodes);
      return kExitUsage;
    }
    // A scale rehearsal of the same job: the node list (if any) gives way to a count; node 0
    // keeps master_addr, and what follows from the node count follows the new one.
    for (const std::string& change : ResizeCluster(spec, n)) {
      fmt::print(stderr, "ddprun simulate: --nodes {}: {}\n", n, change);
    }
    sim_options.nodes_override = n;
  }
  for (const std::string& text : options.faults) {
    auto fault = ParseFaultFlag(text);
    if (!fault) {
      fmt::print(stderr, "ddprun simulate: --fault {}: {}\n", text, fault.error());
      return kExitUsage;
    }
    spec.simulate.faults.push_back(*fault);
    sim_options.flag_faults.push_back(*fault);
  }
  for (const FaultSpec& fault : spec.simulate.faults) {
    if (auto fits = FaultFitsJob(fault, spec); !fits) {
      fmt::print(stderr, "ddprun simulate: {}\n", fits.error());
      return kExitUsage;
    }
  }

  if (!options.replay_dir.empty()) return Replay(std::move(spec), std::move(sim_options), options);
  if (!options.sweeps.empty()) {
    if (options.nodes || !options.faults.empty()) {
      fmt::print(stderr,
                 "ddprun simulate: --sweep runs the job's own faults only; use --set to change the job "
                 "(cluster.nnodes=N) and [[simulate.faults]] for faults\n");
      return kExitUsage;
    }
    return Sweep(job_text, spec, sets, sim_options.seed, options);
  }

  if (options.swarm) {
    if (*options.swarm < 1 || *options.swarm > 1'000'000) {
      fmt::print(stderr, "ddprun simulate: --swarm {} is out of range (1..1000000)\n", *options.swarm);
      return kExitUsage;
    }
    const sim::SwarmResult swarm =
        sim::RunSwarm(spec, sim_options, *options.swarm, std::cout, options.vary_shape ? &job_text : nullptr);
    std::cout.flush();
    return swarm.failures > 0 ? kExitInternal : kExitOk;
  }

  sim::Timeline timeline;
  const sim::SimResult result =
      sim::RunSimulation(spec, sim_options, &std::cout, sim_options.record_timeline ? &timeline : nullptr);
  std::cout.flush();
  const bool written = WriteTimeline(options, spec, sim_options, result, timeline);
  if (result.violation) return kExitInternal;
  if (!written) return kExitUsage;
  return result.exit_code;
}

}  // namespace ddprun::cli
