#include "runner/io/guardian.h"

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <set>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace ddprun::io {
namespace {

// Fixed-size records so a read never sees half a command: op ('+' or '-') and a pgid.
struct Record {
  char op;
  int32_t pgid;
};

[[noreturn]] void GuardianMain(int read_fd) {
  // Signals aimed at the agent's terminal group must not stop the guardian early; it ends on
  // EOF, which comes when every copy of the write end is closed: the agent exited or died.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::prctl(PR_SET_NAME, "ddprun-guardian", 0, 0, 0);
  std::set<int32_t> groups;
  Record record{};
  for (;;) {
    const ssize_t n = ::read(read_fd, &record, sizeof record);
    if (n == static_cast<ssize_t>(sizeof record)) {
      if (record.op == '+') groups.insert(record.pgid);
      if (record.op == '-') groups.erase(record.pgid);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EOF or error: the agent is gone
  }
  for (int32_t pgid : groups) ::kill(-pgid, SIGKILL);
  ::_exit(0);
}

}  // namespace

Guardian::Guardian() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  if (pid == 0) {
    ::close(fds[1]);
    // Close everything else we may have inherited so the guardian holds no sockets or pipes:
    // two close_range calls rather than one close() per possible descriptor.
    const auto keep = static_cast<unsigned>(fds[0]);
    const bool closed = (keep <= 3 || ::close_range(3, keep - 1, 0) == 0) &&
                        ::close_range(keep + 1, ~0U, 0) == 0;
    if (!closed) {  // kernels before 5.9
      const long max_fd = ::sysconf(_SC_OPEN_MAX);
      for (int fd = 3; fd < (max_fd > 0 && max_fd < 65536 ? max_fd : 65536); ++fd) {
        if (fd != fds[0]) ::close(fd);
      }
    }
    GuardianMain(fds[0]);
  }
  ::close(fds[0]);
  write_fd_ = fds[1];
  pid_ = pid;
}

Guardian::~Guardian() {
  if (write_fd_ >= 0) ::close(write_fd_);
  if (pid_ > 0) {
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

void Guardian::Write(char op, pid_t pgid) {
  if (write_fd_ < 0) return;
  Record record{op, static_cast<int32_t>(pgid)};
  ssize_t n;
  do {
    n = ::write(write_fd_, &record, sizeof record);
  } while (n < 0 && errno == EINTR);
}

void Guardian::Watch(pid_t pgid) { Write('+', pgid); }
void Guardian::Forget(pid_t pgid) { Write('-', pgid); }

}  // namespace ddprun::io
