#include "report/event_log.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/byte_size.h"

namespace ddprun::report {

std::string EventFileName(int node_rank) { return fmt::format("events-node{}.jsonl", node_rank); }

bool IsEventFileName(std::string_view name) {
  constexpr std::string_view kPrefix = "events-node";
  constexpr std::string_view kSuffix = ".jsonl";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return false;
  const std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  return !digits.empty() &&
         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

namespace {

// The tags of packed fields (EventRecord::fields_).
constexpr char kInt = 'i';
constexpr char kFalse = 'f';
constexpr char kTrue = 't';
constexpr char kText = 's';
constexpr char kInts = 'I';
constexpr char kTexts = 'S';

void PutVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

uint64_t GetVarint(const char*& p) {
  uint64_t value = 0;
  for (int shift = 0;; shift += 7) {
    const auto byte = static_cast<unsigned char>(*p++);
    value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return value;
  }
}

// Small negative numbers (-1: "none") stay one byte.
void PutInt(std::string& out, int64_t value) {
  PutVarint(out, (static_cast<uint64_t>(value) << 1) ^ static_cast<uint64_t>(value >> 63));
}

int64_t GetInt(const char*& p) {
  const uint64_t zigzag = GetVarint(p);
  return static_cast<int64_t>(zigzag >> 1) ^ -static_cast<int64_t>(zigzag & 1);
}

void PutText(std::string& out, std::string_view text) {
  PutVarint(out, text.size());
  out += text;
}

std::string GetText(const char*& p) {
  const auto size = static_cast<size_t>(GetVarint(p));
  std::string text(p, size);
  p += size;
  return text;
}

/// The byte after the value of tag `tag` that starts at `p`.
const char* Skip(char tag, const char* p) {
  if (tag == kInt) {
    GetVarint(p);
  } else if (tag == kText) {
    p += GetVarint(p);
  } else if (tag == kInts || tag == kTexts) {
    for (uint64_t n = GetVarint(p); n > 0; --n) {
      if (tag == kInts) {
        GetVarint(p);
      } else {
        p += GetVarint(p);
      }
    }
  }
  return p;
}

/// Bytes that `text` allocated beyond its own object (none while it fits inside it).
size_t HeapBytes(const std::string& text) {
  static const size_t kInline = std::string().capacity();
  return text.capacity() > kInline ? text.capacity() + 1 : 0;
}

}  // namespace

void EventRecord::Set(std::string_view key, const Value& value) {
  DDPRUN_ASSERT(key.size() <= kMaxKeyBytes);
  fields_ += static_cast<char>(key.size());
  fields_ += key;
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          fields_ += kInt;
          PutInt(fields_, v);
        } else if constexpr (std::is_same_v<T, bool>) {
          fields_ += v ? kTrue : kFalse;
        } else if constexpr (std::is_same_v<T, std::string>) {
          fields_ += kText;
          PutText(fields_, v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          fields_ += kInts;
          PutVarint(fields_, v.size());
          for (const int64_t item : v) PutInt(fields_, item);
        } else {
          fields_ += kTexts;
          PutVarint(fields_, v.size());
          for (const std::string& item : v) PutText(fields_, item);
        }
      },
      value);
}

const char* EventRecord::Find(std::string_view key, char* tag) const {
  const char* p = fields_.data();
  const char* end = p + fields_.size();
  while (p < end) {
    const auto size = static_cast<unsigned char>(*p++);
    const std::string_view name(p, size);
    p += size;
    *tag = *p++;
    if (name == key) return p;
    p = Skip(*tag, p);
  }
  return nullptr;
}

size_t EventRecord::Footprint() const { return sizeof(EventRecord) + HeapBytes(type) + HeapBytes(fields_); }

int64_t EventRecord::Int(std::string_view key, int64_t fallback) const {
  char tag = 0;
  const char* p = Find(key, &tag);
  return p && tag == kInt ? GetInt(p) : fallback;
}

bool EventRecord::Flag(std::string_view key) const {
  char tag = 0;
  return Find(key, &tag) && tag == kTrue;
}

std::string EventRecord::Text(std::string_view key) const {
  char tag = 0;
  const char* p = Find(key, &tag);
  return p && tag == kText ? GetText(p) : "";
}

