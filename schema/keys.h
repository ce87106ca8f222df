#pragma once
// The one table of job file keys: for each key of each section its type, allowed range or
// values, default and a one-line description. The loader takes names and ranges from it, the
// --fault flag parser takes fault keys and ranges from it, and the JSON Schema is generated
// from it, so the three cannot disagree. No toml++ here: every layer may include this.

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "schema/job_spec.h"

namespace ddprun {

// Limits on what a job file may ask for; a limit on everything (STYLE.md rule 6).
inline constexpr int64_t kMaxNodes = 10'000;
inline constexpr int64_t kMaxProcsPerNode = 1'024;
inline constexpr int64_t kMaxRestarts = 10'000;
inline constexpr size_t kMaxNameLength = 128;

/// Both ends included. A maximum of INT64_MAX means "no maximum" in the JSON Schema.
struct IntRange {
  int64_t min = 0;
  int64_t max = std::numeric_limits<int64_t>::max();
  bool Contains(int64_t value) const { return value >= min && value <= max; }
  /// This range with its maximum lowered to `max` (a bound that depends on the job, e.g. the
  /// node ranks of a job with 2 nodes), never raised.
  IntRange Below(int64_t max_of_job) const;
  bool operator==(const IntRange&) const = default;
};

/// How a key's value is written; each type has one reader in the loader and one JSON Schema.
enum class KeyType {
  kInteger,          // `range`
  kString,           // `values` (when closed), `examples`, `max_length`
  kStringOrInteger,  // trainer.precision ("bf16-mixed" or 32)
  kDuration,         // "30s"
  kDurationOrAuto,   // "30s" or "auto" (timeouts.progress)
  kStringArray,      // `min_items`, `unique`, `nonempty_items`
  kIntegerArray,     // items in `item_range`
  kStringMap,        // job.env: names matching `pattern`, string values
  kDevices,          // a count in `range` or a list of ids in `item_range`
  kCountOrNames,     // a count in `range` or a list of host names (cluster.spares)
  kConsole,          // one of `values` or a list of ranks in `item_range`
  kSection,          // a table described by the section of the same name
  kSectionArray,     // [[name]]: tables described by the section `<section>.<name>`
};

struct KeySpec {
  std::string_view name;
  KeyType type = KeyType::kString;
  std::string_view doc;                             // one sentence or two, for the schema
  std::optional<IntRange> range = {};               // integers, device counts
  std::optional<IntRange> item_range = {};          // items of integer lists
  std::span<const std::string_view> values = {};    // the only values allowed
  std::span<const std::string_view> examples = {};  // values worth suggesting
  std::string_view default_value = {};              // as TOML would write it, unquoted
  bool required = false;
  size_t max_length = 0;          // strings: 0 = no limit
  std::string_view pattern = {};  // what a string (kStringMap: a name) looks like, a JSON
                                  // Schema regex for editors; the loader checks it in code
  size_t min_items = 0;           // arrays
  bool unique = false;            // arrays: no item twice
  bool nonempty_items = false;    // string arrays: no "" item
};

struct SectionSpec {
  std::string_view name = {};  // "" for the top level, "simulate.faults" for [[simulate.faults]]
  std::string_view doc = {};   // for [[...]] items; a [section] is described by its key's doc
  std::span<const KeySpec> keys = {};
  /// The names the loader knows here, in the order hints list them. The keys of `keys`,
  /// except for [trainer], which accepts any name and knows Lightning's Trainer arguments.
  std::span<const std::string_view> known_names = {};
  bool open = false;                                       // other names are allowed ([trainer])
  std::span<const std::string_view> any_of_required = {};  // at least one of these
};

/// Every section, the top level first, in the order the file format documents them.
std::span<const SectionSpec> Sections();

/// The section named `name`; aborts when there is none (a programmer error).
const SectionSpec& SectionNamed(std::string_view name);

/// The key at `dotted_path` ("cluster.master_port", "simulate.faults.node", "version");
/// aborts when the table has none (a programmer error).
const KeySpec& Key(std::string_view dotted_path);

/// The key `name` of `section`, or nullptr.
const KeySpec* FindKey(const SectionSpec& section, std::string_view name);

/// The allowed values of a closed string key as prose: `"off", "warn" or "refuse"`.
std::string QuotedAlternatives(std::span<const std::string_view> values);

/// What each fault kind is called in the job file and which optional keys it takes (besides
/// `at`, `kind` and `node`, which every kind takes).
struct FaultKindSpec {
  FaultKind kind;
  std::string_view name;
  std::span<const std::string_view> optional_keys;
};

/// Every fault kind, in the order messages list them.
std::span<const FaultKindSpec> FaultKinds();

/// The kebab-case name of a fault kind, as written in the job file ("node-crash").
std::string_view FaultKindName(FaultKind kind);

/// The fault kind named `name` ("worker-exit"), or nullopt.
std::optional<FaultKind> ParseFaultKind(std::string_view name);

}  // namespace ddprun
