#include "runner/io/guardian.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "runner/core/failure.h"
#include "runner/io/kernel_compat.h"
#include "runner/io/process_tree.h"

namespace ddprun::io {
namespace {

// Fixed-size records so a read never sees half a command: op and a value. '+' and '-' record
// and forget a worker (the value is its pgid), 'K' renews the workers' lease (the value is
// the time left, in ms), '.' says the agent is exiting. A write of this size to a pipe is
// atomic, so workers registering themselves never interleave.
struct Record {
  char op;
  int32_t pgid;
};

// A bound on what the guardian remembers; a job with more live workers than this is not one
// ddprun runs (workers per node are GPUs per node).
constexpr size_t kMaxWatched = 65536;

int64_t MonotonicMs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

// Runs in the forked child: only system calls and plain allocation (glibc's fork leaves the
// allocator usable even when the agent had other threads), no stdio, no locks.
[[noreturn]] void GuardianMain(int read_fd, pid_t agent) {
  // Its own session and process group: `kill -9 %1` (the agent's group), a terminal's Ctrl-C
  // or hangup do not reach it. It ends on EOF, which comes when every copy of the write end is
  // closed: the agent exited or died.
  ::setsid();
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_NAME, "ddprun-guardian", 0, 0, 0);
  // It never prints: holding the agent's terminal or output pipe open would keep a `| tee`
  // waiting after the agent died.
  const int dev_null = ::open("/dev/null", O_RDWR);
  if (dev_null >= 0) {
    for (int fd = 0; fd <= 2; ++fd) ::dup2(dev_null, fd);
    if (dev_null > 2) ::close(dev_null);
  }
  const pid_t self = ::getpid();
  std::vector<pid_t> groups;        // registered workers: pid == pgid
  std::vector<ProcessEntry> known;  // the agent's descendants at the last look
  int64_t next_scan = 0;
  int64_t kill_at = -1;  // the workers' lease ends then; -1: none yet ('K' records)
  Record record{};
  // The workers' process groups and what is below them, SIGKILLed.
  auto kill_workers = [&] {
    KillTrees(
        [&](const ProcessEntry& entry) {
          for (pid_t group : groups) {
            if (entry.pid == group || entry.pgid == group) return true;
          }
          return false;
        },
        self);
  };
  for (;;) {
    const int64_t now = MonotonicMs();
    if (now >= next_scan) {
      known = DescendantsOf(ReadProcessTable(), {agent}, self);
      next_scan = now + kGuardianScanInterval.count();
    }
    // The lease: an agent that is alive but does not run (SIGSTOP, a VM pause of the agent's
    // cgroup, a stuck system call) cannot stop its workers, and the coordinator will soon give
    // their ranks to another agent. When the lease the agent last renewed ends (the loss bound
    // + stop_grace after its last word from the coordinator), the guardian SIGKILLs them, as
    // the agent itself does then if it runs. The lease is counted from that word, never from
    // the agent's last record: an agent paused in the middle of its own stop would otherwise
    // give its workers the whole lease again, past the coordinator's fence.
    if (kill_at >= 0 && !groups.empty() && now >= kill_at) {
      kill_workers();
      groups.clear();
    }
    int64_t wake = next_scan;
    if (kill_at >= 0 && !groups.empty()) wake = std::min(wake, kill_at);
    pollfd pfd{read_fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(0, wake - now)));
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
    const ssize_t n = ::read(read_fd, &record, sizeof record);
    if (n == static_cast<ssize_t>(sizeof record)) {
      if (record.op == 'K') {
        kill_at = MonotonicMs() + std::max<int32_t>(0, record.pgid);
        continue;
      }
      auto it = std::find(groups.begin(), groups.end(), record.pgid);
      if (record.op == '+' && record.pgid > 1 && it == groups.end() && groups.size() < kMaxWatched)
        groups.push_back(record.pgid);
      if (record.op == '-' && it != groups.end()) groups.erase(it);
      // The agent is exiting and has killed everything below it itself.
      if (record.op == '.') ::_exit(0);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EOF or error: the agent is gone
  }
  // The workers themselves (no parent-death signal while a guardian runs, so they are still
  // there with their children below them), their groups, and whatever the last look saw.
  KillTrees(
      [&](const ProcessEntry& entry) {
        for (pid_t group : groups) {
          if (entry.pid == group || entry.pgid == group) return true;
        }
        for (const ProcessEntry& seen : known) {
          if (seen.pid == entry.pid && seen.start_time == entry.start_time) return true;
        }
        return false;
      },
      self);
  ::_exit(0);
}

std::string DescribeStatus(int status) {
  if (WIFSIGNALED(status)) {
    const std::string name = core::SignalName(WTERMSIG(status));
    return name.starts_with("SIG") ? fmt::format("killed by {}", name)
                                   : fmt::format("killed by signal {}", WTERMSIG(status));
  }
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  return "ended";
}

}  // namespace