std::vector<int64_t> EventRecord::Ints(std::string_view key) const {
  char tag = 0;
  const char* p = Find(key, &tag);
  std::vector<int64_t> out;
  if (!p || tag != kInts) return out;
  for (uint64_t n = GetVarint(p); n > 0; --n) out.push_back(GetInt(p));
  return out;
}

std::vector<std::string> EventRecord::Texts(std::string_view key) const {
  char tag = 0;
  const char* p = Find(key, &tag);
  std::vector<std::string> out;
  if (!p || tag != kTexts) return out;
  for (uint64_t n = GetVarint(p); n > 0; --n) out.push_back(GetText(p));
  return out;
}

namespace {

using Json = nlohmann::json;

// A field's JSON value as a record value: integers, booleans, strings, and arrays of integers
// or of strings (an empty array reads as integers). Anything else is an error.
Result<EventRecord::Value> ValueOf(const Json& value) {
  if (value.is_boolean()) return EventRecord::Value(value.get<bool>());
  if (value.is_number_integer()) return EventRecord::Value(value.get<int64_t>());
  if (value.is_string()) return EventRecord::Value(value.get<std::string>());
  if (value.is_array()) {
    if (std::all_of(value.begin(), value.end(), [](const Json& v) { return v.is_number_integer(); })) {
      std::vector<int64_t> out;
      for (const Json& v : value) out.push_back(v.get<int64_t>());
      return EventRecord::Value(std::move(out));
    }
    if (std::all_of(value.begin(), value.end(), [](const Json& v) { return v.is_string(); })) {
      std::vector<std::string> out;
      for (const Json& v : value) out.push_back(v.get<std::string>());
      return EventRecord::Value(std::move(out));
    }
    return Fail("an array that is neither all integers nor all strings");
  }
  return Fail(fmt::format("a {}, not an integer, boolean, string or array", value.type_name()));
}

/// The record of one line, and in `host` the writer's host name the line gives.
Result<EventRecord> ParseLine(std::string_view line, std::string& host) {
  const Json json = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Fail("not JSON");
  if (!json.is_object()) return Fail(fmt::format("a JSON {}, not an object", json.type_name()));
  EventRecord record;
  auto integer = [&](const char* key, int64_t& out) -> Status {
    auto it = json.find(key);
    if (it == json.end()) return Fail(fmt::format("no \"{}\"", key));
    if (!it->is_number_integer()) return Fail(fmt::format("\"{}\" is not an integer", key));
    out = it->get<int64_t>();
    return {};
  };
  int64_t version = 0;
  if (Status s = integer("v", version); !s) return Fail(s.error());
  if (version > kEventLogVersion || version < 1) {
    return Fail(fmt::format("format version {}; this ddprun reads version {} (a newer ddprun wrote it?)",
                            version, kEventLogVersion));
  }
  auto event = json.find("event");
  if (event == json.end()) return Fail("no \"event\"");
  if (!event->is_string() || event->get<std::string>().empty())
    return Fail("\"event\" is not a non-empty string");
  record.type = event->get<std::string>();
  if (Status s = integer("unix_ms", record.unix_ms); !s) return Fail(s.error());
  if (Status s = integer("mono_ms", record.mono_ms); !s) return Fail(s.error());
  int64_t node = 0;
  if (Status s = integer("node", node); !s) return Fail(s.error());
  if (node < 0 || node > 1'000'000) return Fail(fmt::format("\"node\" {} is out of range", node));
  record.node = static_cast<int>(node);
  auto host_field = json.find("host");
  if (host_field == json.end() || !host_field->is_string())
    return Fail("\"host\" is missing or not a string");
  host = host_field->get<std::string>();
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& key = it.key();
    if (key == "v" || key == "event" || key == "unix_ms" || key == "mono_ms" || key == "node" ||
        key == "host")
      continue;
    if (key.size() > EventRecord::kMaxKeyBytes) {
      return Fail(fmt::format("a field name longer than {} bytes", EventRecord::kMaxKeyBytes));
    }
    auto value = ValueOf(it.value());
    if (!value) return Fail(fmt::format("\"{}\" is {}", key, value.error()));
    record.Set(key, *value);
  }
  record.Shrink();
  return record;
}

}  // namespace

