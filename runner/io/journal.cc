#include "runner/io/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "runner/io/log_files.h"

namespace ddprun::io {
namespace {

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

FileJournal::FileJournal(std::string folder, std::function<void(const std::string&)> report)
    : folder_(std::move(folder)), report_(std::move(report)) {
  const std::filesystem::path path(folder_);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  UniqueFd parent(::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent.valid()) {
    Report(fmt::format("cannot open {}: {}", path.parent_path().string(), std::strerror(errno)));
    return;
  }
  auto opened = OpenFolderBelow(parent.get(), path.parent_path().string(), path.filename().string(),
                                /*last_must_be_new=*/false);
  if (!opened) {
    Report(opened.error());
    return;
  }
  folder_fd_ = *std::move(opened);
}

std::string FileJournal::Format(bool rounds_may_run, int64_t unix_ms) {
  return fmt::format("ddprun-journal 1 rounds_may_run={} unix_ms={}\n", rounds_may_run ? 1 : 0, unix_ms);
}

std::optional<Duration> FileJournal::SinceRoundsMayRun() {
  if (!folder_fd_.valid()) return std::nullopt;
  UniqueFd fd(::openat(folder_fd_.get(), kFileName, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::nullopt;
    // Unreadable (a link planted in its place, permissions): assume the worst, a record now.
    Report(fmt::format("cannot read {}/{}: {}; assuming workers of a previous run may still run",
                       folder_, kFileName, std::strerror(errno)));
    return Duration::zero();
  }
  char buffer[128] = {};
  const ssize_t n = ::read(fd.get(), buffer, sizeof buffer - 1);
  int may_run = -1;
  long long unix_ms = 0;
  if (n <= 0 || std::sscanf(buffer, "ddprun-journal 1 rounds_may_run=%d unix_ms=%lld", &may_run,
                            &unix_ms) != 2 ||
      (may_run != 0 && may_run != 1)) {
    Report(fmt::format("{}/{} is not a journal record; assuming workers of a previous run may "
                       "still run", folder_, kFileName));
    return Duration::zero();
  }
  if (may_run == 0) return std::nullopt;
  // A clock set back since the record makes it look younger, never older: the safe side.
  const int64_t age_ms = std::max<int64_t>(0, UnixMillis() - unix_ms);
  return std::chrono::milliseconds(age_ms);
}

void FileJournal::Record(bool rounds_may_run) {
  if (!folder_fd_.valid()) return;
  const std::string text = Format(rounds_may_run, UnixMillis());
  const std::string temp = std::string(kFileName) + ".new";
  UniqueFd fd(::openat(folder_fd_.get(), temp.c_str(),
                       O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid() || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    Report(fmt::format("cannot write {}/{}: {}", folder_, temp, std::strerror(errno)));
    return;
  }
  if (fd.Reset() != 0) {
    Report(fmt::format("cannot write {}/{}: {}", folder_, temp, std::strerror(errno)));
    return;
  }
  if (::renameat(folder_fd_.get(), temp.c_str(), folder_fd_.get(), kFileName) != 0) {
    Report(fmt::format("cannot rename {}/{} to {}: {}", folder_, temp, kFileName, std::strerror(errno)));
  }
}

void FileJournal::Report(const std::string& text) {
  if (reported_) return;
  reported_ = true;
  if (report_) {
    report_(fmt::format("coordinator journal: {} (after a crash of this host, the next coordinator "
                        "cannot know whether workers of this run still run)",
                        text));
  }
}

}  // namespace ddprun::io
