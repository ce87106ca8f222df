#include "schema/loader.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <span>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "schema/canonical.h"
#include "schema/worker_env.h"

namespace ddprun {
namespace {

// Limits on what a job file may ask for; a limit on everything (STYLE.md rule 6).
constexpr size_t kMaxFileBytes = 1 << 20;
constexpr int kMaxNesting = 32;
constexpr int64_t kMaxNodes = 10'000;
constexpr int64_t kMaxProcsPerNode = 1'024;
constexpr int64_t kMaxRestarts = 10'000;
constexpr size_t kMaxNameLength = 128;

using Keys = std::span<const std::string_view>;

constexpr std::array<std::string_view, 8> kTopKeys = {
    "version", "job", "cluster", "trainer", "restart", "timeouts", "logs", "simulate"};
constexpr std::array<std::string_view, 5> kJobKeys = {"name", "command", "workdir", "env",
                                                      "code_check"};
constexpr std::array<std::string_view, 6> kClusterKeys = {
    "nodes", "nnodes", "master_addr", "master_port", "nproc_per_node", "store_port"};
constexpr std::array<std::string_view, 3> kRestartKeys = {"max_restarts", "backoff",
                                                          "backoff_max"};
constexpr std::array<std::string_view, 3> kTimeoutKeys = {"rendezvous", "heartbeat",
                                                          "stop_grace"};
constexpr std::array<std::string_view, 2> kLogKeys = {"dir", "console"};
constexpr std::array<std::string_view, 8> kSimulateKeys = {
    "seed",       "faults",           "node_mtbf",      "worker_mtbf",
    "train_time", "checkpoint_every", "worker_startup", "max_time"};
constexpr std::array<std::string_view, 8> kFaultKeys = {
    "at", "kind", "node", "local_rank", "exit_code", "duration", "reboot_after", "peers"};

// Lightning 2.x `Trainer.__init__` parameters. Lightning reads PL_TRAINER_<NAME> only for
// these, so any other [trainer] key would be silently ignored by the script: worth a warning.
constexpr std::array<std::string_view, 40> kLightningTrainerArgs = {
    "accelerator", "strategy", "devices", "num_nodes", "precision", "logger", "callbacks",
    "fast_dev_run", "max_epochs", "min_epochs", "max_steps", "min_steps", "max_time",
    "limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
    "overfit_batches", "val_check_interval", "check_val_every_n_epoch", "num_sanity_val_steps",
    "log_every_n_steps", "enable_checkpointing", "enable_progress_bar", "enable_model_summary",
    "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm", "deterministic",
    "benchmark", "inference_mode", "use_distributed_sampler", "profiler", "detect_anomaly",
    "barebones", "plugins", "sync_batchnorm", "reload_dataloaders_every_n_epochs",
    "default_root_dir", "model_registry"};

struct Section {
  std::string_view name;
  Keys keys;
};
constexpr std::array<Section, 8> kSections = {{
    {"", kTopKeys},
    {"job", kJobKeys},
    {"cluster", kClusterKeys},
    {"trainer", kLightningTrainerArgs},
    {"restart", kRestartKeys},
    {"timeouts", kTimeoutKeys},
    {"logs", kLogKeys},
    {"simulate", kSimulateKeys},
}};

// Strategies that work when something else (torchrun, ddprun) starts one process per device:
// Lightning then only joins the process group from the environment. The "popen" DDP family,
// FSDP and DeepSpeed all do that; the spawn/fork/notebook variants start their own processes.
constexpr std::array<std::string_view, 14> kLauncherStrategies = {
    "auto",
    "ddp",
    "ddp_find_unused_parameters_false",
    "ddp_find_unused_parameters_true",
    "fsdp",
    "fsdp_cpu_offload",
    "deepspeed",
    "deepspeed_stage_1",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
    "deepspeed_stage_3_offload_nvme",
    "model_parallel"};

struct FaultKindInfo {
  FaultKind kind;
  std::string_view name;
  // Which optional keys the kind takes, besides `at`, `kind` and `node`.
  bool local_rank, exit_code, duration, reboot_after, peers;
};
constexpr std::array<FaultKindInfo, 9> kFaultKinds = {{
    {FaultKind::kNodeCrash, "node-crash", false, false, false, true, false},
    {FaultKind::kAgentHang, "agent-hang", false, false, true, false, false},
    {FaultKind::kWorkerExit, "worker-exit", true, true, false, false, false},
    {FaultKind::kWorkerHang, "worker-hang", true, false, true, false, false},
    {FaultKind::kPartition, "partition", false, false, true, false, true},
    {FaultKind::kMasterPortBlocked, "master-port-blocked", false, false, true, false, false},
    {FaultKind::kSlowJoiner, "slow-joiner", false, false, true, false, false},
    {FaultKind::kJobFileDiffers, "job-file-differs", false, false, false, false, false},
    {FaultKind::kDuplicateNodeRank, "duplicate-node-rank", false, false, false, false, false},
}};

const FaultKindInfo& InfoOf(FaultKind kind) {
  for (const auto& info : kFaultKinds) {
    if (info.kind == kind) return info;
  }
  return kFaultKinds[0];
}

// Whether `key` may be given for a fault of this kind.
bool FaultTakes(const FaultKindInfo& info, std::string_view key) {
  if (key == "at" || key == "kind" || key == "node") return true;
  if (key == "local_rank") return info.local_rank;
  if (key == "exit_code") return info.exit_code;
  if (key == "duration") return info.duration;
  if (key == "reboot_after") return info.reboot_after;
  if (key == "peers") return info.peers;
  return false;
}

std::string KnownFaultKinds() {
  std::string out;
  for (const auto& info : kFaultKinds) {
    if (!out.empty()) out += ", ";
    out += info.name;
  }
  return out;
}

std::string JoinKeys(std::span<const std::string_view> keys);

std::string FaultKeysHint(const FaultKindInfo& info) {
  std::vector<std::string_view> keys = {"at", "kind", "node"};
  for (std::string_view key : {"local_rank", "exit_code", "duration", "reboot_after", "peers"}) {
    if (FaultTakes(info, key)) keys.push_back(key);
  }
  return fmt::format("a {} fault takes: {}", info.name, JoinKeys(keys));
}

// The closest of `candidates` to `word`, when close enough to be a typo.
std::optional<std::string_view> Closest(std::string_view word, Keys candidates) {
  return ClosestName(word, candidates);
}

std::string JoinKeys(std::span<const std::string_view> keys) {
  std::string out;
  for (std::string_view k : keys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

std::string Dotted(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
}

SourceLoc LocOf(const toml::source_region& region) {
  return {region.begin.line, region.begin.column};
}
SourceLoc LocOf(const toml::node& node) { return LocOf(node.source()); }

std::string TypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// The value as the user would write it, for messages (short; long values are cut).
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

bool IsValidJobName(std::string_view name) {
  return !name.empty() && name.size() <= kMaxNameLength &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
         });
}

bool IsValidEnvName(std::string_view name) {
  if (name.empty() || name.size() > 256 || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool IsValidTrainerKey(std::string_view key) {
  if (key.empty() || key.size() > 64 || (key[0] >= '0' && key[0] <= '9')) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool IsIpAddress(const std::string& text) {
  unsigned char buffer[16];
  return inet_pton(AF_INET, text.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, text.c_str(), buffer) == 1;
}

// RFC 1123 host names; underscores are tolerated because some sites use them and the
// resolver accepts them. All-numeric dotted names must be real IPv4 addresses.
bool IsHostName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  bool numeric = true;
  size_t label_start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      const std::string_view label = name.substr(label_start, i - label_start);
      if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
        return false;
      }
      label_start = i + 1;
      continue;
    }
    const char c = name[i];
    const bool digit = c >= '0' && c <= '9';
    if (!digit) numeric = false;
    if (!(digit || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_')) {
      return false;
    }
  }
  return !numeric;
}

bool IsHostOrIp(const std::string& text) { return IsIpAddress(text) || IsHostName(text); }

// 1-based line and column (in code points, as toml++ counts them) of byte `offset`.
SourceLoc LocAtOffset(std::string_view text, size_t offset) {
  SourceLoc loc{1, 1};
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++loc.line;
      loc.column = 1;
    } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      ++loc.column;
    }
  }
  return loc;
}

// Offset of the first byte that is not part of valid UTF-8, or npos.
size_t FirstInvalidUtf8(std::string_view text) {
  uint32_t cp = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t length = DecodeUtf8(text, i, cp);
    if (length == 0) return i;
    i += length;
  }
  return std::string_view::npos;
}

