// The `ddprun` executable: parses the command line with CLI11 and calls one subcommand of
// cli/commands.h. `ddprun job.toml` means `ddprun run job.toml`, and
// `ddprun --simulate job.toml` means `ddprun simulate job.toml`.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/torchrun_habits.h"
#include "ddprun_build.h"
#include "ddprun_version.h"
#include "schema/diagnostics.h"
#include "schema/plan.h"

namespace ddprun::cli {
namespace {

constexpr std::string_view kSubcommands[] = {
    "run", "simulate", "check", "preflight",         "schema", "init", "report",
    "up",  "status",   "down",  "__preflight-worker"};
// What a mistyped command is compared with (the hidden one is not suggested).
constexpr std::string_view kPublicSubcommands[] = {"run",  "simulate", "check", "preflight", "schema",
                                                   "init", "report",   "up",    "status",    "down"};

bool IsSubcommand(std::string_view word) {
  for (std::string_view name : kSubcommands) {
    if (word == name) return true;
  }
  return false;
}

// Rewrites the two short forms into their subcommands so each keeps one set of options and
// one --help.
std::vector<std::string> Normalise(std::vector<std::string> args) {
  if (args.size() < 2 || IsSubcommand(args[1])) return args;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--simulate") {
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
      args.insert(args.begin() + 1, "simulate");
      return args;
    }
  }
  const std::string& first = args[1];
  if (first == "--help" || first == "-h" || first == "--version") return args;
  args.insert(args.begin() + 1, "run");
  return args;
}

// Splits off what follows the first `--`: the script's own arguments, which ddprun appends to
// job.command (CLI11 never sees them, so `-- --help` reaches the script).
std::vector<std::string> TakeScriptArgs(std::vector<std::string>& args) {
  const auto dashes = std::find(args.begin() + (args.empty() ? 0 : 1), args.end(), "--");
  if (dashes == args.end()) return {};
  std::vector<std::string> script_args(dashes + 1, args.end());
  args.erase(dashes, args.end());
  return script_args;
}

// `ddprun chekc job.toml`: a first word that is neither a command nor a file, but close to a
// command, is a typo, not a job file to run.
std::optional<std::string_view> MistypedSubcommand(const std::vector<std::string>& args) {
  if (args.size() < 2 || args[1].empty() || args[1][0] == '-' || IsSubcommand(args[1])) {
    return std::nullopt;
  }
  std::error_code ec;
  if (std::filesystem::exists(args[1], ec)) return std::nullopt;
  return ClosestName(args[1], kPublicSubcommands);
}

// The long option of `command` closest to each unknown `--flag` in `args`, for a hint after
// CLI11's own message ("did you mean `--node-rank`?").
std::string FlagHints(const CLI::App& command, const std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  }
  std::vector<std::string_view> views(names.begin(), names.end());
  std::string hints;
  for (const std::string& arg : args) {
    if (!arg.starts_with("--")) continue;
    const std::string flag = arg.substr(0, arg.find('='));
    if (std::find(names.begin(), names.end(), flag) != names.end()) continue;
    if (auto close = ClosestName(flag, views)) {
      hints += fmt::format("hint: `{}` is not an option of `ddprun {}`; did you mean `{}`?\n", flag,
                           command.get_name(), *close);
    }
  }
  return hints;
}

bool ColorWanted(const std::string& mode) {
  if (mode == "always") return true;
  if (mode == "never") return false;
  return ::isatty(STDERR_FILENO) == 1 && std::getenv("NO_COLOR") == nullptr;
}

/// One subcommand: where CLI11 parsed it, and what runs it once parsed, given the arguments
/// after `--` (only the commands that take them may get any).
struct Command {
  CLI::App* app = nullptr;
  bool takes_script_args = false;
  std::function<int(const std::vector<std::string>& script_args)> run;
};

