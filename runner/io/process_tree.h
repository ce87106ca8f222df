#pragma once
// The system's processes as /proc shows them, and the trees below given processes: how the
// agent and its guardian find everything a worker started, whatever process group or session
// it moved to (`setsid`), without cgroups. Only system calls and plain allocation, so the
// guardian may use it in a child forked from a process that has threads.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace ddprun::io {

struct ProcessEntry {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgid = 0;
  /// Clock ticks after boot at which the process started: with the pid it names one process,
  /// so a pid reused by an unrelated process is never mistaken for a remembered one.
  uint64_t start_time = 0;
  char state = '?';  // 'Z' for a zombie
  /// The kernel's task flags (field 9); PF_EXITING is set when the process begins to exit,
  /// before it gives up its memory, and stays set: a process that shows it has exited.
  uint64_t flags = 0;
  static constexpr uint64_t kExiting = 0x4;            // PF_EXITING, the same value in every kernel
  static constexpr uint64_t kKernelThread = 0x200000;  // PF_KTHREAD: no memory, no environment
  bool exiting() const { return state == 'Z' || state == 'X' || (flags & kExiting) != 0; }
  bool kernel_thread() const { return (flags & kKernelThread) != 0; }
  /// Where the program's environment ends in its memory (field 51, Linux 3.5 on; shown only to
  /// who may read the environment). 0 while an exec is between replacing the memory and laying
  /// out the new program's arguments and environment: /proc/<pid>/environ then reads empty.
  uint64_t env_end = 0;
};

/// A bound on the table: a host with more processes is cut there (the rest is not seen).
inline constexpr size_t kMaxProcesses = 1 << 17;

/// Reads /proc/<pid>/stat. False when the process is gone or the line cannot be read.
bool ReadProcessEntry(pid_t pid, ProcessEntry& entry);

/// Every process in /proc now, sorted by pid.
std::vector<ProcessEntry> ReadProcessTable();

/// The processes of `table` whose parent chain leads to one of `roots`, roots excluded. The
/// process `exclude` and its own descendants are left out (the guardian, seen from the agent).
std::vector<ProcessEntry> DescendantsOf(const std::vector<ProcessEntry>& table,
                                        const std::vector<pid_t>& roots, pid_t exclude = 0);

/// `kill(-leader, signal)`: the process group that `leader` (a worker ddprun started with its
/// own group, or a child it made the leader of one) leads. Aborts when `leader` <= 1: 0 would be
/// our own group, 1 and below every process (STYLE.md rule 7: a broken invariant stops here).
void SignalGroup(pid_t leader, int signal);
/// `kill(pid, signal)` for one process; aborts when `pid` <= 1 as SignalGroup does.
void SignalProcess(pid_t pid, int signal);

/// SIGKILLs every process for which `is_seed` holds, and all their descendants, leaving out
/// `exclude` and its descendants and this process. Each found process is first stopped
/// (SIGSTOP) and /proc read again, until no new one appears, so nothing can fork its way out
/// between the look and the kill. Returns how many processes were killed.
size_t KillTrees(const std::function<bool(const ProcessEntry&)>& is_seed, pid_t exclude = 0);

}  // namespace ddprun::io
