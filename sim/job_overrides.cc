#include "sim/job_overrides.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "schema/keys.h"

namespace ddprun::sim {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The value as TOML text: numbers and arrays as written, everything else a quoted string
// (durations, names), unless the user quoted it already.
std::string TomlValue(const KeySpec* key, std::string_view value) {
  if (value.empty() || value.front() == '"' || value.front() == '[' || value == "true" || value == "false") {
    return std::string(value);
  }
  const bool number_ok = !key || key->type == KeyType::kInteger || key->type == KeyType::kCountOrNames ||
                         key->type == KeyType::kStringOrInteger || key->type == KeyType::kDevices;
  if (number_ok && AllDigits(value)) return std::string(value);
  std::string quoted = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

// The header's table name for a `[name]` line ("" when the line is no [table] header; an
// [[array]] header gives "[[").
std::string HeaderOf(std::string_view line) {
  line = Trim(line);
  if (line.size() < 3 || line.front() != '[') return "";
  if (line[1] == '[') return "[[";
  const size_t close = line.find(']');
  if (close == std::string_view::npos) return "";
  return std::string(Trim(line.substr(1, close - 1)));
}

// How far a value that starts on `line` opens brackets that later lines close (strings and
// comments skipped).
int OpenBrackets(std::string_view line) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '#') break;
    if (c == '"') in_string = true;
    if (c == '[') ++depth;
    if (c == ']') --depth;
  }
  return depth;
}

bool IsKeyLine(std::string_view line, std::string_view name) {
  line = Trim(line);
  if (line.size() <= name.size() || line.substr(0, name.size()) != name) return false;
  return Trim(line.substr(name.size())).substr(0, 1) == "=";
}

std::vector<std::string> Lines(std::string_view text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace

Result<std::string> ResolveJobKey(std::string_view key) {
  const size_t dot = key.rfind('.');
  if (dot != std::string_view::npos) {
    const std::string_view section = key.substr(0, dot);
    const std::string_view name = key.substr(dot + 1);
    for (const SectionSpec& s : Sections()) {
      if (s.name != section) continue;
      if (s.open || FindKey(s, name)) return std::string(key);
      return Fail(fmt::format("[{}] has no key \"{}\"", section, name));
    }
    return Fail(fmt::format("no section [{}] in a job file", section));
  }
  std::vector<std::string> found;
  for (const SectionSpec& s : Sections()) {
    if (s.name.empty() || s.name.find('.') != std::string_view::npos) continue;
    if (FindKey(s, key)) found.push_back(fmt::format("{}.{}", s.name, key));
  }
  if (found.size() == 1) return found.front();
  if (found.empty()) return Fail(fmt::format("no section of a job file has a key \"{}\"", key));
  return Fail(
      fmt::format("\"{}\" is a key of several sections: write one of {}", key, fmt::join(found, ", ")));
}

Result<JobOverride> ParseJobOverride(std::string_view text) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0)
    return Fail("expected key=value (for example cluster.spares=2)");
  auto key = ResolveJobKey(Trim(text.substr(0, eq)));
  if (!key) return Fail(key.error());
  const std::string_view value = Trim(text.substr(eq + 1));
  // `key=` removes the key (the shape swarm's repro lines drop a host list that way).
  return JobOverride{*key, std::string(value), value.empty()};
}

std::string FormatJobOverride(const JobOverride& change) {
  return change.remove ? change.key + "=" : change.key + "=" + change.value;
}

std::string ApplyJobOverrides(std::string_view text, const std::vector<JobOverride>& changes) {
  std::vector<std::string> lines = Lines(text);
  for (const JobOverride& change : changes) {
    const size_t dot = change.key.rfind('.');
    const std::string section = dot == std::string::npos ? "" : change.key.substr(0, dot);
    const std::string name = dot == std::string::npos ? change.key : change.key.substr(dot + 1);
    const SectionSpec* spec = nullptr;
    for (const SectionSpec& s : Sections()) {
      if (s.name == section) spec = &s;
    }
    const std::string line =
        fmt::format("{} = {}", name, TomlValue(spec ? FindKey(*spec, name) : nullptr, change.value));
    // The section's lines: from its header (the top level: from the start) to the next header.
    size_t begin = 0;
    bool have_section = section.empty();
    for (size_t i = 0; !section.empty() && i < lines.size(); ++i) {
      if (HeaderOf(lines[i]) == section) {
        begin = i + 1;
        have_section = true;
        break;
      }
    }
    if (!have_section) {
      if (change.remove) continue;
      lines.emplace_back("");
      lines.push_back(fmt::format("[{}]", section));
      lines.push_back(line);
      continue;
    }
    size_t end = begin;
    while (end < lines.size() && HeaderOf(lines[end]).empty()) ++end;
    bool done = false;
    for (size_t i = begin; i < end && !done; ++i) {
      if (!IsKeyLine(lines[i], name)) continue;
      // The value may go on over the next lines (an array): up to where its brackets close.
      size_t last = i;
      for (int depth = OpenBrackets(lines[i]); depth > 0 && last + 1 < end;)
        depth += OpenBrackets(lines[++last]);
      lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(i),
                  lines.begin() + static_cast<std::ptrdiff_t>(last + 1));
      if (!change.remove) lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), line);
      done = true;
    }
    if (!done && !change.remove) lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(begin), line);
  }
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

}  // namespace ddprun::sim
