#include "runner/io/ssh_command.h"

#include <algorithm>
#include <array>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runner/io/remote_install.h"
#include "schema/plan.h"

namespace ddprun::io {
namespace {

bool Contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

/// ssh's own last message (its stderr may also hold the login banner).
std::string LastLine(const std::string& text) {
  std::string trimmed = text;
  while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == '\r')) trimmed.pop_back();
  const size_t start = trimmed.find_last_of('\n');
  return start == std::string::npos ? trimmed : trimmed.substr(start + 1);
}

/// "port 2222" from ssh's "ssh: connect to host h port 2222: ..." ("its ssh port" when ssh
/// did not say which).
std::string PortOf(const std::string& err) {
  const size_t at = err.find(" port ");
  if (at == std::string::npos) return "its ssh port";
  size_t end = at + 6;
  while (end < err.size() && err[end] >= '0' && err[end] <= '9') ++end;
  if (end == at + 6) return "its ssh port";
  return "port " + err.substr(at + 6, end - at - 6);
}

/// What sets $d on the host (this build's copy or `ddprun` on the PATH): "" when the program
/// was given.
std::string Prelude(const RemoteProgram& program) {
  if (!program.given.empty()) return "";
  return CopyCheckShell(program.copy_id, program.manifest_sum) +
         "if ddprun_copy_ok \"$c\"; then d=\"$c/bin/ddprun\"; else d=ddprun; fi; ";
}

/// The program as a word of the line.
std::string Program(const RemoteProgram& program) {
  return program.given.empty() ? "\"$d\"" : ShellQuote(program.given);
}

}  // namespace

RemoteProgram RemoteProgram::ThisBuildOrPath(std::string copy_id, std::string manifest_sum) {
  RemoteProgram program("");
  program.copy_id = std::move(copy_id);
  program.manifest_sum = std::move(manifest_sum);
  return program;
}

std::vector<std::string> ProbeSshOptions(int connect_timeout_s) {
  return {"-o", "BatchMode=yes", "-o", fmt::format("ConnectTimeout={}", connect_timeout_s)};
}

std::vector<std::string> AgentSshOptions(int connect_timeout_s) {
  return {"-o", "BatchMode=yes",         "-o", fmt::format("ConnectTimeout={}", connect_timeout_s),
          "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"};
}

std::vector<std::string> SshArgv(const std::string& ssh_command, const std::vector<std::string>& options,
                                 const std::string& host, const std::string& remote_command) {
  std::vector<std::string> argv;
  if (ssh_command.empty()) {
    argv.push_back("ssh");
  } else {
    // As git runs GIT_SSH_COMMAND: the shell splits the user's words, "$@" keeps ours whole.
    argv = {"/bin/sh", "-c", ssh_command + " \"$@\"", ssh_command};
  }
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back(host);
  argv.push_back(remote_command);
  return argv;
}

Status CheckDestination(const std::string& host) {
  if (host.empty() || host.front() == '-') {
    return Fail(fmt::format("host \"{}\" cannot be given to ssh (it would read it as an option)", host));
  }
  return {};
}

std::string ProbeCommand(const RemoteProgram& program, const std::string& job_path, bool job_copied) {
  std::string line = Prelude(program);
  if (!job_copied) {
    line += fmt::format("if test -r {0}; then echo job-file-found; else echo job-file-missing; fi; ",
                        ShellQuote(job_path));
  }
  line +=
      fmt::format("command -v {0} >/dev/null 2>&1 || exit 127; {0} --version || exit 126", Program(program));
  return line;
}

