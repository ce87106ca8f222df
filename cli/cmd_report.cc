// `ddprun report LOGDIR`: a real run's page and trace from its event logs (docs/report.md).
#include <fstream>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/event_files.h"
#include "report/event_log.h"
#include "report/rebuild.h"
#include "report/render.h"
#include "schema/diagnostics.h"

namespace ddprun::cli {
namespace {

/// Writes straight into the file: a long run's page is megabytes, and a copy in memory too
/// would add them to the report's peak.
bool WriteFile(const std::string& path, const std::string& what,
               const std::function<void(std::ostream&)>& write) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (file) write(file);
  file.close();
  if (!file) {
    fmt::print(stderr, "ddprun report: cannot write the {} to {}\n", what, path);
    return false;
  }
  fmt::print(stderr, "ddprun report: wrote the {} to {}\n", what, path);
  return true;
}

}  // namespace

int ReportCommand(const ReportOptions& options) {
  auto files = LoadEventFiles(options.log_dir);
  if (!files) {
    fmt::print(stderr, "ddprun report: error: {}\n", files.error());
    return kExitUsage;
  }
  auto runs = report::GroupRuns(*files);
  if (!runs) {
    fmt::print(stderr, "ddprun report: error: {}\n", runs.error());
    return kExitUsage;
  }
  const auto chosen = ChooseRun(*runs, options.run, options.log_dir, "ddprun report", "this report is of");
  if (!chosen) return kExitUsage;
  const report::RebuiltRun rebuilt = report::RebuildTimeline((*runs)[*chosen]);
  // The records are not needed past the timeline: their memory goes before the page is drawn.
  runs->clear();
  files->clear();
  files->shrink_to_fit();
  // The title and notes come from event files in a shared folder: escaped for the terminal.
  fmt::print("{}\n{} round{} begun, {} restart{} used, exit code {}\n",
             EscapeLinesForTerminal(rebuilt.timeline.title), rebuilt.rounds, rebuilt.rounds == 1 ? "" : "s",
             rebuilt.restarts, rebuilt.restarts == 1 ? "" : "s",
             rebuilt.exit_code < 0 ? std::string("unknown") : std::to_string(rebuilt.exit_code));
  for (const std::string& note : rebuilt.notes) fmt::print("note: {}\n", EscapeLinesForTerminal(note));
  std::fflush(stdout);

  bool written = WriteFile(options.out_path, "report", [&](std::ostream& out) {
    report::WriteHtmlReport(rebuilt.timeline, rebuilt.summary, out);
  });
  if (!options.trace_path.empty()) {
    written &= WriteFile(options.trace_path, "trace",
                         [&](std::ostream& out) { report::WriteChromeTrace(rebuilt.timeline, out); });
  }
  return written ? kExitOk : kExitUsage;
}

}  // namespace ddprun::cli
