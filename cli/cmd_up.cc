// `ddprun up job.toml`: the whole job from one machine. Checks every host over ssh first (in
// parallel, within seconds), then starts one agent per host with its node rank, streams their
// output as one, and turns Ctrl-C, SIGTERM and a lost session into a stop on every node.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "ddprun_version.h"
#include "runner/io/controller_link.h"
#include "runner/io/node_identity_slurm.h"
#include "runner/io/remote_install.h"
#include "runner/io/remote_processes.h"
#include "runner/io/ssh_command.h"
#include "schema/diagnostics.h"
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

/// Until the job's first round starts, an agent that exits 2 (usage) or 3 (rendezvous) means
/// the job cannot start as written, and the other agents would wait for it until
/// timeouts.rendezvous: `up` stops them at once and ends with that agent's code and reason
/// (issue 39.2). Once a round started (the coordinator's agent says so, controller_link.h), the
/// job decides: a node refused or lost then may be replaced by a spare, or the job shrinks.
class EarlyExitWatch {
 public:
  explicit EarlyExitWatch(const JobSpec& spec)
      : spec_(spec), reasons_(static_cast<size_t>(spec.cluster.Agents())) {}

  io::RunHooks Hooks() {
    io::RunHooks hooks;
    hooks.line = [this](size_t i, int stream, std::string_view line) {
      if (stream == 0 && line == io::kJobStartedLine) {
        started_ = true;
        return false;
      }
      // The agent's reason: its summary's first line, or an error line.
      if (line.find("error: ") != std::string_view::npos || line.starts_with("ddprun cannot ")) {
        reasons_[i] = EscapeForTerminal(line.substr(0, 2000));  // remote text, quoted again
      }
      return true;
    };
    hooks.exited = [this](size_t i, int status) {
      if (started_ || ended_by_ || (status != 2 && status != 3)) return false;
      ended_by_ = i;
      code_ = status;
      std::fprintf(stderr, "ddprun up: %s exited %d before the job started; stopping the other agents\n",
                   Who(spec_, static_cast<int>(i)).c_str(), status);
      return true;
    };
    return hooks;
  }

  /// After the run: the code `up` ends with when an early exit ended the job, and its summary.
  std::optional<int> Verdict() const {
    if (!ended_by_) return std::nullopt;
    const std::string& reason = reasons_[*ended_by_];
    std::fprintf(stderr, "ddprun up: the job did not start: %s exited %d%s%s\n",
                 Who(spec_, static_cast<int>(*ended_by_)).c_str(), code_, reason.empty() ? "" : ": ",
                 reason.c_str());
    return code_;
  }

 private:
  const JobSpec& spec_;
  std::vector<std::string> reasons_;  // per agent, its last line that gave a reason
  bool started_ = false;
  std::optional<size_t> ended_by_;
  int code_ = 0;
};

/// This ddprun's files as `up --install` copies them (remote_install.h).
Result<io::LocalCopy> ReadThisBuild(bool with_tar) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return Fail("cannot tell where this ddprun is: " + ec.message());
  return io::ReadLocalCopy(exe, DDPRUN_VERSION, with_tar);
}

/// The ddprun the hosts run: the one --remote-ddprun names; else this build's copy where a host
/// has it (`up --install`), else `ddprun` on the PATH (io::RemoteProgram).
io::RemoteProgram ProgramOf(const UpOptions& options, const io::LocalCopy* copy) {
  if (!options.remote_ddprun.empty()) return io::RemoteProgram(options.remote_ddprun);
  if (copy) return io::RemoteProgram::ThisBuildOrPath(copy->id, copy->manifest_sum);
  if (auto read = ReadThisBuild(false))
    return io::RemoteProgram::ThisBuildOrPath(read->id, read->manifest_sum);
  return io::RemoteProgram("ddprun");  // no share/ddprun beside this binary: no copy to look for
}

