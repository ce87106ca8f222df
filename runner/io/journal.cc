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

#include "base/wall_clock.h"
#include "runner/io/log_files.h"
#include "runner/io/safe_file.h"

namespace ddprun::io {

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
  const auto text = ReadRegularFile(folder_fd_.get(), kFileName, folder_ + "/" + kFileName, kMaxJournalBytes);
  if (!text) {
    // Unreadable (something planted in its place, permissions): assume the worst, a record now.
    Report(text.error() + "; assuming workers of a previous run may still run");
    return Duration::zero();
  }
  if (!*text) return std::nullopt;
  int may_run = -1;
  long long unix_ms = 0;
  if (std::sscanf((*text)->c_str(), "ddprun-journal 1 rounds_may_run=%d unix_ms=%lld", &may_run, &unix_ms) !=
          2 ||
      (may_run != 0 && may_run != 1)) {
    Report(
        fmt::format("{}/{} is not a journal record; assuming workers of a previous run may "
                    "still run",
                    folder_, kFileName));
    return Duration::zero();
  }
  if (may_run == 0) return std::nullopt;
  // A clock set back since the record makes it look younger, never older: the safe side.
  const int64_t age_ms = std::max<int64_t>(0, UnixMillis() - unix_ms);
  return std::chrono::milliseconds(age_ms);
}

void FileJournal::Record(bool rounds_may_run) {
  if (!folder_fd_.valid()) return;
  if (Status written =
          ReplaceFile(folder_fd_.get(), folder_, kFileName, Format(rounds_may_run, UnixMillis()));
      !written) {
    Report(written.error());
  }
}

std::string FileJournal::FormatQuarantine(const std::vector<core::QuarantinedHost>& hosts, int64_t unix_ms) {
  std::string text = "ddprun-quarantine 1\n";
  for (const core::QuarantinedHost& h : hosts) {
    if (!UsableHost(h.host)) continue;
    text += fmt::format(
        "host={} until_unix_ms={} times={}\n", h.host,
        unix_ms + std::max<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(h.left).count(), 0),
        h.times);
  }
  return text;
}

bool FileJournal::UsableHost(std::string_view host) {
  if (host.empty() || host.size() > 255) return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':';
  });
}

std::vector<core::QuarantinedHost> FileJournal::ParseQuarantine(std::string_view text, int64_t unix_ms,
                                                                std::string* error) {
  std::vector<core::QuarantinedHost> hosts;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string line(text.substr(0, end));
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    ++line_no;
    if (line_no == 1) {
      if (line != "ddprun-quarantine 1") {
        if (error) *error = "line 1 is not \"ddprun-quarantine 1\"";
        return {};
      }
      continue;
    }
    if (line.empty()) continue;
    char host[256] = {};
    long long until = 0;
    int times = 0;
    if (std::sscanf(line.c_str(), "host=%255s until_unix_ms=%lld times=%d", host, &until, &times) != 3 ||
        !UsableHost(host) || times < 1 || times > 1'000) {
      if (error) *error = fmt::format("line {} is not \"host=NAME until_unix_ms=N times=K\"", line_no);
      return {};
    }
    // A clock set back makes the cooldown look longer, never shorter: the safe side.
    hosts.push_back({host, std::chrono::milliseconds(until - unix_ms), times});
  }
  if (line_no == 0 && error) *error = "the file is empty";
  return hosts;
}

std::vector<core::QuarantinedHost> FileJournal::Quarantined() {
  if (!folder_fd_.valid()) return {};
  const auto text = ReadRegularFile(folder_fd_.get(), kQuarantineFileName,
                                    folder_ + "/" + kQuarantineFileName, kMaxQuarantineBytes);
  if (!text) {
    ReportQuarantine(text.error());
    return {};
  }
  if (!*text) return {};
  std::string error;
  auto hosts = ParseQuarantine(**text, UnixMillis(), &error);
  if (!error.empty()) ReportQuarantine(fmt::format("{}/{}: {}", folder_, kQuarantineFileName, error));
  return hosts;
}

void FileJournal::RecordQuarantine(const std::vector<core::QuarantinedHost>& hosts) {
  if (!folder_fd_.valid()) return;
  if (Status written =
          ReplaceFile(folder_fd_.get(), folder_, kQuarantineFileName, FormatQuarantine(hosts, UnixMillis()));
      !written) {
    ReportQuarantine(written.error());
  }
}

void FileJournal::ReportQuarantine(const std::string& text) {
  if (report_) {
    report_(
        fmt::format("quarantine state: {} (ignored: no host is kept out by an earlier launch; "
                    "delete the file to start afresh)",
                    text));
  }
}

void FileJournal::Report(const std::string& text) {
  if (reported_) return;
  reported_ = true;
  if (report_) {
    report_(
        fmt::format("coordinator journal: {} (after a crash of this host, the next coordinator "
                    "cannot know whether workers of this run still run)",
                    text));
  }
}

}  // namespace ddprun::io
