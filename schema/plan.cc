#include "schema/plan.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "schema/canonical.h"
#include "schema/loader.h"

namespace ddprun {
namespace {

using Json = nlohmann::ordered_json;


bool IsGpuJob(const JobSpec& spec) {
  return spec.trainer.accelerator == "gpu" || spec.trainer.accelerator == "cuda";
}

std::string HostOf(const JobSpec& spec, int node_rank) {
  if (node_rank < static_cast<int>(spec.cluster.nodes.size())) {
    return spec.cluster.nodes[static_cast<size_t>(node_rank)];
  }
  return fmt::format("node{}", node_rank);
}

uint16_t WorkerMasterPort(const JobSpec& spec) {
  return spec.cluster.store_port.value_or(spec.cluster.master_port);
}

// torchrun runs `python -u script args` itself; only a plain `python`/`python3` interpreter can
// be handed over that way, anything else runs as is with --no_python.
std::string TorchrunCommand(const JobSpec& spec, int node_rank, const std::string& run_id) {
  std::vector<std::string> words;
  for (const auto& [name, value] : spec.job.env) {
    words.push_back(name + "=" + PrintableEnvValue(name, value));
  }
  for (const auto& [key, value] : spec.trainer.settings) {
    std::string upper = key;
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](char c) { return static_cast<char>(std::toupper(c)); });
    words.push_back("PL_TRAINER_" + upper + "=" + TrainerEnvValue(value));
  }
  words.push_back("torchrun");
  words.push_back(fmt::format("--nnodes={}", spec.cluster.nnodes));
  words.push_back(fmt::format("--nproc_per_node={}", spec.cluster.nproc_per_node));
  words.push_back(fmt::format("--node_rank={}", node_rank));
  words.push_back(fmt::format("--master_addr={}", spec.cluster.master_addr));
  words.push_back(fmt::format("--master_port={}", spec.cluster.master_port));
  words.push_back(fmt::format("--max_restarts={}", spec.restart.max_restarts));
  words.push_back(fmt::format("--rdzv_id={}", run_id));
  const auto& command = spec.job.command;
  size_t first = 0;
  if (!command.empty() && (command[0] == "python" || command[0] == "python3") &&
      command.size() >= 2) {
    if (command[1] == "-m" && command.size() >= 3) {
      words.push_back("-m");
      first = 2;
    } else if (!command[1].starts_with("-")) {
      first = 1;
    } else {
      words.push_back("--no_python");
    }
  } else {
    words.push_back("--no_python");
  }
  for (size_t i = first; i < command.size(); ++i) words.push_back(command[i]);

  std::string line;
  if (spec.job.workdir != ".") line = fmt::format("cd {} && ", ShellQuote(spec.job.workdir));
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) line += ' ';
    // VAR=value prefixes: quote the value only, so the shell still sees an assignment.
    const size_t eq = words[i].find('=');
    const bool assignment = i < spec.job.env.size() + spec.trainer.settings.size() &&
                            eq != std::string::npos;
    line += assignment ? words[i].substr(0, eq + 1) + ShellQuote(words[i].substr(eq + 1))
                       : ShellQuote(words[i]);
  }
  return line;
}

std::string DdprunCommand(const JobSpec& spec, int node_rank) {
  const std::string job = ShellQuote(spec.source_name.empty() ? "job.toml" : spec.source_name);
  std::string line = fmt::format("ddprun {}", job);
  // One node needs no rank (it is node 0); listed nodes find theirs by host name.
  if (spec.cluster.nodes.empty() && spec.cluster.nnodes > 1) {
    line += fmt::format(" --node-rank {}", node_rank);
  }
  if (!spec.script_args.empty()) {
    line += " --";
    for (const std::string& arg : spec.script_args) line += " " + ShellQuote(arg);
  }
  return line;
}

std::string DeviceText(const RankPlan& rank) {
  return rank.device ? fmt::format("cuda:{}", *rank.device) : "-";
}

