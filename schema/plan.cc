#include "schema/plan.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "schema/canonical.h"
#include "schema/loader.h"
#include "schema/python_command.h"

namespace ddprun {
namespace {

// Outside a SLURM allocation (`check` on a login node) nothing is known of node 0's host: the
// plan says so instead of showing the default 127.0.0.1 as if it were the coordinator (issue 40).
constexpr std::string_view kSlurmMasterPlaceholder = "<node 0's host in the allocation>";

std::string ShownMasterAddr(const JobSpec& spec) {
  if (spec.cluster.hosts_from_slurm && spec.cluster.nodes.empty())
    return std::string(kSlurmMasterPlaceholder);
  return spec.cluster.master_addr;
}

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

// Where a scraper reaches node `node_rank`'s metrics: a wildcard address is reached at the
// node's host name. Only for a job that serves metrics.
std::string MetricsUrl(const JobSpec& spec, int node_rank) {
  std::string host = spec.MetricsAddressOf(node_rank);
  if (host == "0.0.0.0" || host == "::") host = HostOf(spec, node_rank);
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return fmt::format("http://{}:{}/metrics", host, spec.MetricsPortOf(node_rank));
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
  if (spec.rendezvous.Etcd()) {
    // torchrun's own etcd rendezvous: it assigns the node ranks, and rank 0 may be anywhere.
    std::string endpoint = spec.rendezvous.endpoints.empty() ? "" : spec.rendezvous.endpoints.front();
    if (const size_t scheme = endpoint.find("://"); scheme != std::string::npos)
      endpoint.erase(0, scheme + 3);
    if (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    words.push_back("--rdzv_backend=etcd-v2");
    words.push_back(fmt::format("--rdzv_endpoint={}", endpoint));
  } else {
    words.push_back(fmt::format("--node_rank={}", node_rank));
    words.push_back(fmt::format("--master_addr={}", ShownMasterAddr(spec)));
    words.push_back(fmt::format("--master_port={}", spec.cluster.master_port));
  }
  words.push_back(fmt::format("--max_restarts={}", spec.restart.max_restarts));
  words.push_back(fmt::format("--rdzv_id={}", run_id));
  const auto& command = spec.job.command;
  size_t first = 0;
  if (!command.empty() && (command[0] == "python" || command[0] == "python3") && command.size() >= 2) {
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
  // The workers' folder, absolute when the job file's is known, so that the line works from
  // any folder (job.workdir is relative to the job file, not to where it is pasted).
  if (!spec.source_dir.empty()) {
    std::string dir = (std::filesystem::path(spec.source_dir) / spec.job.workdir).lexically_normal().string();
    if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    line = fmt::format("cd {} && ", ShellQuote(dir));
  } else if (spec.job.workdir != ".") {
    line = fmt::format("cd {} && ", ShellQuote(spec.job.workdir));
  }
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) line += ' ';
    // VAR=value prefixes: quote the value only, so the shell still sees an assignment.
    const size_t eq = words[i].find('=');
    const bool assignment = i < spec.job.env.size() + spec.trainer.settings.size() && eq != std::string::npos;
    line +=
        assignment ? words[i].substr(0, eq + 1) + ShellQuote(words[i].substr(eq + 1)) : ShellQuote(words[i]);
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

std::string DescribeCodeFields(const JobSpec::Code& code) {
  std::string text = code.script.empty()
                         ? fmt::format("nothing to hash ({})",
                                       code.what.empty() ? "no file named in job.command" : code.what)
                         : fmt::format("{} sha256 {}{}", code.script,
                                       code.script_sha256.empty() ? std::string("(not read)")
                                                                  : code.script_sha256.substr(0, 12),
                                       code.what.empty() ? std::string() : " (" + code.what + ")");
  text += code.git_commit.empty()
              ? ", workdir not in a git repository"
              : fmt::format(", git {}{}", code.git_commit.substr(0, 12), code.git_dirty ? " (dirty)" : "");
  return text;
}

std::string DescribeLibraries(const JobSpec::Libraries& libraries) {
  auto shown = [](const std::string& version) { return version.empty() ? std::string("-") : version; };
  std::string text = fmt::format(
      "python {}{}, torch {}, lightning {}, pytorch_lightning {}, nccl {}, cuda {}", shown(libraries.python),
      libraries.interpreter.empty() ? std::string() : " (" + libraries.interpreter + ")",
      shown(libraries.torch), shown(libraries.lightning), shown(libraries.pytorch_lightning),
      shown(libraries.nccl), shown(libraries.cuda));
  if (!libraries.note.empty()) text += " (" + libraries.note + ")";
  return text;
}

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
        rank.device =
            spec.trainer.device_ids ? (*spec.trainer.device_ids)[static_cast<size_t>(local)] : int64_t{local};
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
      if (spec.cluster.hosts_from_slurm && spec.cluster.nodes.empty())
        position.master_addr = ShownMasterAddr(spec);
      if (spec.cluster.Agents() > 1) position.socket_ifname = std::string(kSocketIfnamePlaceholder);
      rank.env = WorkerEnvironment(spec, position, {});
      // Under the relay rank 0 hosts the store on a port node 0's agent picks each round, so
      // no number written here would be true; say what it is instead.
      for (auto& [name, value] : rank.env) {
        if (name == "MASTER_PORT" && !spec.cluster.store_port && rank.global_rank == 0) {
          value = std::string(kRankZeroRelayPort);
        }
        // NCCL's "=" (an exact name) is the agent's business; the plan shows the placeholder.
        if (value == "=" + std::string(kSocketIfnamePlaceholder))
          value = std::string(kSocketIfnamePlaceholder);
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
/// The plan's lines on spares, shrinking, quarantine and the metrics endpoint (where the job
/// has them).
std::string SparesShrinkQuarantineMetricsLines(const JobSpec& spec) {
  std::string out;
  const auto& c = spec.cluster;
  const auto& t = spec.timeouts;
  const bool etcd = spec.rendezvous.Etcd();
  if (c.spares > 0) {
    out += fmt::format(
        "spares: {} ({}) wait and take the node rank of a node away for longer "
        "than timeouts.replace = {} ({})\n",
        c.spares,
        c.spare_hosts.empty() ? fmt::format("--node-rank {}..{}", c.nnodes, c.Agents() - 1)
                              : fmt::format("{}", fmt::join(c.spare_hosts, ", ")),
        FormatDuration(t.replace), etcd ? "any node's but the coordinator's" : "never node 0's");
  }
  if (c.min_nodes < c.nnodes) {
    out += fmt::format(
        "shrinking: with no spare left, rounds run with the nodes left, down to "
        "{} (world size {}..{}); WORLD_SIZE, GROUP_WORLD_SIZE and "
        "PL_TRAINER_NUM_NODES follow the round, and a node that returns takes "
        "part again from the next restart\n",
        c.min_nodes, c.min_nodes * c.nproc_per_node, spec.WorldSize());
  }
  if (c.CanReplace() && spec.quarantine.failures > 0) {
    out += fmt::format(
        "quarantine: a host (not {}) on which {} rounds fail within {} sits "
        "out for {}, twice as long each further time; kept in {}\n",
        etcd ? "the coordinator's" : "node 0's", spec.quarantine.failures,
        FormatDuration(spec.quarantine.window), FormatDuration(spec.quarantine.cooldown),
        etcd ? std::string("etcd, with the job's state")
             : fmt::format("{}/{}/quarantine.state", spec.logs.dir, spec.job.name));
  }
  if (spec.metrics.Served()) {
    constexpr int kUrlsShown = 2;
    std::vector<std::string> urls;
    for (int k = 0; k < std::min(c.nnodes, kUrlsShown); ++k) urls.push_back(MetricsUrl(spec, k));
    if (c.nnodes > kUrlsShown) urls.push_back("...");
    const std::string where = spec.metrics.addr == JobSpec::Metrics::kOwnNodeAddress
                                  ? fmt::format("port {} of its address in cluster.nodes", spec.metrics.port)
                                  : spec.metrics.Listen();
    const std::string per_node = spec.metrics.port_per_node ? " + its node rank" : "";
    out += fmt::format(
        "metrics: each node serves GET /metrics on {}{} for itself, node 0 also for "
        "the job: {}\n",
        where, per_node, fmt::join(urls, ", "));
  }
  return out;
}

std::string PlanHeader(const JobSpec& spec) {
  std::string out;
  const auto& c = spec.cluster;
  out += fmt::format("job {}: {} node{} x {} process{} = world size {}\n", spec.job.name, c.nnodes,
                     c.nnodes == 1 ? "" : "s", c.nproc_per_node, c.nproc_per_node == 1 ? "" : "es",
                     spec.WorldSize());
  out += fmt::format("run id {}, fingerprint {}\n", RunId(spec), Fingerprint(spec).substr(0, 16));
  const bool etcd = spec.rendezvous.Etcd();
  if (etcd) {
    out += fmt::format(
        "coordinator: whichever agent holds the role in etcd ({}; keys under "
        "{}/), on port {} of its host; its agent plays node rank 0, so rank 0 "
        "and MASTER_ADDR move with it (shown below as when node 0 holds it); a "
        "lost holder is replaced within rendezvous.lease = {} and a few seconds\n",
        fmt::join(spec.rendezvous.endpoints, ", "), EtcdKeyDir(spec), c.master_port,
        FormatDuration(spec.rendezvous.lease));
  } else {
    out += fmt::format("coordinator on node 0 at {}:{}\n", ShownMasterAddr(spec), c.master_port);
  }
  if (c.store_port) {
    out += fmt::format("store: worker rank 0 listens on {}:{}\n", ShownMasterAddr(spec), *c.store_port);
  } else {
    out += fmt::format(
        "store: relayed through {} to worker rank 0, whose MASTER_PORT is a "
        "private port node 0 picks each round (other ranks get MASTER_PORT={}); "
        "code that derives ports from MASTER_PORT needs cluster.store_port\n",
        c.master_port, c.master_port);
  }
  if (c.Agents() > 1) {
    std::vector<std::string> set, kept;
    for (std::string_view name : kSocketIfnameNames) {
      (spec.job.env.count(std::string(name)) > 0 ? kept : set).push_back(std::string(name));
    }
    if (!set.empty()) {
      out += fmt::format(
          "worker sockets: {} name, on each node, the interface that holds its "
          "cluster.nodes address, or else the one it reaches master_addr through "
          "(NCCL's as \"=name\"), found by its agent when it starts{}; a variable "
          "set in job.env or in the agent's environment is kept\n",
          fmt::join(set, ", "), kept.empty() ? "" : fmt::format(" ({} from job.env)", fmt::join(kept, ", ")));
    }
  }
  if (spec.job.code_check != JobSpec::CodeCheck::kOff) {
    out += fmt::format("code (nodes that differ are {}): {}\n",
                       spec.job.code_check == JobSpec::CodeCheck::kRefuse ? "refused" : "warned about",
                       DescribeCodeFields(spec.job.code));
  }
  if (spec.job.library_check != JobSpec::CodeCheck::kOff) {
    out += fmt::format("libraries (nodes that differ are {}): {}\n",
                       spec.job.library_check == JobSpec::CodeCheck::kRefuse ? "refused" : "warned about",
                       DescribeLibraries(spec.job.libraries));
    // When the job's own interpreter ran, and with how little of the job's code (issue 36.4).
    out += fmt::format(
        "  (read by running {} -S -c '<print version and sys.path>' once, in workdir with job.env, at "
        "most 5 s: -S runs no sitecustomize.py and no .pth import line, and nothing is imported; "
        "then the versions are read from the files on that path)\n",
        spec.job.libraries.interpreter.empty() ? "the job's interpreter" : spec.job.libraries.interpreter);
  }
  out += WorkerStartText(spec.job.command, spec.job.preload) + "\n";
  if (spec.restart.backoff_max) {
    out +=
        fmt::format("restarts: up to {} job-wide, backoff {} doubling up to {}\n", spec.restart.max_restarts,
                    FormatDuration(spec.restart.backoff), FormatDuration(*spec.restart.backoff_max));
  } else {
    out += fmt::format("restarts: up to {} job-wide, backoff {}\n", spec.restart.max_restarts,
                       FormatDuration(spec.restart.backoff));
  }
  const auto& t = spec.timeouts;
  if (t.progress_auto) {
    out += fmt::format(
        "hung ranks: timeouts.progress = \"auto\" (5 x the longest interval between "
        "beacons, at least {}; {} to the first beacon); workers must call "
        "ddprun.progress()\n",
        FormatDuration(JobSpec::Timeouts::kAutoProgressFloor), FormatDuration(t.progress_start));
  } else if (t.progress) {
    out += fmt::format(
        "hung ranks: a rank without a progress beacon for {} ({} to the first) is "
        "hung; workers must call ddprun.progress()\n",
        FormatDuration(*t.progress), FormatDuration(t.progress_start));
  } else {
    // Issue 26: say what that means, since nothing else will end such a round.
    out +=
        "hung ranks: NOT detected: without timeouts.progress a round whose ranks all hang (a "
        "deadlock, a collective that never returns) runs until someone stops the job, since no "
        "other timeout ends it; set timeouts.progress and call ddprun.progress() in the "
        "training loop (docs/job-file.md, [timeouts])\n";
  }
  out += SparesShrinkQuarantineMetricsLines(spec);
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
  return fmt::format("  ddprun:   {}\n  torchrun: {}\n", node.ddprun_command, node.torchrun_command);
}

}  // namespace

std::string RenderPlanText(const JobSpec& spec, const Plan& plan) {
  std::string out = PlanHeader(spec);

  // The rank table is sized to its contents so long host names stay aligned.
  size_t host_width = 4;
  for (const NodePlan& node : plan.nodes) host_width = std::max(host_width, node.host.size());
  out += "\nranks:\n";
  out += fmt::format("  {:>5}  {:>4}  {:<{}}  {:>5}  {}\n", "rank", "node", "host", host_width, "local",
                     "device");
  for (const NodePlan& node : plan.nodes) {
    for (const RankPlan& rank : node.ranks) {
      out += fmt::format("  {:>5}  {:>4}  {:<{}}  {:>5}  {}\n", rank.global_rank, rank.node_rank, rank.host,
                         host_width, rank.local_rank, DeviceText(rank));
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
  out += fmt::format(
      "\n{} nodes: a summary; the whole plan with --full, one node with "
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
  {
    Json start;
    start["preload"] = spec.job.preload;
    const auto parsed = ParsePythonCommand(spec.job.command);
    start["warm"] = !spec.job.preload.empty() && parsed.ok();
    if (!spec.job.preload.empty() && !parsed) start["cold_reason"] = parsed.error();
    j["worker_start"] = std::move(start);
  }
  j["nnodes"] = spec.cluster.nnodes;
  j["nproc_per_node"] = spec.cluster.nproc_per_node;
  j["world_size"] = spec.WorldSize();
  j["master_addr"] = spec.cluster.master_addr;
  j["master_port"] = spec.cluster.master_port;
  j["store_port"] = spec.cluster.store_port ? Json(*spec.cluster.store_port) : Json(nullptr);
  j["max_restarts"] = spec.restart.max_restarts;
  j["metrics_listen"] = spec.metrics.Served() ? Json(spec.metrics.Listen()) : Json(nullptr);
  j["nodes"] = Json::array();
  for (const NodePlan& node : plan.nodes) {
    Json n;
    n["node_rank"] = node.node_rank;
    n["host"] = node.host;
    n["ddprun_command"] = node.ddprun_command;
    n["torchrun_command"] = node.torchrun_command;
    n["metrics_url"] = spec.metrics.Served() ? Json(MetricsUrl(spec, node.node_rank)) : Json(nullptr);
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

std::string RenderPlanJson(const JobSpec& spec, const Plan& plan) { return PlanToJson(spec, plan).dump(2); }

std::string RenderCheckJson(const Diagnostics& diagnostics, std::string_view source_name, const JobSpec* spec,
                            const Plan* plan) {
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
      item["note"] = {{"line", d.note_loc.line}, {"column", d.note_loc.column}, {"message", d.note}};
    }
    j["diagnostics"].push_back(std::move(item));
  }
  j["plan"] = spec && plan ? PlanToJson(*spec, *plan) : Json(nullptr);
  // Invalid UTF-8 from a broken file must not make the dump throw.
  return j.dump(2, ' ', false, Json::error_handler_t::replace);
}

}  // namespace ddprun