/// `ddprun run`.
Command AddRun(CLI::App& app) {
  struct State {
    RunOptions options;
    int node_rank = 0;
    CLI::Option* rank_opt = nullptr;
  };
  auto s = std::make_shared<State>();
  RunOptions& run = s->options;
  CLI::App* cmd = app.add_subcommand("run", "Run this node's agent (on every node)");
  cmd->add_option("job", run.job_path, "The job file")->required();
  s->rank_opt = cmd->add_option("--node-rank", s->node_rank,
                                "This node's rank (default: DDPRUN_NODE_RANK, SLURM_NODEID, or this "
                                "host's position in cluster.nodes)")
                    ->check(CLI::NonNegativeNumber);
  cmd->add_flag("-v,--verbose", run.verbose, "Log the protocol as it happens");
  // Hidden: what `ddprun up` passes to each agent it starts (stdin is the link to it).
  cmd->add_flag("--under-up", run.under_up, "")->group("");
  cmd->footer(
      "Examples:\n"
      "  ddprun run job.toml                  node rank from the host name in cluster.nodes\n"
      "  ddprun job.toml                      the same\n"
      "  ddprun run job.toml --node-rank 1    when the job gives nnodes instead of nodes\n"
      "  DDPRUN_NODE_RANK=1 ddprun job.toml\n"
      "  ddprun job.toml -- --lr 0.1          append arguments to job.command (every node\n"
      "                                       must pass the same: they are part of the job)");
  return {cmd, true, [s](const std::vector<std::string>& script_args) {
            s->options.script_args = script_args;
            if (*s->rank_opt) s->options.node_rank = s->node_rank;
            return RunCommand(s->options);
          }};
}

/// `ddprun up`.
Command AddUp(CLI::App& app) {
  auto s = std::make_shared<UpOptions>();
  UpOptions& up = *s;
  CLI::App* cmd =
      app.add_subcommand("up", "From one machine: start, watch and stop every node's agent over ssh");
  cmd->add_option("job", up.job_path,
                  "The job file; the nodes read it at the same path (a shared or checked-out folder), "
                  "or --copy puts it there")
      ->required();
  cmd->add_flag("--copy", up.copy, "Copy the job file to the same path on every host first");
  cmd->add_flag("--detach", up.detach,
                "Start the agents and return: each runs on in its own session, its pid and console "
                "in <logs.dir>/<job>/up-n<K>.{pid,console}; see `ddprun status` and `ddprun down`");
  cmd->add_flag("--install", up.install,
                "Where a host has no ddprun, or another version, copy this one over ssh into "
                "~/.ddprun/<version>-<hash> there and run that (docs/install.md)");
  cmd->add_option("--remote-ddprun", up.remote_ddprun,
                  "The ddprun program on the hosts (default: this ddprun's copy in ~/.ddprun when "
                  "`up --install` put it there, else `ddprun` on the remote PATH)");
  cmd->add_option("--connect-timeout", up.connect_timeout_s, "Seconds ssh waits for each host (default 10)")
      ->check(CLI::Range(1, 600));
  cmd->footer(
      "Runs `ssh HOST ddprun run job.toml --node-rank K` for every host of cluster.nodes and\n"
      "cluster.spares, with your own ssh configuration; DDPRUN_SSH_COMMAND replaces `ssh` and\n"
      "its options (as GIT_SSH_COMMAND does for git). Ctrl-C stops the job on every node.\n"
      "\n"
      "Examples:\n"
      "  ddprun up job.toml\n"
      "  ddprun up job.toml -- --lr 0.1\n"
      "  ddprun up job.toml --copy --install\n"
      "  ddprun up job.toml --copy --remote-ddprun /opt/ddprun/bin/ddprun\n"
      "  DDPRUN_SSH_COMMAND=\"ssh -F cluster.sshconfig\" ddprun up job.toml\n"
      "  ddprun up job.toml --detach; ddprun status job.toml; ddprun down job.toml");
  return {cmd, true, [s](const std::vector<std::string>& script_args) {
            s->script_args = script_args;
            return UpCommand(*s);
          }};
}

/// `ddprun status`.
Command AddStatus(CLI::App& app) {
  auto s = std::make_shared<UpOptions>();
  UpOptions& status = *s;
  CLI::App* cmd = app.add_subcommand("status", "Show the agents `ddprun up --detach` started (over ssh)");
  cmd->add_option("job", status.job_path, "The job file")->required();
  cmd->add_option("--connect-timeout", status.connect_timeout_s, "Seconds ssh waits for each host")
      ->check(CLI::Range(1, 600));
  cmd->add_option("--remote-ddprun", status.remote_ddprun,
                  "The ddprun program on the hosts (default: as for `up`)");
  cmd->footer("Exit codes: 0 every agent runs, 1 not every agent runs, 2 job file error.");
  return {cmd, false, [s](const std::vector<std::string>&) { return StatusCommand(*s); }};
}

