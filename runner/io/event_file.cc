#include "runner/io/event_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/wall_clock.h"
#include "runner/io/log_files.h"

namespace ddprun::io {
namespace {

// Room kept below the bound for the "truncated" record itself.
constexpr uint64_t kTruncatedReserve = 512;

}  // namespace

Result<std::unique_ptr<FileEventLog>> FileEventLog::Create(int folder_fd, const std::string& folder,
                                                           int node_rank, std::string host,
                                                           std::function<void(const std::string&)> report,
                                                           uint64_t max_bytes) {
  const std::string name = fmt::format("events-node{}.jsonl", node_rank);
  auto fd = CreateFileBelow(folder_fd, folder, name);
  if (!fd) return Fail(fd.error());
  return std::unique_ptr<FileEventLog>(new FileEventLog(*std::move(fd), folder + "/" + name, node_rank,
                                                        std::move(host), std::move(report), max_bytes));
}

FileEventLog::FileEventLog(UniqueFd fd, std::string path, int node_rank, std::string host,
                           std::function<void(const std::string&)> report, uint64_t max_bytes)
    : fd_(std::move(fd)),
      path_(std::move(path)),
      node_rank_(node_rank),
      host_(std::move(host)),
      report_(std::move(report)),
      max_bytes_(std::max(max_bytes, kTruncatedReserve * 2)) {}

std::string FileEventLog::Format(const host::Event& event, int64_t unix_ms, int64_t mono_ms, int node,
                                 const std::string& host) {
  nlohmann::ordered_json record;
  record["v"] = 1;
  record["event"] = std::string(event.type);
  record["unix_ms"] = unix_ms;
  record["mono_ms"] = mono_ms;
  record["node"] = node;
  record["host"] = host;
  for (const auto& [key, value] : event.fields) {
    std::visit([&, k = std::string(key)](const auto& v) { record[k] = v; }, value);
  }
  return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void FileEventLog::Record(TimePoint now, const host::Event& event) {
  if (closed_) return;
  const int64_t mono_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const int64_t unix_ms = UnixMillis();
  const std::string line = Format(event, unix_ms, mono_ms, node_rank_, host_);
  if (written_ + line.size() > max_bytes_ - kTruncatedReserve) {
    closed_ = true;
    host::Event truncated{"truncated", {}};
    truncated.Add("limit_bytes", static_cast<int64_t>(max_bytes_));
    Write(Format(truncated, unix_ms, mono_ms, node_rank_, host_));
    if (report_) {
      report_(
          fmt::format("event log {} reached its bound of {} bytes: later events of this run are not "
                      "recorded",
                      path_, max_bytes_));
    }
    return;
  }
  Write(line);
}

bool FileEventLog::Write(const std::string& line) {
  const ssize_t n = ::write(fd_.get(), line.data(), line.size());
  if (n == static_cast<ssize_t>(line.size())) {
    written_ += line.size();
    return true;
  }
  const int error = n < 0 ? errno : ENOSPC;
  if (n > 0) written_ += static_cast<uint64_t>(n);
  closed_ = true;
  if (report_) {
    report_(fmt::format("cannot write the event log {}: {}; later events of this run are not recorded", path_,
                        std::strerror(error)));
  }
  return false;
}

}  // namespace ddprun::io
