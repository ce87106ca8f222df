#include "report/event_log.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ddprun::report {

std::string EventFileName(int node_rank) { return fmt::format("events-node{}.jsonl", node_rank); }

bool IsEventFileName(std::string_view name) {
  constexpr std::string_view kPrefix = "events-node";
  constexpr std::string_view kSuffix = ".jsonl";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return false;
  const std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  return !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

int64_t EventRecord::Int(std::string_view key, int64_t fallback) const {
  auto it = fields.find(key);
  if (it == fields.end()) return fallback;
  const auto* value = std::get_if<int64_t>(&it->second);
  return value ? *value : fallback;
}

bool EventRecord::Flag(std::string_view key) const {
  auto it = fields.find(key);
  if (it == fields.end()) return false;
  const auto* value = std::get_if<bool>(&it->second);
  return value && *value;
}

std::string EventRecord::Text(std::string_view key) const {
  auto it = fields.find(key);
  if (it == fields.end()) return "";
  const auto* value = std::get_if<std::string>(&it->second);
  return value ? *value : "";
}

std::vector<int64_t> EventRecord::Ints(std::string_view key) const {
  auto it = fields.find(key);
  if (it == fields.end()) return {};
  const auto* value = std::get_if<std::vector<int64_t>>(&it->second);
  return value ? *value : std::vector<int64_t>{};
}

std::vector<std::string> EventRecord::Texts(std::string_view key) const {
  auto it = fields.find(key);
  if (it == fields.end()) return {};
  const auto* value = std::get_if<std::vector<std::string>>(&it->second);
  return value ? *value : std::vector<std::string>{};
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

Result<EventRecord> ParseLine(std::string_view line) {
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
    return Fail(fmt::format("format version {}; this ddprun reads version {} (a newer ddprun wrote it?)", version,
                            kEventLogVersion));
  }
  auto event = json.find("event");
  if (event == json.end()) return Fail("no \"event\"");
  if (!event->is_string() || event->get<std::string>().empty()) return Fail("\"event\" is not a non-empty string");
  record.type = event->get<std::string>();
  if (Status s = integer("unix_ms", record.unix_ms); !s) return Fail(s.error());
  if (Status s = integer("mono_ms", record.mono_ms); !s) return Fail(s.error());
  int64_t node = 0;
  if (Status s = integer("node", node); !s) return Fail(s.error());
  if (node < 0 || node > 1'000'000) return Fail(fmt::format("\"node\" {} is out of range", node));
  record.node = static_cast<int>(node);
  auto host = json.find("host");
  if (host == json.end() || !host->is_string()) return Fail("\"host\" is missing or not a string");
  record.host = host->get<std::string>();
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& key = it.key();
    if (key == "v" || key == "event" || key == "unix_ms" || key == "mono_ms" || key == "node" || key == "host") continue;
    auto value = ValueOf(it.value());
    if (!value) return Fail(fmt::format("\"{}\" is {}", key, value.error()));
    record.fields.emplace(key, *std::move(value));
  }
  return record;
}

}  // namespace

Result<EventFile> ParseEventFile(std::string path, std::string_view text) {
  EventFile file;
  file.path = std::move(path);
  int line_number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    ++line_number;
    const size_t newline = text.find('\n', pos);
    const bool complete = newline != std::string_view::npos;
    std::string_view line = text.substr(pos, complete ? newline - pos : std::string_view::npos);
    pos = complete ? newline + 1 : text.size();
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
      if (complete) continue;
      break;
    }
    auto record = ParseLine(line);
    if (!record) {
      if (!complete) {
        // The writer's last write(2) was cut (a crash, a full disk): the lines before stand.
        file.torn = fmt::format("{}:{}: the last line is incomplete ({}); skipped", file.path, line_number,
                                record.error());
        break;
      }
      return Fail(fmt::format("{}:{}: {}", file.path, line_number, record.error()));
    }
    record->line = line_number;
    if (record->type == "truncated") file.truncated = true;
    file.records.push_back(*std::move(record));
  }
  if (file.records.empty()) return Fail(fmt::format("{}: no records", file.path));
  return file;
}

Result<std::vector<Run>> GroupRuns(const std::vector<EventFile>& files) {
  std::vector<const EventFile*> sorted;
  for (const EventFile& file : files) {
    const EventRecord& first = file.records.front();
    if (first.type != "agent-start") {
      return Fail(fmt::format("{}:{}: the first record is \"{}\", not \"agent-start\" (not the start of an "
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
