// Reading a folder of event logs for `ddprun report` and `ddprun --simulate --replay`.
#include "cli/event_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "base/unique_fd.h"
#include "runner/io/safe_file.h"
#include "schema/diagnostics.h"

namespace ddprun::cli {
namespace {

namespace fs = std::filesystem;

// Bounds on what is read: event logs are written with a bound of 64 MiB each
// (runner/io/event_file.h), and a job has at most 10,000 nodes plus spares, a few runs each.
constexpr size_t kMaxFiles = 65'536;
constexpr uintmax_t kMaxFileBytes = uintmax_t{128} << 20;
// What the records of all the files together may take in memory (about the files' size): the
// longest runs of large jobs, and no more than a laptop that draws their page has to spare.
constexpr size_t kMaxHeldBytes = size_t{1} << 30;
// Each file is read this much at a time; its text is never held whole.
constexpr size_t kPieceBytes = size_t{1} << 20;
constexpr int kMaxDepth = 4;  // LOGDIR may be logs.dir: <logs.dir>/<job>/<run>/events-node<k>.jsonl

/// The event files below `dir`, relative to it; `dir` itself ("") when it is a file.
Result<std::vector<std::string>> FindEventFiles(const std::string& dir) {
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (ec || !fs::exists(status)) return Fail(fmt::format("{} does not exist", dir));
  if (fs::is_regular_file(status)) return std::vector<std::string>{""};
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
      return Fail(
          fmt::format("more than {} event files below {}: pass the folder of one job", kMaxFiles, dir));
    }
    found.push_back(entry.path().lexically_relative(dir).string());
  }
  std::sort(found.begin(), found.end());
  if (found.empty()) {
    return Fail(
        fmt::format("no event files (events-node<k>.jsonl) in {} or below it; each agent writes its own "
                    "in its run folder, <logs.dir>/<job>/<run>/: pass <logs.dir>/<job>, or a folder where "
                    "you copied every node's file",
                    dir));
  }
  return found;
}

/// The event file `relative` below the open folder `folder_fd`, read a piece at a time and
/// opened as every file in a shared folder is (runner/io/safe_file.h); its records may take
/// `max_held_bytes` in memory.
Result<report::EventFile> ReadEventFile(int folder_fd, const std::string& relative, const std::string& shown,
                                        size_t max_held_bytes) {
  auto opened = io::OpenRegularFile(folder_fd, relative, shown);
  if (!opened) return Fail(opened.error());
  if (!*opened) return Fail(fmt::format("{} does not exist", shown));
  const int fd = (*opened)->get();
  auto too_large = [&] {
    return Fail(fmt::format("{} is larger than {}, more than any event log", shown, ByteSize(kMaxFileBytes)));
  };
  struct stat st {};
  if (::fstat(fd, &st) == 0 && static_cast<uintmax_t>(st.st_size) > kMaxFileBytes) return too_large();
  report::EventFileParser parser(shown, max_held_bytes);
  std::string piece(kPieceBytes, '\0');
  uintmax_t total = 0;
  while (true) {
    const ssize_t n = ::read(fd, piece.data(), piece.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Fail(fmt::format("cannot read {}: {}", shown, std::strerror(errno)));
    if (n == 0) break;
    total += static_cast<uintmax_t>(n);
    if (total > kMaxFileBytes) return too_large();  // it grew while read
    if (Status fed = parser.Feed(std::string_view(piece.data(), static_cast<size_t>(n))); !fed) {
      return Fail(fed.error());
    }
  }
  return std::move(parser).Finish();
}

}  // namespace

Result<std::vector<report::EventFile>> LoadEventFiles(const std::string& dir) {
  auto paths = FindEventFiles(dir);
  if (!paths) return Fail(paths.error());
  // The folder the user named may be reached through links (their choice); nothing below it is.
  const bool one_file = paths->size() == 1 && paths->front().empty();
  const fs::path folder = one_file ? fs::path(dir).parent_path() : fs::path(dir);
  const std::string folder_text = folder.empty() ? "." : folder.string();
  UniqueFd folder_fd(::open(folder_text.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!folder_fd.valid()) return Fail(fmt::format("cannot open {}: {}", folder_text, std::strerror(errno)));
  std::vector<report::EventFile> files;
  files.reserve(paths->size());
  size_t held = 0;
  std::vector<std::string> skipped;
  for (const std::string& relative : *paths) {
    const std::string name = one_file ? fs::path(dir).filename().string() : relative;
    const std::string shown = one_file ? dir : (folder / relative).string();
    auto file = ReadEventFile(folder_fd.get(), name, shown, kMaxHeldBytes - held);
    if (!file) {
      // One file that cannot be read (empty: its agent exited before its first record; cut
      // short; planted) takes no other run down with it: said, and skipped (issue 39).
      skipped.push_back(file.error());
      continue;
    }
    held += file->held_bytes;
    files.push_back(*std::move(file));
  }
  if (files.empty()) {
    return Fail(skipped.size() == 1
                    ? skipped.front()
                    : fmt::format("no event file could be read:\n  {}", fmt::join(skipped, "\n  ")));
  }
  for (const std::string& why : skipped) {
    fmt::print(stderr, "ddprun: skipped {} (the other event files are read)\n", EscapeForTerminal(why));
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
      fmt::print(stderr, "  {:>3}  job \"{}\" from {} to {}, {} event file{}\n", i + 1,
                 EscapeForTerminal(r.job), report::FormatUtc(r.first_unix_ms),
                 report::FormatUtc(r.last_unix_ms), r.files.size(), r.files.size() == 1 ? "" : "s");
    }
  }
  return static_cast<size_t>(chosen - 1);
}

}  // namespace ddprun::cli
