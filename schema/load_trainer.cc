// [trainer]: Lightning Trainer defaults, forwarded to the script as PL_TRAINER_<KEY>.
#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "schema/canonical.h"
#include "schema/sections.h"
#include "schema/worker_env.h"

namespace ddprun {
namespace {

bool IsValidTrainerKey(std::string_view key) {
  if (key.empty() || key.size() > 64 || (key[0] >= '0' && key[0] <= '9')) return false;
  return std::all_of(key.begin(), key.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

std::string UpperCase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

bool IsOneOf(std::span<const std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool RenderComposite(const toml::node& node, const std::string& path, TomlReader& reader,
                     TrainerLiteral& out);

// Every TOML value but dates and times: each has a Python literal that Lightning's
// literal_eval reads back as the same type (worker_env.cc writes it).
std::optional<TrainerValue> TrainerValueOf(const toml::node& node, const std::string& path,
                                           TomlReader& reader) {
  if (auto b = node.value_exact<bool>()) return TrainerValue{*b};
  if (auto i = node.value_exact<int64_t>()) return TrainerValue{*i};
  if (auto d = node.value_exact<double>()) {
    if (!std::isfinite(*d)) {
      reader.diags().Error(LocOf(node), path, fmt::format("{} must be a finite number", path),
                           "inf and nan have no Python literal, so Lightning would read them "
                           "as strings");
      return std::nullopt;
    }
    return TrainerValue{*d};
  }
  if (auto s = node.value_exact<std::string>()) return TrainerValue{*s};
  if (const toml::array* array = node.as_array()) {
    // A list of integers keeps its own spelling (device ids).
    const bool all_ints =
        std::all_of(array->begin(), array->end(), [](const toml::node& item) { return item.is_integer(); });
    if (all_ints) {
      std::vector<int64_t> ints;
      for (const toml::node& item : *array) ints.push_back(*item.value_exact<int64_t>());
      return TrainerValue{std::move(ints)};
    }
  }
  if (node.is_array() || node.is_table()) {
    TrainerLiteral literal;
    if (!RenderComposite(node, path, reader, literal)) return std::nullopt;
    return TrainerValue{std::move(literal)};
  }
  reader.TypeError(node, path, "a boolean, number, string, array or table",
                   "[trainer] values reach the script as PL_TRAINER_* Python literals, which "
                   "have no dates or times; write it as a string");
  return std::nullopt;
}

// One item of an array or inline table, in both spellings.
bool RenderItem(const toml::node& child, const std::string& child_path, TomlReader& reader,
                std::string& python, std::string& canonical) {
  if (child.is_array() || child.is_table()) {
    TrainerLiteral nested;
    if (!RenderComposite(child, child_path, reader, nested)) return false;
    python = std::move(nested.python);
    canonical = std::move(nested.canonical);
    return true;
  }
  auto value = TrainerValueOf(child, child_path, reader);
  if (!value) return false;
  python = TrainerPythonLiteral(*value, /*top_level=*/false);
  canonical = TrainerCanonical(*value);
  return true;
}

// An array or inline table of [trainer] in both spellings, items rendered recursively (the
// depth is bounded by PreScan). Reports every bad item; false when there was one.
bool RenderComposite(const toml::node& node, const std::string& path, TomlReader& reader,
                     TrainerLiteral& out) {
  bool ok = true;
  if (const toml::array* array = node.as_array()) {
    out.python = "[";
    out.canonical = "[";
    for (size_t i = 0; i < array->size(); ++i) {
      std::string python, canonical;
      if (!RenderItem(*array->get(i), fmt::format("{}[{}]", path, i), reader, python, canonical)) {
        ok = false;
        continue;
      }
      if (i > 0) {
        out.python += ", ";
        out.canonical += ", ";
      }
      out.python += python;
      out.canonical += canonical;
    }
    out.python += "]";
    out.canonical += "]";
    return ok;
  }
  const toml::table* table = node.as_table();
  if (!table) return false;
  // toml++ tables iterate in key order, so equal tables render the same.
  out.python = "{";
  out.canonical = "{";
  bool first = true;
  for (auto&& [key, child] : *table) {
    std::string python, canonical;
    if (!RenderItem(child, fmt::format("{}.{}", path, key.str()), reader, python, canonical)) {
      ok = false;
      continue;
    }
    if (!first) {
      out.python += ", ";
      out.canonical += ", ";
    }
    first = false;
    out.python += TrainerPythonString(key.str()) + ": " + python;
    out.canonical += CanonicalQuote(key.str()) + " = " + canonical;
  }
  out.python += "}";
  out.canonical += "}";
  return ok;
}

// trainer.devices as a list of ids: each in the table's range, none twice.
void LoadDeviceIds(const toml::array& array, const SourceLoc loc, TomlReader& reader,
                   JobSpec::Trainer& trainer) {
  const KeySpec& key = Key("trainer.devices");
  const std::string path = "trainer.devices";
  if (array.size() < key.min_items || array.size() > static_cast<size_t>(key.range->max)) {
    reader.diags().Error(loc, path, "trainer.devices must list at least one device id",
                         "e.g. devices = [0, 1]");
    return;
  }
  std::vector<int64_t> ids;
  std::map<int64_t, SourceLoc> seen;
  bool ok = true;
  for (size_t i = 0; i < array.size(); ++i) {
    const toml::node& item = *array.get(i);
    const std::string item_path = fmt::format("{}[{}]", path, i);
    reader.Record(item_path, item);
    auto id = reader.Integer(item, item_path, *key.item_range);
    if (!id) {
      ok = false;
      continue;
    }
    if (auto it = seen.find(*id); it != seen.end()) {
      reader.diags().Error(LocOf(item), item_path,
                           fmt::format("device id {} is listed twice in trainer.devices", *id));
      reader.diags().AddNote(it->second, "first listed here");
      ok = false;
      continue;
    }
    seen[*id] = LocOf(item);
    ids.push_back(*id);
  }
  if (!ok) return;
  trainer.devices = static_cast<int>(ids.size());
  trainer.device_ids = ids;
  trainer.settings.emplace_back("devices", TrainerValue{std::move(ids)});
}

void LoadDevices(const toml::node& node, TomlReader& reader, JobSpec::Trainer& trainer) {
  const std::string path = "trainer.devices";
  const IntRange count_range = *Key(path).range;
  const SourceLoc loc = LocOf(node);
  Diagnostics& diags = reader.diags();
  const std::string explicit_hint =
      "ddprun starts one process per device and must know "
      "how many: set an explicit count, e.g. devices = 8";
  if (auto s = node.value_exact<std::string>()) {
    if (*s == "auto") {
      diags.Error(loc, path, "trainer.devices = \"auto\" is not supported", explicit_hint);
    } else {
      diags.Error(loc, path, fmt::format("trainer.devices = {} is not a device count", Show(node)),
                  "write a count (devices = 8) or a list of device ids (devices = [0, 1])");
    }
    return;
  }
  if (auto n = node.value_exact<int64_t>()) {
    if (*n == -1) {
      diags.Error(loc, path, "trainer.devices = -1 (all devices) is not supported", explicit_hint);
      return;
    }
    if (!count_range.Contains(*n)) {
      diags.Error(
          loc, path,
          fmt::format("trainer.devices = {} is out of range ({}..{})", *n, count_range.min, count_range.max));
      return;
    }
    trainer.devices = static_cast<int>(*n);
    trainer.settings.emplace_back("devices", TrainerValue{*n});
    return;
  }
  if (const toml::array* array = node.as_array()) {
    LoadDeviceIds(*array, loc, reader, trainer);
    return;
  }
  reader.TypeError(node, path, "a device count or a list of device ids",
                   "e.g. devices = 8 or devices = [0, 1]");
}

bool CheckNumNodes(const toml::node& node, const TrainerValue& value, TomlReader& reader,
                   JobSpec::Trainer& trainer) {
  const std::string path = "trainer.num_nodes";
  auto* n = std::get_if<int64_t>(&value.value);
  if (!n || !Key(path).range->Contains(*n)) {
    reader.diags().Error(LocOf(node), path,
                         fmt::format("trainer.num_nodes must be a positive integer, not {}", Show(node)),
                         "Lightning requires num_nodes >= 1");
    return false;
  }
  trainer.num_nodes = static_cast<int>(*n);
  return true;
}

bool CheckAccelerator(const toml::node& node, const TrainerValue& value, TomlReader& reader,
                      JobSpec::Trainer& trainer) {
  const std::string path = "trainer.accelerator";
  Diagnostics& diags = reader.diags();
  const auto* name = std::get_if<std::string>(&value.value);
  if (!name) {
    reader.TypeError(node, path, "a string", "e.g. accelerator = \"gpu\"");
    return false;
  }
  trainer.accelerator = *name;
  if (*name == "mps") {
    diags.Warning(LocOf(node), path,
                  "trainer.accelerator = \"mps\" has one device per machine and no multi-node "
                  "backend",
                  "use \"cpu\" for a multi-node test on Macs");
    return true;
  }
  const auto accepted = Key(path).values;
  if (IsOneOf(accepted, *name)) return true;
  if (*name == "tpu") {
    diags.Error(LocOf(node), path, "trainer.accelerator = \"tpu\" is not supported",
                "TPU jobs start their processes through XLA, not through a DDP launcher");
    return false;
  }
  // Known names for "did you mean": the accepted ones and the refused "tpu".
  std::vector<std::string_view> known(accepted.begin(), accepted.end());
  known.push_back("tpu");
  std::string hint = "use \"gpu\", \"cuda\", \"cpu\" or \"auto\"";
  if (auto close = ClosestName(*name, known)) hint = fmt::format("did you mean \"{}\"?", *close);
  diags.Error(LocOf(node), path, fmt::format("unknown accelerator {}", Show(node)), std::move(hint));
  return false;
}

// A strategy that starts its own processes or runs in one: the message and hint, or nullopt.
std::optional<std::pair<std::string, std::string>> RefusedStrategy(const std::string& name,
                                                                   const toml::node& node) {
  if (name.starts_with("ddp_spawn") || name.starts_with("ddp_fork") || name.starts_with("ddp_notebook")) {
    std::string suggestion = "ddp";
    if (name.ends_with("_find_unused_parameters_true")) {
      suggestion = "ddp_find_unused_parameters_true";
    } else if (name.ends_with("_find_unused_parameters_false")) {
      suggestion = "ddp_find_unused_parameters_false";
    }
    return std::pair(fmt::format("trainer.strategy = {} starts its own worker processes", Show(node)),
                     fmt::format("ddprun starts one process per device; use strategy = \"{}\"", suggestion));
  }
  if (name == "dp") {
    return std::pair(std::string("trainer.strategy = \"dp\" runs in a single process on one node"),
                     std::string("use strategy = \"ddp\" for multi-node training"));
  }
  if (name == "single_device" || name == "xla" || name == "single_xla" || name == "xla_fsdp") {
    return std::pair(fmt::format("trainer.strategy = {} cannot run under a DDP launcher", Show(node)),
                     std::string("use strategy = \"ddp\""));
  }
  return std::nullopt;
}

bool CheckStrategy(const toml::node& node, const TrainerValue& value, TomlReader& reader,
                   JobSpec::Trainer& trainer) {
  const std::string path = "trainer.strategy";
  const auto* name = std::get_if<std::string>(&value.value);
  if (!name) {
    reader.TypeError(node, path, "a string", "e.g. strategy = \"ddp\"");
    return false;
  }
  trainer.strategy = *name;
  const auto known = Key(path).examples;
  if (IsOneOf(known, *name)) return true;
  const SourceLoc loc = LocOf(node);
  if (auto refused = RefusedStrategy(*name, node)) {
    reader.diags().Error(loc, path, refused->first, refused->second);
    return false;
  }
  std::string hint =
      "ddprun knows ddp, ddp_find_unused_parameters_true/false, fsdp and "
      "deepspeed; a custom strategy must initialise from the environment";
  if (auto close = ClosestName(*name, known)) hint = fmt::format("did you mean \"{}\"?", *close);
  reader.diags().Warning(loc, path,
                         fmt::format("unknown strategy {}: ddprun cannot tell whether it works "
                                     "with an external launcher",
                                     Show(node)),
                         std::move(hint));
  return true;
}

// The checks of a key that is not a Lightning argument name (an error) or not one Lightning
// knows (a warning: Lightning ignores it). False when the key is refused.
bool CheckTrainerKey(const std::string& key, SourceLoc loc, const std::string& path, Diagnostics& diags) {
  if (!IsValidTrainerKey(key)) {
    diags.Error(loc, ShownName(path), fmt::format("`{}` is not a valid [trainer] key", ShownName(key)),
                "Lightning's Trainer arguments are lower-case names like max_epochs");
    return false;
  }
  const auto lightning = SectionNamed("trainer").known_names;
  if (!IsOneOf(lightning, key)) {
    std::string hint;
    if (auto close = ClosestName(key, lightning)) hint = fmt::format("did you mean `{}`?", *close);
    diags.Warning(loc, ShownName(path),
                  fmt::format("trainer.{} is not an argument of Lightning's Trainer; Lightning "
                              "ignores PL_TRAINER_{}",
                              ShownName(key), ShownName(UpperCase(key))),
                  std::move(hint));
  }
  return true;
}

// One [trainer] setting: checked, mirrored typed where ddprun reads it, and kept in order.
void LoadSetting(const std::string& key, const toml::node& node, TomlReader& reader,
                 JobSpec::Trainer& trainer) {
  const std::string path = "trainer." + key;
  reader.Record(path, node);
  if (!CheckTrainerKey(key, LocOf(node), path, reader.diags())) return;
  if (key == "devices") {
    LoadDevices(node, reader, trainer);
    return;
  }
  auto value = TrainerValueOf(node, path, reader);
  if (!value) return;
  if (key == "num_nodes" && !CheckNumNodes(node, *value, reader, trainer)) return;
  if (key == "accelerator" && !CheckAccelerator(node, *value, reader, trainer)) return;
  if (key == "strategy" && !CheckStrategy(node, *value, reader, trainer)) return;
  trainer.settings.emplace_back(key, std::move(*value));
}

}  // namespace

TrainerFacts LoadTrainer(const toml::table& root, TomlReader& reader, JobSpec::Trainer& trainer) {
  TrainerFacts facts;
  facts.table = reader.Table(root, "trainer", "trainer");
  if (!facts.table) return facts;
  // Sorted by position: settings keep the order the user wrote them in.
  std::vector<std::pair<std::string, const toml::node*>> entries;
  for (auto&& [key, value] : *facts.table) entries.emplace_back(std::string(key.str()), &value);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    const auto la = LocOf(*a.second);
    const auto lb = LocOf(*b.second);
    return std::pair(la.line, la.column) < std::pair(lb.line, lb.column);
  });
  for (const auto& [key, node] : entries) LoadSetting(key, *node, reader, trainer);
  facts.devices_failed = facts.table->get("devices") && !trainer.devices;
  return facts;
}

}  // namespace ddprun
