#include "runner/io/ssh_command.h"

#include <filesystem>

#include <fmt/format.h>

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

}  // namespace

std::vector<std::string> ProbeSshOptions(int connect_timeout_s) {
  return {"-o", "BatchMode=yes", "-o", fmt::format("ConnectTimeout={}", connect_timeout_s)};
}

std::vector<std::string> AgentSshOptions(int connect_timeout_s) {
  return {"-o", "BatchMode=yes", "-o", fmt::format("ConnectTimeout={}", connect_timeout_s),
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

std::string ProbeCommand(const std::string& remote_ddprun, const std::string& job_path, bool job_copied) {
  const std::string ddprun = ShellQuote(remote_ddprun);
  std::string line = fmt::format("command -v {0} >/dev/null 2>&1 || exit 127; {0} --version || exit 126", ddprun);
  if (!job_copied) {
    line += fmt::format("; if test -r {0}; then echo job-file-found; else echo job-file-missing; fi",
                        ShellQuote(job_path));
  }
  return line;
}

ProbeOutcome ReadProbe(const std::string& host, int exit_status, const std::string& out, const std::string& err,
                       const std::string& remote_ddprun, const std::string& job_path,
                       const std::string& local_version, int connect_timeout_s) {
  ProbeOutcome outcome;
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
      outcome.what = "connection refused: no ssh server listens there: " + said;
      outcome.fix = "hint: start sshd on that host, or set its Port in ~/.ssh/config";
    } else if (Contains(err, "timed out")) {
      outcome.what = fmt::format("connection timed out ({} s): {}", connect_timeout_s, said);
      outcome.fix =
          "hint: is the host up and port 22 open? For a slow network: DDPRUN_SSH_COMMAND=\"ssh -o "
          "ConnectTimeout=30\"";
    } else if (Contains(err, "No route to host") || Contains(err, "Network is unreachable")) {
      outcome.what = "no route to the host: " + said;
      outcome.fix = "hint: check the address in cluster.nodes and the network between this machine and it";
    } else if (Contains(err, "Host key verification failed")) {
      outcome.what = "its host key is not known here (ssh runs with BatchMode=yes and asks nothing)";
      outcome.fix = fmt::format("hint: `ssh {}` once by hand and accept the key, or add it to known_hosts", host);
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
  if (exit_status == 127) {
    outcome.what = fmt::format("no `{}` on the remote PATH", remote_ddprun);
    outcome.fix =
        "hint: install ddprun there, or pass `--remote-ddprun /path/to/ddprun`; a command run "
        "through ssh gets the PATH of a non-interactive shell, without what ~/.profile adds";
    return outcome;
  }
  if (exit_status != 0) {
    outcome.what = fmt::format("`{} --version` failed there (exit {}): {}", remote_ddprun, exit_status,
                               LastLine(err.empty() ? out : err));
    outcome.fix = "hint: run it by hand on that host";
    return outcome;
  }
  const std::string expected = "ddprun " + local_version;
  const size_t found = out.find("ddprun ");
  const std::string remote_version =
      found == std::string::npos ? LastLine(out) : out.substr(found, out.find('\n', found) - found);
  if (remote_version != expected) {
    outcome.what = fmt::format("it runs {}, this machine runs {}", remote_version, expected);
    outcome.fix = "hint: install the same ddprun on every node and here (the agents refuse a mixed job)";
    return outcome;
  }
  if (Contains(out, "job-file-missing")) {
    outcome.what = fmt::format("the job file is not at {} there", job_path);
    outcome.fix =
        "hint: keep it in a folder every node sees at the same path (a shared home, a checked-out "
        "repository), or pass --copy to copy it there";
    return outcome;
  }
  outcome.ok = true;
  return outcome;
}

std::string CopyCommand(const std::string& job_path, int tag) {
  const std::string dir = std::filesystem::path(job_path).parent_path().string();
  const std::string temporary = fmt::format("{}.ddprun-up-{}.tmp", job_path, tag);
  return fmt::format("mkdir -p {0} && cat > {1} && mv -f {1} {2}", ShellQuote(dir.empty() ? "." : dir),
                     ShellQuote(temporary), ShellQuote(job_path));
}

std::string AgentRemoteLine(const AgentCommand& agent) {
  const std::string dir = std::filesystem::path(agent.job_path).parent_path().string();
  std::string line = fmt::format("cd {} && ", ShellQuote(dir.empty() ? "." : dir));
  if (!agent.secret_file.empty()) line += "DDPRUN_SECRET_FILE=" + ShellQuote(agent.secret_file) + " ";
  line += fmt::format("exec {} run {} --node-rank {} --under-up", ShellQuote(agent.remote_ddprun),
                      ShellQuote(agent.job_path), agent.node_rank);
  if (!agent.script_args.empty()) {
    line += " --";
    for (const std::string& arg : agent.script_args) line += " " + ShellQuote(arg);
  }
  return line;
}

namespace {

// Whether $pid is the agent of `job_path`: alive, and its command line names the job file.
std::string IsAgentTest(const std::string& job_path) {
  return fmt::format("kill -0 \"$pid\" 2>/dev/null && tr '\\0' ' ' < /proc/\"$pid\"/cmdline | grep -qF -- {}",
                     ShellQuote(job_path));
}

}  // namespace

std::string DetachedAgentLine(const AgentCommand& agent, const DetachedFiles& files) {
  const std::string dir = std::filesystem::path(agent.job_path).parent_path().string();
  const std::string state_dir = std::filesystem::path(files.pid_file).parent_path().string();
  std::string run = fmt::format("{} run {} --node-rank {}", ShellQuote(agent.remote_ddprun),
                                ShellQuote(agent.job_path), agent.node_rank);
  if (!agent.script_args.empty()) {
    run += " --";
    for (const std::string& arg : agent.script_args) run += " " + ShellQuote(arg);
  }
  // The background command is a simple command, so the shell's child applies the redirections
  // and execs: nothing keeps the ssh session's stdout open and ssh returns at once.
  std::string line = fmt::format("cd {} && mkdir -p {} || exit 1; ", ShellQuote(dir.empty() ? "." : dir), ShellQuote(state_dir));
  if (!agent.secret_file.empty()) line += "DDPRUN_SECRET_FILE=" + ShellQuote(agent.secret_file) + " ";
  line += fmt::format("setsid nohup {} </dev/null >{} 2>&1 & pid=$!; echo \"$pid\" > {} && echo \"started $pid\"", run,
                      ShellQuote(files.console), ShellQuote(files.pid_file));
  return line;
}

std::string StatusLine(const std::string& job_path, const DetachedFiles& files) {
  return fmt::format(
      "if ! test -r {0}; then echo 'state: never-started'; exit 0; fi; pid=$(cat {0}); "
      "if {1}; then echo \"state: running $pid\"; else echo \"state: exited $pid\"; fi; "
      "tail -n 3 {2} 2>/dev/null | sed 's/^/log: /'",
      ShellQuote(files.pid_file), IsAgentTest(job_path), ShellQuote(files.console));
}

std::string DownLine(const std::string& job_path, const DetachedFiles& files, int wait_s) {
  return fmt::format(
      "if ! test -r {0}; then echo 'state: never-started'; exit 0; fi; pid=$(cat {0}); "
      "if ! {1}; then echo \"state: not-running $pid\"; exit 0; fi; kill -TERM \"$pid\"; i=0; "
      "while [ $i -lt {2} ]; do if ! kill -0 \"$pid\" 2>/dev/null; then echo \"state: stopped $pid\"; exit 0; fi; "
      "sleep 0.2; i=$((i+1)); done; echo \"state: still-running $pid\"; exit 1",
      ShellQuote(files.pid_file), IsAgentTest(job_path), wait_s * 5);
}

}  // namespace ddprun::io
