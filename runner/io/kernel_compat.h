#pragma once
// What ddprun asks of Linux that older kernels and C libraries lack, with a fallback for each:
// the portable build runs on glibc 2.31 (no close_range wrapper before 2.34) and on the kernels
// of the distributions users have (Ubuntu 20.04: 5.4, Debian 11: 5.10, Rocky 8: 4.18), while
// close_range needs 5.9, its CLOSE_RANGE_CLOEXEC 5.11 and pidfd_open 5.3.
//
// Everything here is a system call or plain arithmetic on the stack: safe between vfork (or
// fork in a process with threads) and exec.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace ddprun::io {

inline constexpr unsigned kCloseRangeCloexec = 1U << 2;  // CLOSE_RANGE_CLOEXEC (linux/close_range.h)

/// close_range(2) through the system call (glibc 2.31 has no wrapper): -1 with errno ENOSYS on
/// kernels before 5.9, EINVAL for CLOSE_RANGE_CLOEXEC before 5.11.
inline int CloseRangeSyscall(unsigned first, unsigned last, unsigned flags) noexcept {
#ifdef SYS_close_range
  return static_cast<int>(::syscall(SYS_close_range, first, last, flags));
#else
  (void)first, (void)last, (void)flags;
  errno = ENOSYS;
  return -1;
#endif
}

namespace internal {

struct LinuxDirent64 {
  unsigned long long ino;
  long long off;
  unsigned short reclen;
  unsigned char type;
  char name[1];
};

/// Calls `apply(fd)` for every open descriptor >= first, from /proc/self/fd read with getdents64
/// (no allocation); without /proc, for every number below the descriptor limit (at most 65,536).
template <typename Apply>
void ForEachDescriptorFrom(int first, Apply apply) noexcept {
  const int dir =
      static_cast<int>(::syscall(SYS_openat, AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir >= 0) {
    alignas(8) char buffer[4096];
    while (true) {
      const long n = ::syscall(SYS_getdents64, dir, buffer, sizeof buffer);
      if (n <= 0) break;
      for (long at = 0; at < n;) {
        const auto* entry = reinterpret_cast<const LinuxDirent64*>(buffer + at);
        at += entry->reclen;
        int fd = 0;
        bool number = entry->name[0] != '\0';
        for (const char* c = entry->name; *c != '\0'; ++c) {
          if (*c < '0' || *c > '9' || fd > 100000000) {
            number = false;
            break;
          }
          fd = fd * 10 + (*c - '0');
        }
        if (number && fd >= first && fd != dir) apply(fd);
      }
    }
    ::syscall(SYS_close, dir);
    return;
  }
  rlimit limit{};
  const long max = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < 65536
                       ? static_cast<long>(limit.rlim_cur)
                       : 65536;
  for (int fd = first; fd < max; ++fd) apply(fd);
}

}  // namespace internal

/// Marks every descriptor >= first close-on-exec: one close_range where the kernel has
/// CLOSE_RANGE_CLOEXEC (5.11), else one fcntl per open descriptor.
inline void CloexecFrom(int first) noexcept {
  if (CloseRangeSyscall(static_cast<unsigned>(first), ~0U, kCloseRangeCloexec) == 0) return;
  internal::ForEachDescriptorFrom(first, [](int fd) { ::fcntl(fd, F_SETFD, FD_CLOEXEC); });
}

/// Closes every descriptor >= first but `keep` (-1: none): close_range where the kernel has it
/// (5.9), else one close per open descriptor.
inline void CloseFrom(int first, int keep) noexcept {
  bool done;
  if (keep >= first) {
    done = (keep == first ||
            CloseRangeSyscall(static_cast<unsigned>(first), static_cast<unsigned>(keep - 1), 0) == 0) &&
           CloseRangeSyscall(static_cast<unsigned>(keep + 1), ~0U, 0) == 0;
  } else {
    done = CloseRangeSyscall(static_cast<unsigned>(first), ~0U, 0) == 0;
  }
  if (done) return;
  internal::ForEachDescriptorFrom(first, [keep](int fd) {
    if (fd != keep) ::syscall(SYS_close, fd);
  });
}

}  // namespace ddprun::io