// Variables whose value differs between the ranks of one node; RANK and LOCAL_RANK always,
// so a node with one worker still shows its rank.
std::vector<std::string> VaryingNames(const NodePlan& node) {
  std::set<std::string> names = {"LOCAL_RANK", "RANK"};
  if (!node.ranks.empty()) {
    const EnvList& first = node.ranks.front().env;
    for (const RankPlan& rank : node.ranks) {
      for (size_t i = 0; i < rank.env.size() && i < first.size(); ++i) {
        if (rank.env[i] != first[i]) names.insert(rank.env[i].first);
      }
    }
  }
  // Column order: the ranks first, then the rest alphabetically.
  std::vector<std::string> ordered = {"RANK", "LOCAL_RANK"};
  for (const std::string& name : names) {
    if (name != "RANK" && name != "LOCAL_RANK") ordered.push_back(name);
  }
  return ordered;
}

std::string ValueOf(const EnvList& env, const std::string& name) {
  for (const auto& [key, value] : env) {
    if (key == name) return value;
  }
  return {};
}

}  // namespace

std::string ShellQuote(std::string_view word) {
  const bool safe = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("@%+=:,./_-").find(c) != std::string_view::npos;
  });
  if (safe) return std::string(word);
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

Plan MakePlan(const JobSpec& spec, std::optional<int> only_node) {
  Plan plan;
  const int nproc = spec.cluster.nproc_per_node;
  // Once, not per rank: the fingerprint hashes the whole canonical form (2,048 hosts, say).
  const std::string run_id = RunId(spec);
  for (int node_rank = 0; node_rank < spec.cluster.nnodes; ++node_rank) {
    if (only_node && *only_node != node_rank) continue;
    NodePlan node;
    node.node_rank = node_rank;
    node.host = HostOf(spec, node_rank);
    for (int local = 0; local < nproc; ++local) {
      RankPlan rank;
      rank.global_rank = node_rank * nproc + local;
      rank.node_rank = node_rank;
      rank.local_rank = local;
      rank.host = node.host;
      if (IsGpuJob(spec)) {
        rank.device = spec.trainer.device_ids
                          ? (*spec.trainer.device_ids)[static_cast<size_t>(local)]
                          : int64_t{local};
      }
      WorkerPosition position;
      position.node_rank = node_rank;
      position.local_rank = local;
      position.restart_count = 0;
      position.master_port = WorkerMasterPort(spec);
      // Each run picks its own folder when it starts; the plan shows where it goes.
      position.error_file = spec.logs.dir + "/" + RunLogFolder(spec, "<run>") + "/" +
                            RankErrorFilePath(spec, 0, rank.global_rank);
      position.run_id = run_id;
      rank.env = WorkerEnvironment(spec, position, {});
      // Under the relay rank 0 hosts the store on a port node 0's agent picks each round, so
      // no number written here would be true; say what it is instead.
      for (auto& [name, value] : rank.env) {
        if (name == "MASTER_PORT" && !spec.cluster.store_port && rank.global_rank == 0) {
          value = std::string(kRankZeroRelayPort);
        }
        // The plan is printed, pasted into tickets and piped to tools: no secrets in it.
        value = PrintableEnvValue(name, value);
      }
      node.ranks.push_back(std::move(rank));
    }
    node.torchrun_command = TorchrunCommand(spec, node_rank, run_id);
    node.ddprun_command = DdprunCommand(spec, node_rank);
    plan.nodes.push_back(std::move(node));
  }
  return plan;
}

