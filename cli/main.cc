// The `ddprun` executable: parses the command line with CLI11 and calls one subcommand of
// cli/commands.h. `ddprun job.toml` means `ddprun run job.toml`, and
// `ddprun --simulate job.toml` means `ddprun simulate job.toml`.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/torchrun_habits.h"
#include "ddprun_build.h"
#include "ddprun_version.h"
#include "schema/diagnostics.h"
#include "schema/plan.h"

namespace ddprun::cli {
namespace {

constexpr std::string_view kSubcommands[] = {"run",  "simulate", "check", "preflight", "schema", "init",
                                             "report", "up",     "status", "down",   "__preflight-worker"};
// What a mistyped command is compared with (the hidden one is not suggested).
constexpr std::string_view kPublicSubcommands[] = {"run",    "simulate", "check",  "preflight", "schema",
                                                   "init",   "report",   "up",     "status",    "down"};

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

  RunOptions run;
  int run_node_rank = 0;
  CLI::App* run_cmd = app.add_subcommand("run", "Run this node's agent (on every node)");
  run_cmd->add_option("job", run.job_path, "The job file")->required();
  CLI::Option* run_rank_opt =
      run_cmd->add_option("--node-rank", run_node_rank,
                          "This node's rank (default: DDPRUN_NODE_RANK, SLURM_NODEID, or this "
                          "host's position in cluster.nodes)")
          ->check(CLI::NonNegativeNumber);
  run_cmd->add_flag("-v,--verbose", run.verbose, "Log the protocol as it happens");
  // Hidden: what `ddprun up` passes to each agent it starts (stdin is the link to it).
  run_cmd->add_flag("--under-up", run.under_up, "")->group("");
  run_cmd->footer(
      "Examples:\n"
      "  ddprun run job.toml                  node rank from the host name in cluster.nodes\n"
      "  ddprun job.toml                      the same\n"
      "  ddprun run job.toml --node-rank 1    when the job gives nnodes instead of nodes\n"
      "  DDPRUN_NODE_RANK=1 ddprun job.toml\n"
      "  ddprun job.toml -- --lr 0.1          append arguments to job.command (every node\n"
      "                                       must pass the same: they are part of the job)");

