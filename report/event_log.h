#pragma once
// Reading a real run's event log (docs/report.md): one JSON-lines file per agent,
// events-node<k>.jsonl in that agent's run folder. The writer is runner/io/event_file.h, fed by
// runner/host/event_recorder.h; this side parses the text, checks every line, and groups the
// files of one run. Pure: the CLI reads the files and hands over their text, a piece at a time.

#include <cstddef>
#include <cstdint>
#include <deque>
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

/// One record as read: the fields every record has, and the rest by name. A long run's files
/// hold millions of records, so the rest are kept packed in one string (see `Set`), about as
/// large as their JSON, rather than as a map of values ten times that.
struct EventRecord {
  using Value = std::variant<int64_t, bool, std::string, std::vector<int64_t>, std::vector<std::string>>;
  int line = 0;         // in its file, from 1
  std::string type;     // "worker-exit"
  int64_t unix_ms = 0;  // wall clock of the writer's host
  int64_t mono_ms = 0;  // its monotonic clock (only differences within one file mean anything)
  int node = 0;         // the writer's node rank (its host name is the file's, EventFile::host)

  /// A field's value, or `fallback` when it is missing or of another type.
  int64_t Int(std::string_view key, int64_t fallback = -1) const;
  bool Flag(std::string_view key) const;
  std::string Text(std::string_view key) const;
  std::vector<int64_t> Ints(std::string_view key) const;
  std::vector<std::string> Texts(std::string_view key) const;

  /// Adds the field `key` (at most kMaxKeyBytes, not set yet) with `value`.
  void Set(std::string_view key, const Value& value);
  static constexpr size_t kMaxKeyBytes = 255;
  /// Gives back what the fields' string reserved beyond its text (after the last Set).
  void Shrink() { fields_.shrink_to_fit(); }
  /// The bytes this record takes in memory: its own and those its strings allocated.
  size_t Footprint() const;

 private:
  /// Where `key`'s value starts in fields_, and its tag; nullptr when there is no such field.
  const char* Find(std::string_view key, char* tag) const;

  /// Each field in turn: the key's length (1 byte), the key, a tag (1 byte), then the value:
  /// an integer as a zigzag varint, a boolean in the tag alone, a string as its length (varint)
  /// and its bytes, an array as its count (varint) and its items.
  std::string fields_;
};

/// One agent's file.
struct EventFile {
  std::string path;                 // as the user named it, for messages
  std::string host;                 // the writer's host name, as every record says it
  std::deque<EventRecord> records;  // in file order (a deque: no copy of them all as it grows)
  bool truncated = false;           // the writer reached its bound
  std::string torn;                 // a last line cut by a crash, skipped: why ("" none)
  size_t held_bytes = 0;            // what the records take in memory (their Footprint()s)
};

/// Reads one file's text a piece at a time, so that a caller never holds the text: each line is
/// parsed once it is complete, and only its record is kept. Every line must be a JSON object
/// with the common fields of the right types, else the error is "path:line: what is wrong".
/// Only a last line without its newline (a write cut by a crash) is forgiven: it is skipped and
/// said in `torn`. Records of types this reader does not know are kept (a newer writer's); the
/// timeline ignores them.
class EventFileParser {
 public:
  /// A line is at most this long (the writer's longest, a job's summary, is far shorter).
  static constexpr size_t kMaxLineBytes = size_t{4} << 20;

  /// `path` names the file in messages; its records may take up to `max_held_bytes` in memory.
  EventFileParser(std::string path, size_t max_held_bytes);
  /// The next piece of the text; lines may span pieces.
  Status Feed(std::string_view text);
  /// The file, once its last piece was fed.
  Result<EventFile> Finish() &&;

 private:
  Status Line(std::string_view line, bool complete);

  EventFile file_;
  size_t max_held_bytes_;
  std::string partial_;  // the start of a line whose end has not come yet
  int line_number_ = 0;
};

/// A whole file's text at once, with no bound on what its records take.
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
