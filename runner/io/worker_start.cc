#include "runner/io/worker_start.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "base/unique_fd.h"
#include "runner/io/guardian.h"
#include "runner/io/kernel_compat.h"

namespace ddprun::io {

Result<LaunchPlan> PrepareLaunch(const std::vector<std::string>& command, const std::string& workdir,
                                 const std::map<std::string, std::string>& inherited, const EnvList& added,
                                 const std::function<bool(const std::string&)>& is_executable) {
  if (command.empty()) {
    return Fail("job.command is empty");
  }
  std::map<std::string, std::string> env = inherited;
  for (const auto& [name, value] : added) env[name] = value;
  LaunchPlan plan;
  const std::string& name = command[0];
  if (name.find('/') != std::string::npos) {
    std::filesystem::path p(name);
    if (p.is_relative()) p = std::filesystem::path(workdir) / p;
    plan.executable = p.string();
  } else {
    auto path = env.find("PATH");
    const std::string dirs = path != env.end() ? path->second : "/usr/local/bin:/usr/bin:/bin";
    size_t start = 0;
    while (start <= dirs.size() && plan.executable.empty()) {
      size_t end = dirs.find(':', start);
      if (end == std::string::npos) end = dirs.size();
      const std::string candidate = (std::filesystem::path(dirs.substr(start, end - start)) / name).string();
      if (is_executable(candidate)) plan.executable = candidate;
      start = end + 1;
    }
    if (plan.executable.empty()) {
      return Fail(fmt::format("command not found: \"{}\" is not on PATH", name));
    }
  }
  plan.argv.push_back(plan.executable);
  plan.argv.insert(plan.argv.end(), command.begin() + 1, command.end());
  plan.env.reserve(env.size());
  for (const auto& [var, value] : env) plan.env.push_back(var + "=" + value);
  return plan;
}

StartResult SpawnWorkerProcess(char* const argv[], char* const envp[], const char* workdir, int out_fd,
                               int err_fd, int guardian_fd, const rlimit& nofile, pid_t& pid) {
  int status_pipe[2];  // the child reports a failed step; exec closes it on success
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) return {StartStep::kFork, errno};
  UniqueFd status_read(status_pipe[0]), status_write(status_pipe[1]);
  UniqueFd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null.valid()) return {StartStep::kStdio, errno};
  const pid_t agent = ::getpid();
  const pid_t child = ::vfork();
  if (child == 0) {
    StartResult failed;
    // Its own process group, so a stop reaches everything the worker started that stays in it.
    if (::setpgid(0, 0) != 0) failed = {StartStep::kProcessGroup, errno};
    // It dies with the agent, even by SIGKILL: the guardian kills it and everything below it.
    // It registers itself before exec so that no instant passes in which the agent could die
    // unseen. It gets no parent-death signal then: that would kill it before the guardian
    // could find its children through it. Without a guardian, the signal is the fallback.
    if (failed.step == StartStep::kNone &&
        !(guardian_fd >= 0 && Guardian::RegisterFromChild(guardian_fd, ::getpid()))) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    }
    if (failed.step == StartStep::kNone && ::getppid() != agent) ::_exit(137);  // the agent died
    if (failed.step == StartStep::kNone &&
        (::dup2(dev_null.get(), 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0)) {
      failed = {StartStep::kStdio, errno};
    }
    // Nothing of the agent's but stdio crosses exec: Asio's sockets are not close-on-exec, and
    // a worker holding the master port's listener or the agent's connections would keep them
    // alive after the agent died (a restarted node 0 could not listen; the coordinator would
    // not see the agent's connection close). The flag marks them close-on-exec, so a failed
    // step can still be reported through the status pipe.
    if (failed.step == StartStep::kNone) CloexecFrom(3);
    if (failed.step == StartStep::kNone && ::chdir(workdir) != 0) failed = {StartStep::kWorkdir, errno};
    // The agent raised its own descriptor limit; the worker gets the one it was started with.
    if (failed.step == StartStep::kNone && nofile.rlim_cur != 0) ::setrlimit(RLIMIT_NOFILE, &nofile);
    if (failed.step == StartStep::kNone) {
      // The agent ignores SIGPIPE, and exec keeps ignored signals ignored.
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(SIGPIPE, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execve(argv[0], argv, envp);
      failed = {StartStep::kExec, errno};
    }
    [[maybe_unused]] const ssize_t n = ::write(status_pipe[1], &failed, sizeof failed);
    ::_exit(127);
  }
  if (child < 0) return {StartStep::kFork, errno};
  status_write.Reset();
  // vfork returns once the child has exec'd (the pipe closed: EOF) or exited (step written).
  StartResult reported;
  if (::read(status_read.get(), &reported, sizeof reported) == static_cast<ssize_t>(sizeof reported)) {
    int status = 0;
    ::waitpid(child, &status, 0);
    return reported;
  }
  pid = child;
  return {};
}

std::string DescribeStartFailure(const StartResult& result, const std::string& executable,
                                 const std::string& workdir) {
  switch (result.step) {
    case StartStep::kWorkdir:
      if (result.error == ENOENT) {
        return fmt::format("the workdir {} does not exist (job.workdir, relative to the job file)", workdir);
      }
      if (result.error == ENOTDIR)
        return fmt::format("the workdir {} is not a folder (job.workdir)", workdir);
      return fmt::format("cannot enter the workdir {}: {}", workdir, std::strerror(result.error));
    case StartStep::kExec:
      return fmt::format("cannot start {}: {}", executable, std::strerror(result.error));
    case StartStep::kProcessGroup:
      return fmt::format("cannot give the worker its own process group: {}", std::strerror(result.error));
    case StartStep::kStdio:
      return fmt::format("cannot connect the worker's output: {}", std::strerror(result.error));
    case StartStep::kFork:
    case StartStep::kNone:
      break;
  }
  return fmt::format("cannot start a process: {}", std::strerror(result.error));
}

}  // namespace ddprun::io