/// The probe of every host at once. The agents that need this ddprun installed (`install`),
/// or nullopt when a host is not ready otherwise (each failure printed).
std::optional<std::vector<int>> ProbeHosts(const JobSpec& spec, const UpOptions& options,
                                           const io::RemoteProgram& program, const std::string& ssh_command,
                                           const std::string& job_path) {
  std::vector<io::RemoteChild> probes;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    io::RemoteChild probe;
    probe.argv = io::SshArgv(ssh_command, io::ProbeSshOptions(options.connect_timeout_s),
                             spec.cluster.HostOf(agent), io::ProbeCommand(program, job_path, options.copy));
    probes.push_back(std::move(probe));
  }
  io::RunLimits limits;
  limits.deadline = std::chrono::seconds(options.connect_timeout_s + 5);
  const io::RunOutcome outcome = io::RunRemoteChildren(probes, limits);
  if (outcome.interrupted_by) return std::nullopt;
  int failed = 0;
  std::vector<int> to_install;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    const io::ChildOutcome& child = outcome.children[static_cast<size_t>(agent)];
    const io::ProbeOutcome read =
        io::ReadProbe(spec.cluster.HostOf(agent), child.exit_status, child.out, child.err, program, job_path,
                      DDPRUN_VERSION, options.connect_timeout_s, options.install);
    if (read.ok && read.install) to_install.push_back(agent);
    if (read.ok) continue;
    ++failed;
    std::fprintf(stderr, "ddprun up: error: %s: %s\n  %s\n", Who(spec, agent).c_str(),
                 EscapeLinesForTerminal(read.what).c_str(), read.fix.c_str());
  }
  if (failed > 0) {
    std::fprintf(stderr, "ddprun up: %d of %d host%s not ready; no agent was started\n", failed,
                 spec.cluster.Agents(), spec.cluster.Agents() == 1 ? " is" : "s are");
    return std::nullopt;
  }
  return to_install;
}

/// `--install`: this ddprun into ~/.ddprun/<id> on each of `agents`, at once; true when every
/// host has it (each failure printed).
bool InstallOnHosts(const JobSpec& spec, const UpOptions& options, const io::LocalCopy& copy,
                    const std::string& ssh_command, const std::vector<int>& agents) {
  std::fprintf(stderr,
               "ddprun up: installing this ddprun (%s, %zu files, %.1f MB) into ~/.ddprun/%s on %zu host%s\n",
               DDPRUN_VERSION, copy.files, static_cast<double>(copy.bytes) / 1e6, copy.id.c_str(),
               agents.size(), agents.size() == 1 ? "" : "s");
  std::vector<io::RemoteChild> installs;
  for (int agent : agents) {
    io::RemoteChild install;
    install.argv = io::SshArgv(ssh_command, io::ProbeSshOptions(options.connect_timeout_s),
                               spec.cluster.HostOf(agent), io::InstallLine(copy));
    install.input = copy.tar;
    installs.push_back(std::move(install));
  }
  io::RunLimits limits;
  limits.deadline = std::chrono::seconds(options.connect_timeout_s + 300);
  const io::RunOutcome outcome = io::RunRemoteChildren(installs, limits);
  bool ok = !outcome.interrupted_by;
  for (size_t i = 0; i < agents.size(); ++i) {
    const io::ChildOutcome& child = outcome.children[i];
    const io::InstallOutcome read = io::ReadInstall(child.exit_status, child.out, child.err);
    const std::string who = Who(spec, agents[i]);
    if (!read.ok) {
      ok = false;
      std::fprintf(stderr, "ddprun up: error: %s: cannot install this ddprun: %s\n", who.c_str(),
                   EscapeLinesForTerminal(read.what).c_str());
      continue;
    }
    std::fprintf(stderr, "ddprun up: %s: %s %s\n", who.c_str(),
                 read.installed ? "installed in" : "already installed in",
                 EscapeForTerminal(read.path).c_str());
    if (!read.moved_aside.empty()) {
      std::fprintf(stderr, "ddprun up: %s: a folder of that name with other contents was moved to %s\n",
                   who.c_str(), EscapeForTerminal(read.moved_aside).c_str());
    }
  }
  if (!ok) std::fprintf(stderr, "ddprun up: no agent was started\n");
  return ok;
}