  UpOptions up;
  CLI::App* up_cmd = app.add_subcommand("up", "From one machine: start, watch and stop every node's agent over ssh");
  up_cmd->add_option("job", up.job_path,
                     "The job file; the nodes read it at the same path (a shared or checked-out folder), "
                     "or --copy puts it there")
      ->required();
  up_cmd->add_flag("--copy", up.copy, "Copy the job file to the same path on every host first");
  up_cmd->add_flag("--detach", up.detach,
                   "Start the agents and return: each runs on in its own session, its pid and console "
                   "in <logs.dir>/<job>/up-n<K>.{pid,console}; see `ddprun status` and `ddprun down`");
  up_cmd->add_flag("--install", up.install,
                   "Where a host has no ddprun, or another version, copy this one over ssh into "
                   "~/.ddprun/<version>-<hash> there and run that (docs/install.md)");
  up_cmd->add_option("--remote-ddprun", up.remote_ddprun,
                     "The ddprun program on the hosts (default: this ddprun's copy in ~/.ddprun when "
                     "`up --install` put it there, else `ddprun` on the remote PATH)");
  up_cmd->add_option("--connect-timeout", up.connect_timeout_s, "Seconds ssh waits for each host (default 10)")
      ->check(CLI::Range(1, 600));
  up_cmd->footer(
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

  UpOptions status;
  CLI::App* status_cmd = app.add_subcommand("status", "Show the agents `ddprun up --detach` started (over ssh)");
  status_cmd->add_option("job", status.job_path, "The job file")->required();
  status_cmd->add_option("--connect-timeout", status.connect_timeout_s, "Seconds ssh waits for each host")
      ->check(CLI::Range(1, 600));
  status_cmd->add_option("--remote-ddprun", status.remote_ddprun,
                         "The ddprun program on the hosts (default: as for `up`)");
  status_cmd->footer("Exit codes: 0 every agent runs, 1 not every agent runs, 2 job file error.");
  UpOptions down;
  CLI::App* down_cmd = app.add_subcommand("down", "Stop a job `ddprun up --detach` started (SIGTERM to every agent)");
  down_cmd->add_option("job", down.job_path, "The job file")->required();
  down_cmd->add_option("--connect-timeout", down.connect_timeout_s, "Seconds ssh waits for each host")
      ->check(CLI::Range(1, 600));
  down_cmd->add_option("--remote-ddprun", down.remote_ddprun,
                       "The ddprun program on the hosts (default: as for `up`)");
  down_cmd->footer("Each agent stops its workers within timeouts.stop_grace; exit 0 when none is left running.");

  SimulateOptions sim;
  uint64_t sim_seed = 0;
  int sim_nodes = 0;
  int sim_swarm = 0;
  CLI::App* sim_cmd =
      app.add_subcommand("simulate", "Simulate the whole cluster with faults in virtual time");
  sim_cmd->add_option("job", sim.job_path, "The job file")->required();
  CLI::Option* seed_opt = sim_cmd->add_option("--seed", sim_seed, "PRNG seed (overrides [simulate].seed)");
  sim_cmd->add_option("--fault", sim.faults,
                      "Inject a fault: kind@time[:key=value,...]; repeatable");
  CLI::Option* nodes_opt = sim_cmd->add_option("--nodes", sim_nodes, "Override the number of nodes")
                               ->check(CLI::PositiveNumber);
  sim_cmd->add_option("--trace", sim.trace_path, "Write a Chrome trace (JSON, opens in Perfetto) of one run");
  sim_cmd->add_option("--report", sim.report_path, "Write an HTML timeline report of one run");
  CLI::Option* swarm_opt = sim_cmd->add_option("--swarm", sim_swarm, "Run N seeds and summarise")
                               ->check(CLI::PositiveNumber);
  sim_cmd->add_flag("-q,--quiet", sim.quiet, "Print the summary only");
  sim_cmd->add_flag("--beat-by-beat", sim.beat_by_beat,
                    "Run every heartbeat of quiet stretches as events instead of computing them (the "
                    "same run, slower; docs/simulator.md)");
  sim_cmd->add_option("--set", sim.sets, "Change a key of the job file: key=value (key= removes it); repeatable");
  sim_cmd->add_flag("--vary-shape", sim.vary_shape,
                        "With --swarm: each seed also draws its own job shape (nodes, processes, timeouts, "
                        "spares, min_nodes, etcd)")
          ->needs(swarm_opt);
  CLI::Option* sweep_opt = sim_cmd->add_option(
      "--sweep", sim.sweeps,
      "Run a grid of settings: key=v1,v2,...; repeatable (each --sweep is one axis); prints a goodput table");
  int sim_seeds = 0;
  CLI::Option* seeds_opt = sim_cmd->add_option("--seeds", sim_seeds, "With --sweep: seeds per setting (default 20)")
                               ->check(CLI::PositiveNumber)
                               ->needs(sweep_opt);
  sim_cmd->add_option("--chart", sim.chart_path, "With --sweep: write the chart (FILE.svg, or FILE.html with the table)")
      ->needs(sweep_opt);
  sweep_opt->excludes(swarm_opt);
  int sim_run = 0;
  CLI::Option* replay_opt = sim_cmd->add_option(
      "--replay", sim.replay_dir,
      "Replay a real run: its failures as faults, and its rounds, restarts and exit code beside "
      "the simulated ones (LOGDIR holds its events-node<k>.jsonl)");
  CLI::Option* sim_run_opt =
      sim_cmd->add_option("--run", sim_run, "With --replay, when LOGDIR holds several runs: the Nth, oldest first")
          ->check(CLI::PositiveNumber)
          ->needs(replay_opt);
  replay_opt->excludes(swarm_opt);
  replay_opt->excludes(sweep_opt);
  sim_cmd->footer(
      "Examples:\n"
      "  ddprun --simulate examples/laptop.toml\n"
      "  ddprun simulate job.toml --seed 42 --fault node-crash@40m:node=1\n"
      "  ddprun simulate job.toml --fault worker-exit@90s:node=1,local_rank=0,exit_code=3\n"
      "  ddprun simulate job.toml --nodes 64 --swarm 100 --quiet\n"
      "  ddprun simulate job.toml --sweep spares=0,1,2 --sweep simulate.checkpoint_every=10m,1h --seeds 50 --chart sweep.html\n"
      "  ddprun simulate job.toml --trace trace.json --report report.html\n"
      "  ddprun simulate job.toml --replay logs/job   would the simulator have predicted that run?\n"
      "\n"
      "Fault kinds: node-crash, agent-hang, worker-exit, worker-hang, worker-slow,\n"
      "partition, master-port-blocked, slow-joiner, job-file-differs, duplicate-node-rank,\n"
      "etcd-member-down, etcd-leader-lost, etcd-partition (rendezvous.backend = \"etcd\").");

  ReportOptions report;
  int report_run = 0;
  CLI::App* report_cmd =
      app.add_subcommand("report", "Draw a real run's timeline (HTML, Chrome trace) from its event logs");
  report_cmd->add_option("logdir", report.log_dir,
                         "A folder with the run's events-node<k>.jsonl files below it (e.g. "
                         "<logs.dir>/<job>)")
      ->required();
  report_cmd->add_option("--out", report.out_path, "Where to write the HTML page (default report.html)");
  report_cmd->add_option("--trace", report.trace_path, "Also write a Chrome trace (JSON, opens in Perfetto)");
  CLI::Option* report_run_opt =
      report_cmd->add_option("--run", report_run, "When the folder holds several runs: the Nth, oldest first "
                                                  "(default: the newest)")
          ->check(CLI::PositiveNumber);
  report_cmd->footer(
      "Examples:\n"
      "  ddprun report logs/resnet50                    the newest run of job resnet50\n"
      "  ddprun report logs/resnet50 --out run.html --trace run.json\n"
      "  ddprun report collected/ --run 1               the oldest run in a folder of copied logs");

  CheckOptions check;
  int check_node_rank = 0;
  std::string color = "auto";
  CLI::App* check_cmd =
      app.add_subcommand("check", "Validate a job file and print the plan (ranks, env, commands)");
  check_cmd->add_option("job", check.job_path, "The job file")->required();
  CLI::Option* check_rank_opt =
      check_cmd->add_option("--node-rank", check_node_rank, "Show only this node's plan")
          ->check(CLI::NonNegativeNumber);
  check_cmd->add_flag("--json", check.json,
                      "Print {valid, diagnostics, plan} as JSON on stdout (always the whole "
                      "plan; nothing on stderr)");
  check_cmd->add_flag("--full", check.full,
                      fmt::format("Print the whole plan of a job above {} nodes (default: "
                                  "a summary)",
                                  kPlanSummaryAboveNodes));
  check_cmd->add_option("--color", color, "Color diagnostics: auto, always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  check_cmd->footer(
      "Exit codes: 0 valid (warnings allowed), 2 invalid.\n"
      "\n"
      "Examples:\n"
      "  ddprun check job.toml\n"
      "  ddprun check job.toml --node-rank 1\n"
      "  ddprun check job.toml --json | jq .plan.nodes[0].torchrun_command");

  InitOptions init;
  CLI::App* init_cmd =
      app.add_subcommand("init", "Write a commented starter job file (valid under `check`)");
  init_cmd->add_option("-o,--output", init.output, "Where to write it (default job.toml)");
  init_cmd->add_option("--name", init.name, "Job name (default: from the script's file name)");
  init_cmd->add_option("--script", init.script,
                       "What every worker runs (default train.py; *.py runs under python3)");
  CLI::Option* init_nodes_opt =
      init_cmd->add_option("--nodes", init.nodes, "Host names of the nodes, comma-separated")
          ->delimiter(',');
  CLI::Option* init_nnodes_opt =
      init_cmd->add_option("--nnodes", init.nnodes, "Number of nodes, when not listed (default 1)")
          ->check(CLI::Range(1, 10000));
  init_nodes_opt->excludes(init_nnodes_opt);
  init_cmd->add_option("--gpus", init.gpus_per_node,
                       "GPUs (worker processes) per node; 0 for one CPU worker per node "
                       "(default 1)")
      ->check(CLI::Range(0, 1024));
  init_cmd->add_option("--master-port", init.master_port, "Default 29500")
      ->check(CLI::Range(1, 65535));
  init_cmd->add_flag("--force", init.force, "Overwrite an existing file");
  init_cmd->add_flag("--slurm", init.slurm,
                     "Take the hosts from the SLURM allocation (cluster.hosts_from) and write an sbatch "
                     "script beside the job file (job.toml -> job.sbatch)")
      ->excludes(init_nodes_opt);
  init_cmd->footer(
      "Examples:\n"
      "  ddprun init --nodes gpu-01,gpu-02 --gpus 8 --script train.py\n"
      "  ddprun init --nnodes 4 --gpus 8 -o big.toml\n"
      "  ddprun init --gpus 0                      one node, one CPU worker\n"
      "  ddprun init --slurm --nnodes 4 --gpus 8   and job.sbatch: sbatch job.sbatch");

  PreflightOptions preflight;
  int preflight_node_rank = 0;
  CLI::App* preflight_cmd = app.add_subcommand(
      "preflight", "On every node: check ports, GPUs and an NCCL all-reduce, then exit");
  preflight_cmd->add_option("job", preflight.job_path, "The job file")->required();
  CLI::Option* preflight_rank_opt =
      preflight_cmd->add_option("--node-rank", preflight_node_rank, "This node's rank")
          ->check(CLI::NonNegativeNumber);
  preflight_cmd->footer(
      "Examples:\n"
      "  ddprun preflight job.toml                 on every node, like the job itself\n"
      "  ddprun preflight job.toml --node-rank 1");

  // Hidden (no group): what `preflight` runs as every rank's command.
  PreflightWorkerOptions worker;
  CLI::App* worker_cmd = app.add_subcommand("__preflight-worker", "");
  worker_cmd->group("");
  worker_cmd->add_option("--job-name", worker.job_name);
  worker_cmd->add_option("--nnodes", worker.nnodes)->check(CLI::PositiveNumber);
  worker_cmd->add_option("--nproc-per-node", worker.nproc_per_node)->check(CLI::PositiveNumber);
  worker_cmd->add_option("--accelerator", worker.accelerator);
  worker_cmd->add_option("--node", worker.nodes);
  worker_cmd->add_option("--master-port", worker.master_port)->check(CLI::Range(0, 65535));
  worker_cmd->add_option("--python", worker.python);

  CLI::App* schema_cmd =
      app.add_subcommand("schema", "Print the JSON Schema of job files (for editors)");
  schema_cmd->footer(
      "Examples:\n"
      "  ddprun schema > job-file.schema.json\n"
      "  then start the job file with `#:schema ./job-file.schema.json` (taplo, Even Better "
      "TOML)");

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
    for (const CLI::App* sub : {run_cmd, up_cmd, sim_cmd, check_cmd, init_cmd, preflight_cmd, report_cmd}) {
      if (args.size() > 1 && sub->get_name() == args[1]) command = sub;
    }
    std::fputs(FlagHints(*command, args).c_str(), stderr);
    return kExitUsage;
  }
  if (!script_args.empty() && !run_cmd->parsed() && !check_cmd->parsed() &&
      !preflight_cmd->parsed() && !up_cmd->parsed()) {
    std::fputs("ddprun: error: arguments after `--` are for the script: only `run`, `up`, `check` "
               "and `preflight` take them\n",
               stderr);
    return kExitUsage;
  }

