// `ddprun job.toml` / `ddprun run job.toml`: this node's agent.

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/host_name.h"
#include "cli/code_identity.h"
#include "cli/commands.h"
#include "cli/library_identity.h"
#include "cli/node_job.h"
#include "runner/io/detached_agent.h"
#include "runner/io/node_identity.h"
#include "runner/io/node_identity_slurm.h"
#include "schema/loader.h"
#include "schema/plan.h"

namespace ddprun::cli {
namespace {

// Set and not empty: shells and schedulers often leave variables empty to mean unset.
bool EnvSet(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0';
}

}  // namespace

std::optional<NodeJob> LoadNodeJob(const std::string& job_path, std::optional<int> node_rank_flag,
                                   const std::vector<std::string>& script_args) {
  LoadResult loaded = LoadJobFile(job_path, io::MachineLoadContext());
  if (!loaded.diagnostics.items.empty()) {
    const std::string text = RenderDiagnostics(loaded.diagnostics, job_path, loaded.source_text, false);
    std::fwrite(text.data(), 1, text.size(), stderr);
  }
  if (!loaded.spec) return std::nullopt;
  if (EnvSet("DDPRUN_SECRET") && EnvSet("DDPRUN_SECRET_FILE")) {
    // ReadSharedSecret takes DDPRUN_SECRET; a stale file setting would otherwise go unnoticed
    // until another node, configured the other way, is refused.
    std::fputs(
        "ddprun: warning: both DDPRUN_SECRET and DDPRUN_SECRET_FILE are set; using "
        "DDPRUN_SECRET (unset one of them)\n",
        stderr);
  }
  NodeJob job{std::move(*loaded.spec), {}};
  AppendScriptArgs(job.spec, script_args);
  // A task of an srun step in an allocation: the hosts the job file lists must be the
  // allocation's (cluster.hosts_from = "slurm" took them from it already).
  if (EnvSet("SLURM_JOB_NODELIST") && EnvSet("SLURM_STEP_ID") && !job.spec.cluster.hosts_from_slurm &&
      !job.spec.cluster.nodes.empty()) {
    const auto allocation = io::SlurmAllocationHosts();
    if (!allocation) {
      std::fprintf(stderr, "ddprun: error: %s\n", allocation.error().c_str());
      return std::nullopt;
    }
    if (const Status same = io::CheckListedHostsAgainstAllocation(job.spec, *allocation); !same) {
      std::fprintf(stderr, "ddprun: error: %s\n", same.error().c_str());
      return std::nullopt;
    }
  }

  // A job of one node has one possible rank: it needs no flag, variable or host match (the
  // one listed host may be a name this machine does not answer to, e.g. "localhost" vs its
  // host name). A variable that is set is still checked, so a wrong one is reported.
  if (!node_rank_flag && job.spec.cluster.nnodes == 1 && !EnvSet("DDPRUN_NODE_RANK") &&
      !EnvSet("SLURM_NODEID")) {
    node_rank_flag = 0;
  }
  const auto detected = io::DetectNodeRank(job.spec, node_rank_flag);
  if (!detected) {
    std::fprintf(stderr, "ddprun: error: %s\n", detected.error().c_str());
    return std::nullopt;
  }
  if (!detected->warning.empty()) std::fprintf(stderr, "ddprun: warning: %s\n", detected->warning.c_str());
  const std::optional<int> node_rank = detected->rank;
  job.run.node_rank = *node_rank;
  job.run.rank_source = detected->how;
  // A listed node or spare is known by its entry; otherwise by the host's own name.
  job.run.host = job.spec.cluster.HostOf(*node_rank);
  if (job.run.host.empty()) job.run.host = LocalHostName();
  job.run.job_dir = std::filesystem::path(job_path).parent_path().string();
  // Before the agent computes the fingerprint, so that code and libraries are part of it.
  const std::filesystem::path dir = job.run.job_dir.empty() ? "." : job.run.job_dir;
  const std::string workdir = (dir / job.spec.job.workdir).lexically_normal().string();
  if (job.spec.job.code_check != JobSpec::CodeCheck::kOff) {
    job.spec.job.code = FindCode(job.spec, workdir);
    std::fprintf(stderr, "ddprun: %s\n", DescribeCode(job.spec.job.code).c_str());
  }
  if (job.spec.job.library_check != JobSpec::CodeCheck::kOff) {
    job.spec.job.libraries = FindLibraries(job.spec, workdir);
    std::fprintf(stderr, "ddprun: libraries: %s\n", DescribeLibraries(job.spec.job.libraries).c_str());
  }
  return job;
}

int RunCommand(const RunOptions& options) {
  // A detached agent's launch token (runner/io/detached_agent.h) identifies this process to
  // `status` and `down` through /proc/<pid>/environ, which keeps it; its workers do not carry it.
  ::unsetenv(std::string(io::kLaunchTokenVariable).c_str());
  auto job = LoadNodeJob(options.job_path, options.node_rank, options.script_args);
  if (!job) return kExitUsage;
  job->run.verbose = options.verbose;
  job->run.controlled_by_up = options.under_up;
  // Under `up` the job's summary is printed once, by node 0 (the coordinator's node).
  job->run.print_job_summary = !options.under_up || job->run.node_rank == 0;
  return io::RunNode(job->spec, job->run);
}

}  // namespace ddprun::cli