/// `--copy`: the job file to the same path on every host.
bool CopyJobFile(const JobSpec& spec, const UpOptions& options, const io::RemoteProgram& program,
                 const std::string& ssh_command, const std::string& job_path, const std::string& text) {
  std::vector<io::RemoteChild> copies;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    io::RemoteChild copy;
    copy.argv = io::SshArgv(ssh_command, io::ProbeSshOptions(options.connect_timeout_s),
                            spec.cluster.HostOf(agent), io::CopyCommand(program, job_path));
    copy.input = std::make_shared<const std::string>(text);
    copies.push_back(std::move(copy));
  }
  io::RunLimits limits;
  limits.deadline = std::chrono::seconds(options.connect_timeout_s + 30);
  const io::RunOutcome outcome = io::RunRemoteChildren(copies, limits);
  bool ok = !outcome.interrupted_by;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    const io::ChildOutcome& child = outcome.children[static_cast<size_t>(agent)];
    const auto answer = io::ParseRemoteAnswer(child.out);
    if (child.exit_status == 0 && answer && answer->state == io::RemoteState::kCopied) continue;
    ok = false;
    const std::string why = answer ? answer->why : child.err.empty() ? "(no message)" : child.err;
    std::fprintf(stderr, "ddprun up: error: %s: cannot copy the job file to %s: %s\n",
                 Who(spec, agent).c_str(), job_path.c_str(), EscapeLinesForTerminal(why).c_str());
  }
  return ok;
}

/// The job as `up`, `status` and `down` see it: loaded, with hosts ssh can be given.
struct UpJob {
  io::RemoteProgram program;  // the ddprun the hosts run
  JobSpec spec;
  std::string job_path;  // absolute: the same path on every host
  std::string source_text;
};

std::optional<UpJob> LoadUpJob(const UpOptions& options, const char* command,
                               const io::LocalCopy* copy = nullptr) {
  std::error_code ec;
  UpJob job;
  job.job_path = std::filesystem::absolute(options.job_path, ec).lexically_normal().string();
  LoadResult loaded = LoadJobFile(options.job_path, io::MachineLoadContext());
  if (!loaded.diagnostics.items.empty()) {
    const std::string text =
        RenderDiagnostics(loaded.diagnostics, options.job_path, loaded.source_text, false);
    std::fwrite(text.data(), 1, text.size(), stderr);
  }
  if (!loaded.spec) return std::nullopt;
  job.spec = std::move(*loaded.spec);
  job.source_text = std::move(loaded.source_text);
  AppendScriptArgs(job.spec, options.script_args);
  const JobSpec& spec = job.spec;
  if (spec.cluster.nodes.empty() && spec.cluster.hosts_from_slurm) {
    std::fprintf(
        stderr,
        "ddprun %s: error: %s takes its hosts from a SLURM allocation (cluster.hosts_from = \"slurm\")\n"
        "  hint: start it with srun or sbatch (docs/running.md, \"Under SLURM\"), or list cluster.nodes\n",
        command, options.job_path.c_str());
    return std::nullopt;
  }
  if (spec.cluster.nodes.empty()) {
    std::fprintf(stderr,
                 "ddprun %s: error: %s gives cluster.nnodes but not the hosts; `%s` needs them to know "
                 "where the agents run\n  hint: list them in cluster.nodes (host names or addresses, "
                 "as ssh reaches them)\n",
                 command, options.job_path.c_str(), command);
    return std::nullopt;
  }
  if (static_cast<int>(spec.cluster.spare_hosts.size()) < spec.cluster.spares) {
    std::fprintf(stderr,
                 "ddprun %s: error: cluster.spares gives a count, not hosts; `%s` needs the spares' "
                 "host names\n",
                 command, command);
    return std::nullopt;
  }
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    if (const Status checked = io::CheckDestination(spec.cluster.HostOf(agent)); !checked) {
      std::fprintf(stderr, "ddprun %s: error: %s\n", command, checked.error().c_str());
      return std::nullopt;
    }
  }
  job.program = ProgramOf(options, copy);
  return job;
}

/// Where a detached job's agents keep their pid and console files (ssh_command.h).
std::string StateDirOf(const UpJob& job) {
  const std::filesystem::path dir = std::filesystem::path(job.job_path).parent_path();
  return (dir / job.spec.logs.dir / job.spec.job.name).lexically_normal().string();
}

std::string ConsoleOf(const UpJob& job, int agent) {
  return fmt::format("{}/up-n{}.console", StateDirOf(job), agent);
}

