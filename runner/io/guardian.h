#pragma once
// The guardian: a small process forked by the agent that kills every process the workers
// started when the agent dies, however it dies (SIGKILL, the OOM killer, `kill -9 %1` on its
// whole process group). It runs in its own session, so signals to the agent's process group or
// terminal do not reach it; it reads /proc every kGuardianScanInterval for every descendant of
// the agent (the agent is a child subreaper, so orphans of workers stay below it); when the
// agent's end of the pipe closes it stops and kills the workers and everything below them, and
// what it saw at its last look. It also holds the workers' lease, which the agent renews on
// every word from the coordinator (RenewLease): when it ends, the guardian SIGKILLs the workers
// of an agent that is alive but does not run. The agent watches the guardian and starts a new
// one if it dies.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "base/result.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

/// How often the guardian rereads /proc for the agent's descendants. Only processes that
/// lost their parent in the last interval before the agent died depend on it; workers and
/// everything still below them are found when the agent dies.
inline constexpr std::chrono::milliseconds kGuardianScanInterval{500};

class Guardian {
 public:
  /// Forks the guardian. On failure the guardian is absent (Active() false) and the workers
  /// get a parent-death signal instead, which reaches them but not what they started.
  Guardian();
  ~Guardian();
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  bool Active() const { return write_fd_ >= 0; }
  pid_t pid() const { return pid_; }
  /// The pipe to the guardian, for a worker between vfork and exec to register itself (the
  /// descriptor is close-on-exec); -1 when inactive.
  int write_fd() const { return write_fd_; }

  /// Records a worker (its pid, which is also its process group); the guardian kills it, its
  /// group and its descendants if the agent dies.
  void Watch(pid_t pgid);
  /// Forgets a worker that has exited and been reaped.
  void Forget(pid_t pgid);
  /// The agent has killed everything below it and is exiting: the guardian may then end
  /// without its own look at /proc (the agent's exit is that much faster).
  void Release();

  /// The workers' lease now ends at `kill_at` (core::RenewLease: the agent's last word from
  /// the coordinator + the loss bound + stop_grace). If no later one comes by then, the
  /// guardian SIGKILLs the workers itself: the agent may be alive but not run (SIGSTOP, a VM
  /// pause), so it cannot, and the coordinator may give their ranks to another agent soon
  /// after. Until the first call there is no lease.
  void RenewLease(std::chrono::steady_clock::time_point kill_at);

  /// From now on, notices the guardian's death on `io`, starts a new one (telling it the
  /// workers it must know) and reports it with `report`, a sentence for the console.
  void Supervise(boost::asio::io_context& io, std::function<void(const std::string&)> report);
  /// Stops watching; call before `io` is destroyed.
  void StopSupervising();

  /// Writes a '+' record for `pid` to `fd` with one write(2): safe between vfork and exec.
  /// Returns false if the write failed (no guardian listens).
  static bool RegisterFromChild(int fd, pid_t pid);

 private:
  struct Supervision;
  Status Start();
  void Write(char op, pid_t pgid);
  void WriteLease();
  void WatchDeath();
  void OnDeath();

  int write_fd_ = -1;
  pid_t pid_ = -1;
  std::set<pid_t> watched_;  // resent to a replacement guardian
  bool released_ = false;
  std::optional<std::chrono::steady_clock::time_point> kill_at_;  // resent to a replacement guardian
  std::unique_ptr<Supervision> supervision_;
  bool watching_ = false;  // its death is waited for through a pidfd (kernels from 5.3)
};

}  // namespace ddprun::io