// toml++ parses arrays and inline tables recursively; bound the depth before it sees the text.
// Strings and comments are skipped so brackets inside them do not count.
size_t FirstTooDeep(std::string_view text) {
  int depth = 0;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const bool triple = text.substr(i, 3) == std::string(3, c);
      const std::string_view close = triple ? text.substr(i, 3) : text.substr(i, 1);
      i += close.size();
      while (i < text.size()) {
        if (c == '"' && text[i] == '\\') {
          i += 2;
          continue;
        }
        if (!triple && text[i] == '\n') break;  // unterminated: toml++ reports it
        if (text.substr(i, close.size()) == close) {
          i += close.size();
          break;
        }
        ++i;
      }
      continue;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNesting) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    ++i;
  }
  return std::string_view::npos;
}

class Loader {
 public:
  Loader(const toml::table& root, JobSpec& spec, Diagnostics& diagnostics)
      : root_(root), spec_(spec), diags_(diagnostics) {}

  void Run() {
    CheckKeys(root_, "", kTopKeys);
    LoadVersion();
    LoadJob();
    LoadTrainer();
    LoadCluster();
    CrossCheckTrainer();
    LoadRestart();
    LoadTimeouts();
    LoadLogs();
    LoadSimulate();
  }

 private:
  // --- generic access -------------------------------------------------------------------

  void Record(const std::string& path, const toml::node& node) {
    spec_.locations[path] = LocOf(node);
  }

  void TypeError(const toml::node& node, const std::string& path, std::string_view expected,
                 std::string hint = {}) {
    diags_.Error(LocOf(node), path, fmt::format("{} must be {}, not {}", path, expected,
                                                TypeName(node)),
                 std::move(hint));
  }

  void Missing(const toml::table* table, const std::string& path, std::string hint) {
    diags_.Error(table ? LocOf(*table) : SourceLoc{}, path,
                 fmt::format("missing required key `{}`", path), std::move(hint));
  }

