#pragma once
// A node's event log on disk (host::EventLog): JSON lines in its run's log folder,
// <logs.dir>/<job>/<run>/events-node<k>.jsonl, beside the rank logs (docs/report.md has every
// record). Each record is one write(2) of one line, so a crash loses at most the line being
// written; nothing is buffered. The file is bounded: past `max_bytes` one "truncated" record
// is written and nothing more (a run that long keeps its beginning, where a reader starts).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/result.h"
#include "base/unique_fd.h"
#include "runner/host/ports.h"

namespace ddprun::io {

class FileEventLog final : public host::EventLog {
 public:
  static constexpr uint64_t kMaxBytes = uint64_t{64} << 20;

  /// Creates the file "events-node<node_rank>.jsonl" in the open folder `folder_fd` (named
  /// `folder` in messages), never over an existing file or through a link. `report` says a
  /// later write failure, once.
  static Result<std::unique_ptr<FileEventLog>> Create(int folder_fd, const std::string& folder, int node_rank,
                                                      std::string host,
                                                      std::function<void(const std::string&)> report,
                                                      uint64_t max_bytes = kMaxBytes);

  void Record(TimePoint now, const host::Event& event) override;

  /// The record's line as written, newline included: {"v":1,"event":...,"unix_ms":...,
  /// "mono_ms":...,"node":...,"host":...,<fields>}. Bytes that are not UTF-8 become U+FFFD.
  static std::string Format(const host::Event& event, int64_t unix_ms, int64_t mono_ms, int node,
                            const std::string& host);

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return written_; }

 private:
  FileEventLog(UniqueFd fd, std::string path, int node_rank, std::string host,
               std::function<void(const std::string&)> report, uint64_t max_bytes);
  bool Write(const std::string& line);

  UniqueFd fd_;
  std::string path_;
  int node_rank_;
  std::string host_;
  std::function<void(const std::string&)> report_;
  uint64_t max_bytes_;
  uint64_t written_ = 0;
  bool closed_ = false;  // truncated, or a write failed: no more records
};

}  // namespace ddprun::io
