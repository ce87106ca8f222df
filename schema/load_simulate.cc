// [simulate] and [[simulate.faults]]: only read by `ddprun --simulate`. Fault keys are checked
// by schema/faults.h, the same code that checks the --fault flag.
#include <algorithm>

#include <fmt/format.h>

#include "schema/sections.h"

namespace ddprun {
namespace {

constexpr std::string_view kMissingAtHint = "e.g. at = \"40m\" (virtual time since the start)";

// `kind`: the fault's kind, or nullptr when it is missing or unknown (reported).
const FaultKindSpec* LoadFaultKind(const toml::table& table, const std::string& prefix, TomlReader& reader) {
  const toml::node* node = reader.Node(&table, "kind", prefix + ".kind");
  if (!node) {
    reader.Missing(&table, prefix + ".kind", "e.g. kind = \"node-crash\"");
    return nullptr;
  }
  auto name = reader.String(*node, prefix + ".kind");
  if (!name) return nullptr;
  if (auto kind = ParseFaultKind(*name)) return &FaultKindSpecOf(*kind);
  reader.diags().Error(LocOf(*node), prefix + ".kind", fmt::format("unknown fault kind {}", Show(*node)),
                       fmt::format("known kinds: {}", KnownFaultKinds()));
  return nullptr;
}

// The value of fault key `key` as the table types it, in range for the job.
std::optional<FaultValue> LoadFaultValue(const toml::node& node, const std::string& path,
                                         std::string_view key, FaultBounds bounds, TomlReader& reader) {
  const IntRange range = FaultKeyRange(key, bounds);
  switch (Key(Dotted("simulate.faults", key)).type) {
    case KeyType::kInteger:
      if (auto n = reader.Integer(node, path, range)) return FaultValue{*n};
      return std::nullopt;
    case KeyType::kDuration:
      if (auto d = reader.DurationValue(node, path)) return FaultValue{*d};
      return std::nullopt;
    case KeyType::kIntegerArray: {
      const toml::array* array = node.as_array();
      if (!array) {
        reader.TypeError(node, path, "an array of node ranks", "e.g. peers = [0]");
        return std::nullopt;
      }
      std::vector<int> ranks;
      bool ok = true;
      for (size_t i = 0; i < array->size(); ++i) {
        if (auto n = reader.Integer(*array->get(i), fmt::format("{}[{}]", path, i), range)) {
          ranks.push_back(static_cast<int>(*n));
        } else {
          ok = false;
        }
      }
      if (!ok) return std::nullopt;
      return FaultValue{std::move(ranks)};
    }
    default:
      break;
  }
  return std::nullopt;
}

// One [[simulate.faults]] table; nullopt when anything in it is wrong (all of it reported).
std::optional<FaultSpec> LoadFault(const toml::table& table, const std::string& prefix, FaultBounds bounds,
                                   TomlReader& reader) {
  reader.CheckKeys(table, SectionNamed("simulate.faults"), prefix);
  FaultSpec fault;
  const FaultKindSpec* kind = LoadFaultKind(table, prefix, reader);
  bool ok = kind != nullptr;
  if (kind) fault.kind = kind->kind;
  if (const toml::node* node = reader.Node(&table, "at", prefix + ".at")) {
    if (auto at = reader.DurationValue(*node, prefix + ".at")) {
      fault.at = *at;
    } else {
      ok = false;
    }
  } else {
    reader.Missing(&table, prefix + ".at", std::string(kMissingAtHint));
    ok = false;
  }
  for (auto&& [key, node] : table) {
    const std::string name(key.str());
    const std::string path = prefix + "." + name;
    reader.Record(path, node);
    if (name == "at" || name == "kind") continue;
    const FaultKeyUse use = UseOfFaultKey(kind, name);
    if (use == FaultKeyUse::kUnknown) continue;  // CheckKeys reported it
    if (use == FaultKeyUse::kNotForKind) {
      reader.diags().Error(LocOf(key.source()), path,
                           fmt::format("{} does not apply to a fault of kind \"{}\"", path, kind->name),
                           FaultKeysHint(*kind));
      ok = false;
      continue;
    }
    if (auto value = LoadFaultValue(node, path, name, bounds, reader)) {
      SetFaultKey(fault, name, std::move(*value));
    } else {
      ok = false;
    }
  }
  if (ok && std::find(fault.peers.begin(), fault.peers.end(), fault.node) != fault.peers.end()) {
    reader.diags().Error(reader.LocationOf(prefix + ".peers"), prefix + ".peers",
                         fmt::format("{}.peers contains node {}, the node it cuts off", prefix, fault.node));
    ok = false;
  }
  if (!ok) return std::nullopt;
  return fault;
}

void LoadFaults(const toml::node& faults, TomlReader& reader, FaultBounds bounds,
                std::vector<FaultSpec>& out) {
  const toml::array* array = faults.as_array();
  if (!array) {
    reader.TypeError(faults, "simulate.faults", "an array of tables",
                     "write each fault as a [[simulate.faults]] section");
    return;
  }
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string path = fmt::format("simulate.faults[{}]", i);
    const toml::node& item = *array->get(i);
    reader.Record(path, item);
    const toml::table* table = item.as_table();
    if (!table) {
      reader.TypeError(item, path, "a table", "write each fault as a [[simulate.faults]] section");
      continue;
    }
    if (auto fault = LoadFault(*table, path, bounds, reader)) out.push_back(*fault);
  }
}

}  // namespace