ProbeOutcome ReadProbe(const std::string& host, int exit_status, const std::string& out,
                       const std::string& err, const RemoteProgram& program, const std::string& job_path,
                       const std::string& local_version, int connect_timeout_s, bool install) {
  ProbeOutcome outcome;
  const std::string remote_ddprun = program.Shown();
  const std::string said = LastLine(err);
  if (exit_status == -1) {
    outcome.what = fmt::format("no answer within {} s", connect_timeout_s + 5);
    outcome.fix = fmt::format("hint: is {} up? `ssh {} true` should return at once", host, host);
    return outcome;
  }
  if (exit_status == 255) {
    if (Contains(err, "Could not resolve hostname") || Contains(err, "Name or service not known")) {
      outcome.what = "ssh cannot resolve the host name (DNS): " + said;
      outcome.fix = "hint: check the name in cluster.nodes, or give it a HostName in ~/.ssh/config";
    } else if (Contains(err, "Connection refused")) {
      outcome.what = fmt::format("connection refused: no ssh server listens on {}: {}", PortOf(err), said);
      outcome.fix = "hint: start sshd on that host, or set its Port in ~/.ssh/config";
    } else if (Contains(err, "timed out")) {
      outcome.what = fmt::format("connection timed out ({} s): {}", connect_timeout_s, said);
      outcome.fix = fmt::format(
          "hint: is the host up and {} open? For a slow network: DDPRUN_SSH_COMMAND=\"ssh -o "
          "ConnectTimeout=30\"",
          PortOf(err));
    } else if (Contains(err, "No route to host") || Contains(err, "Network is unreachable")) {
      outcome.what = "no route to the host: " + said;
      outcome.fix = "hint: check the address in cluster.nodes and the network between this machine and it";
    } else if (Contains(err, "REMOTE HOST IDENTIFICATION HAS CHANGED") ||
               Contains(err, "has changed and you have")) {
      // Never talk the user into accepting it: this is what an interception looks like.
      outcome.what =
          "its host key has CHANGED since it was recorded in known_hosts: someone may be intercepting the "
          "connection (a man-in-the-middle attack), or the host was reinstalled";
      outcome.fix = fmt::format(
          "hint: do not accept the new key as it is offered: confirm the host's new key with whoever runs {} "
          "(out of band), and only then replace the recorded one (`ssh-keygen -R {}`)",
          host, host);
    } else if (Contains(err, "Host key verification failed")) {
      outcome.what = "its host key is not known here (ssh runs with BatchMode=yes and asks nothing)";
      outcome.fix = fmt::format(
          "hint: check the key's fingerprint with whoever runs {0} (`ssh-keyscan {0} | ssh-keygen -lf -` "
          "shows what it offers), then add it to known_hosts",
          host);
    } else if (Contains(err, "Permission denied") || Contains(err, "Authentication failed")) {
      outcome.what = "authentication failed: " + said;
      outcome.fix = fmt::format(
          "hint: `ssh-copy-id {}`, or load the key into ssh-agent; ddprun up runs ssh with "
          "BatchMode=yes, so it cannot ask for a password",
          host);
    } else {
      outcome.what = "ssh failed: " + (said.empty() ? std::string("(no message)") : said);
      outcome.fix = fmt::format("hint: run `ssh {} true` to see why", host);
    }
    return outcome;
  }
  const bool default_program = program.given.empty();
  const std::string or_install = default_program ? "`ddprun up --install` copies this one there; or " : "";
  if (exit_status == 127) {
    outcome.what =
        default_program
            ? fmt::format("no `ddprun` on the remote PATH, and no copy of this one in ~/.ddprun/{}",
                          program.copy_id)
            : fmt::format("no `{}` on the remote PATH", remote_ddprun);
    outcome.fix =
        "hint: " + or_install +
        "install ddprun there (docs/install.md), or pass `--remote-ddprun /path/to/ddprun`; a command "
        "run through ssh gets the PATH of a non-interactive shell, without what ~/.profile adds";
  } else if (exit_status != 0) {
    outcome.what = fmt::format("`{} --version` failed there (exit {}): {}", remote_ddprun, exit_status,
                               LastLine(err.empty() ? out : err));
    outcome.fix = "hint: " + or_install + "run it by hand on that host";
  } else {
    const std::string expected = "ddprun " + local_version;
    const size_t found = out.find("ddprun ");
    const std::string remote_version =
        found == std::string::npos ? LastLine(out) : out.substr(found, out.find('\n', found) - found);
    if (remote_version != expected) {
      outcome.what = fmt::format("it runs {}, this machine runs {}", remote_version, expected);
      outcome.fix = "hint: " + or_install +
                    "install the same ddprun on every node and here (the agents refuse a mixed job)";
    }
  }
  // Whatever is wrong with the remote ddprun (missing, failing, another version), --install
  // puts this one there, unless the user named a program of their own.
  outcome.install = install && default_program && !outcome.what.empty();
  if (!outcome.what.empty() && !outcome.install) return outcome;
  if (Contains(out, "job-file-missing")) {
    outcome.install = false;
    outcome.what = fmt::format("the job file is not at {} there", job_path);
    outcome.fix =
        "hint: keep it in a folder every node sees at the same path (a shared home, a checked-out "
        "repository), or pass --copy to copy it there";
    return outcome;
  }
  outcome.ok = true;
  return outcome;
}

std::string CopyCommand(const RemoteProgram& program, const std::string& job_path) {
  return fmt::format("{}exec {} __up-remote copy --to {}", Prelude(program), Program(program),
                     ShellQuote(job_path));
}