/// One remote line per host at once, through ssh, collected; the outcomes in host order.
std::vector<io::ChildOutcome> OnEveryHost(const UpJob& job, const UpOptions& options,
                                          const std::function<std::string(int)>& line, int extra_wait_s) {
  const std::string ssh_command = Env("DDPRUN_SSH_COMMAND");
  std::vector<io::RemoteChild> children;
  for (int agent = 0; agent < job.spec.cluster.Agents(); ++agent) {
    io::RemoteChild child;
    child.argv = io::SshArgv(ssh_command, io::ProbeSshOptions(options.connect_timeout_s),
                             job.spec.cluster.HostOf(agent), line(agent));
    children.push_back(std::move(child));
  }
  io::RunLimits limits;
  limits.deadline = std::chrono::seconds(options.connect_timeout_s + 5 + extra_wait_s);
  return io::RunRemoteChildren(children, limits).children;
}

/// ssh's own failure for a status or down answer that has no state line.
std::string SshFailure(const UpJob& job, int agent, const io::ChildOutcome& child, const UpOptions& options) {
  const io::ProbeOutcome read =
      io::ReadProbe(job.spec.cluster.HostOf(agent), child.exit_status, child.out, child.err, job.program,
                    job.job_path, DDPRUN_VERSION, options.connect_timeout_s);
  if (!read.ok) return EscapeLinesForTerminal(read.what) + "\n  " + read.fix;
  if (const auto answer = io::ParseRemoteAnswer(child.out);
      answer && answer->state == io::RemoteState::kError) {
    return EscapeLinesForTerminal(answer->why);
  }
  std::string said = child.err.empty() ? child.out : child.err;
  while (!said.empty() && said.back() == '\n') said.pop_back();
  return "no answer from ddprun there" +
         (said.empty() ? std::string() : ": " + EscapeLinesForTerminal(said)) +
         "\n  hint: the host's ddprun may be older than this one; `ddprun --version` there should say " +
         DDPRUN_VERSION;
}

/// What the agent of node rank `agent` runs there, attached or detached.
io::AgentCommand AgentCommandOf(const UpJob& job, const UpOptions& options, int agent) {
  io::AgentCommand command;
  command.program = job.program;
  command.job_path = job.job_path;
  command.node_rank = agent;
  command.script_args = options.script_args;
  command.secret_file = Env("DDPRUN_SECRET_FILE");
  return command;
}

int StartDetached(const UpJob& job, const UpOptions& options) {
  const auto started = OnEveryHost(
      job, options,
      [&](int agent) { return io::DetachedAgentLine(AgentCommandOf(job, options, agent), StateDirOf(job)); },
      0);
  int failed = 0;
  for (int agent = 0; agent < job.spec.cluster.Agents(); ++agent) {
    const io::ChildOutcome& child = started[static_cast<size_t>(agent)];
    const auto answer = io::ParseRemoteAnswer(child.out);
    if (child.exit_status == 0 && answer && answer->state == io::RemoteState::kStarted) {
      std::fprintf(stderr, "ddprun up: %s: agent started, pid %lld; console in %s\n",
                   Who(job.spec, agent).c_str(), static_cast<long long>(answer->pid),
                   ConsoleOf(job, agent).c_str());
    } else {
      ++failed;
      std::fprintf(stderr, "ddprun up: error: %s: cannot start the agent: %s\n", Who(job.spec, agent).c_str(),
                   SshFailure(job, agent, child, options).c_str());
    }
  }
  if (failed > 0) {
    std::fprintf(stderr, "ddprun up: `ddprun down %s` stops the agents that did start\n",
                 options.job_path.c_str());
    return kExitRendezvous;
  }
  std::fprintf(stderr,
               "ddprun up: detached; `ddprun status %s` shows the agents, `ddprun down %s` stops the job\n",
               options.job_path.c_str(), options.job_path.c_str());
  return kExitOk;
}

}  // namespace

