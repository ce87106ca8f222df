// `ddprun report LOGDIR`: a real run's page and trace from its event logs (docs/report.md).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/event_files.h"
#include "schema/diagnostics.h"
#include "report/event_log.h"
#include "report/rebuild.h"
#include "report/render.h"

namespace ddprun::cli {
namespace {

namespace fs = std::filesystem;

bool WriteFile(const std::string& path, const std::string& what, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
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
  // The title and notes come from event files in a shared folder: escaped for the terminal.
  fmt::print("{}\n{} round{} begun, {} restart{} used, exit code {}\n",
             EscapeLinesForTerminal(rebuilt.timeline.title), rebuilt.rounds,
             rebuilt.rounds == 1 ? "" : "s", rebuilt.restarts, rebuilt.restarts == 1 ? "" : "s",
             rebuilt.exit_code < 0 ? std::string("unknown") : std::to_string(rebuilt.exit_code));
  for (const std::string& note : rebuilt.notes) fmt::print("note: {}\n", EscapeLinesForTerminal(note));
  std::fflush(stdout);

  bool written = true;
  {
    std::ostringstream page;
    report::WriteHtmlReport(rebuilt.timeline, rebuilt.summary, page);
    written &= WriteFile(options.out_path, "report", page.str());
  }
  if (!options.trace_path.empty()) {
    std::ostringstream trace;
    report::WriteChromeTrace(rebuilt.timeline, trace);
    written &= WriteFile(options.trace_path, "trace", trace.str());
  }
  return written ? kExitOk : kExitUsage;
}

}  // namespace ddprun::cli