EventFileParser::EventFileParser(std::string path, size_t max_held_bytes) : max_held_bytes_(max_held_bytes) {
  file_.path = std::move(path);
}

Status EventFileParser::Feed(std::string_view text) {
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    if (newline == std::string_view::npos) {
      if (partial_.size() + text.size() > kMaxLineBytes) {
        return Fail(fmt::format("{}:{}: a line longer than {}", file_.path, line_number_ + 1,
                                ByteSize(kMaxLineBytes)));
      }
      partial_ += text;
      return {};
    }
    Status parsed;
    if (partial_.empty()) {
      parsed = Line(text.substr(0, newline), true);
    } else {
      partial_ += text.substr(0, newline);
      parsed = Line(partial_, true);
      partial_.clear();
    }
    if (!parsed) return parsed;
    text.remove_prefix(newline + 1);
  }
  return {};
}

Status EventFileParser::Line(std::string_view line, bool complete) {
  ++line_number_;
  if (line.size() > kMaxLineBytes) {
    return Fail(
        fmt::format("{}:{}: a line longer than {}", file_.path, line_number_, ByteSize(kMaxLineBytes)));
  }
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.find_first_not_of(" \t") == std::string_view::npos) return {};
  std::string host;
  auto record = ParseLine(line, host);
  if (!record) {
    if (!complete) {
      // The writer's last write(2) was cut (a crash, a full disk): the lines before stand.
      file_.torn = fmt::format("{}:{}: the last line is incomplete ({}); skipped", file_.path, line_number_,
                               record.error());
      return {};
    }
    return Fail(fmt::format("{}:{}: {}", file_.path, line_number_, record.error()));
  }
  record->line = line_number_;
  if (file_.records.empty()) file_.host = std::move(host);
  if (record->type == "truncated") file_.truncated = true;
  file_.held_bytes += record->Footprint();
  if (file_.held_bytes > max_held_bytes_) {
    return Fail(
        fmt::format("{}:{}: the event files read so far take more than {} in memory, the most ddprun "
                    "holds; pass a folder with fewer of them (one job's, or one run's)",
                    file_.path, line_number_, ByteSize(max_held_bytes_)));
  }
  file_.records.push_back(*std::move(record));
  return {};
}

Result<EventFile> EventFileParser::Finish() && {
  if (!partial_.empty()) {
    if (Status last = Line(partial_, false); !last) return Fail(last.error());
  }
  if (file_.records.empty()) return Fail(fmt::format("{}: no records", file_.path));
  return std::move(file_);
}

Result<EventFile> ParseEventFile(std::string path, std::string_view text) {
  EventFileParser parser(std::move(path), std::numeric_limits<size_t>::max());
  if (Status fed = parser.Feed(text); !fed) return Fail(fed.error());
  return std::move(parser).Finish();
}

Result<std::vector<Run>> GroupRuns(const std::vector<EventFile>& files) {
  std::vector<const EventFile*> sorted;
  for (const EventFile& file : files) {
    const EventRecord& first = file.records.front();
    if (first.type != "agent-start") {
      return Fail(
          fmt::format("{}:{}: the first record is \"{}\", not \"agent-start\" (not the start of an "
                      "agent's log)",
                      file.path, first.line, first.type));
    }
    sorted.push_back(&file);
  }
  std::stable_sort(sorted.begin(), sorted.end(), [](const EventFile* a, const EventFile* b) {
    return a->records.front().unix_ms < b->records.front().unix_ms;
  });
  // A file belongs to the run it overlaps: its agent started before the run's last record.
  std::vector<Run> runs;
  for (const EventFile* file : sorted) {
    const EventRecord& first = file->records.front();
    const std::string job = first.Text("job");
    const std::string fingerprint = first.Text("fingerprint");
    Run* run = nullptr;
    for (Run& r : runs) {
      if (r.job == job && r.fingerprint == fingerprint && first.unix_ms <= r.last_unix_ms) run = &r;
    }
    if (!run) {
      runs.push_back(Run{job, fingerprint, first.unix_ms, first.unix_ms, {}});
      run = &runs.back();
    }
    run->files.push_back(file);
    run->last_unix_ms = std::max(run->last_unix_ms, file->records.back().unix_ms);
  }
  return runs;
}

}  // namespace ddprun::report