/// `ddprun down`.
Command AddDown(CLI::App& app) {
  auto s = std::make_shared<UpOptions>();
  UpOptions& down = *s;
  CLI::App* cmd =
      app.add_subcommand("down", "Stop a job `ddprun up --detach` started (SIGTERM to every agent)");
  cmd->add_option("job", down.job_path, "The job file")->required();
  cmd->add_option("--connect-timeout", down.connect_timeout_s, "Seconds ssh waits for each host")
      ->check(CLI::Range(1, 600));
  cmd->add_option("--remote-ddprun", down.remote_ddprun,
                  "The ddprun program on the hosts (default: as for `up`)");
  cmd->footer("Each agent stops its workers within timeouts.stop_grace; exit 0 when none is left running.");
  return {cmd, false, [s](const std::vector<std::string>&) { return DownCommand(*s); }};
}

/// `ddprun simulate` (and `ddprun --simulate`).
Command AddSimulate(CLI::App& app) {
  struct State {
    SimulateOptions options;
    uint64_t seed = 0;
    int nodes = 0, swarm = 0, seeds = 0, run = 0;
    CLI::Option *seed_opt = nullptr, *nodes_opt = nullptr, *swarm_opt = nullptr, *seeds_opt = nullptr,
                *run_opt = nullptr;
  };
  auto s = std::make_shared<State>();
  SimulateOptions& sim = s->options;
  CLI::App* cmd = app.add_subcommand("simulate", "Simulate the whole cluster with faults in virtual time");
  cmd->add_option("job", sim.job_path, "The job file")->required();
  s->seed_opt = cmd->add_option("--seed", s->seed, "PRNG seed (overrides [simulate].seed)");
  cmd->add_option("--fault", sim.faults, "Inject a fault: kind@time[:key=value,...]; repeatable");
  s->nodes_opt =
      cmd->add_option("--nodes", s->nodes, "Override the number of nodes")->check(CLI::PositiveNumber);
  cmd->add_option("--trace", sim.trace_path, "Write a Chrome trace (JSON, opens in Perfetto) of one run");
  cmd->add_option("--report", sim.report_path, "Write an HTML timeline report of one run");
  s->swarm_opt =
      cmd->add_option("--swarm", s->swarm, "Run N seeds and summarise")->check(CLI::PositiveNumber);
  cmd->add_flag("-q,--quiet", sim.quiet, "Print the summary only");
  cmd->add_flag("--beat-by-beat", sim.beat_by_beat,
                "Run every heartbeat of quiet stretches as events instead of computing them (the "
                "same run, slower; docs/simulator.md)");
  cmd->add_option("--set", sim.sets, "Change a key of the job file: key=value (key= removes it); repeatable");
  cmd->add_flag("--vary-shape", sim.vary_shape,
                "With --swarm: each seed also draws its own job shape (nodes, processes, timeouts, "
                "spares, min_nodes, etcd)")
      ->needs(s->swarm_opt);
  CLI::Option* sweep_opt = cmd->add_option(
      "--sweep", sim.sweeps,
      "Run a grid of settings: key=v1,v2,...; repeatable (each --sweep is one axis); prints a goodput table");
  s->seeds_opt = cmd->add_option("--seeds", s->seeds, "With --sweep: seeds per setting (default 20)")
                     ->check(CLI::PositiveNumber)
                     ->needs(sweep_opt);
  cmd->add_option("--chart", sim.chart_path,
                  "With --sweep: write the chart (FILE.svg, or FILE.html with the table)")
      ->needs(sweep_opt);
  sweep_opt->excludes(s->swarm_opt);
  CLI::Option* replay_opt = cmd->add_option(
      "--replay", sim.replay_dir,
      "Replay a real run: its failures as faults, and its rounds, restarts and exit code beside "
      "the simulated ones (LOGDIR holds its events-node<k>.jsonl)");
  s->run_opt =
      cmd->add_option("--run", s->run, "With --replay, when LOGDIR holds several runs: the Nth, oldest first")
          ->check(CLI::PositiveNumber)
          ->needs(replay_opt);
  replay_opt->excludes(s->swarm_opt);
  replay_opt->excludes(sweep_opt);
  cmd->footer(
      "Examples:\n"
      "  ddprun --simulate examples/laptop.toml\n"
      "  ddprun simulate job.toml --seed 42 --fault node-crash@40m:node=1\n"
      "  ddprun simulate job.toml --fault worker-exit@90s:node=1,local_rank=0,exit_code=3\n"
      "  ddprun simulate job.toml --nodes 64 --swarm 100 --quiet\n"
      "  ddprun simulate job.toml --sweep spares=0,1,2 --sweep simulate.checkpoint_every=10m,1h --seeds 50 "
      "--chart sweep.html\n"
      "  ddprun simulate job.toml --trace trace.json --report report.html\n"
      "  ddprun simulate job.toml --replay logs/job   would the simulator have predicted that run?\n"
      "\n"
      "Fault kinds: node-crash, agent-hang, worker-exit, worker-hang, worker-slow,\n"
      "partition, master-port-blocked, slow-joiner, job-file-differs, duplicate-node-rank,\n"
      "etcd-member-down, etcd-leader-lost, etcd-partition (rendezvous.backend = \"etcd\").");
  return {cmd, false, [s](const std::vector<std::string>&) {
            if (*s->seed_opt) s->options.seed = s->seed;
            if (*s->nodes_opt) s->options.nodes = s->nodes;
            if (*s->swarm_opt) s->options.swarm = s->swarm;
            if (*s->seeds_opt) s->options.seeds = s->seeds;
            if (*s->run_opt) s->options.run = s->run;
            return SimulateCommand(s->options);
          }};
}

