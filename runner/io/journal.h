#pragma once
// Node 0's journal on its own disk (host::Journal): one line in <logs.dir>/<job>/coordinator.journal
// saying whether workers of the job may run and when that was written (wall clock, so that it
// means something after a reboot):
//
//   ddprun-journal 1 rounds_may_run=1 unix_ms=1764763200123
//
// Written whole to a temporary file and renamed over the last one, so a crash leaves either
// record, never half of one. Folders are opened without following links (log_files.h), and the
// files without following links, without blocking, and within a bound (safe_file.h).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"
#include "runner/host/ports.h"

namespace ddprun::io {

class FileJournal final : public host::Journal {
 public:
  static constexpr const char* kFileName = "coordinator.journal";
  /// A record is one line of about 60 bytes; a larger file is not the journal.
  static constexpr size_t kMaxJournalBytes = 4096;

  /// `folder` is <logs.dir>/<job>; created if missing. Problems are said once through `report`
  /// (the journal is a safety net: a job runs without it, only less safely after a crash).
  FileJournal(std::string folder, std::function<void(const std::string&)> report);

  /// Node 0's quarantine state, beside the journal: a header line, then one line per host
  ///
  ///   ddprun-quarantine 1
  ///   host=gpu-07 until_unix_ms=1764766800123 times=2
  ///
  /// written whole and renamed over the last one, as the journal is.
  static constexpr const char* kQuarantineFileName = "quarantine.state";
  static constexpr size_t kMaxQuarantineBytes = 1 << 20;

  std::optional<Duration> SinceRoundsMayRun() override;
  void Record(bool rounds_may_run) override;
  std::vector<core::QuarantinedHost> Quarantined() override;
  void RecordQuarantine(const std::vector<core::QuarantinedHost>& hosts) override;

  /// The record as written to the file, for tests.
  static std::string Format(bool rounds_may_run, int64_t unix_ms);
  /// The quarantine state as written at `unix_ms`, and read back at `unix_ms` (hosts whose
  /// name could not be a host are left out); on a malformed file, none and `error` says why.
  static std::string FormatQuarantine(const std::vector<core::QuarantinedHost>& hosts, int64_t unix_ms);
  static std::vector<core::QuarantinedHost> ParseQuarantine(std::string_view text, int64_t unix_ms,
                                                            std::string* error);

 private:
  static bool UsableHost(std::string_view host);
  void Report(const std::string& text);
  void ReportQuarantine(const std::string& text);

  std::string folder_;
  std::function<void(const std::string&)> report_;
  UniqueFd folder_fd_;
  bool reported_ = false;
};

}  // namespace ddprun::io
