#pragma once
// Starting one worker process. What execve needs is computed before the fork (job.command[0]
// found on the workers' PATH, the environments merged), because between vfork and exec the
// child shares the agent's memory and may not allocate; then vfork+exec, each step between
// them commented, and a failed step reported through a pipe with its errno. RealProcessLauncher
// starts cold workers through it; the warm template (warm_template.h) takes the same plan.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/types.h>

#include "base/result.h"
#include "schema/worker_env.h"

namespace ddprun::io {

/// What execve needs for one worker, computed before vfork (the child may not allocate).
struct LaunchPlan {
  std::string executable;         // absolute or relative to workdir
  std::vector<std::string> argv;  // argv[0] is `executable`
  std::vector<std::string> env;   // NAME=value
};

/// Resolves job.command[0] (a name on PATH, or a path relative to `workdir`) and merges the
/// environments: `added` over `inherited`. `is_executable` answers for a candidate path (the
/// real one calls access(X_OK)). A failure says what is missing, for the user.
Result<LaunchPlan> PrepareLaunch(const std::vector<std::string>& command, const std::string& workdir,
                                 const std::map<std::string, std::string>& inherited, const EnvList& added,
                                 const std::function<bool(const std::string&)>& is_executable);

/// The step of a worker's start that failed, reported by the child with its errno.
enum class StartStep : int { kNone, kProcessGroup, kStdio, kWorkdir, kExec, kFork };

struct StartResult {
  StartStep step = StartStep::kNone;
  int error = 0;
};

/// Starts one worker with vfork+exec, so starting 8 workers does not copy the agent's page
/// tables 8 times (Boost.Process v2's launcher forks and waits for each exec). Between vfork
/// and exec the child shares our memory: it only makes system calls, no allocation. The child
/// gets its own process group, registers with the guardian on `guardian_fd` (-1: none; it then
/// dies with the agent by PR_SET_PDEATHSIG), reads /dev/null and writes to `out_fd` and
/// `err_fd`, enters `workdir`, gets `nofile` (rlim_cur 0: the agent's own) and nothing else of
/// the agent's descriptors. Sets `pid` on success.
StartResult SpawnWorkerProcess(char* const argv[], char* const envp[], const char* workdir, int out_fd,
                               int err_fd, int guardian_fd, const rlimit& nofile, pid_t& pid);

/// A failed start in words for the user ("the workdir /w does not exist (job.workdir, ...)").
std::string DescribeStartFailure(const StartResult& result, const std::string& executable,
                                 const std::string& workdir);

}  // namespace ddprun::io
