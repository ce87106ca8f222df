// `ddprun up job.toml`: the whole job from one machine. Checks every host over ssh first (in
// parallel, within seconds), then starts one agent per host with its node rank, streams their
// output as one, and turns Ctrl-C, SIGTERM and a lost session into a stop on every node.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "ddprun_version.h"
#include "runner/io/remote_processes.h"
#include "runner/io/ssh_command.h"
#include "schema/diagnostics.h"
#include "runner/io/node_identity_slurm.h"
#include "schema/loader.h"

namespace ddprun::cli {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

/// "gpu-02 (node 1)", "gpu-05 (spare 0)".
std::string Who(const JobSpec& spec, int agent) {
  const std::string host = spec.cluster.HostOf(agent);
  return agent < spec.cluster.nnodes ? fmt::format("{} (node {})", host, agent)
                                     : fmt::format("{} (spare {})", host, agent - spec.cluster.nnodes);
}

/// The probe of every host at once; true when all answered well, else each failure printed.
bool ProbeHosts(const JobSpec& spec, const UpOptions& options, const std::string& ssh_command,
                const std::string& job_path) {
  std::vector<io::RemoteChild> probes;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    io::RemoteChild probe;
    probe.argv = io::SshArgv(ssh_command, io::ProbeSshOptions(options.connect_timeout_s), spec.cluster.HostOf(agent),
                             io::ProbeCommand(options.remote_ddprun, job_path, options.copy));
    probes.push_back(std::move(probe));
  }
  io::RunLimits limits;
  limits.deadline = std::chrono::seconds(options.connect_timeout_s + 5);
  const io::RunOutcome outcome = io::RunRemoteChildren(probes, limits);
  if (outcome.interrupted_by) return false;
  int failed = 0;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    const io::ChildOutcome& child = outcome.children[static_cast<size_t>(agent)];
    const io::ProbeOutcome read =
        io::ReadProbe(spec.cluster.HostOf(agent), child.exit_status, child.out, child.err, options.remote_ddprun,
                      job_path, DDPRUN_VERSION, options.connect_timeout_s);
    if (read.ok) continue;
    ++failed;
    std::fprintf(stderr, "ddprun up: error: %s: %s\n  %s\n", Who(spec, agent).c_str(), read.what.c_str(),
                 read.fix.c_str());
  }
  if (failed > 0) {
    std::fprintf(stderr, "ddprun up: %d of %d host%s not ready; no agent was started\n", failed,
                 spec.cluster.Agents(), spec.cluster.Agents() == 1 ? " is" : "s are");
  }
  return failed == 0;
}

/// `--copy`: the job file to the same path on every host.
bool CopyJobFile(const JobSpec& spec, const UpOptions& options, const std::string& ssh_command,
                 const std::string& job_path, const std::string& text) {
  std::vector<io::RemoteChild> copies;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    io::RemoteChild copy;
    copy.argv = io::SshArgv(ssh_command, io::ProbeSshOptions(options.connect_timeout_s), spec.cluster.HostOf(agent),
                            io::CopyCommand(job_path, agent));
    copy.input = text;
    copies.push_back(std::move(copy));
  }
  io::RunLimits limits;
  limits.deadline = std::chrono::seconds(options.connect_timeout_s + 30);
  const io::RunOutcome outcome = io::RunRemoteChildren(copies, limits);
  bool ok = !outcome.interrupted_by;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    const io::ChildOutcome& child = outcome.children[static_cast<size_t>(agent)];
    if (child.exit_status == 0) continue;
    ok = false;
    std::fprintf(stderr, "ddprun up: error: %s: cannot copy the job file to %s: %s\n", Who(spec, agent).c_str(),
                 job_path.c_str(), child.err.empty() ? "(no message)" : child.err.c_str());
  }
  return ok;
}

}  // namespace

