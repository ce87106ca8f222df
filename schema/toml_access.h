#pragma once
// Typed access to a parsed TOML document with diagnostics: each reader checks one value's type
// (and range, from the key table) and reports a mistake at the value's line:column, with a hint
// in the user's terms. Internal to the job file loader: this header includes toml++, which is
// heavy, so only the schema/load_*.cc files that parse include it; no header does.

#include <array>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <toml++/toml.h>

#include "schema/diagnostics.h"
#include "schema/duration.h"
#include "schema/job_spec.h"
#include "schema/keys.h"

namespace ddprun {

SourceLoc LocOf(const toml::source_region& region);
SourceLoc LocOf(const toml::node& node);

/// "an integer", "a table": the node's TOML type, for messages.
std::string TypeName(const toml::node& node);

/// The value as the user would write it, for messages (short; long values are cut).
std::string Show(const toml::node& node);

/// "cluster.nodes" from "cluster" and "nodes"; just `key` at the top level.
std::string Dotted(std::string_view prefix, std::string_view key);

/// The last component of a key path: "nodes" of "cluster.nodes".
std::string_view LastKey(std::string_view path);

/// Reads values out of the document, records where each key was written (JobSpec::locations)
/// and reports every problem to the diagnostics. One per load; the section loaders share it.
class TomlReader {
 public:
  TomlReader(Diagnostics& diagnostics, std::map<std::string, SourceLoc>& locations)
      : diags_(diagnostics), locations_(locations) {}

  Diagnostics& diags() { return diags_; }
  /// Where `path` was written; {0,0} when it was not.
  SourceLoc LocationOf(const std::string& path) const;

  void Record(const std::string& path, const toml::node& node);
  void TypeError(const toml::node& node, const std::string& path, std::string_view expected,
                 std::string hint = {});
  void Missing(const toml::table* table, const std::string& path, std::string hint);

  /// Reports keys of `table` that the key table does not know in `section` ("" for the top
  /// level), with the likeliest intended key: a typo, or a key of another section.
  void CheckKeys(const toml::table& table, const SectionSpec& section, std::string_view prefix);

  /// A sub-table; a non-table value there is an error and reads as absent.
  const toml::table* Table(const toml::table& parent, std::string_view key, const std::string& path);
  /// The node of `key` in `table` (recorded), or nullptr when absent or `table` is null.
  const toml::node* Node(const toml::table* table, std::string_view key, const std::string& path);

  std::optional<int64_t> Integer(const toml::node& node, const std::string& path, IntRange range);
  std::optional<std::string> String(const toml::node& node, const std::string& path,
                                    bool allow_empty = false);
  std::optional<Duration> DurationValue(const toml::node& node, const std::string& path);
  /// A duration that must be longer than 0s.
  std::optional<Duration> PositiveDuration(const toml::node& node, const std::string& path);
  /// A string that must be one of `choices`: the index of the one written, or empty (reported:
  /// "path = "x" is not "a", "b" or "c"", with `hint`) when it is none of them or not a string.
  std::optional<size_t> ChoiceIndex(const toml::node& node, const std::string& path,
                                    std::span<const std::string_view> choices, std::string hint);
  /// ChoiceIndex over named values: sets `out` to the value of the name written.
  template <typename E, size_t N>
  void ReadChoice(const toml::node& node, const std::string& path,
                  const std::array<std::pair<std::string_view, E>, N>& choices, std::string hint, E& out) {
    std::array<std::string_view, N> names;
    for (size_t i = 0; i < N; ++i) names[i] = choices[i].first;
    if (const std::optional<size_t> i = ChoiceIndex(node, path, names, std::move(hint)))
      out = choices[*i].second;
  }
  /// Reads the duration `prefix.key` into `out` when it is written and valid.
  void ReadDuration(const toml::table* table, std::string_view key, std::string_view prefix, Duration& out);

 private:
  Diagnostics& diags_;
  std::map<std::string, SourceLoc>& locations_;
};

}  // namespace ddprun
