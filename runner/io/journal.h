#pragma once
// Node 0's journal on its own disk (host::Journal): one line in <logs.dir>/<job>/coordinator.journal
// saying whether workers of the job may run and when that was written (wall clock, so that it
// means something after a reboot):
//
//   ddprun-journal 1 rounds_may_run=1 unix_ms=1764763200123
//
// Written whole to a temporary file and renamed over the last one, so a crash leaves either
// record, never half of one. Folders are opened without following links (log_files.h).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "runner/host/ports.h"
#include "base/unique_fd.h"

namespace ddprun::io {

class FileJournal final : public host::Journal {
 public:
  static constexpr const char* kFileName = "coordinator.journal";

  /// `folder` is <logs.dir>/<job>; created if missing. Problems are said once through `report`
  /// (the journal is a safety net: a job runs without it, only less safely after a crash).
  FileJournal(std::string folder, std::function<void(const std::string&)> report);

  std::optional<Duration> SinceRoundsMayRun() override;
  void Record(bool rounds_may_run) override;

  /// The record as written to the file, for tests.
  static std::string Format(bool rounds_may_run, int64_t unix_ms);

 private:
  void Report(const std::string& text);

  std::string folder_;
  std::function<void(const std::string&)> report_;
  UniqueFd folder_fd_;
  bool reported_ = false;
};

}  // namespace ddprun::io
