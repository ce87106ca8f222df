#pragma once
// The host's side of `ddprun up --detach`, `ddprun status` and `ddprun down`: ddprun itself
// (`ddprun __up-remote ...` run through ssh), never a line of generated shell, so that every
// decision to signal a process is made here, by code that is tested.
//
// A detached agent is recognised by more than its pid: the pid file (<state>/up-n<K>.pid)
// records the pid, the process's start time (/proc/<pid>/stat, in clock ticks since boot), the
// boot it started in, and a random per-launch token that the agent carries in its environment
// (DDPRUN_LAUNCH_TOKEN). A process is ours only when all four match and it belongs to this
// user: a planted file naming someone else's process, init, `-1`, a pid reused since, or a
// `tail -f job.toml` is refused, and nothing is signalled. Every file here is written and read
// through safe_file.h: no link followed, no FIFO opened, every read bounded.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"

namespace ddprun::io {

/// The environment variable that carries a detached agent's launch token.
inline constexpr std::string_view kLaunchTokenVariable = "DDPRUN_LAUNCH_TOKEN";
/// The most a pid file may hold (it is one short line).
inline constexpr size_t kMaxPidFile = 4096;

/// What the pid file records of the agent that `up --detach` started.
struct AgentIdentity {
  pid_t pid = 0;
  uint64_t start_ticks = 0;  // /proc/<pid>/stat field 22
  std::string boot_id;       // /proc/sys/kernel/random/boot_id
  std::string token;         // 32 hex digits, also in the agent's environment
};

/// The pid file's text: one JSON object on a line.
std::string FormatIdentity(const AgentIdentity& identity);
/// Reads a pid file's text. Refused: anything but that object, a pid <= 1 (no ddprun agent is
/// init, and 0 or -1 would reach a whole group or every process), a token that is not 32 hex.
Result<AgentIdentity> ParseIdentity(std::string_view text);

/// Whether the process a pid file names is the agent it recorded.
struct Recognition {
  enum class Verdict {
    kOurs,     // alive, and every recorded fact matches: it may be signalled
    kGone,     // it exited (or the host restarted, or the pid now belongs to a later process)
    kNotOurs,  // a live process that is not the recorded agent: never signalled
  };
  Verdict verdict = Verdict::kGone;
  std::string why;  // for kGone and kNotOurs: one clause ("pid 812 started at another time")
};
/// Looks `identity` up in /proc.
Recognition Recognise(const AgentIdentity& identity);

/// This boot's id ("" when the kernel does not say).
std::string BootId();
/// 32 random hex digits (getrandom).
std::string NewLaunchToken();

/// Where a detached agent's files go: the folder (created when missing) and the two names in it.
struct DetachedFiles {
  std::string state_dir;
  std::string pid_name;      // "up-n0.pid"
  std::string console_name;  // "up-n0.console"
};

/// Starts `argv` (argv[0] a path to exec) in its own session, stdin from /dev/null, stdout and
/// stderr to a new console file, `env` plus the launch token as its environment, in `cwd`;
/// then records its identity in the pid file. Both files are created afresh under exclusive
/// temporary names and renamed into place: whatever was planted under their names (a link, a
/// FIFO) is replaced, never written through. Fails when the program could not be executed.
Result<AgentIdentity> StartDetachedAgent(const std::vector<std::string>& argv, std::vector<std::string> env,
                                         const std::string& cwd, const DetachedFiles& files);

/// Opens the state folder (following links there, as the user's own logs.dir may be one).
/// nullopt: it does not exist.
Result<std::optional<UniqueFd>> OpenStateDir(const std::string& state_dir);
/// The pid file's identity; nullopt when there is none. Refused: a file that is not a regular
/// file (safe_file.h), is larger than kMaxPidFile, belongs to another user, or does not parse.
Result<std::optional<AgentIdentity>> ReadPidFile(int dir_fd, const std::string& name,
                                                 const std::string& shown);
/// The last `count` lines of the console file (the last 16 KiB at most read; "" lines none).
Result<std::vector<std::string>> ConsoleTail(int dir_fd, const std::string& name, const std::string& shown,
                                             size_t count);

/// Writes `text` to `path` through a fresh exclusive temporary name beside it, then renames:
/// `up --copy`'s remote side. The folder is created when missing.
Status ReplaceFileAt(const std::string& path, std::string_view text);

}  // namespace ddprun::io
