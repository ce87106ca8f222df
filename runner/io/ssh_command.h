#pragma once
// What `ddprun up` runs through the OpenSSH client, and how it reads ssh's failures: pure
// functions (no process is started here), so the words a user sees are tested one by one.
//
// The ssh program is the user's own `ssh` with the user's configuration (keys, ports, jump
// hosts, ControlMaster). DDPRUN_SSH_COMMAND replaces it and its options, as GIT_SSH_COMMAND
// does for git: it is run by /bin/sh with the destination and the remote command appended.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace ddprun::io {

/// ssh options `up` adds for its first pass (the probe): no prompt that nobody would answer,
/// and a bounded wait. Options given first win in ssh, so DDPRUN_SSH_COMMAND (and `-o` in it)
/// can override these; the user's ssh config cannot, which is what a launcher needs.
std::vector<std::string> ProbeSshOptions(int connect_timeout_s);
/// For the agents' sessions: no prompt, and the client notices a dead connection.
std::vector<std::string> AgentSshOptions(int connect_timeout_s);

/// The argv that runs `remote_command` (a line for the remote user's shell) on `host`.
/// `ssh_command` is DDPRUN_SSH_COMMAND ("" for plain `ssh`).
std::vector<std::string> SshArgv(const std::string& ssh_command, const std::vector<std::string>& options,
                                 const std::string& host, const std::string& remote_command);

/// A host name ssh would read as an option ("-oProxyCommand=..."): refused before any ssh runs.
Status CheckDestination(const std::string& host);

/// The ddprun a remote line runs. `given` (--remote-ddprun) is run as named. Without it, a
/// host runs this build's copy in ~/.ddprun/<copy_id> (what `up --install` put there,
/// remote_install.h) when the copy is whole, unchanged and its owner's alone, else `ddprun` on
/// the remote PATH. Both are decided on the host, in the line itself.
struct RemoteProgram {
  RemoteProgram(std::string path = "ddprun") : given(std::move(path)) {}  // NOLINT: a path is a program
  RemoteProgram(const char* path) : given(path) {}                        // NOLINT
  static RemoteProgram ThisBuildOrPath(std::string copy_id, std::string manifest_sum);

  std::string given;  // "" for this build's copy, else `ddprun`
  std::string copy_id, manifest_sum;
  /// How messages name it: "ddprun" or the path given.
  std::string Shown() const { return given.empty() ? "ddprun" : given; }
};

/// The remote line of the probe: whether the job file is there (unless it is copied), then
/// `ddprun --version`. Exit 127 when the program is not found, 126 when it does not run.
std::string ProbeCommand(const RemoteProgram& program, const std::string& job_path, bool job_copied);

/// What the probe of one host found.
struct ProbeOutcome {
  bool ok = false;
  bool install = false;  // `install` was asked and the host needs this ddprun (else ok says all)
  std::string what;      // what failed, one line ("ssh cannot resolve the host name (DNS)")
  std::string fix;       // what to do ("hint: ...")
};
/// Reads one host's probe: ssh's exit status (-1 when it was killed at the deadline), its
/// stdout and stderr; `local_version` is this ddprun's version. With `install` (`up
/// --install`), a host that has no ddprun, or another version, or one that does not run, is
/// ok with `install` set; its other problems (the job file) are still reported.
ProbeOutcome ReadProbe(const std::string& host, int exit_status, const std::string& out,
                       const std::string& err, const RemoteProgram& program, const std::string& job_path,
                       const std::string& local_version, int connect_timeout_s, bool install = false);

/// The remote line that copies stdin into `job_path` for `up --copy`: `ddprun __up-remote copy`
/// there, which writes through a fresh exclusive temporary name and renames (detached_agent.h).
std::string CopyCommand(const RemoteProgram& program, const std::string& job_path);

/// The remote line that runs one agent under `up`.
struct AgentCommand {
  RemoteProgram program;
  std::string job_path;
  int node_rank = 0;
  std::vector<std::string> script_args;
  std::string secret_file;  // DDPRUN_SECRET_FILE to pass on ("" none)
};
std::string AgentRemoteLine(const AgentCommand& agent);

/// `up --detach`, `status` and `down` run ddprun itself on each host (`ddprun __up-remote`,
/// runner/io/detached_agent.h): no decision to signal a process is made in shell. A detached
/// agent's pid and console lie in `state_dir` = <logs.dir>/<job.name> (the job file lies at the
/// same path on every host, so this does too), as up-n<K>.{pid,console}.
///
/// The remote line that starts one agent detached (its own session, stdin from /dev/null,
/// console to its file); answers "started" with the pid.
std::string DetachedAgentLine(const AgentCommand& agent, const std::string& state_dir);
/// The remote line of `ddprun status`: "running", "exited", "never-started", "not-ours" (a pid
/// file naming a process that is not the agent it started) or "unreadable", with the pid, why,
/// and the console's last lines.
std::string StatusLine(const RemoteProgram& program, const std::string& state_dir, int node_rank);
/// The remote line of `ddprun down`: SIGTERM to the agent when it is provably the one started
/// (which stops the job's workers within stop_grace), then waits up to `wait_s` for it:
/// "stopped", "not-running", "never-started", "not-ours", "unreadable" or "still-running".
std::string DownLine(const RemoteProgram& program, const std::string& state_dir, int node_rank, int wait_s);

/// What `ddprun __up-remote` found or did on a host.
enum class RemoteState {
  kError,         // the action could not be done: `why` says
  kStarted,       // start: the agent runs detached (`pid`)
  kCopied,        // copy: the job file is in place
  kRunning,       // status: the agent `up --detach` started runs (`pid`)
  kExited,        // status: it has exited
  kNeverStarted,  // status, down: nothing was started there
  kNotOurs,       // status, down: the pid file names a process that is not that agent
  kUnreadable,    // status, down: the pid file cannot be read
  kStopped,       // down: it exited after SIGTERM
  kNotRunning,    // down: it was not running
  kStillRunning,  // down: it still runs after SIGTERM and the wait
  kUnknown,       // a state this ddprun does not know (the host's is newer): `why` names it
};
/// Its name in the answer: "error", "started", "copied", "running", "exited", "never-started",
/// "not-ours", "unreadable", "stopped", "not-running", "still-running" ("unknown" is never sent).
std::string_view RemoteStateName(RemoteState state);

/// What `ddprun __up-remote` answers: one JSON line, {"ddprun_up": 1, "state": ..., ...}.
struct RemoteAnswer {
  RemoteState state = RemoteState::kError;
  int64_t pid = 0;               // 0: none
  std::string why;               // "" or one clause, from the host: escape before printing
  std::vector<std::string> log;  // the console's last lines, from the host: escape too
};
std::string FormatRemoteAnswer(const RemoteAnswer& answer);
/// The answer in `out` (the last line that is one; ssh's banners and motd are skipped);
/// nullopt when there is none (ssh failed, or the remote ddprun is older).
std::optional<RemoteAnswer> ParseRemoteAnswer(const std::string& out);

}  // namespace ddprun::io
