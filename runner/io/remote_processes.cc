#include "runner/io/remote_processes.h"
#include "runner/io/process_tree.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "base/unique_fd.h"
#include "runner/io/controller_link.h"

extern char** environ;

namespace ddprun::io {
namespace {

using Clock = std::chrono::steady_clock;

// A line longer than this is printed in pieces rather than held without bound.
constexpr size_t kMaxLine = 64 * 1024;
// Collected output above this is cut (a probe says a few lines).
constexpr size_t kMaxCollected = 256 * 1024;

struct Running {
  pid_t pid = -1;
  UniqueFd in;   // our end of its stdin
  UniqueFd out;  // our ends of its stdout and stderr
  UniqueFd err;
  std::shared_ptr<const std::string> input;
  size_t input_at = 0;  // how much of `input` was written
  std::string line[2];  // partial lines of stdout and stderr (stream)
  bool reaped = false;
  bool timed_out = false;
  std::chrono::steady_clock::time_point reaped_at;
};

void WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

/// Prints every complete line of `buffer` with `prefix`, keeping the rest; all of it at `eof`.
/// A line `keep` refuses is not printed.
void EmitLines(std::string& buffer, const std::string& prefix, int fd, bool eof,
               const std::function<bool(std::string_view)>& keep) {
  size_t start = 0;
  while (true) {
    const size_t end = buffer.find('\n', start);
    if (end == std::string::npos) break;
    if (!keep || keep(std::string_view(buffer).substr(start, end - start))) {
      WriteAll(fd, prefix + buffer.substr(start, end - start + 1));
    }
    start = end + 1;
  }
  buffer.erase(0, start);
  if ((eof && !buffer.empty()) || buffer.size() > kMaxLine) {
    WriteAll(fd, prefix + buffer + "\n");
    buffer.clear();
  }
}

/// posix_spawnp with pipes for stdin, stdout and stderr, in a process group of its own, with
/// the default signal dispositions and an empty signal mask.
bool Spawn(const RemoteChild& child, Running& running, std::string* why) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return *why = std::strerror(errno), false;
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]), ::close(in[1]);
    return *why = std::strerror(errno), false;
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(in[0]), ::close(in[1]), ::close(out[0]), ::close(out[1]);
    return *why = std::strerror(errno), false;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&defaults, signal);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> argv;
  for (const std::string& arg : child.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]), ::close(out[1]), ::close(err[1]);
  running.in.Reset(in[1]);
  running.out.Reset(out[0]);
  running.err.Reset(err[0]);
  if (rc != 0) {
    *why = fmt::format("cannot start {}: {}", child.argv[0], std::strerror(rc));
    return false;
  }
  running.pid = pid;
  ::fcntl(running.in.get(), F_SETFL, O_NONBLOCK);
  running.input = child.input;
  return true;
}

/// Writes what the child's stdin can take now; closes it when all is written, unless the child
/// holds it (the agent's link to `up`).
void FeedInput(const RemoteChild& child, Running& r) {
  if (!r.in.valid()) return;
  const size_t size = r.input ? r.input->size() : 0;
  while (r.input_at < size) {
    const ssize_t n = ::write(r.in.get(), r.input->data() + r.input_at, size - r.input_at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) r.input_at = size;  // it stopped reading (EPIPE): no more to say
    if (n <= 0) break;
    r.input_at += static_cast<size_t>(n);
  }
  if (r.input_at == size && !child.hold_stdin) r.in.Reset();
}

/// What the loop waits on: the signalfd (owner: running.size()), each child's output, and its
/// stdin while input is left to write (megabytes for --install).
void PollSet(const std::vector<Running>& running, int signals, std::vector<pollfd>& fds,
             std::vector<std::pair<size_t, int>>& owners) {
  fds.push_back({signals, POLLIN, 0});
  owners.push_back({running.size(), 0});
  for (size_t i = 0; i < running.size(); ++i) {
    const Running& r = running[i];
    if (r.in.valid() && r.input && r.input_at < r.input->size())
      fds.push_back({r.in.get(), POLLOUT, 0}), owners.push_back({i, 2});
    if (r.out.valid()) fds.push_back({r.out.get(), POLLIN, 0}), owners.push_back({i, 0});
    if (r.err.valid()) fds.push_back({r.err.get(), POLLIN, 0}), owners.push_back({i, 1});
  }
}

/// Reads what child `i` wrote on `stream` (0 stdout, 1 stderr): streamed as lines, or collected.
void ReadOutput(const RemoteChild& child, size_t i, int stream, const RunHooks& hooks, Running& r,
                ChildOutcome& outcome) {
  char buffer[16384];
  UniqueFd& fd = stream == 0 ? r.out : r.err;
  const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  const bool eof = n <= 0;
  if (child.stream) {
    if (!eof) r.line[stream].append(buffer, static_cast<size_t>(n));
    std::function<bool(std::string_view)> keep;
    if (hooks.line) keep = [&](std::string_view line) { return hooks.line(i, stream, line); };
    EmitLines(r.line[stream], child.prefix, stream == 0 ? STDOUT_FILENO : STDERR_FILENO, eof, keep);
  } else if (!eof) {
    std::string& sink = stream == 0 ? outcome.out : outcome.err;
    if (sink.size() < kMaxCollected) sink.append(buffer, static_cast<size_t>(n));
  }
  if (eof) fd.Reset();
}

