// The `ddprun` executable: parses the command line with CLI11 and calls one subcommand of
// runner/cli/commands.h. `ddprun job.toml` means `ddprun run job.toml`, and
// `ddprun --simulate job.toml` means `ddprun simulate job.toml`.
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ddprun_version.h"
#include "runner/cli/commands.h"

namespace ddprun::cli {
namespace {

constexpr std::string_view kSubcommands[] = {"run",    "simulate", "check", "preflight",
                                             "schema", "__preflight-worker"};

bool IsSubcommand(std::string_view word) {
  for (std::string_view name : kSubcommands) {
    if (word == name) return true;
  }
  return false;
}

// Rewrites the two short forms into their subcommands so each keeps one set of options and
// one --help.
std::vector<std::string> Normalise(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
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

bool ColorWanted(const std::string& mode) {
  if (mode == "always") return true;
  if (mode == "never") return false;
  return ::isatty(STDERR_FILENO) == 1 && std::getenv("NO_COLOR") == nullptr;
}

int Main(int argc, char** argv) {
  CLI::App app{"ddprun: run multi-node PyTorch DDP jobs from one TOML job file", "ddprun"};
  app.set_version_flag("--version", std::string("ddprun ") + DDPRUN_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Short forms:\n"
      "  ddprun job.toml              same as `ddprun run job.toml`\n"
      "  ddprun --simulate job.toml   same as `ddprun simulate job.toml`\n"
      "\n"
      "Examples:\n"
      "  ddprun check job.toml        validate and print ranks, environment, torchrun commands\n"
      "  ddprun job.toml              on every node: start this node's agent\n"
      "  ddprun --simulate job.toml   the whole cluster with faults, in virtual time\n"
      "  ddprun schema > job-file.schema.json\n"
      "\n"
      "Exit codes: 0 ok, 1 job failed, 2 usage or job file error, 3 rendezvous failed,\n"
      "130/143 interrupted, 70 internal error.");

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
  run_cmd->footer(
      "Examples:\n"
      "  ddprun run job.toml                  node rank from the host name in cluster.nodes\n"
      "  ddprun job.toml                      the same\n"
      "  ddprun run job.toml --node-rank 1    when the job gives nnodes instead of nodes\n"
      "  DDPRUN_NODE_RANK=1 ddprun job.toml");

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
  sim_cmd->add_option("--trace", sim.trace_path, "Write a Chrome trace (JSON, opens in Perfetto)");
  sim_cmd->add_option("--report", sim.report_path, "Write an HTML timeline report");
  CLI::Option* swarm_opt = sim_cmd->add_option("--swarm", sim_swarm, "Run N seeds and summarise")
                               ->check(CLI::PositiveNumber);
  sim_cmd->add_flag("-q,--quiet", sim.quiet, "Print the summary only");
  sim_cmd->footer(
      "Examples:\n"
      "  ddprun --simulate examples/laptop.toml\n"
      "  ddprun simulate job.toml --seed 42 --fault node-crash@40m:node=1\n"
      "  ddprun simulate job.toml --fault worker-exit@90s:node=1,local_rank=0,exit_code=3\n"
      "  ddprun simulate job.toml --nodes 64 --swarm 100 --quiet\n"
      "  ddprun simulate job.toml --trace trace.json --report report.html\n"
      "\n"
      "Fault kinds: node-crash, agent-hang, worker-exit, worker-hang, partition,\n"
      "master-port-blocked, slow-joiner, job-file-differs, duplicate-node-rank.");

  CheckOptions check;
  int check_node_rank = 0;
  std::string color = "auto";
  CLI::App* check_cmd =
      app.add_subcommand("check", "Validate a job file and print the plan (ranks, env, commands)");
  check_cmd->add_option("job", check.job_path, "The job file")->required();
  CLI::Option* check_rank_opt =
      check_cmd->add_option("--node-rank", check_node_rank, "Show only this node's plan")
          ->check(CLI::NonNegativeNumber);
  check_cmd->add_flag("--json", check.json, "Print {valid, diagnostics, plan} as JSON");
  check_cmd->add_option("--color", color, "Color diagnostics: auto, always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  check_cmd->footer(
      "Exit codes: 0 valid (warnings allowed), 2 invalid.\n"
      "\n"
      "Examples:\n"
      "  ddprun check job.toml\n"
      "  ddprun check job.toml --node-rank 1\n"
      "  ddprun check job.toml --json | jq .plan.nodes[0].torchrun_command");

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

  CLI::App* schema_cmd =
      app.add_subcommand("schema", "Print the JSON Schema of job files (for editors)");
  schema_cmd->footer(
      "Examples:\n"
      "  ddprun schema > job-file.schema.json\n"
      "  then start the job file with `#:schema ./job-file.schema.json` (taplo, Even Better "
      "TOML)");

  std::vector<std::string> args = Normalise(argc, argv);
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
    return kExitUsage;
  }

  if (run_cmd->parsed()) {
    if (*run_rank_opt) run.node_rank = run_node_rank;
    return RunCommand(run);
  }
  if (sim_cmd->parsed()) {
    if (*seed_opt) sim.seed = sim_seed;
    if (*nodes_opt) sim.nodes = sim_nodes;
    if (*swarm_opt) sim.swarm = sim_swarm;
    return SimulateCommand(sim);
  }
  if (check_cmd->parsed()) {
    if (*check_rank_opt) check.node_rank = check_node_rank;
    check.color = ColorWanted(color);
    return CheckCommand(check);
  }
  if (preflight_cmd->parsed()) {
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