int StatusCommand(const UpOptions& options) {
  const auto job = LoadUpJob(options, "status");
  if (!job) return kExitUsage;
  const std::string state_dir = StateDirOf(*job);
  const auto answers = OnEveryHost(
      *job, options, [&](int agent) { return io::StatusLine(job->program, state_dir, agent); }, 0);
  int running = 0;
  for (int agent = 0; agent < job->spec.cluster.Agents(); ++agent) {
    const io::ChildOutcome& child = answers[static_cast<size_t>(agent)];
    const auto answer = io::ParseRemoteAnswer(child.out);
    const std::string who = Who(job->spec, agent);
    if (!answer || answer->state == io::RemoteState::kError) {
      std::printf("%s: unknown: %s\n", who.c_str(), SshFailure(*job, agent, child, options).c_str());
      continue;
    }
    const std::string why = EscapeForTerminal(answer->why);
    switch (answer->state) {
      case io::RemoteState::kRunning:
        ++running;
        std::printf("%s: running, pid %lld\n", who.c_str(), static_cast<long long>(answer->pid));
        break;
      case io::RemoteState::kExited:
        std::printf("%s: not running (%s)\n", who.c_str(), why.c_str());
        break;
      case io::RemoteState::kNotOurs:
        std::printf(
            "%s: not running: its pid file names a process that is not the agent `ddprun up --detach` "
            "started (%s); nothing was signalled\n",
            who.c_str(), why.c_str());
        break;
      case io::RemoteState::kNeverStarted:
        std::printf("%s: never started by `ddprun up --detach`\n", who.c_str());
        break;
      case io::RemoteState::kUnreadable:
      case io::RemoteState::kUnknown:
      // Not answers to `status`: said as they came, never taken for one that is.
      case io::RemoteState::kError:
      case io::RemoteState::kStarted:
      case io::RemoteState::kCopied:
      case io::RemoteState::kStopped:
      case io::RemoteState::kNotRunning:
      case io::RemoteState::kStillRunning:
        std::printf("%s: unknown: %s\n", who.c_str(),
                    why.empty() ? std::string(io::RemoteStateName(answer->state)).c_str() : why.c_str());
        break;
    }
    for (const std::string& line : answer->log) std::printf("    %s\n", EscapeForTerminal(line).c_str());
  }
  // 0 when every agent runs, 1 when none or some do not (the job is over or broken).
  return running == job->spec.cluster.Agents() ? kExitOk : kExitJobFailed;
}

int DownCommand(const UpOptions& options) {
  const auto job = LoadUpJob(options, "down");
  if (!job) return kExitUsage;
  const int wait_s =
      static_cast<int>(
          std::chrono::duration_cast<std::chrono::seconds>(job->spec.timeouts.StopBound()).count()) +
      5;
  const std::string state_dir = StateDirOf(*job);
  const auto answers = OnEveryHost(
      *job, options, [&](int agent) { return io::DownLine(job->program, state_dir, agent, wait_s); }, wait_s);
  bool ok = true;
  for (int agent = 0; agent < job->spec.cluster.Agents(); ++agent) {
    const io::ChildOutcome& child = answers[static_cast<size_t>(agent)];
    const auto answer = io::ParseRemoteAnswer(child.out);
    std::string said;
    if (!answer || answer->state == io::RemoteState::kError) {
      ok = false;
      said = "unknown: " + SshFailure(*job, agent, child, options);
    } else {
      const std::string why = EscapeForTerminal(answer->why);
      const std::string pid = std::to_string(answer->pid);
      ok = false;
      switch (answer->state) {
        case io::RemoteState::kStopped:
          ok = true;
          said = "stopped (pid " + pid + ")";
          break;
        case io::RemoteState::kNotRunning:
          ok = true;
          said = "was not running (" + why + ")";
          break;
        case io::RemoteState::kNeverStarted:
          ok = true;
          said = "no agent started by `ddprun up --detach` here";
          break;
        case io::RemoteState::kNotOurs:
          said =
              "not stopped: its pid file names a process that is not the agent `ddprun up --detach` "
              "started (" +
              why + "); nothing was signalled";
          break;
        case io::RemoteState::kStillRunning:
          said = "still running (pid " + pid + ") after SIGTERM and " + std::to_string(wait_s) + " s";
          break;
        case io::RemoteState::kUnreadable:
          said = "unknown: " + why + "; nothing was signalled";
          break;
        case io::RemoteState::kUnknown:
        // Not answers to `down`: said as they came, never taken for one that is.
        case io::RemoteState::kError:
        case io::RemoteState::kStarted:
        case io::RemoteState::kCopied:
        case io::RemoteState::kRunning:
        case io::RemoteState::kExited:
          said = "unknown: " + (why.empty() ? std::string(io::RemoteStateName(answer->state)) : why) +
                 "; check it there by hand";
          break;
      }
    }
    std::printf("%s: %s\n", Who(job->spec, agent).c_str(), said.c_str());
  }
  return ok ? kExitOk : kExitJobFailed;
}

