#pragma once
// The guardian: a small process forked at agent start that outlives a SIGKILLed agent just
// long enough to SIGKILL every worker process group the agent had running. A parent-death
// signal alone only reaches the worker itself, not the processes it started.

#include <sys/types.h>

namespace ddprun::io {

class Guardian {
 public:
  /// Forks the guardian. Call before any thread starts. On failure the guardian is absent
  /// (Active() false) and only the parent-death signal protects against orphans.
  Guardian();
  ~Guardian();
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  bool Active() const { return write_fd_ >= 0; }
  /// Records a worker's process group; the guardian kills it if the agent dies.
  void Watch(pid_t pgid);
  /// Forgets a process group whose leader has exited and been reaped.
  void Forget(pid_t pgid);

 private:
  void Write(char op, pid_t pgid);
  int write_fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace ddprun::io