std::string AgentRemoteLine(const AgentCommand& agent) {
  const std::string dir = std::filesystem::path(agent.job_path).parent_path().string();
  std::string line = Prelude(agent.program) + fmt::format("cd {} && ", ShellQuote(dir.empty() ? "." : dir));
  if (!agent.secret_file.empty()) line += "DDPRUN_SECRET_FILE=" + ShellQuote(agent.secret_file) + " ";
  line += fmt::format("exec {} run {} --node-rank {} --under-up", Program(agent.program),
                      ShellQuote(agent.job_path), agent.node_rank);
  if (!agent.script_args.empty()) {
    line += " --";
    for (const std::string& arg : agent.script_args) line += " " + ShellQuote(arg);
  }
  return line;
}

std::string DetachedAgentLine(const AgentCommand& agent, const std::string& state_dir) {
  const std::string dir = std::filesystem::path(agent.job_path).parent_path().string();
  std::string line = Prelude(agent.program) + fmt::format("cd {} && ", ShellQuote(dir.empty() ? "." : dir));
  if (!agent.secret_file.empty()) line += "DDPRUN_SECRET_FILE=" + ShellQuote(agent.secret_file) + " ";
  line +=
      fmt::format("exec {} __up-remote start --state-dir {} --node-rank {} --job {}", Program(agent.program),
                  ShellQuote(state_dir), agent.node_rank, ShellQuote(agent.job_path));
  if (!agent.script_args.empty()) {
    line += " --";
    for (const std::string& arg : agent.script_args) line += " " + ShellQuote(arg);
  }
  return line;
}

std::string StatusLine(const RemoteProgram& program, const std::string& state_dir, int node_rank) {
  return fmt::format("{}exec {} __up-remote status --state-dir {} --node-rank {}", Prelude(program),
                     Program(program), ShellQuote(state_dir), node_rank);
}

std::string DownLine(const RemoteProgram& program, const std::string& state_dir, int node_rank, int wait_s) {
  return fmt::format("{}exec {} __up-remote down --state-dir {} --node-rank {} --wait {}", Prelude(program),
                     Program(program), ShellQuote(state_dir), node_rank, wait_s);
}

namespace {

constexpr std::array<std::string_view, 12> kRemoteStateNames = {
    "error",    "started",    "copied",  "running",     "exited",        "never-started",
    "not-ours", "unreadable", "stopped", "not-running", "still-running", "unknown"};
static_assert(kRemoteStateNames.size() == static_cast<size_t>(RemoteState::kUnknown) + 1);

}  // namespace

std::string_view RemoteStateName(RemoteState state) { return kRemoteStateNames[static_cast<size_t>(state)]; }

std::string FormatRemoteAnswer(const RemoteAnswer& answer) {
  nlohmann::json record;
  record["ddprun_up"] = 1;
  record["state"] = RemoteStateName(answer.state);
  if (answer.pid != 0) record["pid"] = answer.pid;
  if (!answer.why.empty()) record["why"] = answer.why;
  if (!answer.log.empty()) record["log"] = answer.log;
  // Invalid UTF-8 from a console is replaced, not thrown on.
  return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::optional<RemoteAnswer> ParseRemoteAnswer(const std::string& out) {
  std::optional<RemoteAnswer> found;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    const std::string_view line = std::string_view(out).substr(start, end - start);
    start = end + 1;
    if (!line.starts_with("{\"ddprun_up\":")) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("state") || !record["state"].is_string()) continue;
    RemoteAnswer answer;
    if (record.contains("pid") && record["pid"].is_number_integer())
      answer.pid = record["pid"].get<int64_t>();
    if (record.contains("why") && record["why"].is_string()) answer.why = record["why"].get<std::string>();
    const std::string state = record["state"].get<std::string>();
    const auto known = std::find(kRemoteStateNames.begin(), kRemoteStateNames.end() - 1, state);
    if (known != kRemoteStateNames.end() - 1) {
      answer.state = static_cast<RemoteState>(known - kRemoteStateNames.begin());
    } else {
      answer.state = RemoteState::kUnknown;
      answer.why = fmt::format("the host's ddprun answered \"{}\", a state this ddprun does not know{}",
                               state, answer.why.empty() ? "" : " (" + answer.why + ")");
    }
    if (record.contains("log") && record["log"].is_array()) {
      for (const auto& entry : record["log"]) {
        if (entry.is_string()) answer.log.push_back(entry.get<std::string>());
      }
    }
    found = std::move(answer);
  }
  return found;
}

}  // namespace ddprun::io
