#include "runner/io/process_hygiene.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <limits>

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "base/parse_int.h"
#include "runner/io/metrics_server.h"

namespace ddprun::io {

void BecomeSubreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

void OpenClosedStdio() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int null_fd = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null_fd >= 0 && null_fd != fd) {
        ::dup2(null_fd, fd);
        ::close(null_fd);
      }
    }
  }
}

void IgnoreBrokenPipes() { std::signal(SIGPIPE, SIG_IGN); }

size_t InheritedDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return 0;
  size_t count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const auto fd = ParseNonNegative(entry->d_name, std::numeric_limits<int>::max());
    if (fd && *fd > 2 && *fd != ::dirfd(dir)) ++count;
  }
  ::closedir(dir);
  return count;
}

NoFileLimits RaiseNoFileLimit() {
  NoFileLimits out;
  if (::getrlimit(RLIMIT_NOFILE, &out.original) != 0) return out;
  out.soft_now = out.original.rlim_cur;
  if (out.original.rlim_cur < out.original.rlim_max) {
    rlimit raised = out.original;
    raised.rlim_cur = out.original.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) out.soft_now = raised.rlim_cur;
  }
  return out;
}

size_t DescriptorReserve(const JobSpec& spec) {
  const size_t metrics = spec.metrics.Served() ? MetricsServer::Limits{}.max_connections + 2 : 0;
  return 64 + metrics + 8 * static_cast<size_t>(std::max(spec.cluster.nproc_per_node, 1));
}

SocketBudget BudgetSockets(const JobSpec& spec, rlim_t soft_nofile, size_t inherited_fds) {
  SocketBudget budget;
  const size_t reserve = DescriptorReserve(spec) + inherited_fds;
  const size_t soft = soft_nofile == RLIM_INFINITY ? size_t{1} << 20 : static_cast<size_t>(soft_nofile);
  budget.max_sockets = soft > reserve + 16 ? soft - reserve : 16;
  if (soft < reserve + 64) {
    budget.warning = fmt::format(
        "RLIMIT_NOFILE is {} (hard limit too): {} descriptors are kept for workers and logs{}, so at most {} "
        "connections are accepted at once; raise it (ulimit -n) for a job under load",
        soft, reserve - inherited_fds,
        inherited_fds == 0 ? "" : fmt::format(" and {} were open at start", inherited_fds),
        budget.max_sockets);
  }
  return budget;
}

}  // namespace ddprun::io