  // Reports keys of `table` that are not in `allowed`, with the likeliest intended key.
  void CheckKeys(const toml::table& table, std::string_view prefix, Keys allowed) {
    for (auto&& [key, node] : table) {
      const std::string_view name = key.str();
      if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) continue;
      std::string hint;
      if (auto close = Closest(name, allowed)) {
        hint = prefix.empty() && node.is_table()
                   ? fmt::format("did you mean [{}]?", *close)
                   : fmt::format("did you mean `{}`?", *close);
      } else if (auto home = SectionOf(name, prefix); home && prefix.empty() && node.is_table()) {
        // `[rendezvous]`: a section header named after a key; `timeouts.rendezvous` would read
        // as a table name too, so say where the key goes instead.
        hint = fmt::format("there is no [{}] table; `{}` is a key of [{}]: write `{} = ...` "
                           "under [{}]",
                           name, name, *home, name, *home);
      } else if (home) {
        hint = fmt::format("`{}` belongs in [{}]: did you mean `{}.{}`?", name, *home, *home,
                           name);
      } else if (auto near = NearKeyElsewhere(name, prefix)) {
        hint = fmt::format("did you mean `{}`?", *near);
      } else {
        hint = fmt::format("known keys{}: {}",
                           prefix.empty() ? std::string(" at the top level")
                                          : fmt::format(" in [{}]", prefix),
                           JoinKeys(allowed));
      }
      const bool table_header = prefix.empty() && node.is_table();
      diags_.Error(LocOf(key.source()), Dotted(prefix, name),
                   table_header ? fmt::format("unknown table [{}]", name)
                                : fmt::format("unknown key `{}`", Dotted(prefix, name)),
                   std::move(hint));
    }
  }

  // The section (other than `here`) that defines `key`, for keys written in the wrong table.
  static std::optional<std::string_view> SectionOf(std::string_view key, std::string_view here) {
    for (const Section& section : kSections) {
      if (section.name.empty() || section.name == here) continue;
      if (std::find(section.keys.begin(), section.keys.end(), key) != section.keys.end()) {
        return section.name;
      }
    }
    return std::nullopt;
  }

  // A key of another section close to `key` ("nmae" -> "job.name"), for keys that are both
  // misspelt and misplaced.
  static std::optional<std::string> NearKeyElsewhere(std::string_view key, std::string_view here) {
    for (const Section& section : kSections) {
      if (section.name.empty() || section.name == here || section.name == "trainer") continue;
      if (auto close = Closest(key, section.keys)) return Dotted(section.name, *close);
    }
    return std::nullopt;
  }

  // A sub-table; a non-table value there is an error and reads as absent.
  const toml::table* Table(const toml::table& parent, std::string_view key,
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

  const toml::node* Node(const toml::table* table, std::string_view key, const std::string& path) {
    if (!table) return nullptr;
    const toml::node* node = table->get(key);
    if (node) Record(path, *node);
    return node;
  }

  std::optional<int64_t> Integer(const toml::node& node, const std::string& path, int64_t lo,
                                 int64_t hi) {
    auto value = node.value_exact<int64_t>();
    if (!value) {
      std::string hint;
      if (auto s = node.value_exact<std::string>()) {
        const bool integer_text =
            !s->empty() && s->size() <= 19 &&
            std::all_of(s->begin() + (s->front() == '-' ? 1 : 0), s->end(),
                        [](char c) { return c >= '0' && c <= '9'; }) &&
            *s != "-";
        if (integer_text) {
          hint = fmt::format("write the number without quotes: {} = {}", LastKey(path), *s);
        } else if (path == "cluster.nnodes" && s->find(':') != std::string::npos) {
          hint = "ddprun runs a fixed number of nodes (no MIN:MAX range as in torchrun's "
                 "--nnodes); write a number, e.g. nnodes = 2";
        }
      }
      TypeError(node, path, "an integer", std::move(hint));
      return std::nullopt;
    }
    if (*value < lo || *value > hi) {
      diags_.Error(LocOf(node), path,
                   fmt::format("{} = {} is out of range ({}..{})", path, *value, lo, hi));
      return std::nullopt;
    }
    return value;
  }

  std::optional<std::string> String(const toml::node& node, const std::string& path,
                                    bool allow_empty = false) {
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

  std::optional<Duration> DurationValue(const toml::node& node, const std::string& path) {
    constexpr std::string_view kUnits = "units: ms, s, m, h, d; e.g. \"250ms\", \"30s\", \"15m\"";
    if (auto i = node.value_exact<int64_t>()) {
      TypeError(node, path, "a duration string",
                fmt::format("write \"{}s\" ({})", *i, kUnits));
      return std::nullopt;
    }
    auto text = node.value_exact<std::string>();
    if (!text) {
      TypeError(node, path, "a duration string", fmt::format("write e.g. \"30s\" ({})", kUnits));
      return std::nullopt;
    }
    auto value = ParseDuration(*text);
    if (!value) {
      diags_.Error(LocOf(node), path,
                   fmt::format("{} = {} is not a duration", path, Show(node)),
                   fmt::format("write a number and a unit, without spaces ({})", kUnits));
      return std::nullopt;
    }
    return value;
  }

  void ReadDuration(const toml::table* table, std::string_view key, std::string_view prefix,
                 Duration& out) {
    const std::string path = Dotted(prefix, key);
    if (const toml::node* node = Node(table, key, path)) {
      if (auto d = DurationValue(*node, path)) out = *d;
    }
  }

  static std::string_view LastKey(std::string_view path) {
    const size_t dot = path.rfind('.');
    return dot == std::string_view::npos ? path : path.substr(dot + 1);
  }

  // --- sections -------------------------------------------------------------------------

  void LoadVersion() {
    const toml::node* node = Node(&root_, "version", "version");
    if (!node) {
      Missing(nullptr, "version", "add `version = 1` at the top of the file");
      return;
    }
    auto value = node->value_exact<int64_t>();
    if (!value) {
      TypeError(*node, "version", "an integer", "write `version = 1`");
    } else if (*value != 1) {
      diags_.Error(LocOf(*node), "version",
                   fmt::format("unsupported job file version {}", *value),
                   "this ddprun reads version 1; write `version = 1` or upgrade ddprun");
    }
  }

  void LoadJob() {
    const toml::table* job = Table(root_, "job", "job");
    if (!job) {
      if (!root_.get("job")) {
        diags_.Error({}, "job", "missing required table [job]",
                     "add [job] with name = \"my-job\" and command = [\"python\", \"train.py\"]");
      }
      return;
    }
    CheckKeys(*job, "job", kJobKeys);

    if (const toml::node* node = Node(job, "name", "job.name")) {
      if (auto name = String(*node, "job.name")) {
        if (!IsValidJobName(*name)) {
          diags_.Error(LocOf(*node), "job.name",
                       fmt::format("job.name = {} is not a valid job name", Show(*node)),
                       fmt::format("use 1 to {} letters, digits, '.', '_' or '-' (it names the "
                                   "run id and the log folder)",
                                   kMaxNameLength));
        } else {
          spec_.job.name = *name;
        }
      }
    } else {
      Missing(job, "job.name", "add name = \"my-job\" under [job]");
    }

    if (const toml::node* node = Node(job, "command", "job.command")) {
      LoadCommand(*node);
    } else {
      Missing(job, "job.command", "add command = [\"python\", \"train.py\"] under [job]");
    }

    if (const toml::node* node = Node(job, "workdir", "job.workdir")) {
      if (auto dir = String(*node, "job.workdir")) spec_.job.workdir = *dir;
    }

    if (const toml::node* node = Node(job, "code_check", "job.code_check")) {
      if (auto mode = String(*node, "job.code_check")) {
        if (*mode == "off") {
          spec_.job.code_check = JobSpec::CodeCheck::kOff;
        } else if (*mode == "warn") {
          spec_.job.code_check = JobSpec::CodeCheck::kWarn;
        } else if (*mode == "refuse") {
          spec_.job.code_check = JobSpec::CodeCheck::kRefuse;
        } else {
          diags_.Error(LocOf(*node), "job.code_check",
                       fmt::format("job.code_check = {} is not \"off\", \"warn\" or \"refuse\"",
                                   Show(*node)),
                       "\"refuse\" refuses a node whose script or git commit differs from node "
                       "0's; \"warn\" lets it join and says what differs");
        }
      }
    }

    if (const toml::table* env = Table(*job, "env", "job.env")) {
      for (auto&& [key, value] : *env) {
        const std::string name(key.str());
        const std::string path = "job.env." + name;
        Record(path, value);
        if (!IsValidEnvName(name)) {
          diags_.Error(LocOf(key.source()), path,
                       fmt::format("`{}` is not a valid environment variable name", name),
                       "use letters, digits and '_', not starting with a digit");
          continue;
        }
        if (name == "DDPRUN_SECRET" || name == "DDPRUN_SECRET_FILE") {
          // A secret in the job file is in version control and in every node's fingerprint
          // exchange; and job.env only reaches the workers, not the agents that use it.
          diags_.Error(LocOf(key.source()), path,
                       fmt::format("job.env may not set {}: the shared secret must not be in "
                                   "the job file",
                                   name),
                       "set DDPRUN_SECRET_FILE (a file only you can read) in the environment "
                       "of ddprun on every node; see Security in docs/running.md");
          diags_.HideLine();
          continue;
        }
        if (IsOwnedEnvName(name)) {
          diags_.Error(LocOf(key.source()), path,
                       fmt::format("job.env may not set {}: ddprun sets it for each worker", name),
                       OwnedNameHint(name));
          continue;
        }
        const size_t before = diags_.items.size();
        if (auto text = String(value, path, /*allow_empty=*/true)) spec_.job.env[name] = *text;
        if (diags_.items.size() > before && LooksSecret(name)) {
          diags_.HideLine();
          diags_.items.back().hint = "write the value as a quoted string";
        }
      }
    }
  }

  static std::string OwnedNameHint(const std::string& name) {
    if (name.starts_with("PL_TRAINER_")) {
      std::string key = name.substr(11);
      std::transform(key.begin(), key.end(), key.begin(),
                     [](char c) { return static_cast<char>(std::tolower(c)); });
      return fmt::format("ddprun sets {} from [trainer]; write `{} = ...` under [trainer]", name,
                         key);
    }
    if (name == "MASTER_ADDR") return "ddprun sets MASTER_ADDR from cluster.master_addr";
    if (name == "MASTER_PORT") {
      return "ddprun sets MASTER_PORT from cluster.master_port (or cluster.store_port)";
    }
    if (name == "WORLD_SIZE" || name == "GROUP_WORLD_SIZE" || name == "LOCAL_WORLD_SIZE" ||
        name == "ROLE_WORLD_SIZE") {
      return fmt::format("ddprun sets {} from cluster.nodes (or nnodes) and "
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
    return fmt::format("ddprun sets {} per worker and round; see the worker contract in "
                       "docs/job-file.md",
                       name);
  }

  void LoadCommand(const toml::node& node) {
    const toml::array* array = node.as_array();
    if (!array) {
      std::string hint;
      if (auto s = node.value_exact<std::string>()) {
        hint = "write the command as a list of arguments, e.g. [\"python\", \"train.py\"]";
      }
      TypeError(node, "job.command", "an array of strings", std::move(hint));
      return;
    }
    if (array->empty()) {
      diags_.Error(LocOf(node), "job.command", "job.command must not be empty",
                   "e.g. command = [\"python\", \"train.py\"]");
      return;
    }
    std::vector<std::string> command;
    bool ok = true;
    for (size_t i = 0; i < array->size(); ++i) {
      const std::string path = fmt::format("job.command[{}]", i);
      const toml::node& item = *array->get(i);
      Record(path, item);
      auto arg = String(item, path, /*allow_empty=*/i > 0);
      if (!arg) {
        ok = false;
        continue;
      }
      command.push_back(*arg);
    }
    if (ok) spec_.job.command = std::move(command);
  }

  void LoadTrainer() {
    const toml::table* trainer = Table(root_, "trainer", "trainer");
    trainer_ = trainer;
    if (!trainer) return;
    // Sorted by position: settings keep the order the user wrote them in.
    std::vector<std::pair<std::string, const toml::node*>> entries;
    for (auto&& [key, value] : *trainer) entries.emplace_back(std::string(key.str()), &value);
    std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
      const auto la = LocOf(*a.second);
      const auto lb = LocOf(*b.second);
      return std::pair(la.line, la.column) < std::pair(lb.line, lb.column);
    });
    for (const auto& [key, node] : entries) {
      const std::string path = "trainer." + key;
      Record(path, *node);
      const SourceLoc loc = LocOf(*node);
      if (!IsValidTrainerKey(key)) {
        diags_.Error(loc, path, fmt::format("`{}` is not a valid [trainer] key", key),
                     "Lightning's Trainer arguments are lower-case names like max_epochs");
        continue;
      }
      if (std::find(kLightningTrainerArgs.begin(), kLightningTrainerArgs.end(), key) ==
          kLightningTrainerArgs.end()) {
        std::string hint;
        if (auto close = Closest(key, kLightningTrainerArgs)) {
          hint = fmt::format("did you mean `{}`?", *close);
        }
        diags_.Warning(loc, path,
                       fmt::format("trainer.{} is not an argument of Lightning's Trainer; "
                                   "Lightning ignores PL_TRAINER_{}",
                                   key, UpperCase(key)),
                       std::move(hint));
      }
      if (key == "devices") {
        LoadDevices(*node);
        continue;
      }
      auto value = TrainerValueOf(*node, path);
      if (!value) continue;
      if (key == "num_nodes") {
        auto* n = std::get_if<int64_t>(&value->value);
        if (!n || *n < 1 || *n > kMaxNodes) {
          diags_.Error(loc, path,
                       fmt::format("trainer.num_nodes must be a positive integer, not {}",
                                   Show(*node)),
                       "Lightning requires num_nodes >= 1");
          continue;
        }
        spec_.trainer.num_nodes = static_cast<int>(*n);
      } else if (key == "accelerator") {
        if (!CheckAccelerator(*node, *value)) continue;
      } else if (key == "strategy") {
        if (!CheckStrategy(*node, *value)) continue;
      }
      spec_.trainer.settings.emplace_back(key, std::move(*value));
    }
  }

  static std::string UpperCase(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](char c) { return static_cast<char>(std::toupper(c)); });
    return s;
  }

  // Every TOML value but dates and times: each has a Python literal that Lightning's
  // literal_eval reads back as the same type (worker_env.cc writes it).
  std::optional<TrainerValue> TrainerValueOf(const toml::node& node, const std::string& path) {
    if (auto b = node.value_exact<bool>()) return TrainerValue{*b};
    if (auto i = node.value_exact<int64_t>()) return TrainerValue{*i};
    if (auto d = node.value_exact<double>()) {
      if (!std::isfinite(*d)) {
        diags_.Error(LocOf(node), path, fmt::format("{} must be a finite number", path),
                     "inf and nan have no Python literal, so Lightning would read them as "
                     "strings");
        return std::nullopt;
      }
      return TrainerValue{*d};
    }
    if (auto s = node.value_exact<std::string>()) return TrainerValue{*s};
    if (const toml::array* array = node.as_array()) {
      // A list of integers keeps its own spelling (device ids).
      const bool all_ints = std::all_of(array->begin(), array->end(),
                                        [](const toml::node& item) { return item.is_integer(); });
      if (all_ints) {
        std::vector<int64_t> ints;
        for (const toml::node& item : *array) ints.push_back(*item.value_exact<int64_t>());
        return TrainerValue{std::move(ints)};
      }
    }
    if (node.is_array() || node.is_table()) {
      TrainerLiteral literal;
      if (!RenderComposite(node, path, literal)) return std::nullopt;
      return TrainerValue{std::move(literal)};
    }
    TypeError(node, path, "a boolean, number, string, array or table",
              "[trainer] values reach the script as PL_TRAINER_* Python literals, which have "
              "no dates or times; write it as a string");
    return std::nullopt;
  }

  // An array or inline table of [trainer] in both spellings, items rendered recursively (the
  // depth is bounded by PreScan). Reports every bad item; false when there was one.
  bool RenderComposite(const toml::node& node, const std::string& path, TrainerLiteral& out) {
    bool ok = true;
    auto item = [&](const toml::node& child, const std::string& child_path, std::string& python,
                    std::string& canonical) {
      if (child.is_array() || child.is_table()) {
        TrainerLiteral nested;
        if (!RenderComposite(child, child_path, nested)) return false;
        python = std::move(nested.python);
        canonical = std::move(nested.canonical);
        return true;
      }
      auto value = TrainerValueOf(child, child_path);
      if (!value) return false;
      python = TrainerPythonLiteral(*value, /*top_level=*/false);
      canonical = TrainerCanonical(*value);
      return true;
    };
    if (const toml::array* array = node.as_array()) {
      out.python = "[";
      out.canonical = "[";
      for (size_t i = 0; i < array->size(); ++i) {
        std::string python, canonical;
        if (!item(*array->get(i), fmt::format("{}[{}]", path, i), python, canonical)) {
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
      if (!item(child, fmt::format("{}.{}", path, key.str()), python, canonical)) {
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

  void LoadDevices(const toml::node& node) {
    const std::string path = "trainer.devices";
    const SourceLoc loc = LocOf(node);
    const std::string explicit_hint = "ddprun starts one process per device and must know "
                                      "how many: set an explicit count, e.g. devices = 8";
    if (auto s = node.value_exact<std::string>()) {
      if (*s == "auto") {
        diags_.Error(loc, path, "trainer.devices = \"auto\" is not supported", explicit_hint);
      } else {
        diags_.Error(loc, path,
                     fmt::format("trainer.devices = {} is not a device count", Show(node)),
                     "write a count (devices = 8) or a list of device ids (devices = [0, 1])");
      }
      return;
    }
    if (auto n = node.value_exact<int64_t>()) {
      if (*n == -1) {
        diags_.Error(loc, path, "trainer.devices = -1 (all devices) is not supported",
                     explicit_hint);
        return;
      }
      if (*n < 1 || *n > kMaxProcsPerNode) {
        diags_.Error(loc, path, fmt::format("trainer.devices = {} is out of range (1..{})", *n,
                                            kMaxProcsPerNode));
        return;
      }
      spec_.trainer.devices = static_cast<int>(*n);
      spec_.trainer.settings.emplace_back("devices", TrainerValue{*n});
      return;
    }
    if (const toml::array* array = node.as_array()) {
      if (array->empty() || array->size() > static_cast<size_t>(kMaxProcsPerNode)) {
        diags_.Error(loc, path, "trainer.devices must list at least one device id",
                     "e.g. devices = [0, 1]");
        return;
      }
      std::vector<int64_t> ids;
      std::map<int64_t, SourceLoc> seen;
      bool ok = true;
      for (size_t i = 0; i < array->size(); ++i) {
        const toml::node& item = *array->get(i);
        const std::string item_path = fmt::format("{}[{}]", path, i);
        Record(item_path, item);
        auto id = Integer(item, item_path, 0, 1'000'000);
        if (!id) {
          ok = false;
          continue;
        }
        if (auto it = seen.find(*id); it != seen.end()) {
          diags_.Error(LocOf(item), item_path,
                       fmt::format("device id {} is listed twice in trainer.devices", *id));
          diags_.AddNote(it->second, "first listed here");
          ok = false;
          continue;
        }
        seen[*id] = LocOf(item);
        ids.push_back(*id);
      }
      if (!ok) return;
      spec_.trainer.devices = static_cast<int>(ids.size());
      spec_.trainer.device_ids = ids;
      spec_.trainer.settings.emplace_back("devices", TrainerValue{std::move(ids)});
      return;
    }
    TypeError(node, path, "a device count or a list of device ids",
              "e.g. devices = 8 or devices = [0, 1]");
  }

  bool CheckAccelerator(const toml::node& node, const TrainerValue& value) {
    const std::string path = "trainer.accelerator";
    const auto* name = std::get_if<std::string>(&value.value);
    if (!name) {
      TypeError(node, path, "a string", "e.g. accelerator = \"gpu\"");
      return false;
    }
    spec_.trainer.accelerator = *name;
    static constexpr std::array<std::string_view, 6> kKnown = {"cpu", "gpu", "cuda",
                                                               "auto", "mps", "tpu"};
    if (*name == "cpu" || *name == "gpu" || *name == "cuda" || *name == "auto") return true;
    if (*name == "mps") {
      diags_.Warning(LocOf(node), path,
                     "trainer.accelerator = \"mps\" has one device per machine and no "
                     "multi-node backend",
                     "use \"cpu\" for a multi-node test on Macs");
      return true;
    }
    if (*name == "tpu") {
      diags_.Error(LocOf(node), path, "trainer.accelerator = \"tpu\" is not supported",
                   "TPU jobs start their processes through XLA, not through a DDP launcher");
      return false;
    }
    std::string hint = "use \"gpu\", \"cuda\", \"cpu\" or \"auto\"";
    if (auto close = Closest(*name, kKnown)) hint = fmt::format("did you mean \"{}\"?", *close);
    diags_.Error(LocOf(node), path,
                 fmt::format("unknown accelerator {}", Show(node)), std::move(hint));
    return false;
  }

  bool CheckStrategy(const toml::node& node, const TrainerValue& value) {
    const std::string path = "trainer.strategy";
    const auto* name = std::get_if<std::string>(&value.value);
    if (!name) {
      TypeError(node, path, "a string", "e.g. strategy = \"ddp\"");
      return false;
    }
    spec_.trainer.strategy = *name;
    if (std::find(kLauncherStrategies.begin(), kLauncherStrategies.end(), *name) !=
        kLauncherStrategies.end()) {
      return true;
    }
    const SourceLoc loc = LocOf(node);
    if (name->starts_with("ddp_spawn") || name->starts_with("ddp_fork") ||
        name->starts_with("ddp_notebook")) {
      std::string suggestion = "ddp";
      if (name->ends_with("_find_unused_parameters_true")) {
        suggestion = "ddp_find_unused_parameters_true";
      } else if (name->ends_with("_find_unused_parameters_false")) {
        suggestion = "ddp_find_unused_parameters_false";
      }
      diags_.Error(loc, path,
                   fmt::format("trainer.strategy = {} starts its own worker processes", Show(node)),
                   fmt::format("ddprun starts one process per device; use strategy = \"{}\"",
                               suggestion));
      return false;
    }
    if (*name == "dp") {
      diags_.Error(loc, path, "trainer.strategy = \"dp\" runs in a single process on one node",
                   "use strategy = \"ddp\" for multi-node training");
      return false;
    }
    if (*name == "single_device" || *name == "xla" || *name == "single_xla" ||
        *name == "xla_fsdp") {
      diags_.Error(loc, path,
                   fmt::format("trainer.strategy = {} cannot run under a DDP launcher",
                               Show(node)),
                   "use strategy = \"ddp\"");
      return false;
    }
    std::string hint = "ddprun knows ddp, ddp_find_unused_parameters_true/false, fsdp and "
                       "deepspeed; a custom strategy must initialise from the environment";
    if (auto close = Closest(*name, kLauncherStrategies)) {
      hint = fmt::format("did you mean \"{}\"?", *close);
    }
    diags_.Warning(loc, path,
                   fmt::format("unknown strategy {}: ddprun cannot tell whether it works with "
                               "an external launcher",
                               Show(node)),
                   std::move(hint));
    return true;
  }

  void LoadCluster() {
    const toml::table* cluster = Table(root_, "cluster", "cluster");
    if (!cluster) {
      if (!root_.get("cluster")) {
        diags_.Error({}, "cluster", "missing required table [cluster]",
                     "add [cluster] with nodes = [\"host-a\", \"host-b\"] (or nnodes = 2)");
      }
      return;
    }
    CheckKeys(*cluster, "cluster", kClusterKeys);
    auto& c = spec_.cluster;

    const toml::node* nodes_node = Node(cluster, "nodes", "cluster.nodes");
    bool nodes_ok = false;
    if (nodes_node) nodes_ok = LoadNodes(*nodes_node);

    const toml::node* nnodes_node = Node(cluster, "nnodes", "cluster.nnodes");
    std::optional<int64_t> nnodes;
    if (nnodes_node) nnodes = Integer(*nnodes_node, "cluster.nnodes", 1, kMaxNodes);

    if (!nodes_node && !nnodes_node) {
      diags_.Error(LocOf(*cluster), "cluster.nodes",
                   "[cluster] needs either `nodes` or `nnodes`",
                   "list the hosts, nodes = [\"gpu-01\", \"gpu-02\"], or give their number, "
                   "nnodes = 2");
    }
    if (nodes_ok) {
      c.nnodes = static_cast<int>(c.nodes.size());
      if (nnodes && *nnodes != c.nnodes) {
        diags_.Error(LocOf(*nnodes_node), "cluster.nnodes",
                     fmt::format("cluster.nnodes = {} does not match the {} hosts of "
                                 "cluster.nodes",
                                 *nnodes, c.nnodes),
                     fmt::format("remove cluster.nnodes (it is len(cluster.nodes)) or set it "
                                 "to {}",
                                 c.nnodes));
      }
    } else if (nnodes && !nodes_node) {
      c.nnodes = static_cast<int>(*nnodes);
    }
    nnodes_known_ = c.nnodes > 0;

    const toml::node* addr_node = Node(cluster, "master_addr", "cluster.master_addr");
    if (addr_node) {
      if (auto addr = String(*addr_node, "cluster.master_addr")) {
        if (!IsHostOrIp(*addr)) {
          diags_.Error(LocOf(*addr_node), "cluster.master_addr",
                       fmt::format("cluster.master_addr = {} is neither an IP address nor a "
                                   "host name",
                                   Show(*addr_node)),
                       "write an address like \"10.10.10.16\" or a host name like \"gpu-01\" "
                       "(IPv6 without brackets)");
        } else {
          c.master_addr = *addr;
          if (nodes_ok) CheckMasterAmongNodes(*addr_node);
        }
      }
    } else {
      c.master_addr = nodes_ok ? c.nodes.front() : "127.0.0.1";
    }

    if (const toml::node* node = Node(cluster, "master_port", "cluster.master_port")) {
      if (auto port = Integer(*node, "cluster.master_port", 1, 65535)) {
        c.master_port = static_cast<uint16_t>(*port);
        if (*port < 1024) {
          diags_.Warning(LocOf(*node), "cluster.master_port",
                         fmt::format("cluster.master_port = {} is a privileged port", *port),
                         "binding it needs root; ports 1024..65535 do not");
        }
      }
    }

    if (const toml::node* node = Node(cluster, "store_port", "cluster.store_port")) {
      if (auto port = Integer(*node, "cluster.store_port", 1, 65535)) {
        if (*port == c.master_port) {
          diags_.Error(LocOf(*node), "cluster.store_port",
                       fmt::format("cluster.store_port = {} is the same as cluster.master_port",
                                   *port),
                       "the store needs a port of its own; remove store_port to relay the "
                       "store through master_port");
        } else {
          c.store_port = static_cast<uint16_t>(*port);
        }
      }
    }

    const toml::node* nproc_node = Node(cluster, "nproc_per_node", "cluster.nproc_per_node");
    nproc_node_ = nproc_node;
    if (nproc_node) {
      if (auto n = Integer(*nproc_node, "cluster.nproc_per_node", 1, kMaxProcsPerNode)) {
        c.nproc_per_node = static_cast<int>(*n);
      }
    } else if (!devices_failed()) {
      c.nproc_per_node = spec_.trainer.devices.value_or(1);
    }
  }

  bool devices_failed() const {
    return trainer_ && trainer_->get("devices") && !spec_.trainer.devices;
  }

  bool LoadNodes(const toml::node& node) {
    const toml::array* array = node.as_array();
    if (!array) {
      TypeError(node, "cluster.nodes", "an array of host names",
                "e.g. nodes = [\"gpu-01\", \"gpu-02\"]");
      return false;
    }
    if (array->empty()) {
      diags_.Error(LocOf(node), "cluster.nodes", "cluster.nodes must list at least one host");
      return false;
    }
    if (array->size() > static_cast<size_t>(kMaxNodes)) {
      diags_.Error(LocOf(node), "cluster.nodes",
                   fmt::format("cluster.nodes lists more than {} hosts", kMaxNodes));
      return false;
    }
    bool ok = true;
    std::map<std::string, std::pair<size_t, SourceLoc>> seen;
    std::vector<std::string> hosts;
    for (size_t i = 0; i < array->size(); ++i) {
      const std::string path = fmt::format("cluster.nodes[{}]", i);
      const toml::node& item = *array->get(i);
      Record(path, item);
      auto host = String(item, path);
      if (!host) {
        ok = false;
        continue;
      }
      if (!IsHostOrIp(*host)) {
        diags_.Error(LocOf(item), path,
                     fmt::format("{} = {} is neither an IP address nor a host name", path,
                                 Show(item)),
                     "write an address like \"10.10.10.16\" or a host name like \"gpu-01\"");
        ok = false;
        continue;
      }
      if (auto it = seen.find(*host); it != seen.end()) {
        diags_.Error(LocOf(item), path,
                     fmt::format("host {} is listed twice in cluster.nodes (nodes {} and {})",
                                 Show(item), it->second.first, i),
                     "each node runs one agent; list every host once");
        diags_.AddNote(it->second.second, fmt::format("first listed here as node {}",
                                                      it->second.first));
        ok = false;
        continue;
      }
      seen[*host] = {i, LocOf(item)};
      hosts.push_back(*host);
    }
    if (ok) spec_.cluster.nodes = std::move(hosts);
    return ok;
  }

  void CheckMasterAmongNodes(const toml::node& addr_node) {
    const auto& c = spec_.cluster;
    auto it = std::find(c.nodes.begin(), c.nodes.end(), c.master_addr);
    if (it == c.nodes.begin()) return;
    if (it != c.nodes.end()) {
      const auto index = it - c.nodes.begin();
      diags_.Error(LocOf(addr_node), "cluster.master_addr",
                   fmt::format("cluster.master_addr = \"{}\" is node {}, but node 0 (\"{}\") "
                               "hosts the coordinator",
                               c.master_addr, index, c.nodes.front()),
                   fmt::format("list \"{}\" first in cluster.nodes, or set master_addr to an "
                               "address of \"{}\"",
                               c.master_addr, c.nodes.front()));
      return;
    }
    diags_.Warning(LocOf(addr_node), "cluster.master_addr",
                   fmt::format("cluster.master_addr = \"{}\" is not one of cluster.nodes",
                               c.master_addr),
                   fmt::format("it must be an address of node 0 (\"{}\"), where the coordinator "
                               "listens; ddprun cannot check that",
                               c.nodes.front()));
  }

  void CrossCheckTrainer() {
    auto& c = spec_.cluster;
    const auto& t = spec_.trainer;
    if (nproc_node_ && c.nproc_per_node > 0 && t.devices && *t.devices != c.nproc_per_node) {
      diags_.Error(LocOf(*nproc_node_), "cluster.nproc_per_node",
                   fmt::format("cluster.nproc_per_node = {} does not match trainer.devices = {}",
                               c.nproc_per_node, *t.devices),
                   fmt::format("set trainer.devices = {} or cluster.nproc_per_node = {}",
                               c.nproc_per_node, *t.devices));
    }
    if (t.num_nodes && nnodes_known_ && *t.num_nodes != c.nnodes) {
      const SourceLoc loc = spec_.LocationOf("trainer.num_nodes");
      if (!c.nodes.empty()) {
        diags_.Error(loc, "trainer.num_nodes",
                     fmt::format("trainer.num_nodes = {} does not match the {} hosts of "
                                 "cluster.nodes",
                                 *t.num_nodes, c.nnodes),
                     fmt::format("set trainer.num_nodes = {} or list {} hosts in cluster.nodes",
                                 c.nnodes, *t.num_nodes));
      } else {
        diags_.Error(loc, "trainer.num_nodes",
                     fmt::format("trainer.num_nodes = {} does not match cluster.nnodes = {}",
                                 *t.num_nodes, c.nnodes),
                     fmt::format("set trainer.num_nodes = {} or cluster.nnodes = {}", c.nnodes,
                                 *t.num_nodes));
      }
    }
    if (trainer_ && !trainer_->get("num_nodes") && nnodes_known_ && c.nnodes > 1) {
      diags_.Warning(LocOf(*trainer_), "trainer.num_nodes",
                     fmt::format("[trainer] does not set num_nodes; Lightning's Trainer() then "
                                 "uses 1 and rejects WORLD_SIZE = {}",
                                 spec_.WorldSize()),
                     fmt::format("add num_nodes = {} under [trainer]", c.nnodes));
    }
    if (t.device_ids && t.accelerator == "cpu") {
      diags_.Error(spec_.LocationOf("trainer.devices"), "trainer.devices",
                   "trainer.devices lists device ids, but accelerator = \"cpu\" takes a count",
                   fmt::format("write devices = {}", *t.devices));
    }
  }

  void LoadRestart() {
    const toml::table* restart = Table(root_, "restart", "restart");
    if (!restart) return;
    CheckKeys(*restart, "restart", kRestartKeys);
    if (const toml::node* node = Node(restart, "max_restarts", "restart.max_restarts")) {
      if (auto n = Integer(*node, "restart.max_restarts", 0, kMaxRestarts)) {
        spec_.restart.max_restarts = static_cast<int>(*n);
      }
    }
    ReadDuration(restart, "backoff", "restart", spec_.restart.backoff);
    if (const toml::node* node = Node(restart, "backoff_max", "restart.backoff_max")) {
      if (auto d = DurationValue(*node, "restart.backoff_max")) {
        if (*d < spec_.restart.backoff) {
          diags_.Error(LocOf(*node), "restart.backoff_max",
                       fmt::format("restart.backoff_max = {} is shorter than restart.backoff = {}",
                                   FormatDuration(*d), FormatDuration(spec_.restart.backoff)),
                       "backoff is the first wait and backoff_max the longest; the wait doubles "
                       "after each restart between the two");
        } else {
          spec_.restart.backoff_max = *d;
        }
      }
    }
  }

  void LoadTimeouts() {
    const toml::table* timeouts = Table(root_, "timeouts", "timeouts");
    if (timeouts) {
      CheckKeys(*timeouts, "timeouts", kTimeoutKeys);
      ReadDuration(timeouts, "rendezvous", "timeouts", spec_.timeouts.rendezvous);
      ReadDuration(timeouts, "heartbeat", "timeouts", spec_.timeouts.heartbeat);
      ReadDuration(timeouts, "stop_grace", "timeouts", spec_.timeouts.stop_grace);
    }
    const auto& t = spec_.timeouts;
    if (t.rendezvous <= Duration::zero()) {
      diags_.Error(spec_.LocationOf("timeouts.rendezvous"), "timeouts.rendezvous",
                   "timeouts.rendezvous must be longer than 0s");
    }
    if (t.heartbeat <= Duration::zero()) {
      diags_.Error(spec_.LocationOf("timeouts.heartbeat"), "timeouts.heartbeat",
                   "timeouts.heartbeat must be longer than 0s", "e.g. heartbeat = \"2s\"");
    } else if (t.rendezvous > Duration::zero() && 3 * t.heartbeat >= t.rendezvous) {
      diags_.Error(spec_.LocationOf("timeouts.heartbeat"), "timeouts.heartbeat",
                   fmt::format("timeouts.heartbeat = {} is too long for timeouts.rendezvous = "
                               "{}: a node is declared lost after 3 missed beats ({})",
                               FormatDuration(t.heartbeat), FormatDuration(t.rendezvous),
                               FormatDuration(3 * t.heartbeat)),
                   HeartbeatHint(t.heartbeat, t.rendezvous));
    }
    if (t.stop_grace > t.rendezvous && t.rendezvous > Duration::zero()) {
      TimeoutOrderWarning("timeouts.stop_grace", t.stop_grace, "is longer than",
                          "other nodes may give up on the next round while this one still "
                          "waits for its workers to stop");
    }
    const Duration longest_backoff = spec_.restart.backoff_max.value_or(spec_.restart.backoff);
    if (longest_backoff >= t.rendezvous && t.rendezvous > Duration::zero()) {
      TimeoutOrderWarning(spec_.restart.backoff_max ? "restart.backoff_max" : "restart.backoff",
                          longest_backoff, "is not shorter than",
                          "nodes wait for the backoff before rejoining; keep it well under the "
                          "rendezvous timeout");
    }
  }

  // Suggestions that satisfy 3 x heartbeat < rendezvous from either side, in round numbers.
  static std::string HeartbeatHint(Duration heartbeat, Duration rendezvous) {
    const auto beat = std::chrono::duration_cast<std::chrono::milliseconds>(rendezvous / 10);
    const auto wait = std::chrono::duration_cast<std::chrono::seconds>(10 * heartbeat);
    if (beat <= Duration::zero()) {
      return fmt::format("make 3 x heartbeat shorter than rendezvous, e.g. rendezvous = \"{}\"",
                         FormatDuration(wait));
    }
    return fmt::format("make 3 x heartbeat shorter than rendezvous: e.g. heartbeat = \"{}\", or "
                       "rendezvous = \"{}\"",
                       FormatDuration(beat), FormatDuration(std::max<Duration>(wait, Seconds(1))));
  }

  // `key` (a wait) is longer than timeouts.rendezvous. The warning points at what the user
  // wrote: at `key` when it is in the file, else at rendezvous, naming `key`'s default, so that
  // nobody is warned about a setting they never made without being told which one to change.
  void TimeoutOrderWarning(const std::string& key, Duration value, std::string_view relation,
                           std::string_view why) {
    const auto& t = spec_.timeouts;
    const SourceLoc key_loc = spec_.LocationOf(key);
    if (key_loc.line != 0) {
      diags_.Warning(key_loc, key,
                     fmt::format("{} = {} {} timeouts.rendezvous = {}", key,
                                 FormatDuration(value), relation, FormatDuration(t.rendezvous)),
                     std::string(why));
      return;
    }
    diags_.Warning(spec_.LocationOf("timeouts.rendezvous"), "timeouts.rendezvous",
                   fmt::format("the default {} = {} {} timeouts.rendezvous = {}", key,
                               FormatDuration(value), relation, FormatDuration(t.rendezvous)),
                   fmt::format("{}; set {} shorter, or rendezvous longer", why, key));
  }

  void LoadLogs() {
    const toml::table* logs = Table(root_, "logs", "logs");
    if (!logs) return;
    CheckKeys(*logs, "logs", kLogKeys);
    if (const toml::node* node = Node(logs, "dir", "logs.dir")) {
      if (auto dir = String(*node, "logs.dir")) spec_.logs.dir = *dir;
    }
    const toml::node* node = Node(logs, "console", "logs.console");
    if (!node) return;
    const std::string console_hint = "write \"all\", \"none\" or a list of global ranks, e.g. [0]";
    if (auto s = node->value_exact<std::string>()) {
      if (*s == "all") {
        spec_.logs.console.mode = ConsoleFilter::Mode::kAll;
      } else if (*s == "none") {
        spec_.logs.console.mode = ConsoleFilter::Mode::kNone;
      } else {
        diags_.Error(LocOf(*node), "logs.console",
                     fmt::format("logs.console = {} is not a console filter", Show(*node)),
                     console_hint);
      }
      return;
    }
    const toml::array* array = node->as_array();
    if (!array) {
      TypeError(*node, "logs.console", "\"all\", \"none\" or an array of ranks", console_hint);
      return;
    }
    const int world = spec_.WorldSize();
    std::vector<int> ranks;
    bool ok = true;
    for (size_t i = 0; i < array->size(); ++i) {
      const std::string path = fmt::format("logs.console[{}]", i);
      const toml::node& item = *array->get(i);
      Record(path, item);
      auto rank = Integer(item, path, 0, world > 0 ? world - 1 : std::numeric_limits<int>::max());
      if (!rank) {
        ok = false;
        continue;
      }
      if (std::find(ranks.begin(), ranks.end(), *rank) != ranks.end()) {
        diags_.Error(LocOf(item), path,
                     fmt::format("rank {} is listed twice in logs.console", *rank));
        ok = false;
        continue;
      }
      ranks.push_back(static_cast<int>(*rank));
    }
    if (!ok) return;
    std::sort(ranks.begin(), ranks.end());
    spec_.logs.console.mode = ConsoleFilter::Mode::kRanks;
    spec_.logs.console.ranks = std::move(ranks);
  }

  void LoadSimulate() {
    const toml::table* sim = Table(root_, "simulate", "simulate");
    if (!sim) return;
    CheckKeys(*sim, "simulate", kSimulateKeys);
    auto& s = spec_.simulate;
    if (const toml::node* node = Node(sim, "seed", "simulate.seed")) {
      if (auto seed = Integer(*node, "simulate.seed", 0, std::numeric_limits<int64_t>::max())) {
        s.seed = static_cast<uint64_t>(*seed);
      }
    }
    for (std::string_view key : {"node_mtbf", "worker_mtbf"}) {
      const std::string path = Dotted("simulate", key);
      if (const toml::node* node = Node(sim, key, path)) {
        if (auto d = PositiveDuration(*node, path)) {
          (key == "node_mtbf" ? s.node_mtbf : s.worker_mtbf) = *d;
        }
      }
    }
    ReadDuration(sim, "train_time", "simulate", s.train_time);
    for (std::string_view key : {"checkpoint_every", "worker_startup", "max_time"}) {
      const std::string path = Dotted("simulate", key);
      if (const toml::node* node = Node(sim, key, path)) {
        auto d = key == "worker_startup" ? DurationValue(*node, path)
                                         : PositiveDuration(*node, path);
        if (!d) continue;
        if (key == "checkpoint_every") s.checkpoint_every = *d;
        if (key == "worker_startup") s.worker_startup = *d;
        if (key == "max_time") s.max_time = *d;
      }
    }
    const toml::node* faults = Node(sim, "faults", "simulate.faults");
    if (!faults) return;
    const toml::array* array = faults->as_array();
    if (!array) {
      TypeError(*faults, "simulate.faults", "an array of tables",
                "write each fault as a [[simulate.faults]] section");
      return;
    }
    for (size_t i = 0; i < array->size(); ++i) {
      const std::string path = fmt::format("simulate.faults[{}]", i);
      const toml::node& item = *array->get(i);
      Record(path, item);
      const toml::table* table = item.as_table();
      if (!table) {
        TypeError(item, path, "a table", "write each fault as a [[simulate.faults]] section");
        continue;
      }
      if (auto fault = LoadFault(*table, path)) s.faults.push_back(*fault);
    }
  }

  std::optional<Duration> PositiveDuration(const toml::node& node, const std::string& path) {
    auto d = DurationValue(node, path);
    if (d && *d <= Duration::zero()) {
      diags_.Error(LocOf(node), path, fmt::format("{} must be longer than 0s", path));
      return std::nullopt;
    }
    return d;
  }

  std::optional<FaultSpec> LoadFault(const toml::table& table, const std::string& prefix) {
    CheckKeys(table, prefix, kFaultKeys);
    FaultSpec fault;
    bool ok = true;
    const toml::node* kind_node = Node(&table, "kind", prefix + ".kind");
    const FaultKindInfo* info = nullptr;
    if (!kind_node) {
      Missing(&table, prefix + ".kind", "e.g. kind = \"node-crash\"");
      ok = false;
    } else if (auto name = String(*kind_node, prefix + ".kind")) {
      if (auto kind = ParseFaultKind(*name)) {
        info = &InfoOf(*kind);
        fault.kind = *kind;
      } else {
        diags_.Error(LocOf(*kind_node), prefix + ".kind",
                     fmt::format("unknown fault kind {}", Show(*kind_node)),
                     fmt::format("known kinds: {}", KnownFaultKinds()));
        ok = false;
      }
    } else {
      ok = false;
    }
    if (const toml::node* node = Node(&table, "at", prefix + ".at")) {
      if (auto at = DurationValue(*node, prefix + ".at")) {
        fault.at = *at;
      } else {
        ok = false;
      }
    } else {
      Missing(&table, prefix + ".at", "e.g. at = \"40m\" (virtual time since the start)");
      ok = false;
    }
    const int nnodes = spec_.cluster.nnodes;
    const int nproc = spec_.cluster.nproc_per_node;
    const int64_t max_node = nnodes > 0 ? nnodes - 1 : kMaxNodes;
    const int64_t max_local = nproc > 0 ? nproc - 1 : kMaxProcsPerNode;
    for (auto&& [key, node] : table) {
      const std::string name(key.str());
      const std::string path = prefix + "." + name;
      Record(path, node);
      if (name == "at" || name == "kind") continue;
      if (std::find(kFaultKeys.begin(), kFaultKeys.end(), name) == kFaultKeys.end()) continue;
      if (info && !FaultTakes(*info, name)) {
        diags_.Error(LocOf(key.source()), path,
                     fmt::format("{} does not apply to a fault of kind \"{}\"", path,
                                 info->name),
                     FaultKeysHint(*info));
        ok = false;
        continue;
      }
      if (name == "node") {
        if (auto n = Integer(node, path, 0, max_node)) {
          fault.node = static_cast<int>(*n);
        } else {
          ok = false;
        }
      } else if (name == "local_rank") {
        if (auto n = Integer(node, path, 0, max_local)) {
          fault.local_rank = static_cast<int>(*n);
        } else {
          ok = false;
        }
      } else if (name == "exit_code") {
        if (auto n = Integer(node, path, 0, 255)) {
          fault.exit_code = static_cast<int>(*n);
        } else {
          ok = false;
        }
      } else if (name == "duration" || name == "reboot_after") {
        if (auto d = DurationValue(node, path)) {
          (name == "duration" ? fault.duration : fault.reboot_after) = *d;
        } else {
          ok = false;
        }
      } else if (name == "peers") {
        const toml::array* peers = node.as_array();
        if (!peers) {
          TypeError(node, path, "an array of node ranks", "e.g. peers = [0]");
          ok = false;
          continue;
        }
        for (size_t i = 0; i < peers->size(); ++i) {
          const std::string peer_path = fmt::format("{}[{}]", path, i);
          if (auto n = Integer(*peers->get(i), peer_path, 0, max_node)) {
            fault.peers.push_back(static_cast<int>(*n));
          } else {
            ok = false;
          }
        }
      }
    }
    if (ok && std::find(fault.peers.begin(), fault.peers.end(), fault.node) != fault.peers.end()) {
      diags_.Error(spec_.LocationOf(prefix + ".peers"), prefix + ".peers",
                   fmt::format("{}.peers contains node {}, the node it cuts off", prefix,
                               fault.node));
      ok = false;
    }
    if (!ok) return std::nullopt;
    return fault;
  }


  const toml::table& root_;
  JobSpec& spec_;
  Diagnostics& diags_;
  const toml::table* trainer_ = nullptr;
  const toml::node* nproc_node_ = nullptr;
  bool nnodes_known_ = false;
};

// Checks that must pass before toml++ sees the text; returns false when one failed.
bool PreScan(std::string_view text, Diagnostics& diagnostics) {
  if (text.size() > kMaxFileBytes) {
    diagnostics.Error({}, "", fmt::format("the job file is larger than {} bytes", kMaxFileBytes),
                      "a job file is a short TOML text; is this the right file?");
    return false;
  }
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    diagnostics.Error(LocAtOffset(text, nul), "",
                      "the job file contains a NUL byte; it must be UTF-8 text",
                      "is this the right file? a job file is TOML text");
    return false;
  }
  if (size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    diagnostics.Error(LocAtOffset(text, bad), "",
                      fmt::format("the job file is not valid UTF-8 (byte 0x{:02x} at offset {})",
                                  static_cast<unsigned char>(text[bad]), bad),
                      "save the file as UTF-8");
    return false;
  }
  if (size_t deep = FirstTooDeep(text); deep != std::string_view::npos) {
    diagnostics.Error(LocAtOffset(text, deep), "",
                      fmt::format("arrays and inline tables are nested more than {} deep",
                                  kMaxNesting),
                      "a job file needs at most two levels");
    return false;
  }
  return true;
}

}  // namespace

std::string_view FaultKindName(FaultKind kind) { return InfoOf(kind).name; }

std::optional<FaultKind> ParseFaultKind(std::string_view name) {
  for (const auto& info : kFaultKinds) {
    if (info.name == name) return info.kind;
  }
  return std::nullopt;
}

LoadResult ParseJobText(std::string_view text, std::string_view source_name) {
  LoadResult result;
  result.source_text = std::string(text.substr(0, std::min(text.size(), kMaxFileBytes + 1)));
  if (!PreScan(text, result.diagnostics)) return result;

  toml::table root;
  // The Debian toml++ is built with exceptions; they stop here and become diagnostics.
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& error) {
    std::string description(error.description());
    result.diagnostics.Error(LocOf(error.source()), "",
                             fmt::format("invalid TOML: {}", description));
    return result;
  } catch (const std::exception& error) {
    result.diagnostics.Error({}, "", fmt::format("cannot parse the job file: {}", error.what()));
    return result;
  }

  JobSpec spec;
  spec.source_name = std::string(source_name);
  Loader(root, spec, result.diagnostics).Run();
  if (!result.diagnostics.HasErrors()) result.spec = std::move(spec);
  return result;
}

LoadResult LoadJobFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    LoadResult result;
    result.diagnostics.Error({}, "", fmt::format("cannot read job file {}", path),
                             "check the path; `ddprun check` takes the job file as argument");
    return result;
  }
  // Read one byte past the limit so an oversized file is recognised without reading it all.
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) {
    LoadResult result;
    result.diagnostics.Error({}, "", fmt::format("cannot read job file {}", path));
    return result;
  }
  return ParseJobText(text, path);
}