int UpCommand(const UpOptions& options) {
  std::error_code ec;
  const std::string job_path = std::filesystem::absolute(options.job_path, ec).lexically_normal().string();
  LoadResult loaded = LoadJobFile(options.job_path, io::MachineLoadContext());
  if (!loaded.diagnostics.items.empty()) {
    const std::string text = RenderDiagnostics(loaded.diagnostics, options.job_path, loaded.source_text, false);
    std::fwrite(text.data(), 1, text.size(), stderr);
  }
  if (!loaded.spec) return kExitUsage;
  JobSpec spec = std::move(*loaded.spec);
  AppendScriptArgs(spec, options.script_args);
  if (spec.cluster.nodes.empty()) {
    std::fprintf(stderr,
                 "ddprun up: error: %s gives cluster.nnodes but not the hosts; `up` needs them to know "
                 "where to start the agents\n  hint: list them in cluster.nodes (host names or addresses, "
                 "as ssh reaches them)\n",
                 options.job_path.c_str());
    return kExitUsage;
  }
  if (static_cast<int>(spec.cluster.spare_hosts.size()) < spec.cluster.spares) {
    std::fprintf(stderr, "ddprun up: error: cluster.spares gives a count, not hosts; `up` needs the spares' "
                         "host names\n");
    return kExitUsage;
  }
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    if (const Status checked = io::CheckDestination(spec.cluster.HostOf(agent)); !checked) {
      std::fprintf(stderr, "ddprun up: error: %s\n", checked.error().c_str());
      return kExitUsage;
    }
  }
  const std::string ssh_command = Env("DDPRUN_SSH_COMMAND");
  if (!Env("DDPRUN_SECRET").empty()) {
    // On a command line it would show in every host's process list.
    std::fputs("ddprun up: warning: DDPRUN_SECRET is not sent over ssh; the agents use their own "
               "environment. Use DDPRUN_SECRET_FILE on a folder every node sees (its path is passed on)\n",
               stderr);
  }

  std::fprintf(stderr, "ddprun up: checking %d host%s over %s ...\n", spec.cluster.Agents(),
               spec.cluster.Agents() == 1 ? "" : "s", ssh_command.empty() ? "ssh" : ssh_command.c_str());
  if (!ProbeHosts(spec, options, ssh_command, job_path)) return kExitRendezvous;
  if (options.copy) {
    if (!CopyJobFile(spec, options, ssh_command, job_path, loaded.source_text)) return kExitRendezvous;
    std::fprintf(stderr, "ddprun up: copied %s to %d host%s\n", job_path.c_str(), spec.cluster.Agents(),
                 spec.cluster.Agents() == 1 ? "" : "s");
  }

  std::vector<io::RemoteChild> agents;
  size_t width = 0;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) width = std::max(width, spec.cluster.HostOf(agent).size());
  std::string legend;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    const std::string host = spec.cluster.HostOf(agent);
    io::AgentCommand command;
    command.remote_ddprun = options.remote_ddprun;
    command.job_path = job_path;
    command.node_rank = agent;
    command.script_args = options.script_args;
    command.secret_file = Env("DDPRUN_SECRET_FILE");
    io::RemoteChild child;
    child.argv = io::SshArgv(ssh_command, io::AgentSshOptions(options.connect_timeout_s), host,
                             io::AgentRemoteLine(command));
    child.hold_stdin = true;
    child.stream = true;
    child.prefix = fmt::format("{:<{}} | ", host, width);
    agents.push_back(std::move(child));
    legend += fmt::format("{}n{} {}", legend.empty() ? "" : ", ", agent, host);
  }
  std::fprintf(stderr, "ddprun up: starting the agents: %s\n", legend.c_str());
  io::RunLimits limits;
  limits.stop_wait = std::chrono::duration_cast<std::chrono::milliseconds>(spec.timeouts.StopBound()) +
                     std::chrono::seconds(10);
  const io::RunOutcome outcome = io::RunRemoteChildren(agents, limits);

  // The job's exit code is what every agent returns; node 0's first, as it ran the coordinator.
  std::optional<int> job_code;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    const int status = outcome.children[static_cast<size_t>(agent)].exit_status;
    if (status == 255 || status < 0) {
      std::fprintf(stderr, "ddprun up: %s: the ssh session ended without the agent's exit code (exit %d)\n",
                   Who(spec, agent).c_str(), status);
      continue;
    }
    if (status == 127) {
      std::fprintf(stderr, "ddprun up: %s: %s\n", Who(spec, agent).c_str(),
                   outcome.children[static_cast<size_t>(agent)].err.c_str());
    }
    if (!job_code) job_code = status;
  }
  if (job_code) return *job_code;
  if (outcome.interrupted_by) return core::InterruptedExitCode(outcome.interrupted_by);
  return kExitJobFailed;
}

}  // namespace ddprun::cli