/// Past the deadline (`overdue`) every client still running is killed. A client that has
/// exited but whose pipes stay open (a descendant holds them, such as a ControlPersist master)
/// is not waited for beyond a moment; one killed at the deadline not at all.
void EnforceDeadline(std::vector<Running>& running, Clock::time_point now, bool overdue) {
  for (Running& r : running) {
    if (overdue && !r.reaped && !r.timed_out) r.timed_out = true, SignalGroup(r.pid, SIGKILL);
    if (r.reaped && r.pid > 0 && (r.timed_out || now - r.reaped_at > std::chrono::seconds(2))) {
      r.out.Reset(), r.err.Reset();
    }
  }
}

/// Starts one client; one that cannot start is done at once, exit 127 with why.
void SpawnOrFail(const RemoteChild& child, Running& running, ChildOutcome& outcome) {
  std::string why;
  if (Spawn(child, running, &why)) return;
  outcome.exit_status = 127;
  outcome.err = why;
  running.reaped = true;
  running.out.Reset();
  running.err.Reset();
  running.in.Reset();
}

void KillAll(std::vector<Running>& running, int signal) {
  for (Running& r : running) {
    if (r.pid > 0 && !r.reaped) SignalGroup(r.pid, signal);
  }
}

/// Asks each child to stop the way the user asked this program with `signal`: one that holds a
/// link gets the stop line (and its link closes); one that holds none (a probe) is ended now.
void AskToStop(const std::vector<RemoteChild>& children, std::vector<Running>& running, int signal) {
  for (size_t j = 0; j < children.size(); ++j) {
    Running& r = running[j];
    if (children[j].hold_stdin && r.in.valid()) {
      const std::string line = StopRequestLine(signal);
      ::fcntl(r.in.get(), F_SETFL, 0);
      WriteAll(r.in.get(), line);
      r.in.Reset();
    } else if (r.pid > 0 && !r.reaped) {
      SignalGroup(r.pid, SIGTERM);
    }
  }
}

}  // namespace

RunOutcome RunRemoteChildren(const std::vector<RemoteChild>& children, const RunLimits& limits,
                             const RunHooks& hooks) {
  RunOutcome outcome;
  outcome.children.resize(children.size());
  std::vector<Running> running(children.size());

  // Interrupts arrive as readable data on a signalfd, in this loop, never in a handler.
  sigset_t interrupts, previous;
  sigemptyset(&interrupts);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&interrupts, signal);
  ::sigprocmask(SIG_BLOCK, &interrupts, &previous);
  UniqueFd signals(::signalfd(-1, &interrupts, SFD_CLOEXEC | SFD_NONBLOCK));
  const auto old_pipe = ::signal(SIGPIPE, SIG_IGN);

  for (size_t i = 0; i < children.size(); ++i) SpawnOrFail(children[i], running[i], outcome.children[i]);

  const Clock::time_point started = Clock::now();
  std::optional<Clock::time_point> stop_deadline;  // after an interrupt: SIGTERM the clients
  std::optional<Clock::time_point> kill_deadline;  // then SIGKILL
  while (true) {
    for (size_t i = 0; i < children.size(); ++i) FeedInput(children[i], running[i]);
    bool all_done = true;
    for (Running& r : running) {
      if (!r.reaped || r.out.valid() || r.err.valid()) all_done = false;
    }
    if (all_done) break;

    const Clock::time_point now = Clock::now();
    EnforceDeadline(running, now, !outcome.interrupted_by && now - started >= limits.deadline);
    if (stop_deadline && now >= *stop_deadline) {
      KillAll(running, SIGTERM);
      stop_deadline.reset();
      kill_deadline = now + std::chrono::seconds(5);
    }
    if (kill_deadline && now >= *kill_deadline) {
      KillAll(running, SIGKILL);
      kill_deadline.reset();
    }

    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, int>> owners;  // child, stream (0 out, 1 err, 2 in)
    PollSet(running, signals.get(), fds, owners);
    // A short wait: children are reaped by polling waitpid, and deadlines are checked above.
    ::poll(fds.data(), fds.size(), 100);

    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const auto [i, stream] = owners[k];
      if (stream == 2) continue;  // written at the top of the loop
      if (i == children.size()) {
        signalfd_siginfo info{};
        while (::read(signals.get(), &info, sizeof info) == sizeof info) {
          const int signal = static_cast<int>(info.ssi_signo);
          if (!outcome.interrupted_by) {
            outcome.interrupted_by = signal;
            AskToStop(children, running, signal);
            if (!stop_deadline && !kill_deadline) stop_deadline = Clock::now() + limits.stop_wait;
          } else {
            // A second interrupt: the user will not wait. The links are closed already, so
            // each agent still stops its workers when its ssh session ends.
            KillAll(running, SIGTERM);
            kill_deadline = Clock::now() + std::chrono::seconds(5);
          }
        }
        continue;
      }
      ReadOutput(children[i], i, stream, hooks, running[i], outcome.children[i]);
    }

    for (size_t i = 0; i < children.size(); ++i) {
      Running& r = running[i];
      if (r.reaped || r.pid <= 0) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) == r.pid) {
        r.reaped = true;
        r.reaped_at = Clock::now();
        r.in.Reset();
        outcome.children[i].exit_status = r.timed_out         ? -1
                                          : WIFEXITED(status) ? WEXITSTATUS(status)
                                                              : 128 + WTERMSIG(status);
        if (hooks.exited && hooks.exited(i, outcome.children[i].exit_status) && !stop_deadline &&
            !kill_deadline && !outcome.interrupted_by) {
          AskToStop(children, running, SIGTERM);
          stop_deadline = Clock::now() + limits.stop_wait;
        }
      }
    }
  }

  ::signal(SIGPIPE, old_pipe);
  signals.Reset();
  // Interrupts that arrived are kept in outcome.interrupted_by; drop the pending ones.
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  return outcome;
}

}  // namespace ddprun::io
