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
constexpr std::array<std::string_view, 20> kOwnedNames = {
    "DDPRUN_PROGRESS_ADDR",
    "DDPRUN_PROGRESS_TOKEN",
    "DDPRUN_STACKS_FILE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "RANK",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "WORLD_SIZE",
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

bool LooksSecret(std::string_view name) {
  const std::string upper = Upper(name);
  return upper.ends_with("_KEY") || upper.ends_with("_TOKEN") || upper.find("SECRET") != std::string::npos ||
         upper.find("PASSWORD") != std::string::npos;
}

std::string PrintableEnvValue(std::string_view name, std::string_view value) {
  return LooksSecret(name) ? std::string(kHiddenValue) : std::string(value);
}

std::string RunId(const JobSpec& spec) { return RunId(spec, Fingerprint(spec)); }

std::string RunId(const JobSpec& spec, std::string_view fingerprint) {
  return fmt::format("{}-{}", spec.job.name, fingerprint.substr(0, 8));
}

std::string EtcdKeyDir(const JobSpec& spec) {
  const std::string& prefix = spec.rendezvous.prefix;
  return fmt::format("{}/{}", prefix == "/" ? "" : prefix, spec.job.name);
}

namespace {

// A Python float literal that reads back as the same double: fmt's shortest round-trip
// digits, with ".0" added when they look like an integer (fmt prints 1.0 as "1", which
// literal_eval would read as the int 1: in Lightning, one batch instead of 100%).
std::string PythonFloat(double d) {
  std::string text = fmt::format("{}", d);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

// A Python string literal in single quotes; literal_eval reads it back exactly. Control
// characters are escaped so the variable stays one printable line.
std::string PythonString(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\'':
        out += "\\'";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (byte < 0x20 || byte == 0x7f) {
          out += fmt::format("\\x{:02x}", byte);
        } else {
          out += c;
        }
    }
  }
  return out + "'";
}

// Whether literal_eval certainly fails on `s` written bare, so Lightning keeps it as the
// string: only letters, digits and "._-", and one '-'-separated part that starts with a
// letter or '_' (a Python name, which no literal contains) and is not True, False or None.
// "ddp", "bf16-mixed" and "16-mixed" qualify; "32", "1e3", "True" and "" do not.
bool BareStringStaysString(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-';
    if (!ok) return false;
  }
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find('-', start);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view part = s.substr(start, end - start);
    const bool name_start = !part.empty() && ((part[0] >= 'a' && part[0] <= 'z') ||
                                              (part[0] >= 'A' && part[0] <= 'Z') || part[0] == '_');
    if (name_start && part != "True" && part != "False" && part != "None") return true;
    start = end + 1;
  }
  return false;
}

struct PythonVisitor {
  bool top_level;
  std::string operator()(bool b) const { return b ? "True" : "False"; }
  std::string operator()(int64_t i) const { return fmt::format("{}", i); }
  std::string operator()(double d) const { return PythonFloat(d); }
  // Bare when that reads back as the same string (what users expect to see in the plan:
  // PL_TRAINER_STRATEGY=ddp), quoted otherwise ("32" must not become the int 32).
  std::string operator()(const std::string& s) const {
    return top_level && BareStringStaysString(s) ? s : PythonString(s);
  }
  std::string operator()(const std::vector<int64_t>& v) const {
    return fmt::format("[{}]", fmt::join(v, ", "));
  }
  std::string operator()(const TrainerLiteral& literal) const { return literal.python; }
};

}  // namespace

std::string TrainerPythonLiteral(const TrainerValue& value, bool top_level) {
  return std::visit(PythonVisitor{top_level}, value.value);
}

std::string TrainerPythonString(std::string_view text) { return PythonString(text); }

std::string TrainerEnvValue(const TrainerValue& value) { return TrainerPythonLiteral(value, true); }

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

std::string NodeLatestLink(int node_rank) { return fmt::format("latest-n{}", node_rank); }

namespace {

// "attempt-<k>/rank-<r><suffix>": built by hand, the agent makes three per worker per round.
std::string RankPath(int restart_count, int global_rank, std::string_view suffix) {
  std::string path = "attempt-";
  path += std::to_string(restart_count);
  path += "/rank-";
  path += std::to_string(global_rank);
  path += suffix;
  return path;
}

}  // namespace

std::string RankLogPath(const JobSpec& /*spec*/, int restart_count, int global_rank) {
  return RankPath(restart_count, global_rank, ".log");
}

std::string RankErrorFilePath(const JobSpec& /*spec*/, int restart_count, int global_rank) {
  return RankPath(restart_count, global_rank, ".error.json");
}

std::string RankStacksPath(const JobSpec& /*spec*/, int restart_count, int global_rank) {
  return RankPath(restart_count, global_rank, ".stacks");
}

