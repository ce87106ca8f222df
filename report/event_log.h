#pragma once
// Reading a real run's event log (docs/report.md): one JSON-lines file per agent,
// events-node<k>.jsonl in that agent's run folder. The writer is runner/io/event_file.h, fed by
// runner/host/event_recorder.h; this side parses the text, checks every line, and groups the
// files of one run. Pure: the CLI reads the files and hands over their text.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/result.h"

namespace ddprun::report {

/// The format version this reader knows; a record with a newer one is refused.
inline constexpr int kEventLogVersion = 1;

/// "events-node3.jsonl" for node 3; IsEventFileName tells such names.
std::string EventFileName(int node_rank);
bool IsEventFileName(std::string_view name);

/// One record as read: the fields every record has, and the rest by name.
struct EventRecord {
  using Value = std::variant<int64_t, bool, std::string, std::vector<int64_t>, std::vector<std::string>>;
  int line = 0;           // in its file, from 1
  std::string type;       // "worker-exit"
  int64_t unix_ms = 0;    // wall clock of the writer's host
  int64_t mono_ms = 0;    // its monotonic clock (only differences within one file mean anything)
  int node = 0;           // the writer's node rank
  std::string host;
  std::map<std::string, Value, std::less<>> fields;

  /// A field's value, or `fallback` when it is missing or of another type.
  int64_t Int(std::string_view key, int64_t fallback = -1) const;
  bool Flag(std::string_view key) const;
  std::string Text(std::string_view key) const;
  std::vector<int64_t> Ints(std::string_view key) const;
  std::vector<std::string> Texts(std::string_view key) const;
};

/// One agent's file.
struct EventFile {
  std::string path;                  // as the user named it, for messages
  std::vector<EventRecord> records;  // in file order
  bool truncated = false;            // the writer reached its bound
  std::string torn;                  // a last line cut by a crash, skipped: why ("" none)
};

/// Parses one file's text. Every line must be a JSON object with the common fields of the
/// right types, else the error is "path:line: what is wrong". Only a last line without its
/// newline (a write cut by a crash) is forgiven: it is skipped and said in `torn`. Records of
/// types this reader does not know are kept (a newer writer's); the timeline ignores them.
Result<EventFile> ParseEventFile(std::string path, std::string_view text);

/// The files of one run of a job: those whose records overlap in time (and agree on the job
/// and its fingerprint), in the order of their first record.
struct Run {
  std::string job;
  std::string fingerprint;
  int64_t first_unix_ms = 0;
  int64_t last_unix_ms = 0;
  std::vector<const EventFile*> files;
};

/// Groups `files` into runs, oldest first. A file without an "agent-start" first record is an
/// error ("path:1: ...").
Result<std::vector<Run>> GroupRuns(const std::vector<EventFile>& files);

}  // namespace ddprun::report
