#include "schema/worker_env.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <ctime>

#include <fmt/format.h>

#include "schema/canonical.h"

namespace ddprun {
namespace {

// Everything ddprun computes per worker. job.env may not override these: a wrong RANK or
// MASTER_PORT in one node's file is exactly the hang ddprun exists to prevent.
constexpr std::array<std::string_view, 17> kOwnedNames = {
    "GROUP_RANK",        "GROUP_WORLD_SIZE",           "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",  "MASTER_ADDR",                "MASTER_PORT",
    "NODE_RANK",         "RANK",                       "ROLE_NAME",
    "ROLE_RANK",         "ROLE_WORLD_SIZE",            "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "WORLD_SIZE",
};

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

bool IsOwnedEnvName(std::string_view name) {
  return std::find(kOwnedNames.begin(), kOwnedNames.end(), name) != kOwnedNames.end() ||
         name.starts_with("PL_TRAINER_");
}

std::string RunId(const JobSpec& spec) { return RunId(spec, Fingerprint(spec)); }

std::string RunId(const JobSpec& spec, std::string_view fingerprint) {
  return fmt::format("{}-{}", spec.job.name, fingerprint.substr(0, 8));
}

std::string TrainerEnvValue(const TrainerValue& value) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t i) const { return fmt::format("{}", i); }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    // Plain text: Lightning's literal_eval fails on "ddp" or "bf16-mixed" and keeps the string.
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const std::vector<int64_t>& v) const {
      return fmt::format("[{}]", fmt::join(v, ", "));
    }
  };
  return std::visit(Visitor{}, value.value);
}

std::string RunFolderName(int64_t unix_seconds, int node_rank, uint32_t random_id) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  // Sorts by time in `ls`; the id (24 bits) tells apart two runs started in the same second.
  return fmt::format("{:04}{:02}{:02}T{:02}{:02}{:02}Z-n{}-{:06x}", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, node_rank, random_id & 0xffffffu);
}

std::string RunLogFolder(const JobSpec& spec, const std::string& run) {
  return fmt::format("{}/{}", spec.job.name, run);
}

std::string RankLogPath(const JobSpec& /*spec*/, int restart_count, int global_rank) {
  return fmt::format("attempt-{}/rank-{}.log", restart_count, global_rank);
}

std::string RankErrorFilePath(const JobSpec& /*spec*/, int restart_count, int global_rank) {
  return fmt::format("attempt-{}/rank-{}.error.json", restart_count, global_rank);
}

EnvList WorkerEnvironment(const JobSpec& spec, const WorkerPosition& position,
                          const std::map<std::string, std::string>& inherited) {
  const int nproc = spec.cluster.nproc_per_node;
  const int world = spec.WorldSize();
  const int rank = position.node_rank * nproc + position.local_rank;
  auto set_somewhere = [&](const std::string& name) {
    return inherited.count(name) > 0 || spec.job.env.count(name) > 0;
  };

  std::map<std::string, std::string> env(spec.job.env.begin(), spec.job.env.end());
  env["GROUP_RANK"] = std::to_string(position.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(spec.cluster.nnodes);
  env["LOCAL_RANK"] = std::to_string(position.local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(nproc);
  env["MASTER_ADDR"] = spec.cluster.master_addr;
  env["MASTER_PORT"] = std::to_string(position.master_port);
  env["NODE_RANK"] = std::to_string(position.node_rank);
  env["RANK"] = std::to_string(rank);
  env["ROLE_NAME"] = "default";
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(world);
  env["TORCHELASTIC_ERROR_FILE"] = position.error_file;
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(spec.restart.max_restarts);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(position.restart_count);
  env["TORCHELASTIC_RUN_ID"] = position.run_id.empty() ? RunId(spec) : position.run_id;
  // ddprun hosts no store: worker rank 0 does (through the relay), so workers must not
  // connect as clients to an agent store.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  env["WORLD_SIZE"] = std::to_string(world);
  for (const char* name : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}) {
    if (!set_somewhere(name)) env[name] = "1";
  }
  if (nproc > 1 && !set_somewhere("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = "1";
  for (const auto& [key, value] : spec.trainer.settings) {
    env["PL_TRAINER_" + Upper(key)] = TrainerEnvValue(value);
  }
  return EnvList(env.begin(), env.end());
}

}  // namespace ddprun