EnvList WorkerEnvironment(const JobSpec& spec, const WorkerPosition& position,
                          const std::map<std::string, std::string>& inherited) {
  const int nproc = spec.cluster.nproc_per_node;
  const int nnodes = position.nnodes > 0 ? position.nnodes : spec.cluster.nnodes;
  const int world = nnodes * nproc;
  const int rank = position.node_rank * nproc + position.local_rank;
  auto set_somewhere = [&](const std::string& name) {
    return inherited.count(name) > 0 || spec.job.env.count(name) > 0;
  };

  // Built as a list of distinct names and sorted once (the agent builds one per worker,
  // 16,384 per round at Llama-3 scale in the simulator). A name set again (PYTHONPATH, a
  // smaller round's PL_TRAINER_NUM_NODES, an owned name in a job.env that was not validated)
  // takes the new value, as in a map.
  EnvList env(spec.job.env.begin(), spec.job.env.end());
  env.reserve(env.size() + 32 + spec.trainer.settings.size());
  const auto replace = [&env](std::string name, std::string value) {
    for (auto& [key, old] : env) {
      if (key == name) {
        old = std::move(value);
        return;
      }
    }
    env.emplace_back(std::move(name), std::move(value));
  };
  const auto set = [&env, &spec, &replace](std::string name, std::string value) {
    if (spec.job.env.count(name) > 0) return replace(std::move(name), std::move(value));
    env.emplace_back(std::move(name), std::move(value));
  };
  set("GROUP_RANK", std::to_string(position.node_rank));
  set("GROUP_WORLD_SIZE", std::to_string(nnodes));
  set("LOCAL_RANK", std::to_string(position.local_rank));
  set("LOCAL_WORLD_SIZE", std::to_string(nproc));
  set("MASTER_ADDR", position.master_addr.empty() ? spec.cluster.master_addr : position.master_addr);
  set("MASTER_PORT", std::to_string(position.master_port));
  set("NODE_RANK", std::to_string(position.node_rank));
  set("RANK", std::to_string(rank));
  set("ROLE_NAME", "default");
  set("ROLE_RANK", std::to_string(rank));
  set("ROLE_WORLD_SIZE", std::to_string(world));
  set("TORCHELASTIC_ERROR_FILE", position.error_file);
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(spec.restart.max_restarts));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(position.restart_count));
  set("TORCHELASTIC_RUN_ID", position.run_id.empty() ? RunId(spec) : position.run_id);
  // ddprun hosts no store: worker rank 0 does (through the relay), so workers must not
  // connect as clients to an agent store.
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  set("WORLD_SIZE", std::to_string(world));
  for (const char* name : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}) {
    if (!set_somewhere(name)) set(name, "1");
  }
  if (nproc > 1 && !set_somewhere("OMP_NUM_THREADS")) set("OMP_NUM_THREADS", "1");
  if (!position.socket_ifname.empty()) {
    for (std::string_view view : kSocketIfnameNames) {
      std::string name(view);
      if (set_somewhere(name)) continue;
      std::string value = (name == "NCCL_SOCKET_IFNAME" ? "=" : "") + position.socket_ifname;
      set(std::move(name), std::move(value));
    }
  }
  bool num_nodes = false;
  for (const auto& [key, value] : spec.trainer.settings) {
    std::string name = "PL_TRAINER_" + Upper(key);
    num_nodes = num_nodes || name == "PL_TRAINER_NUM_NODES";
    replace(std::move(name), TrainerEnvValue(value));  // keys that differ in case only meet here
  }
  // A round with fewer nodes (cluster.min_nodes) tells Lightning its own node count.
  if (nnodes != spec.cluster.nnodes && num_nodes) replace("PL_TRAINER_NUM_NODES", std::to_string(nnodes));
  if (!position.progress_addr.empty()) {
    set("DDPRUN_PROGRESS_ADDR", position.progress_addr);
    set("DDPRUN_PROGRESS_TOKEN", position.progress_token);
    set("DDPRUN_STACKS_FILE", position.stacks_file);
  }
  if (!position.python_dir.empty()) {
    // After the user's own entries (job.env's, else the agent's): theirs come first.
    auto own = spec.job.env.find("PYTHONPATH");
    auto inherited_path = inherited.find("PYTHONPATH");
    const std::string before = own != spec.job.env.end()           ? own->second
                               : inherited_path != inherited.end() ? inherited_path->second
                                                                   : "";
    replace("PYTHONPATH", AppendToSearchPath(before, position.python_dir));
  }
  std::sort(env.begin(), env.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return env;
}

EnvList SiblingWorkerEnvironment(EnvList env, const JobSpec& spec, const WorkerPosition& position) {
  const auto set = [&env](std::string_view name, std::string value) {
    auto it = std::lower_bound(env.begin(), env.end(), name,
                               [](const auto& entry, std::string_view key) { return entry.first < key; });
    if (it != env.end() && it->first == name) it->second = std::move(value);
  };
  const std::string rank =
      std::to_string(position.node_rank * spec.cluster.nproc_per_node + position.local_rank);
  set("LOCAL_RANK", std::to_string(position.local_rank));
  set("MASTER_PORT", std::to_string(position.master_port));
  set("RANK", rank);
  set("ROLE_RANK", rank);
  set("TORCHELASTIC_ERROR_FILE", position.error_file);
  if (!position.progress_addr.empty()) set("DDPRUN_STACKS_FILE", position.stacks_file);
  return env;
}

std::string AppendToSearchPath(const std::string& path, const std::string& dir) {
  if (dir.empty() || dir.find(':') != std::string::npos) return path;
  if (path.empty()) return dir;
  std::string_view rest = path;
  while (true) {
    const size_t colon = rest.find(':');
    if (rest.substr(0, colon) == dir) return path;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return path + ":" + dir;
}

}  // namespace ddprun