/// `ddprun report`.
Command AddReport(CLI::App& app) {
  struct State {
    ReportOptions options;
    int run = 0;
    CLI::Option* run_opt = nullptr;
  };
  auto s = std::make_shared<State>();
  ReportOptions& report = s->options;
  CLI::App* cmd =
      app.add_subcommand("report", "Draw a real run's timeline (HTML, Chrome trace) from its event logs");
  cmd->add_option("logdir", report.log_dir,
                  "A folder with the run's events-node<k>.jsonl files below it (e.g. "
                  "<logs.dir>/<job>)")
      ->required();
  cmd->add_option("--out", report.out_path, "Where to write the HTML page (default report.html)");
  cmd->add_option("--trace", report.trace_path, "Also write a Chrome trace (JSON, opens in Perfetto)");
  s->run_opt = cmd->add_option("--run", s->run,
                               "When the folder holds several runs: the Nth, oldest first "
                               "(default: the newest)")
                   ->check(CLI::PositiveNumber);
  cmd->footer(
      "Examples:\n"
      "  ddprun report logs/resnet50                    the newest run of job resnet50\n"
      "  ddprun report logs/resnet50 --out run.html --trace run.json\n"
      "  ddprun report collected/ --run 1               the oldest run in a folder of copied logs");
  return {cmd, false, [s](const std::vector<std::string>&) {
            if (*s->run_opt) s->options.run = s->run;
            return ReportCommand(s->options);
          }};
}

/// `ddprun check`.
Command AddCheck(CLI::App& app) {
  struct State {
    CheckOptions options;
    int node_rank = 0;
    std::string color = "auto";
    CLI::Option* rank_opt = nullptr;
  };
  auto s = std::make_shared<State>();
  CheckOptions& check = s->options;
  CLI::App* cmd =
      app.add_subcommand("check", "Validate a job file and print the plan (ranks, env, commands)");
  cmd->add_option("job", check.job_path, "The job file")->required();
  s->rank_opt = cmd->add_option("--node-rank", s->node_rank, "Show only this node's plan")
                    ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", check.json,
                "Print {valid, diagnostics, plan} as JSON on stdout (always the whole "
                "plan; nothing on stderr)");
  cmd->add_flag("--full", check.full,
                fmt::format("Print the whole plan of a job above {} nodes (default: "
                            "a summary)",
                            kPlanSummaryAboveNodes));
  cmd->add_option("--color", s->color, "Color diagnostics: auto, always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cmd->footer(
      "Exit codes: 0 valid (warnings allowed), 2 invalid.\n"
      "\n"
      "Examples:\n"
      "  ddprun check job.toml\n"
      "  ddprun check job.toml --node-rank 1\n"
      "  ddprun check job.toml --json | jq .plan.nodes[0].torchrun_command");
  return {cmd, true, [s](const std::vector<std::string>& script_args) {
            s->options.script_args = script_args;
            if (*s->rank_opt) s->options.node_rank = s->node_rank;
            s->options.color = ColorWanted(s->color);
            return CheckCommand(s->options);
          }};
}