namespace {

// The lines every rendering starts with: shape, run id, coordinator, store, restarts.
std::string PlanHeader(const JobSpec& spec) {
  std::string out;
  const auto& c = spec.cluster;
  out += fmt::format("job {}: {} node{} x {} process{} = world size {}\n", spec.job.name,
                     c.nnodes, c.nnodes == 1 ? "" : "s", c.nproc_per_node,
                     c.nproc_per_node == 1 ? "" : "es", spec.WorldSize());
  out += fmt::format("run id {}, fingerprint {}\n", RunId(spec), Fingerprint(spec).substr(0, 16));
  out += fmt::format("coordinator on node 0 at {}:{}\n", c.master_addr, c.master_port);
  if (c.store_port) {
    out += fmt::format("store: worker rank 0 listens on {}:{}\n", c.master_addr, *c.store_port);
  } else {
    out += fmt::format("store: relayed through {} to worker rank 0, whose MASTER_PORT is a "
                       "private port node 0 picks each round (other ranks get MASTER_PORT={}); "
                       "code that derives ports from MASTER_PORT needs cluster.store_port\n",
                       c.master_port, c.master_port);
  }
  if (spec.job.code_check != JobSpec::CodeCheck::kOff) {
    const auto& code = spec.job.code;
    out += fmt::format("code (nodes that differ are {}): script {} sha256 {}, git {}{}\n",
                       spec.job.code_check == JobSpec::CodeCheck::kRefuse ? "refused" : "warned about",
                       code.script.empty() ? "(none found)" : code.script,
                       code.script_sha256.empty() ? "-" : code.script_sha256.substr(0, 12),
                       code.git_commit.empty() ? "-" : code.git_commit.substr(0, 12),
                       code.git_dirty ? " (dirty)" : "");
  }
  if (spec.restart.backoff_max) {
    out += fmt::format("restarts: up to {} job-wide, backoff {} doubling up to {}\n",
                       spec.restart.max_restarts, FormatDuration(spec.restart.backoff),
                       FormatDuration(*spec.restart.backoff_max));
  } else {
    out += fmt::format("restarts: up to {} job-wide, backoff {}\n", spec.restart.max_restarts,
                       FormatDuration(spec.restart.backoff));
  }
  return out;
}

// One row per worker of `node` with the variables `names`, columns sized to their contents.
std::string WorkerTable(const NodePlan& node, const std::vector<std::string>& names) {
  std::string out;
  std::vector<size_t> widths;
  for (const std::string& name : names) {
    size_t width = name.size();
    for (const RankPlan& rank : node.ranks) {
      width = std::max(width, ValueOf(rank.env, name).size());
    }
    widths.push_back(width);
  }
  std::string header = "   ";
  for (size_t i = 0; i < names.size(); ++i) header += fmt::format(" {:<{}}", names[i], widths[i]);
  while (!header.empty() && header.back() == ' ') header.pop_back();
  out += header + "\n";
  for (const RankPlan& rank : node.ranks) {
    std::string row = "   ";
    for (size_t i = 0; i < names.size(); ++i) {
      row += fmt::format(" {:<{}}", ValueOf(rank.env, names[i]), widths[i]);
    }
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += row + "\n";
  }
  return out;
}

std::string Commands(const NodePlan& node) {
  return fmt::format("  ddprun:   {}\n  torchrun: {}\n", node.ddprun_command,
                     node.torchrun_command);
}

}  // namespace

std::string RenderPlanText(const JobSpec& spec, const Plan& plan) {
  std::string out = PlanHeader(spec);

  // The rank table is sized to its contents so long host names stay aligned.
  size_t host_width = 4;
  for (const NodePlan& node : plan.nodes) host_width = std::max(host_width, node.host.size());
  out += "\nranks:\n";
  out += fmt::format("  {:>5}  {:>4}  {:<{}}  {:>5}  {}\n", "rank", "node", "host", host_width,
                     "local", "device");
  for (const NodePlan& node : plan.nodes) {
    for (const RankPlan& rank : node.ranks) {
      out += fmt::format("  {:>5}  {:>4}  {:<{}}  {:>5}  {}\n", rank.global_rank, rank.node_rank,
                         rank.host, host_width, rank.local_rank, DeviceText(rank));
    }
  }

  for (const NodePlan& node : plan.nodes) {
    out += fmt::format("\nnode {} ({}):\n", node.node_rank, node.host);
    if (node.ranks.empty()) continue;
    const std::vector<std::string> varying = VaryingNames(node);
    out += "  environment of every worker:\n";
    for (const auto& [name, value] : node.ranks.front().env) {
      if (std::find(varying.begin(), varying.end(), name) != varying.end()) continue;
      out += fmt::format("    {}={}\n", name, value);
    }
    out += "  per worker:\n";
    out += WorkerTable(node, varying);
    out += Commands(node);
  }
  return out;
}