void LoadSimulate(const toml::table& root, TomlReader& reader, FaultBounds bounds, JobSpec::Simulate& s) {
  const toml::table* table = reader.Table(root, "simulate", "simulate");
  if (!table) return;
  reader.CheckKeys(*table, SectionNamed("simulate"), "simulate");
  if (const toml::node* node = reader.Node(table, "seed", "simulate.seed")) {
    if (auto seed = reader.Integer(*node, "simulate.seed", *Key("simulate.seed").range)) {
      s.seed = static_cast<uint64_t>(*seed);
    }
  }
  for (std::string_view key : {"node_mtbf", "worker_mtbf", "worker_hang_mtbf"}) {
    const std::string path = Dotted("simulate", key);
    if (const toml::node* node = reader.Node(table, key, path)) {
      if (auto d = reader.PositiveDuration(*node, path)) {
        (key == "node_mtbf" ? s.node_mtbf : key == "worker_mtbf" ? s.worker_mtbf : s.worker_hang_mtbf) = *d;
      }
    }
  }
  if (const toml::node* node =
          reader.Node(table, "node_never_returns_percent", "simulate.node_never_returns_percent")) {
    if (auto n = reader.Integer(*node, "simulate.node_never_returns_percent",
                                *Key("simulate.node_never_returns_percent").range)) {
      s.node_never_returns_percent = static_cast<int>(*n);
      if (*n > 0 && !s.node_mtbf) {
        reader.diags().Error(LocOf(*node), "simulate.node_never_returns_percent",
                             "simulate.node_never_returns_percent is a share of the random node "
                             "crashes, but simulate.node_mtbf is not set",
                             "set simulate.node_mtbf, e.g. node_mtbf = \"30d\"");
      }
    }
  }
  reader.ReadDuration(table, "train_time", "simulate", s.train_time);
  // A zero start-up time is a valid model; a zero period or time limit is not.
  for (std::string_view key : {"checkpoint_every", "worker_startup", "max_time", "step_time"}) {
    const std::string path = Dotted("simulate", key);
    const toml::node* node = reader.Node(table, key, path);
    if (!node) continue;
    auto d =
        key == "worker_startup" ? reader.DurationValue(*node, path) : reader.PositiveDuration(*node, path);
    if (!d) continue;
    if (key == "checkpoint_every") s.checkpoint_every = *d;
    if (key == "worker_startup") s.worker_startup = *d;
    if (key == "max_time") s.max_time = *d;
    if (key == "step_time") s.step_time = *d;
  }
  if (const toml::node* node = reader.Node(table, "sigterm", "simulate.sigterm")) {
    using Sigterm = JobSpec::Simulate::Sigterm;
    reader.ReadChoice(
        *node, "simulate.sigterm",
        std::array{std::pair{std::string_view("auto"), Sigterm::kAuto},
                   std::pair{std::string_view("exits"), Sigterm::kExits},
                   std::pair{std::string_view("ignored"), Sigterm::kIgnored}},
        "\"exits\" for a plain PyTorch script, \"ignored\" for Lightning (its SIGTERM handler only "
        "sets a flag)",
        s.sigterm);
  }
  if (const toml::node* faults = reader.Node(table, "faults", "simulate.faults")) {
    LoadFaults(*faults, reader, bounds, s.faults);
  }
}

}  // namespace ddprun
