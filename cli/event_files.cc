// Reading a folder of event logs for `ddprun report` and `ddprun --simulate --replay`.
#include "cli/event_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "schema/diagnostics.h"

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

}  // namespace

Result<std::vector<report::EventFile>> LoadEventFiles(const std::string& dir) {
  auto paths = FindEventFiles(dir);
  if (!paths) return Fail(paths.error());
  std::vector<report::EventFile> files;
  files.reserve(paths->size());
  for (const std::string& path : *paths) {
    auto text = ReadWhole(path);
    if (!text) return Fail(text.error());
    auto file = report::ParseEventFile(path, *text);
    if (!file) return Fail(file.error());
    files.push_back(*std::move(file));
  }
  return files;
}

std::optional<size_t> ChooseRun(const std::vector<report::Run>& runs, std::optional<int> run,
                                const std::string& dir, std::string_view tool, std::string_view what) {
  const int count = static_cast<int>(runs.size());
  const int chosen = run.value_or(count);
  if (chosen < 1 || chosen > count) {
    fmt::print(stderr, "{}: error: --run {} is out of range: {} holds {} run{}\n", tool, chosen, dir, count,
               count == 1 ? "" : "s");
    return std::nullopt;
  }
  if (count > 1) {
    fmt::print(stderr, "{}: {} holds {} runs; {} run {}{} (--run N picks another):\n", tool, dir, count, what,
               chosen, run ? "" : ", the newest");
    for (int i = 0; i < count; ++i) {
      const report::Run& r = runs[static_cast<size_t>(i)];
      fmt::print(stderr, "  {:>3}  job \"{}\" from {} to {}, {} event file{}\n", i + 1, EscapeForTerminal(r.job),
                 report::FormatUtc(r.first_unix_ms), report::FormatUtc(r.last_unix_ms), r.files.size(),
                 r.files.size() == 1 ? "" : "s");
    }
  }
  return static_cast<size_t>(chosen - 1);
}

}  // namespace ddprun::cli