struct Guardian::Supervision {
  Supervision(boost::asio::io_context& io, std::function<void(const std::string&)> on_report)
      : pidfd(io), report(std::move(on_report)) {}
  boost::asio::posix::stream_descriptor pidfd;
  std::function<void(const std::string&)> report;
};

Guardian::Guardian() {
  // Without a guardian the agent still runs; only its own stop and the parent-death signal
  // then end the workers.
  (void)Start();
}

Status Guardian::Start() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return Fail(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  const pid_t agent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int fork_errno = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return Fail(fmt::format("fork: {}", std::strerror(fork_errno)));
  }
  if (pid == 0) {
    ::close(fds[1]);
    // Close everything else we may have inherited so the guardian holds no sockets or pipes.
    CloseFrom(3, fds[0]);
    GuardianMain(fds[0], agent);
  }
  ::close(fds[0]);
  write_fd_ = fds[1];
  pid_ = pid;
  return {};
}

Guardian::~Guardian() {
  StopSupervising();
  if (write_fd_ >= 0) {
    if (released_) Write('.', 0);
    ::close(write_fd_);
  }
  if (pid_ > 0) {
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

bool Guardian::RegisterFromChild(int fd, pid_t pid) {
  const Record record{'+', static_cast<int32_t>(pid)};
  ssize_t n;
  do {
    n = ::write(fd, &record, sizeof record);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(sizeof record);
}

void Guardian::Write(char op, pid_t pgid) {
  if (write_fd_ < 0) return;
  Record record{op, static_cast<int32_t>(pgid)};
  ssize_t n;
  do {
    n = ::write(write_fd_, &record, sizeof record);
  } while (n < 0 && errno == EINTR);
}

void Guardian::Watch(pid_t pgid) {
  if (watched_.size() < kMaxWatched) watched_.insert(pgid);
  Write('+', pgid);
}

void Guardian::Release() { released_ = true; }

void Guardian::RenewLease(std::chrono::steady_clock::time_point kill_at) {
  kill_at_ = kill_at;
  // Without a pidfd to wait on (kernels before 5.3), its death is looked for at each renewal.
  if (supervision_ && !watching_) OnDeath();
  WriteLease();
}

void Guardian::WriteLease() {
  if (!kill_at_) return;
  // The time left, rounded up: the guardian never kills before the agent itself would.
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(*kill_at_ - std::chrono::steady_clock::now());
  Write('K', static_cast<pid_t>(std::clamp<int64_t>(left.count(), 0, INT32_MAX)));
}

void Guardian::Forget(pid_t pgid) {
  watched_.erase(pgid);
  Write('-', pgid);
}

void Guardian::Supervise(boost::asio::io_context& io, std::function<void(const std::string&)> report) {
  supervision_ = std::make_unique<Supervision>(io, std::move(report));
  WatchDeath();
}

void Guardian::StopSupervising() { supervision_.reset(); }

void Guardian::WatchDeath() {
  if (!supervision_ || pid_ <= 0) return;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  watching_ = pidfd >= 0;
  if (pidfd < 0) return;  // kernels before 5.3: RenewLease looks for its death
  boost::system::error_code ec;
  supervision_->pidfd.close(ec);
  supervision_->pidfd.assign(pidfd, ec);
  supervision_->pidfd.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                                 [this](boost::system::error_code wait_ec) {
                                   if (!wait_ec) OnDeath();
                                 });
}

void Guardian::OnDeath() {
  int status = 0;
  if (pid_ <= 0 || ::waitpid(pid_, &status, WNOHANG) != pid_) return;
  const pid_t old_pid = pid_;
  ::close(write_fd_);
  write_fd_ = -1;
  pid_ = -1;
  std::string text = fmt::format("the guardian process (pid {}) {}", old_pid, DescribeStatus(status));
  if (const Status started = Start(); started) {
    for (pid_t pgid : watched_) Write('+', pgid);
    WriteLease();
    text += fmt::format(
        "; started a new one (pid {}), so processes the workers started still "
        "cannot outlive this agent",
        pid_);
  } else {
    text += fmt::format(
        "; cannot start a new one ({}): if this agent dies now, processes its "
        "workers started may outlive it",
        started.error());
  }
  supervision_->report(text);
  WatchDeath();
}

}  // namespace ddprun::io