/// `ddprun init`.
Command AddInit(CLI::App& app) {
  auto s = std::make_shared<InitOptions>();
  InitOptions& init = *s;
  CLI::App* cmd = app.add_subcommand("init", "Write a commented starter job file (valid under `check`)");
  cmd->add_option("-o,--output", init.output, "Where to write it (default job.toml)");
  cmd->add_option("--name", init.name, "Job name (default: from the script's file name)");
  cmd->add_option("--script", init.script,
                  "What every worker runs (default train.py; *.py runs under python3)");
  CLI::Option* init_nodes_opt =
      cmd->add_option("--nodes", init.nodes, "Host names of the nodes, comma-separated")->delimiter(',');
  CLI::Option* init_nnodes_opt =
      cmd->add_option("--nnodes", init.nnodes, "Number of nodes, when not listed (default 1)")
          ->check(CLI::Range(1, 10000));
  init_nodes_opt->excludes(init_nnodes_opt);
  cmd->add_option("--gpus", init.gpus_per_node,
                  "GPUs (worker processes) per node; 0 for one CPU worker per node "
                  "(default 1)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--master-port", init.master_port, "Default 29500")->check(CLI::Range(1, 65535));
  cmd->add_flag("--force", init.force, "Overwrite an existing file");
  cmd->add_flag("--slurm", init.slurm,
                "Take the hosts from the SLURM allocation (cluster.hosts_from) and write an sbatch "
                "script beside the job file (job.toml -> job.sbatch)")
      ->excludes(init_nodes_opt);
  cmd->footer(
      "Examples:\n"
      "  ddprun init --nodes gpu-01,gpu-02 --gpus 8 --script train.py\n"
      "  ddprun init --nnodes 4 --gpus 8 -o big.toml\n"
      "  ddprun init --gpus 0                      one node, one CPU worker\n"
      "  ddprun init --slurm --nnodes 4 --gpus 8   and job.sbatch: sbatch job.sbatch");
  return {cmd, false, [s](const std::vector<std::string>&) { return InitCommand(*s); }};
}

/// `ddprun preflight`.
Command AddPreflight(CLI::App& app) {
  struct State {
    PreflightOptions options;
    int node_rank = 0;
    CLI::Option* rank_opt = nullptr;
  };
  auto s = std::make_shared<State>();
  PreflightOptions& preflight = s->options;
  CLI::App* cmd =
      app.add_subcommand("preflight", "On every node: check ports, GPUs and an NCCL all-reduce, then exit");
  cmd->add_option("job", preflight.job_path, "The job file")->required();
  s->rank_opt =
      cmd->add_option("--node-rank", s->node_rank, "This node's rank")->check(CLI::NonNegativeNumber);
  cmd->footer(
      "Examples:\n"
      "  ddprun preflight job.toml                 on every node, like the job itself\n"
      "  ddprun preflight job.toml --node-rank 1");
  return {cmd, true, [s](const std::vector<std::string>& script_args) {
            s->options.script_args = script_args;
            if (*s->rank_opt) s->options.node_rank = s->node_rank;
            return PreflightCommand(s->options);
          }};
}

/// The hidden `ddprun __preflight-worker` (no group): what `preflight` runs as every rank's command.
Command AddPreflightWorker(CLI::App& app) {
  auto s = std::make_shared<PreflightWorkerOptions>();
  PreflightWorkerOptions& worker = *s;
  CLI::App* cmd = app.add_subcommand("__preflight-worker", "");
  cmd->group("");
  cmd->add_option("--job-name", worker.job_name);
  cmd->add_option("--nnodes", worker.nnodes)->check(CLI::PositiveNumber);
  cmd->add_option("--nproc-per-node", worker.nproc_per_node)->check(CLI::PositiveNumber);
  cmd->add_option("--accelerator", worker.accelerator);
  cmd->add_option("--node", worker.nodes);
  cmd->add_option("--master-port", worker.master_port)->check(CLI::Range(0, 65535));
  cmd->add_option("--python", worker.python);
  return {cmd, false, [s](const std::vector<std::string>&) { return PreflightWorkerCommand(*s); }};
}