  if (init_cmd->parsed()) return InitCommand(init);
  if (run_cmd->parsed()) {
    run.script_args = script_args;
    if (*run_rank_opt) run.node_rank = run_node_rank;
    return RunCommand(run);
  }
  if (up_cmd->parsed()) {
    up.script_args = script_args;
    return UpCommand(up);
  }
  if (status_cmd->parsed()) return StatusCommand(status);
  if (down_cmd->parsed()) return DownCommand(down);
  if (sim_cmd->parsed()) {
    if (*seed_opt) sim.seed = sim_seed;
    if (*nodes_opt) sim.nodes = sim_nodes;
    if (*swarm_opt) sim.swarm = sim_swarm;
    if (*seeds_opt) sim.seeds = sim_seeds;
    if (*sim_run_opt) sim.run = sim_run;
    return SimulateCommand(sim);
  }
  if (report_cmd->parsed()) {
    if (*report_run_opt) report.run = report_run;
    return ReportCommand(report);
  }
  if (check_cmd->parsed()) {
    check.script_args = script_args;
    if (*check_rank_opt) check.node_rank = check_node_rank;
    check.color = ColorWanted(color);
    return CheckCommand(check);
  }
  if (preflight_cmd->parsed()) {
    preflight.script_args = script_args;
    if (*preflight_rank_opt) preflight.node_rank = preflight_node_rank;
    return PreflightCommand(preflight);
  }
  if (worker_cmd->parsed()) return PreflightWorkerCommand(worker);
  if (schema_cmd->parsed()) return SchemaCommand();
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
