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
#include "report/event_log.h"
#include "report/rebuild.h"
#include "report/render.h"

namespace ddprun::cli {
namespace {

namespace fs = std::filesystem;

// Bounds on what is read: event logs are written with a bound of 64 MiB each
// (runner/io/event_file.h), and a job has at most 10,000 nodes plus spares, a few runs each.
constexpr size_t kMaxFiles = 65'536;
constexpr uintmax_t kMaxFileBytes = uintmax_t{128} << 20;
constexpr int kMaxDepth = 4;  // LOGDIR may be logs.dir: <logs.dir>/<job>/<run>/events-node<k>.jsonl

Result<std::vector<std::string>> FindEventFiles(const std::string& dir) {
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (ec || !fs::exists(status)) return Fail(fmt::format("{} does not exist", dir));
  if (fs::is_regular_file(status)) return std::vector<std::string>{dir};
  if (!fs::is_directory(status)) return Fail(fmt::format("{} is neither a folder nor a file", dir));
  std::vector<std::string> found;
  // Links are not followed: `latest` names a run folder that the walk reaches anyway.
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) return Fail(fmt::format("cannot read {}: {}", dir, ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return Fail(fmt::format("cannot read below {}: {}", dir, ec.message()));
    if (it.depth() >= kMaxDepth) it.disable_recursion_pending();
    const fs::directory_entry& entry = *it;
    if (entry.is_symlink(ec) || !entry.is_regular_file(ec)) continue;
    if (!report::IsEventFileName(entry.path().filename().string())) continue;
    if (found.size() >= kMaxFiles) {
      return Fail(fmt::format("more than {} event files below {}: pass the folder of one job", kMaxFiles, dir));
    }
    found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end());
  if (found.empty()) {
    return Fail(fmt::format("no event files (events-node<k>.jsonl) in {} or below it; each agent writes its own "
                            "in its run folder, <logs.dir>/<job>/<run>/: pass <logs.dir>/<job>, or a folder where "
                            "you copied every node's file",
                            dir));
  }
  return found;
}

Result<std::string> ReadWhole(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return Fail(fmt::format("cannot read {}: {}", path, ec.message()));
  if (size > kMaxFileBytes) {
    return Fail(fmt::format("{} has {} bytes: more than any event log ({} at most)", path, size, kMaxFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(fmt::format("cannot open {}", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) return Fail(fmt::format("cannot read {}", path));
  return text.str();
}

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
  auto paths = FindEventFiles(options.log_dir);
  if (!paths) {
    fmt::print(stderr, "ddprun report: error: {}\n", paths.error());
    return kExitUsage;
  }
  std::vector<report::EventFile> files;
  files.reserve(paths->size());
  for (const std::string& path : *paths) {
    auto text = ReadWhole(path);
    if (!text) {
      fmt::print(stderr, "ddprun report: error: {}\n", text.error());
      return kExitUsage;
    }
    auto file = report::ParseEventFile(path, *text);
    if (!file) {
      fmt::print(stderr, "ddprun report: error: {}\n", file.error());
      return kExitUsage;
    }
    files.push_back(*std::move(file));
  }
  auto runs = report::GroupRuns(files);
  if (!runs) {
    fmt::print(stderr, "ddprun report: error: {}\n", runs.error());
    return kExitUsage;
  }
  const int count = static_cast<int>(runs->size());
  const int chosen = options.run.value_or(count);
  if (chosen < 1 || chosen > count) {
    fmt::print(stderr, "ddprun report: error: --run {} is out of range: {} holds {} run{}\n", chosen,
               options.log_dir, count, count == 1 ? "" : "s");
    return kExitUsage;
  }
  if (count > 1) {
    fmt::print(stderr, "ddprun report: {} holds {} runs; this report is of run {}{} (--run N picks another):\n",
               options.log_dir, count, chosen, options.run ? "" : ", the newest");
    for (int i = 0; i < count; ++i) {
      const report::Run& run = (*runs)[static_cast<size_t>(i)];
      fmt::print(stderr, "  {:>3}  job \"{}\" from {} to {}, {} event file{}\n", i + 1, run.job,
                 report::FormatUtc(run.first_unix_ms), report::FormatUtc(run.last_unix_ms), run.files.size(),
                 run.files.size() == 1 ? "" : "s");
    }
  }
  const report::RebuiltRun rebuilt = report::RebuildTimeline((*runs)[static_cast<size_t>(chosen - 1)]);
  fmt::print("{}\n{} round{} begun, {} restart{} used, exit code {}\n", rebuilt.timeline.title, rebuilt.rounds,
             rebuilt.rounds == 1 ? "" : "s", rebuilt.restarts, rebuilt.restarts == 1 ? "" : "s",
             rebuilt.exit_code < 0 ? std::string("unknown") : std::to_string(rebuilt.exit_code));
  for (const std::string& note : rebuilt.notes) fmt::print("note: {}\n", note);
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
