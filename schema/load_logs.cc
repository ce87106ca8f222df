// [logs]: where per-rank logs go and which ranks the console shows.
#include <algorithm>

#include <fmt/format.h>

#include "schema/sections.h"

namespace ddprun {
namespace {

// logs.console as a list of global ranks, each below the world size and listed once.
void LoadConsoleRanks(const toml::array& array, TomlReader& reader, int world_size, ConsoleFilter& console) {
  const IntRange any_job = *Key("logs.console").item_range;
  const IntRange range = world_size > 0 ? any_job.Below(world_size - 1) : any_job;
  std::vector<int> ranks;
  bool ok = true;
  for (size_t i = 0; i < array.size(); ++i) {
    const std::string path = fmt::format("logs.console[{}]", i);
    const toml::node& item = *array.get(i);
    reader.Record(path, item);
    auto rank = reader.Integer(item, path, range);
    if (!rank) {
      ok = false;
      continue;
    }
    if (std::find(ranks.begin(), ranks.end(), *rank) != ranks.end()) {
      reader.diags().Error(LocOf(item), path, fmt::format("rank {} is listed twice in logs.console", *rank));
      ok = false;
      continue;
    }
    ranks.push_back(static_cast<int>(*rank));
  }
  if (!ok) return;
  std::sort(ranks.begin(), ranks.end());
  console.mode = ConsoleFilter::Mode::kRanks;
  console.ranks = std::move(ranks);
}

void LoadConsole(const toml::node& node, TomlReader& reader, int world_size, ConsoleFilter& console) {
  const std::string hint = "write \"all\", \"none\" or a list of global ranks, e.g. [0]";
  if (auto s = node.value_exact<std::string>()) {
    if (*s == "all") {
      console.mode = ConsoleFilter::Mode::kAll;
    } else if (*s == "none") {
      console.mode = ConsoleFilter::Mode::kNone;
    } else {
      reader.diags().Error(LocOf(node), "logs.console",
                           fmt::format("logs.console = {} is not a console filter", Show(node)), hint);
    }
    return;
  }
  const toml::array* array = node.as_array();
  if (!array) {
    reader.TypeError(node, "logs.console", "\"all\", \"none\" or an array of ranks", hint);
    return;
  }
  LoadConsoleRanks(*array, reader, world_size, console);
}

}  // namespace

void LoadLogs(const toml::table& root, TomlReader& reader, int world_size, JobSpec::Logs& logs) {
  const toml::table* table = reader.Table(root, "logs", "logs");
  if (!table) return;
  reader.CheckKeys(*table, SectionNamed("logs"), "logs");
  if (const toml::node* node = reader.Node(table, "dir", "logs.dir")) {
    if (auto dir = reader.String(*node, "logs.dir")) logs.dir = *dir;
  }
  if (const toml::node* node = reader.Node(table, "console", "logs.console")) {
    LoadConsole(*node, reader, world_size, logs.console);
  }
}

}  // namespace ddprun
