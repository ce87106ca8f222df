// `ddprun preflight job.toml`: runs the job's shape (nodes, ranks, ports) with ddprun's own
// preflight worker as every rank's command, so the checks get rendezvous, fingerprint checks,
// the gang stop and per-rank logs from the real runner.

#include "cli/commands.h"
#include "cli/job_python.h"
#include "cli/node_job.h"
#include "preflight/worker.h"
#include "runner/io/driver.h"

namespace ddprun::cli {
namespace {

/// The interpreter whose torch and Lightning the job uses: the Python job.command runs
/// ("python3.11", "/opt/venv/bin/python", also through /usr/bin/env), else the python3 on PATH.
std::string JobPython(const JobSpec& spec) {
  const CommandShape shape = ShapeOf(spec.job.command);
  return shape.python ? spec.job.command[shape.program] : "python3";
}

/// The job as preflight runs it: same nodes, ranks and ports, the preflight worker as command.
JobSpec PreflightSpec(const JobSpec& spec) {
  JobSpec preflight = spec;
  // "/proc/self/exe" rather than the resolved path: the agent forks and execs it, so it names
  // this same ddprun binary on every node while keeping the job fingerprint equal on nodes
  // that install ddprun in different places.
  preflight.job.command = {"/proc/self/exe",   "__preflight-worker",
                           "--job-name",       spec.job.name,
                           "--nnodes",         std::to_string(spec.cluster.nnodes),
                           "--nproc-per-node", std::to_string(spec.cluster.nproc_per_node),
                           "--accelerator",    spec.trainer.accelerator,
                           "--master-port",    std::to_string(spec.cluster.master_port),
                           "--python",         JobPython(spec)};
  for (const std::string& node : spec.cluster.nodes) {
    preflight.job.command.push_back("--node");
    preflight.job.command.push_back(node);
  }
  preflight.job.name = spec.job.name + "-preflight";
  preflight.job.is_preflight = true;
  preflight.restart.max_restarts = 0;
  // Preflight's own workers probe every pair of nodes and report the whole table, with more
  // (GPUs, NCCL) beside it: the agents' probe before the round would only stop it early.
  preflight.rendezvous.probe = JobSpec::Rendezvous::Probe::kOff;
  return preflight;
}

}  // namespace

int PreflightCommand(const PreflightOptions& options) {
  auto job = LoadNodeJob(options.job_path, options.node_rank, options.script_args);
  if (!job) return kExitUsage;
  job->run.raw_console_rank = 0;
  return io::RunNode(PreflightSpec(job->spec), job->run);
}

int PreflightWorkerCommand(const PreflightWorkerOptions& options) {
  preflight::WorkerOptions worker;
  worker.expect.job_name = options.job_name;
  worker.expect.nnodes = options.nnodes;
  worker.expect.nproc_per_node = options.nproc_per_node;
  worker.expect.accelerator = options.accelerator;
  worker.expect.nodes = options.nodes;
  worker.expect.master_port = options.master_port;
  if (!options.python.empty()) worker.expect.python = options.python;
  return preflight::RunPreflightWorker(worker);
}

}  // namespace ddprun::cli