std::string RenderPlanSummary(const JobSpec& spec, const Plan& plan) {
  std::string out = PlanHeader(spec);
  if (plan.nodes.empty() || plan.nodes.front().ranks.empty()) return out;
  out += fmt::format("\n{} nodes: a summary; the whole plan with --full, one node with "
                     "--node-rank N, for tools --json\n",
                     plan.nodes.size());

  // The shape: the first and last few nodes, one line each.
  constexpr size_t kEnds = 3;
  size_t host_width = 4;
  for (const NodePlan& node : plan.nodes) host_width = std::max(host_width, node.host.size());
  out += fmt::format("\nnodes:\n  {:>5}  {:<{}}  ranks\n", "node", "host", host_width);
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    if (i == kEnds && plan.nodes.size() > 2 * kEnds) {
      out += fmt::format("  {:>5}  ({} more)\n", "...", plan.nodes.size() - 2 * kEnds);
      i = plan.nodes.size() - kEnds;
    }
    const NodePlan& node = plan.nodes[i];
    out += fmt::format("  {:>5}  {:<{}}  {}..{}\n", node.node_rank, node.host, host_width,
                       node.ranks.front().global_rank, node.ranks.back().global_rank);
  }

  // Which variables are the same for every worker of the job, which differ only between
  // nodes, and which differ between the workers of a node.
  const EnvList& reference = plan.nodes.front().ranks.front().env;
  std::set<std::string> per_node;
  std::set<std::string> per_worker;
  for (const NodePlan& node : plan.nodes) {
    const EnvList& first = node.ranks.front().env;
    for (const RankPlan& rank : node.ranks) {
      for (size_t i = 0; i < rank.env.size() && i < first.size(); ++i) {
        if (rank.env[i] != first[i]) per_worker.insert(rank.env[i].first);
      }
    }
    for (size_t i = 0; i < first.size() && i < reference.size(); ++i) {
      if (first[i] != reference[i]) per_node.insert(first[i].first);
    }
  }
  for (const std::string& name : per_worker) per_node.erase(name);
  out += "\nenvironment of every worker of the job:\n";
  for (const auto& [name, value] : reference) {
    if (per_node.count(name) == 0 && per_worker.count(name) == 0) {
      out += fmt::format("    {}={}\n", name, value);
    }
  }
  out += fmt::format("differs per node: {}\n", fmt::join(per_node, ", "));
  out += fmt::format("differs per worker: {}\n", fmt::join(per_worker, ", "));

  std::vector<std::string> columns = {"RANK", "LOCAL_RANK"};
  for (const auto* names : {&per_node, &per_worker}) {
    for (const std::string& name : *names) {
      if (name != "RANK" && name != "LOCAL_RANK") columns.push_back(name);
    }
  }
  for (const NodePlan* node : {&plan.nodes.front(), &plan.nodes.back()}) {
    out += fmt::format("\nnode {} ({}):\n  per worker:\n", node->node_rank, node->host);
    out += WorkerTable(*node, columns);
    out += Commands(*node);
    if (plan.nodes.size() == 1) break;
  }
  return out;
}

namespace {

Json PlanToJson(const JobSpec& spec, const Plan& plan) {
  Json j;
  j["job"] = spec.job.name;
  j["run_id"] = RunId(spec);
  j["fingerprint"] = Fingerprint(spec);
  j["nnodes"] = spec.cluster.nnodes;
  j["nproc_per_node"] = spec.cluster.nproc_per_node;
  j["world_size"] = spec.WorldSize();
  j["master_addr"] = spec.cluster.master_addr;
  j["master_port"] = spec.cluster.master_port;
  j["store_port"] = spec.cluster.store_port ? Json(*spec.cluster.store_port) : Json(nullptr);
  j["max_restarts"] = spec.restart.max_restarts;
  j["nodes"] = Json::array();
  for (const NodePlan& node : plan.nodes) {
    Json n;
    n["node_rank"] = node.node_rank;
    n["host"] = node.host;
    n["ddprun_command"] = node.ddprun_command;
    n["torchrun_command"] = node.torchrun_command;
    n["ranks"] = Json::array();
    for (const RankPlan& rank : node.ranks) {
      Json r;
      r["global_rank"] = rank.global_rank;
      r["local_rank"] = rank.local_rank;
      r["device"] = rank.device ? Json(*rank.device) : Json(nullptr);
      Json env = Json::object();
      for (const auto& [name, value] : rank.env) env[name] = value;
      r["env"] = std::move(env);
      n["ranks"].push_back(std::move(r));
    }
    j["nodes"].push_back(std::move(n));
  }
  return j;
}

}  // namespace

