#include "schema/toml_access.h"

#include <algorithm>

#include <fmt/format.h>

namespace ddprun {
namespace {

std::string JoinNames(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

bool Contains(std::span<const std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Sections where a stray key may belong: [[simulate.faults]] entries are not a place one moves
// a key to, so hints never send a key there.
bool IsHomeForStrayKeys(const SectionSpec& section, std::string_view here) {
  return !section.name.empty() && section.name != here && section.name.find('.') == std::string_view::npos;
}

// The section (other than `here`) that defines `key`, for keys written in the wrong table.
std::optional<std::string_view> SectionOf(std::string_view key, std::string_view here) {
  for (const SectionSpec& section : Sections()) {
    if (IsHomeForStrayKeys(section, here) && Contains(section.known_names, key)) {
      return section.name;
    }
  }
  return std::nullopt;
}

// A key of another section close to `key` ("nmae" -> "job.name"), for keys that are both
// misspelt and misplaced. [trainer] is left out: its 40 names would match too much.
std::optional<std::string> NearKeyElsewhere(std::string_view key, std::string_view here) {
  for (const SectionSpec& section : Sections()) {
    if (!IsHomeForStrayKeys(section, here) || section.open) continue;
    if (auto close = ClosestName(key, section.known_names)) return Dotted(section.name, *close);
  }
  return std::nullopt;
}

}  // namespace

SourceLoc LocOf(const toml::source_region& region) { return {region.begin.line, region.begin.column}; }

SourceLoc LocOf(const toml::node& node) { return LocOf(node.source()); }

std::string TypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::string Show(const toml::node& node) {
  if (auto s = node.value_exact<std::string>()) {
    std::string text = s->size() > 40 ? s->substr(0, 40) + "..." : *s;
    return fmt::format("\"{}\"", text);
  }
  if (auto i = node.value_exact<int64_t>()) return fmt::format("{}", *i);
  if (auto d = node.value_exact<double>()) return fmt::format("{}", *d);
  if (auto b = node.value_exact<bool>()) return *b ? "true" : "false";
  return TypeName(node);
}

std::string Dotted(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
}

std::string_view LastKey(std::string_view path) {
  const size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

std::optional<size_t> TomlReader::ChoiceIndex(const toml::node& node, const std::string& path,
                                              std::span<const std::string_view> choices, std::string hint) {
  const std::optional<std::string> value = String(node, path);
  if (!value) return std::nullopt;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (*value == choices[i]) return i;
  }
  diags_.Error(LocOf(node), path,
               fmt::format("{} = {} is not {}", path, Show(node), QuotedAlternatives(choices)),
               std::move(hint));
  return std::nullopt;
}

SourceLoc TomlReader::LocationOf(const std::string& path) const {
  auto it = locations_.find(path);
  return it == locations_.end() ? SourceLoc{} : it->second;
}

void TomlReader::Record(const std::string& path, const toml::node& node) { locations_[path] = LocOf(node); }

void TomlReader::TypeError(const toml::node& node, const std::string& path, std::string_view expected,
                           std::string hint) {
  diags_.Error(LocOf(node), path, fmt::format("{} must be {}, not {}", path, expected, TypeName(node)),
               std::move(hint));
}

void TomlReader::Missing(const toml::table* table, const std::string& path, std::string hint) {
  diags_.Error(table ? LocOf(*table) : SourceLoc{}, path, fmt::format("missing required key `{}`", path),
               std::move(hint));
}

void TomlReader::CheckKeys(const toml::table& table, const SectionSpec& section, std::string_view prefix) {
  const auto allowed = section.known_names;
  for (auto&& [key, node] : table) {
    if (Contains(allowed, key.str())) continue;
    // A key of any length may be written; messages show a bounded one.
    const std::string shown = ShownName(key.str());
    const std::string_view name = shown;
    const bool table_header = prefix.empty() && node.is_table();
    std::string hint;
    if (auto close = ClosestName(name, allowed)) {
      hint = table_header ? fmt::format("did you mean [{}]?", *close)
                          : fmt::format("did you mean `{}`?", *close);
    } else if (auto home = SectionOf(name, section.name); home && table_header) {
      // `[rendezvous]`: a section header named after a key; `timeouts.rendezvous` would read
      // as a table name too, so say where the key goes instead.
      hint = fmt::format(
          "there is no [{}] table; `{}` is a key of [{}]: write `{} = ...` "
          "under [{}]",
          name, name, *home, name, *home);
    } else if (home) {
      hint = fmt::format("`{}` belongs in [{}]: did you mean `{}.{}`?", name, *home, *home, name);
    } else if (auto near = NearKeyElsewhere(name, section.name)) {
      hint = fmt::format("did you mean `{}`?", *near);
    } else {
      hint = fmt::format("known keys{}: {}",
                         prefix.empty() ? std::string(" at the top level") : fmt::format(" in [{}]", prefix),
                         JoinNames(allowed));
      // [rendezvous] timeout = ...: the table exists (the etcd backend), but the rendezvous
      // timeout is a key of [timeouts].
      if (auto key_home = SectionOf(section.name, section.name); key_home && !prefix.empty()) {
        hint += fmt::format("; `{}` is also a key of [{}]: `{}.{}`", section.name, *key_home, *key_home,
                            section.name);
      }
    }
    diags_.Error(LocOf(key.source()), Dotted(prefix, name),
                 table_header ? fmt::format("unknown table [{}]", name)
                              : fmt::format("unknown key `{}`", Dotted(prefix, name)),
                 std::move(hint));
  }
}

const toml::table* TomlReader::Table(const toml::table& parent, std::string_view key,
                                     const std::string& path) {
  const toml::node* node = parent.get(key);
  if (!node) return nullptr;
  Record(path, *node);
  if (!node->is_table()) {
    TypeError(*node, path, "a table", fmt::format("write it as a section: [{}]", path));
    return nullptr;
  }
  return node->as_table();
}

const toml::node* TomlReader::Node(const toml::table* table, std::string_view key, const std::string& path) {
  if (!table) return nullptr;
  const toml::node* node = table->get(key);
  if (node) Record(path, *node);
  return node;
}

std::optional<int64_t> TomlReader::Integer(const toml::node& node, const std::string& path, IntRange range) {
  auto value = node.value_exact<int64_t>();
  if (!value) {
    std::string hint;
    if (auto s = node.value_exact<std::string>()) {
      const bool integer_text = !s->empty() && s->size() <= 19 &&
                                std::all_of(s->begin() + (s->front() == '-' ? 1 : 0), s->end(),
                                            [](char c) { return c >= '0' && c <= '9'; }) &&
                                *s != "-";
      if (integer_text) {
        hint = fmt::format("write the number without quotes: {} = {}", LastKey(path), *s);
      } else if (path == "cluster.nnodes" && s->find(':') != std::string::npos) {
        // torchrun's elastic MIN:MAX is ddprun's nnodes (the most) and min_nodes (the fewest).
        const std::string low = s->substr(0, s->find(':'));
        const std::string high = s->substr(s->find(':') + 1);
        const bool digits = !low.empty() && !high.empty() && low.size() <= 5 && high.size() <= 5 &&
                            low.find_first_not_of("0123456789") == std::string::npos &&
                            high.find_first_not_of("0123456789") == std::string::npos;
        hint = fmt::format(
            "nnodes is a number, not torchrun's MIN:MAX range: write nnodes = {} "
            "and min_nodes = {} (cluster.min_nodes lets rounds run with fewer "
            "nodes when some are lost)",
            digits ? high : "MAX", digits ? low : "MIN");
      }
    }
    TypeError(node, path, "an integer", std::move(hint));
    return std::nullopt;
  }
  if (!range.Contains(*value)) {
    diags_.Error(LocOf(node), path,
                 fmt::format("{} = {} is out of range ({}..{})", path, *value, range.min, range.max));
    return std::nullopt;
  }
  return value;
}

std::optional<std::string> TomlReader::String(const toml::node& node, const std::string& path,
                                              bool allow_empty) {
  auto value = node.value_exact<std::string>();
  if (!value) {
    std::string hint;
    if (node.is_integer() || node.is_floating_point() || node.is_boolean()) {
      hint = path.ends_with("]") ? fmt::format("quote it: \"{}\"", Show(node))
                                 : fmt::format("quote it: {} = \"{}\"", LastKey(path), Show(node));
    }
    TypeError(node, path, "a string", std::move(hint));
    return std::nullopt;
  }
  if (!allow_empty && value->empty()) {
    diags_.Error(LocOf(node), path, fmt::format("{} must not be empty", path));
    return std::nullopt;
  }
  return value;
}

std::optional<Duration> TomlReader::DurationValue(const toml::node& node, const std::string& path) {
  constexpr std::string_view kUnits = "units: ms, s, m, h, d; e.g. \"250ms\", \"30s\", \"15m\"";
  if (auto i = node.value_exact<int64_t>()) {
    TypeError(node, path, "a duration string", fmt::format("write \"{}s\" ({})", *i, kUnits));
    return std::nullopt;
  }
  auto text = node.value_exact<std::string>();
  if (!text) {
    TypeError(node, path, "a duration string", fmt::format("write e.g. \"30s\" ({})", kUnits));
    return std::nullopt;
  }
  auto value = ParseDuration(*text);
  if (!value) {
    diags_.Error(LocOf(node), path, fmt::format("{} = {} is not a duration", path, Show(node)),
                 fmt::format("write a number and a unit, without spaces ({})", kUnits));
    return std::nullopt;
  }
  return value;
}

std::optional<Duration> TomlReader::PositiveDuration(const toml::node& node, const std::string& path) {
  auto d = DurationValue(node, path);
  if (d && *d <= Duration::zero()) {
    diags_.Error(LocOf(node), path, fmt::format("{} must be longer than 0s", path));
    return std::nullopt;
  }
  return d;
}

void TomlReader::ReadDuration(const toml::table* table, std::string_view key, std::string_view prefix,
                              Duration& out) {
  const std::string path = Dotted(prefix, key);
  if (const toml::node* node = Node(table, key, path)) {
    if (auto d = DurationValue(*node, path)) out = *d;
  }
}

}  // namespace ddprun
