// `version` and [job]: what to run.
#include <algorithm>

#include <fmt/format.h>

#include "schema/sections.h"

namespace ddprun {
namespace {

bool IsValidJobName(std::string_view name) {
  return !name.empty() && name.size() <= Key("job.name").max_length &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '_' || c == '-';
         });
}

void LoadName(const toml::node& node, TomlReader& reader, std::string& out) {
  auto name = reader.String(node, "job.name");
  if (!name) return;
  if (!IsValidJobName(*name)) {
    reader.diags().Error(LocOf(node), "job.name",
                         fmt::format("job.name = {} is not a valid job name", Show(node)),
                         fmt::format("use 1 to {} letters, digits, '.', '_' or '-' (it names "
                                     "the run id and the log folder)",
                                     Key("job.name").max_length));
    return;
  }
  out = *name;
}

void LoadCommand(const toml::node& node, TomlReader& reader, std::vector<std::string>& out) {
  const toml::array* array = node.as_array();
  if (!array) {
    std::string hint;
    if (node.value_exact<std::string>()) {
      hint = "write the command as a list of arguments, e.g. [\"python\", \"train.py\"]";
    }
    reader.TypeError(node, "job.command", "an array of strings", std::move(hint));
    return;
  }
  if (array->size() < Key("job.command").min_items) {
    reader.diags().Error(LocOf(node), "job.command", "job.command must not be empty",
                         "e.g. command = [\"python\", \"train.py\"]");
    return;
  }
  std::vector<std::string> command;
  bool ok = true;
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string path = fmt::format("job.command[{}]", i);
    const toml::node& item = *array->get(i);
    reader.Record(path, item);
    // Arguments may be empty strings; the program may not.
    auto arg = reader.String(item, path, /*allow_empty=*/i > 0);
    if (!arg) {
      ok = false;
      continue;
    }
    command.push_back(*arg);
  }
  if (ok) out = std::move(command);
}

// job.code_check and job.library_check: "off", "warn" or "refuse".
void LoadCheckMode(const toml::node& node, TomlReader& reader, const std::string& path,
                   const char* what_refuse_does, JobSpec::CodeCheck& out) {
  using Check = JobSpec::CodeCheck;
  reader.ReadChoice(
      node, path,
      std::array{std::pair{std::string_view("off"), Check::kOff},
                 std::pair{std::string_view("warn"), Check::kWarn},
                 std::pair{std::string_view("refuse"), Check::kRefuse}},
      fmt::format("\"refuse\" refuses a node whose {} from node 0's; \"warn\" lets it join and says "
                  "what differs",
                  what_refuse_does),
      out);
}

bool IsModuleName(std::string_view name) {
  bool start = true;
  for (const char c : name) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (c == '.') {
      if (start) return false;
      start = true;
    } else if (letter || (digit && !start)) {
      start = false;
    } else {
      return false;
    }
  }
  return !start;
}

void LoadPreload(const toml::node& node, TomlReader& reader, std::vector<std::string>& out) {
  const toml::array* array = node.as_array();
  if (!array) {
    reader.TypeError(node, "job.preload", "an array of module names",
                     "e.g. preload = [\"torch\", \"lightning\"]");
    return;
  }
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string path = fmt::format("job.preload[{}]", i);
    const toml::node& item = *array->get(i);
    reader.Record(path, item);
    const auto name = reader.String(item, path);
    if (!name) continue;
    if (!IsModuleName(*name)) {
      reader.diags().Error(LocOf(item), "job.preload",
                           fmt::format("job.preload: \"{}\" is not a Python module name", *name),
                           "write the name `import` takes, e.g. \"torch\" or \"torch.distributed\"");
      continue;
    }
    if (*name == "ddprun" || name->starts_with("ddprun.")) {
      reader.diags().Error(LocOf(item), "job.preload", fmt::format("job.preload may not list \"{}\"", *name),
                           "ddprun's module reads each worker's own environment when it is imported; "
                           "the worker imports it itself");
      continue;
    }
    if (std::find(out.begin(), out.end(), *name) != out.end()) {
      reader.diags().Error(LocOf(item), "job.preload", fmt::format("job.preload lists \"{}\" twice", *name));
      continue;
    }
    out.push_back(*name);
  }
}

}  // namespace

void LoadVersion(const toml::table& root, TomlReader& reader) {
  const toml::node* node = reader.Node(&root, "version", "version");
  if (!node) {
    reader.Missing(nullptr, "version", "add `version = 1` at the top of the file");
    return;
  }
  auto value = node->value_exact<int64_t>();
  if (!value) {
    reader.TypeError(*node, "version", "an integer", "write `version = 1`");
  } else if (!Key("version").range->Contains(*value)) {
    reader.diags().Error(LocOf(*node), "version", fmt::format("unsupported job file version {}", *value),
                         "this ddprun reads version 1; write `version = 1` or upgrade ddprun");
  }
}

void LoadJob(const toml::table& root, TomlReader& reader, JobSpec::Job& job) {
  const toml::table* table = reader.Table(root, "job", "job");
  if (!table) {
    if (!root.get("job")) {
      reader.diags().Error({}, "job", "missing required table [job]",
                           "add [job] with name = \"my-job\" and command = [\"python\", \"train.py\"]");
    }
    return;
  }
  reader.CheckKeys(*table, SectionNamed("job"), "job");

  if (const toml::node* node = reader.Node(table, "name", "job.name")) {
    LoadName(*node, reader, job.name);
  } else {
    reader.Missing(table, "job.name", "add name = \"my-job\" under [job]");
  }
  if (const toml::node* node = reader.Node(table, "command", "job.command")) {
    LoadCommand(*node, reader, job.command);
  } else {
    reader.Missing(table, "job.command", "add command = [\"python\", \"train.py\"] under [job]");
  }
  if (const toml::node* node = reader.Node(table, "workdir", "job.workdir")) {
    if (auto dir = reader.String(*node, "job.workdir")) job.workdir = *dir;
  }
  if (const toml::node* node = reader.Node(table, "code_check", "job.code_check")) {
    LoadCheckMode(*node, reader, "job.code_check", "script or git commit differs", job.code_check);
  }
  if (const toml::node* node = reader.Node(table, "library_check", "job.library_check")) {
    LoadCheckMode(*node, reader, "job.library_check",
                  "Python, torch, Lightning, NCCL or CUDA version differs", job.library_check);
  }
  if (const toml::node* node = reader.Node(table, "preload", "job.preload")) {
    LoadPreload(*node, reader, job.preload);
  }
  LoadEnv(*table, reader, job.env);
}

}  // namespace ddprun