std::string RenderPlanJson(const JobSpec& spec, const Plan& plan) {
  return PlanToJson(spec, plan).dump(2);
}

std::string RenderCheckJson(const Diagnostics& diagnostics, std::string_view source_name,
                            const JobSpec* spec, const Plan* plan) {
  Json j;
  j["valid"] = !diagnostics.HasErrors() && spec != nullptr;
  j["diagnostics"] = Json::array();
  for (const Diagnostic& d : SortedDiagnostics(diagnostics)) {
    Json item;
    item["severity"] = d.severity == Severity::kError ? "error" : "warning";
    item["file"] = source_name;
    item["line"] = d.loc.line;
    item["column"] = d.loc.column;
    item["key"] = d.key_path;
    item["message"] = d.message;
    item["hint"] = d.hint;
    if (!d.note.empty()) {
      item["note"] = {{"line", d.note_loc.line}, {"column", d.note_loc.column},
                      {"message", d.note}};
    }
    j["diagnostics"].push_back(std::move(item));
  }
  j["plan"] = spec && plan ? PlanToJson(*spec, *plan) : Json(nullptr);
  // Invalid UTF-8 from a broken file must not make the dump throw.
  return j.dump(2, ' ', false, Json::error_handler_t::replace);
}

namespace {

Json Describe(Json schema, std::string_view description) {
  schema["description"] = description;
  return schema;
}

Json DurationSchema(std::string_view description, std::optional<std::string> default_value) {
  Json s = {{"type", "string"},
            {"pattern", "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h|d))+$"}};
  s["description"] = fmt::format("{} A duration such as \"250ms\", \"30s\", \"15m\", \"2h\", "
                                 "\"1h30m\".",
                                 description);
  if (default_value) s["default"] = *default_value;
  return s;
}

Json PortSchema(std::string_view description) {
  return Describe({{"type", "integer"}, {"minimum", 1}, {"maximum", 65535}}, description);
}

Json Strict(Json properties, std::string_view description, std::vector<std::string> required = {}) {
  Json s = {{"type", "object"}, {"description", description}};
  s["properties"] = std::move(properties);
  if (!required.empty()) s["required"] = required;
  s["additionalProperties"] = false;
  return s;
}

}  // namespace

