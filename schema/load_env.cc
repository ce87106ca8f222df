// job.env: extra environment variables for the workers.
#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "schema/sections.h"
#include "schema/worker_env.h"

namespace ddprun {
namespace {

bool IsValidEnvName(std::string_view name) {
  if (name.empty() || name.size() > 256 || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// Where the value of a variable ddprun owns comes from, so the user knows what to set instead.
std::string OwnedNameHint(const std::string& name) {
  if (name.starts_with("PL_TRAINER_")) {
    std::string key = name.substr(11);
    std::transform(key.begin(), key.end(), key.begin(),
                   [](char c) { return static_cast<char>(std::tolower(c)); });
    return fmt::format("ddprun sets {} from [trainer]; write `{} = ...` under [trainer]", name, key);
  }
  if (name == "MASTER_ADDR") return "ddprun sets MASTER_ADDR from cluster.master_addr";
  if (name == "MASTER_PORT") {
    return "ddprun sets MASTER_PORT from cluster.master_port (or cluster.store_port)";
  }
  if (name == "WORLD_SIZE" || name == "GROUP_WORLD_SIZE" || name == "LOCAL_WORLD_SIZE" ||
      name == "ROLE_WORLD_SIZE") {
    return fmt::format(
        "ddprun sets {} from cluster.nodes (or nnodes) and "
        "cluster.nproc_per_node",
        name);
  }
  if (name == "TORCHELASTIC_MAX_RESTARTS") {
    return "ddprun sets TORCHELASTIC_MAX_RESTARTS from restart.max_restarts";
  }
  if (name == "TORCHELASTIC_RUN_ID") {
    return "ddprun sets TORCHELASTIC_RUN_ID from job.name and the job's fingerprint";
  }
  if (name.find("RANK") != std::string::npos) {
    return fmt::format("ddprun sets {} per worker from its node rank and local rank", name);
  }
  return fmt::format(
      "ddprun sets {} per worker and round; see the worker contract in "
      "docs/job-file.md",
      name);
}

// Whether `name` may be set at all; reports why not.
bool CheckEnvName(const toml::key& key, const std::string& name, const std::string& path,
                  Diagnostics& diags) {
  if (!IsValidEnvName(name)) {
    diags.Error(LocOf(key.source()), ShownName(path),
                fmt::format("`{}` is not a valid environment variable name", ShownName(name)),
                "use letters, digits and '_', not starting with a digit");
    return false;
  }
  if (name == "DDPRUN_SECRET" || name == "DDPRUN_SECRET_FILE") {
    // A secret in the job file is in version control and in every node's fingerprint
    // exchange; and job.env only reaches the workers, not the agents that use it.
    diags.Error(LocOf(key.source()), path,
                fmt::format("job.env may not set {}: the shared secret must not be in the job "
                            "file",
                            name),
                "set DDPRUN_SECRET_FILE (a file only you can read) in the environment of "
                "ddprun on every node; see Security in docs/running.md");
    diags.HideLine();
    return false;
  }
  if (IsOwnedEnvName(name)) {
    diags.Error(LocOf(key.source()), path,
                fmt::format("job.env may not set {}: ddprun sets it for each worker", name),
                OwnedNameHint(name));
    return false;
  }
  return true;
}

}  // namespace

void LoadEnv(const toml::table& job, TomlReader& reader, std::map<std::string, std::string>& env) {
  const toml::table* table = reader.Table(job, "env", "job.env");
  if (!table) return;
  Diagnostics& diags = reader.diags();
  for (auto&& [key, value] : *table) {
    const std::string name(key.str());
    const std::string path = "job.env." + name;
    reader.Record(path, value);
    if (!CheckEnvName(key, name, path, diags)) continue;
    const size_t before = diags.items.size();
    if (auto text = reader.String(value, path, /*allow_empty=*/true)) env[name] = *text;
    // A value of the wrong type under a secret-looking name may be the secret: not quoted.
    if (diags.items.size() > before && LooksSecret(name)) {
      diags.HideLine();
      diags.items.back().hint = "write the value as a quoted string";
    }
  }
}

}  // namespace ddprun