void AppendScriptArgs(JobSpec& spec, const std::vector<std::string>& args) {
  spec.job.command.insert(spec.job.command.end(), args.begin(), args.end());
  spec.script_args.insert(spec.script_args.end(), args.begin(), args.end());
}

void CheckEphemeralPorts(const JobSpec& spec, PortRange ephemeral,
                         const std::vector<PortRange>& reserved, Diagnostics& diagnostics) {
  auto check = [&](std::string_view key, uint16_t port) {
    if (port < ephemeral.first || port > ephemeral.last) return;
    for (const PortRange& r : reserved) {
      if (port >= r.first && port <= r.last) return;
    }
    const std::string path = fmt::format("cluster.{}", key);
    const bool default_fits = 29500 < ephemeral.first || 29500 > ephemeral.last;
    diagnostics.Warning(
        spec.LocationOf(path), path,
        fmt::format("{} = {} is inside this machine's ephemeral port range ({}-{})", path, port,
                    ephemeral.first, ephemeral.last),
        fmt::format("an outgoing connection may be given this port, and node 0 then cannot "
                    "listen on it; use a port outside the range{}, or reserve it with "
                    "`sysctl net.ipv4.ip_local_reserved_ports={}`",
                    default_fits ? " (e.g. 29500, as torchrun)" : "", port));
  };
  check("master_port", spec.cluster.master_port);
  if (spec.cluster.store_port) check("store_port", *spec.cluster.store_port);
}