/// `ddprun schema`.
Command AddSchema(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("schema", "Print the JSON Schema of job files (for editors)");
  cmd->footer(
      "Examples:\n"
      "  ddprun schema > job-file.schema.json\n"
      "  then start the job file with `#:schema ./job-file.schema.json` (taplo, Even Better "
      "TOML)");
  return {cmd, false, [](const std::vector<std::string>&) { return SchemaCommand(); }};
}

int Main(int argc, char** argv) {
  // Hidden, and parsed by hand: what `up --detach`, `status`, `down` and `up --copy` run on
  // each host through ssh (cmd_up_remote.cc); its answer is one JSON line.
  if (argc >= 2 && std::string_view(argv[1]) == "__up-remote") {
    return UpRemoteCommand(std::vector<std::string>(argv + 2, argv + argc));
  }
  CLI::App app{"ddprun: run multi-node PyTorch DDP jobs from one TOML job file", "ddprun"};
  app.set_version_flag("--version", std::string("ddprun ") + DDPRUN_VERSION + "\ncommit " + DDPRUN_COMMIT +
                                        "\nbuild " + DDPRUN_BUILD);
  app.require_subcommand(1);
  app.footer(
      "Short forms:\n"
      "  ddprun job.toml              same as `ddprun run job.toml`\n"
      "  ddprun --simulate job.toml   same as `ddprun simulate job.toml`\n"
      "\n"
      "Examples:\n"
      "  ddprun init --nodes a,b --gpus 8   write a starter job.toml\n"
      "  ddprun check job.toml        validate and print ranks, environment, torchrun commands\n"
      "  ddprun job.toml              on every node: start this node's agent\n"
      "  ddprun job.toml -- --lr 0.1  the same, appending `--lr 0.1` to job.command\n"
      "  ddprun up job.toml           from one machine: every node's agent over ssh\n"
      "  ddprun --simulate job.toml   the whole cluster with faults, in virtual time\n"
      "  ddprun report logs/job       a real run's timeline page from its event logs\n"
      "  ddprun schema > job-file.schema.json\n"
      "\n"
      "Exit codes: 0 ok, 1 job failed, 2 usage or job file error, 3 rendezvous failed,\n"
      "129/130/143 interrupted (SIGHUP/SIGINT/SIGTERM), 70 internal error.");

  // In the order `--help` lists them.
  const std::vector<Command> commands = {
      AddRun(app),    AddUp(app),    AddStatus(app), AddDown(app),      AddSimulate(app),
      AddReport(app), AddCheck(app), AddInit(app),   AddPreflight(app), AddPreflightWorker(app),
      AddSchema(app)};

  std::vector<std::string> args(argv, argv + argc);
  const std::vector<std::string> script_args = TakeScriptArgs(args);
  if (auto pointer = TorchrunHabitPointer(args)) {
    std::fputs(pointer->c_str(), stderr);
    return kExitUsage;
  }
  if (auto command = MistypedSubcommand(args)) {
    fmt::print(stderr,
               "ddprun: error: `{}` is neither a command nor a job file; did you mean `ddprun "
               "{}`?\n",
               args[1], *command);
    return kExitUsage;
  }
  args = Normalise(std::move(args));
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  // CLI11 reports through exceptions; they end here and become exit codes.
  try {
    app.parse(static_cast<int>(pointers.size()), pointers.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    const CLI::App* command = &app;
    for (const Command& sub : commands) {
      if (args.size() > 1 && sub.app->get_name() == args[1]) command = sub.app;
    }
    std::fputs(FlagHints(*command, args).c_str(), stderr);
    return kExitUsage;
  }
  for (const Command& command : commands) {
    if (!command.app->parsed()) continue;
    if (!script_args.empty() && !command.takes_script_args) {
      std::fputs(
          "ddprun: error: arguments after `--` are for the script: only `run`, `up`, `check` "
          "and `preflight` take them\n",
          stderr);
      return kExitUsage;
    }
    return command.run(script_args);
  }
  return kExitUsage;
}

}  // namespace
}  // namespace ddprun::cli

int main(int argc, char** argv) {
  try {
    return ddprun::cli::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: internal error: %s\n", e.what());
    return ddprun::cli::kExitInternal;
  }
}