namespace {

/// The agents over ssh, attached: their lines streamed with a host prefix, the job's exit code
/// theirs (node 0's first), an early exit judged by EarlyExitWatch.
int RunAttached(const UpJob& job, const UpOptions& options, const std::string& ssh_command) {
  const JobSpec& spec = job.spec;
  std::vector<io::RemoteChild> agents;
  size_t width = 0;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent)
    width = std::max(width, spec.cluster.HostOf(agent).size());
  std::string legend;
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    const std::string host = spec.cluster.HostOf(agent);
    io::RemoteChild child;
    child.argv = io::SshArgv(ssh_command, io::AgentSshOptions(options.connect_timeout_s), host,
                             io::AgentRemoteLine(AgentCommandOf(job, options, agent)));
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
  EarlyExitWatch watch(spec);
  const io::RunOutcome outcome = io::RunRemoteChildren(agents, limits, watch.Hooks());
  if (const std::optional<int> code = watch.Verdict()) return *code;

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

}  // namespace

int UpCommand(const UpOptions& options) {
  std::optional<io::LocalCopy> copy;
  if (options.install) {
    if (!options.remote_ddprun.empty()) {
      std::fputs(
          "ddprun up: error: --install runs this ddprun's copy, --remote-ddprun another program: give one\n",
          stderr);
      return kExitUsage;
    }
    auto read = ReadThisBuild(/*with_tar=*/false);  // its stream is read only for hosts that need it
    if (!read) {
      std::fprintf(stderr, "ddprun up: error: --install: %s\n", read.error().c_str());
      return kExitUsage;
    }
    copy = std::move(*read);
  }
  auto loaded_job = LoadUpJob(options, "up", copy ? &*copy : nullptr);
  if (!loaded_job) return kExitUsage;
  const UpJob& job = *loaded_job;
  const std::string& job_path = job.job_path;
  const JobSpec& spec = job.spec;
  const std::string ssh_command = Env("DDPRUN_SSH_COMMAND");
  if (!Env("DDPRUN_SECRET").empty()) {
    // On a command line it would show in every host's process list.
    std::fputs(
        "ddprun up: warning: DDPRUN_SECRET is not sent over ssh; the agents use their own "
        "environment. Use DDPRUN_SECRET_FILE on a folder every node sees (its path is passed on)\n",
        stderr);
  }

  std::fprintf(stderr, "ddprun up: checking %d host%s over %s ...\n", spec.cluster.Agents(),
               spec.cluster.Agents() == 1 ? "" : "s", ssh_command.empty() ? "ssh" : ssh_command.c_str());
  const auto to_install = ProbeHosts(spec, options, job.program, ssh_command, job_path);
  if (!to_install) return kExitRendezvous;
  if (!to_install->empty()) {
    auto with_tar = ReadThisBuild(/*with_tar=*/true);
    if (!with_tar || with_tar->id != copy->id) {
      std::fprintf(stderr, "ddprun up: error: --install: %s\n",
                   with_tar ? "this ddprun's files changed while `up` ran" : with_tar.error().c_str());
      return kExitUsage;
    }
    if (!InstallOnHosts(spec, options, *with_tar, ssh_command, *to_install)) return kExitRendezvous;
  }
  if (options.copy) {
    if (!CopyJobFile(spec, options, job.program, ssh_command, job_path, job.source_text))
      return kExitRendezvous;
    std::fprintf(stderr, "ddprun up: copied %s to %d host%s\n", job_path.c_str(), spec.cluster.Agents(),
                 spec.cluster.Agents() == 1 ? "" : "s");
  }

  if (options.detach) return StartDetached(job, options);
  return RunAttached(job, options, ssh_command);
}

}  // namespace ddprun::cli