namespace {

// A decimal port 0..65535 in `text`, whitespace around it ignored.
std::optional<int> ParsePort(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\n')) {
    text.remove_suffix(1);
  }
  if (text.empty() || text.size() > 5) return std::nullopt;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value <= 65535 ? std::optional<int>(value) : std::nullopt;
}

}  // namespace

std::optional<PortRange> ParsePortRange(std::string_view text) {
  const size_t split = text.find_first_of(" \t");
  if (split == std::string_view::npos) return std::nullopt;
  auto first = ParsePort(text.substr(0, split));
  auto last = ParsePort(text.substr(split + 1));
  if (!first || !last || *first > *last) return std::nullopt;
  return PortRange{*first, *last};
}

std::vector<PortRange> ParseReservedPorts(std::string_view text) {
  std::vector<PortRange> out;
  // A bounded number of items: the kernel writes a short list, a huge one is not read.
  for (int items = 0; !text.empty() && items < 4096; ++items) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    const size_t dash = item.find('-');
    auto first = ParsePort(item.substr(0, dash));
    auto last = dash == std::string_view::npos ? first : ParsePort(item.substr(dash + 1));
    if (first && last && *first <= *last) out.push_back({*first, *last});
  }
  return out;
}

bool FaultFitsJob(const FaultSpec& fault, const JobSpec& spec, std::string* error) {
  const int nnodes = spec.cluster.nnodes;
  auto fail = [&](std::string message) {
    if (error) *error = std::move(message);
    return false;
  };
  if (fault.node < 0 || fault.node >= nnodes) {
    return fail(fmt::format("{} fault: node {} is out of range (the job has nodes 0..{})",
                            FaultKindName(fault.kind), fault.node, nnodes - 1));
  }
  if (fault.local_rank &&
      (*fault.local_rank < 0 || *fault.local_rank >= spec.cluster.nproc_per_node)) {
    return fail(fmt::format("{} fault: local_rank {} is out of range (0..{})",
                            FaultKindName(fault.kind), *fault.local_rank,
                            spec.cluster.nproc_per_node - 1));
  }
  for (int peer : fault.peers) {
    if (peer < 0 || peer >= nnodes || peer == fault.node) {
      return fail(fmt::format("{} fault: peer {} is not another node of the job (0..{})",
                              FaultKindName(fault.kind), peer, nnodes - 1));
    }
  }
  return true;
}