std::string JobFileJsonSchema() {
  Json job_props;
  job_props["name"] = Describe({{"type", "string"}, {"pattern", "^[A-Za-z0-9._-]{1,128}$"}},
                               "Job name: prefix of TORCHELASTIC_RUN_ID and the log folder.");
  job_props["command"] = Describe(
      {{"type", "array"}, {"items", {{"type", "string"}}}, {"minItems", 1}},
      "The worker command, one argument per item, e.g. [\"python\", \"train.py\"].");
  job_props["workdir"] = Describe({{"type", "string"}, {"default", "."}},
                                  "Working directory of the workers, relative to the job file.");
  job_props["code_check"] = Describe(
      {{"type", "string"}, {"enum", {"off", "warn", "refuse"}}, {"default", "off"}},
      "\"refuse\": each node sends the SHA-256 of the script job.command runs and the git "
      "commit (and dirty state) of the workdir; a node whose code differs from node 0's is "
      "refused at join, naming what differs. \"warn\": the same comparison, but the node "
      "joins and node 0 logs what differs.");
  job_props["env"] = Describe(
      {{"type", "object"},
       {"propertyNames", {{"pattern", "^[A-Za-z_][A-Za-z0-9_]*$"}}},
       {"additionalProperties", {{"type", "string"}}}},
      "Extra environment variables for every worker. Names ddprun sets itself (RANK, "
      "WORLD_SIZE, MASTER_PORT, PL_TRAINER_*, ...) are not allowed.");

  Json cluster_props;
  cluster_props["nodes"] = Describe(
      {{"type", "array"}, {"items", {{"type", "string"}, {"minLength", 1}}}, {"minItems", 1},
       {"uniqueItems", true}},
      "Host names or addresses of the nodes; a node's rank is its position. Give this or "
      "nnodes.");
  cluster_props["nnodes"] = Describe({{"type", "integer"}, {"minimum", 1}, {"maximum", 10000}},
                                     "Number of nodes, when they are not listed (each node then "
                                     "needs --node-rank or DDPRUN_NODE_RANK).");
  cluster_props["master_addr"] = Describe(
      {{"type", "string"}},
      "Address of node 0, where the coordinator listens. Default: nodes[0], else 127.0.0.1.");
  cluster_props["master_port"] = PortSchema(
      "The one port node 0 listens on (coordinator and relayed store). Default 29500.");
  cluster_props["master_port"]["default"] = 29500;
  cluster_props["nproc_per_node"] = Describe(
      {{"type", "integer"}, {"minimum", 1}, {"maximum", 1024}},
      "Worker processes per node. Default: the trainer.devices count, else 1.");
  cluster_props["store_port"] = PortSchema(
      "Set to let worker rank 0 bind this port for the store instead of relaying it through "
      "master_port.");

  Json trainer_props;
  trainer_props["accelerator"] = Describe(
      {{"type", "string"}, {"enum", {"cpu", "gpu", "cuda", "auto", "mps"}}},
      "Lightning accelerator; reaches the script as PL_TRAINER_ACCELERATOR.");
  trainer_props["devices"] = Describe(
      {{"oneOf",
        {{{"type", "integer"}, {"minimum", 1}, {"maximum", 1024}},
         {{"type", "array"},
          {"items", {{"type", "integer"}, {"minimum", 0}}},
          {"minItems", 1},
          {"uniqueItems", true}}}}},
      "Devices per node: a count or a list of device ids. Must equal cluster.nproc_per_node; "
      "\"auto\" and -1 are not allowed.");
  trainer_props["num_nodes"] = Describe({{"type", "integer"}, {"minimum", 1}},
                                        "Must equal the number of nodes.");
  trainer_props["strategy"] = Describe(
      {{"type", "string"},
       {"examples", {"ddp", "ddp_find_unused_parameters_true", "fsdp", "deepspeed"}}},
      "A strategy that works under an external launcher; ddp_spawn, ddp_fork, ddp_notebook "
      "and dp do not.");
  trainer_props["precision"] = Describe({{"type", {"string", "integer"}}},
                                        "Lightning precision, e.g. \"bf16-mixed\".");
  Json trainer = {{"type", "object"},
                  {"description",
                   "Lightning Trainer defaults: each key reaches the script as "
                   "PL_TRAINER_<KEY>, so Trainer() with no arguments uses them."},
                  {"properties", trainer_props},
                  {"additionalProperties",
                   {{"type", {"boolean", "integer", "number", "string", "array", "object"}},
                    {"description",
                     "Any TOML value but a date or time; it reaches the script as a Python "
                     "literal of the same type (1.0 stays a float)."}}}};

  Json restart_props;
  restart_props["max_restarts"] = Describe(
      {{"type", "integer"}, {"minimum", 0}, {"maximum", 10000}, {"default", 0}},
      "Job-wide restart budget: how many times all workers may be restarted after a failure.");
  restart_props["backoff"] = DurationSchema("Wait before the first restart (before each "
                                            "restart without backoff_max).",
                                            "10s");
  restart_props["backoff_max"] = DurationSchema(
      "Set: the wait doubles after each restart, from backoff up to this (not below backoff).",
      std::nullopt);

  Json timeout_props;
  timeout_props["rendezvous"] = DurationSchema("All nodes must have joined by then.", "15m");
  timeout_props["heartbeat"] = DurationSchema(
      "Heartbeat period; a node silent for 3 beats is lost. 3 x heartbeat must be shorter than "
      "rendezvous.",
      "2s");
  timeout_props["stop_grace"] = DurationSchema("SIGTERM to SIGKILL grace when stopping workers.",
                                               "30s");

  Json log_props;
  log_props["dir"] = Describe({{"type", "string"}, {"default", "logs"}},
                              "Per-rank logs go to <dir>/<job>/<run>/attempt-<k>/rank-<r>.log, a new "
                              "<run> folder per run, <dir>/<job>/latest the newest "
                              "(relative to the job file).");
  log_props["console"] = Describe(
      {{"oneOf",
        {{{"type", "string"}, {"enum", {"all", "none"}}},
         {{"type", "array"}, {"items", {{"type", "integer"}, {"minimum", 0}}},
          {"uniqueItems", true}}}}},
      {"Which global ranks' output is shown live: \"all\", \"none\" or a list of ranks."});
  log_props["console"]["default"] = "all";

  std::vector<std::string> kinds;
  for (FaultKind kind :
       {FaultKind::kNodeCrash, FaultKind::kAgentHang, FaultKind::kWorkerExit,
        FaultKind::kWorkerHang, FaultKind::kPartition, FaultKind::kMasterPortBlocked,
        FaultKind::kSlowJoiner, FaultKind::kJobFileDiffers, FaultKind::kDuplicateNodeRank}) {
    kinds.emplace_back(FaultKindName(kind));
  }
  Json fault_props;
  fault_props["at"] = DurationSchema("Virtual time of the fault since the start.", std::nullopt);
  fault_props["kind"] = Describe({{"type", "string"}, {"enum", kinds}}, "What happens.");
  fault_props["node"] = Describe({{"type", "integer"}, {"minimum", 0}, {"default", 0}},
                                 "The node it hits.");
  fault_props["local_rank"] = Describe({{"type", "integer"}, {"minimum", 0}},
                                       "worker-exit, worker-hang: which worker (default 0).");
  fault_props["exit_code"] = Describe(
      {{"type", "integer"}, {"minimum", 0}, {"maximum", 255}, {"default", 1}},
      "worker-exit: the exit code.");
  fault_props["duration"] = DurationSchema(
      "agent-hang, worker-hang, partition, master-port-blocked, slow-joiner: heals after this.",
      std::nullopt);
  fault_props["reboot_after"] = DurationSchema("node-crash: the node comes back after this.",
                                               std::nullopt);
  fault_props["peers"] = Describe(
      {{"type", "array"}, {"items", {{"type", "integer"}, {"minimum", 0}}}},
      "partition: the nodes cut off from `node` (default: node 0).");

  Json sim_props;
  sim_props["seed"] = Describe({{"type", "integer"}, {"minimum", 0}, {"default", 1}},
                               "PRNG seed; the same seed and file give the same run.");
  sim_props["faults"] = Describe(
      {{"type", "array"},
       {"items", Strict(fault_props, "One scheduled fault.", {"at", "kind"})}},
      "Scheduled faults.");
  sim_props["node_mtbf"] = DurationSchema("Random node crashes: mean time between failures "
                                          "per node.",
                                          std::nullopt);
  sim_props["worker_mtbf"] = DurationSchema("Random worker exits: mean time between failures "
                                            "per worker.",
                                            std::nullopt);
  sim_props["train_time"] = DurationSchema("Training a round needs to finish the job.", "10m");
  sim_props["checkpoint_every"] = DurationSchema("Checkpoint period of the simulated script.",
                                                 "30m");
  sim_props["worker_startup"] = DurationSchema("Simulated worker start-up time.", "20s");
  sim_props["max_time"] = DurationSchema("The simulation gives up after this.", "60d");

  Json props;
  props["version"] = Describe({{"type", "integer"}, {"const", 1}}, "Job file format version.");
  props["job"] = Strict(job_props, "What to run.", {"name", "command"});
  props["cluster"] = Strict(cluster_props, "Where to run it: give nodes or nnodes.");
  props["cluster"]["anyOf"] = Json::array({{{"required", {"nodes"}}}, {{"required", {"nnodes"}}}});
  props["trainer"] = trainer;
  props["restart"] = Strict(restart_props, "Job-wide restarts after a failure.");
  props["timeouts"] = Strict(timeout_props, "Rendezvous, heartbeat and stop timeouts.");
  props["logs"] = Strict(log_props, "Per-rank log files and the live console.");
  props["simulate"] = Strict(sim_props, "Only read by `ddprun --simulate`.");

  Json schema;
  schema["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  schema["title"] = "ddprun job file (version 1)";
  schema["description"] =
      "A multi-node PyTorch DDP job for ddprun. See docs/job-file.md for every rule.";
  schema["type"] = "object";
  schema["properties"] = std::move(props);
  schema["required"] = {"version", "job", "cluster"};
  schema["additionalProperties"] = false;
  return schema.dump(2);
}

}  // namespace ddprun