std::optional<FaultSpec> ParseFaultFlag(std::string_view text, std::string* error) {
  auto fail = [&](std::string message) -> std::optional<FaultSpec> {
    if (error) *error = std::move(message);
    return std::nullopt;
  };
  const std::string usage = "write kind@time[:key=value,...], e.g. node-crash@40m:node=1";
  if (text.size() > 512) return fail("--fault value is too long");
  const size_t at_sign = text.find('@');
  if (at_sign == std::string_view::npos) {
    return fail(fmt::format("--fault `{}` has no time: {}", text, usage));
  }
  const std::string_view kind_name = text.substr(0, at_sign);
  auto kind = ParseFaultKind(kind_name);
  if (!kind) {
    return fail(fmt::format("unknown fault kind `{}` (known: {})", kind_name, KnownFaultKinds()));
  }
  const FaultKindInfo& info = InfoOf(*kind);
  std::string_view rest = text.substr(at_sign + 1);
  const size_t colon = rest.find(':');
  const std::string_view time = rest.substr(0, colon);
  FaultSpec fault;
  fault.kind = *kind;
  auto at = ParseDuration(time);
  if (!at) return fail(fmt::format("`{}` is not a duration (e.g. 90s, 40m, 1h30m)", time));
  fault.at = *at;
  if (colon == std::string_view::npos) return fault;

  auto parse_int = [](std::string_view s, int lo, int hi) -> std::optional<int> {
    if (s.empty() || s.size() > 9) return std::nullopt;
    int value = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return std::nullopt;
      value = value * 10 + (c - '0');
    }
    if (value < lo || value > hi) return std::nullopt;
    return value;
  };

  std::string_view pairs = rest.substr(colon + 1);
  std::set<std::string, std::less<>> seen;
  while (!pairs.empty()) {
    const size_t comma = pairs.find(',');
    const std::string_view pair = pairs.substr(0, comma);
    pairs = comma == std::string_view::npos ? std::string_view{} : pairs.substr(comma + 1);
    const size_t eq = pair.find('=');
    if (eq == std::string_view::npos) {
      return fail(fmt::format("`{}` is not key=value: {}", pair, usage));
    }
    const std::string_view key = pair.substr(0, eq);
    const std::string_view value = pair.substr(eq + 1);
    if (std::find(kFaultKeys.begin(), kFaultKeys.end(), key) == kFaultKeys.end() ||
        key == "at" || key == "kind") {
      std::string hint;
      if (auto close = Closest(key, kFaultKeys)) hint = fmt::format("; did you mean `{}`?", *close);
      return fail(fmt::format("unknown fault key `{}`{}", key, hint));
    }
    if (!FaultTakes(info, key)) {
      return fail(fmt::format("`{}` does not apply to a {} fault ({})", key, info.name,
                              FaultKeysHint(info)));
    }
    if (!seen.insert(std::string(key)).second) {
      return fail(fmt::format("`{}` is given twice", key));
    }
    if (key == "node" || key == "local_rank" || key == "exit_code") {
      auto n = parse_int(value, 0, key == "exit_code" ? 255 : static_cast<int>(kMaxNodes));
      if (!n) return fail(fmt::format("{}={} is not a valid number", key, value));
      if (key == "node") fault.node = *n;
      if (key == "local_rank") fault.local_rank = *n;
      if (key == "exit_code") fault.exit_code = *n;
    } else if (key == "duration" || key == "reboot_after") {
      auto d = ParseDuration(value);
      if (!d) return fail(fmt::format("{}={} is not a duration (e.g. 30s, 5m)", key, value));
      (key == "duration" ? fault.duration : fault.reboot_after) = *d;
    } else if (key == "peers") {
      std::string_view list = value;
      while (true) {
        const size_t plus = list.find('+');
        auto n = parse_int(list.substr(0, plus), 0, static_cast<int>(kMaxNodes));
        if (!n) return fail(fmt::format("peers={} is not a list of node ranks (e.g. 0+2)", value));
        fault.peers.push_back(*n);
        if (plus == std::string_view::npos) break;
        list = list.substr(plus + 1);
      }
    }
  }
  return fault;
}

}  // namespace ddprun
