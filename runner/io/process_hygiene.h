#pragma once
// What an agent's process needs of the system before it runs a job: it adopts whatever its
// workers leave behind, stdin, stdout and stderr are open, a closed pipe or socket is an error
// and not a death, and its descriptor limit is raised as far as it goes, with a share kept for
// workers and log files that connections may not take.

#include <cstddef>
#include <string>

#include <sys/resource.h>

#include "schema/job_spec.h"

namespace ddprun::io {

/// Makes this process a child subreaper: whatever a worker starts and leaves behind (a double
/// fork, `setsid cmd &`) is reparented to this agent instead of init, so the agent and its
/// guardian can still find it below the agent and kill it (runner/io/guardian.h).
void BecomeSubreaper();

/// Opens /dev/null on whichever of descriptors 0, 1 and 2 the agent was started without
/// (`>&-`), so that the next pipe or socket does not get that number and console lines are
/// not written into it.
void OpenClosedStdio();

/// SIGPIPE ignored: writing to a peer or a console that went away is an error to handle, not
/// the agent's end. (Workers get the default back before exec.)
void IgnoreBrokenPipes();

/// Descriptors above stderr that the agent was started with (a parent that leaks them): they
/// count against RLIMIT_NOFILE like our own.
size_t InheritedDescriptors();

/// Raises the soft RLIMIT_NOFILE to the hard limit: an agent holds one descriptor per
/// connection and several per worker, and distributions default to a soft limit of 1024.
/// Returns the limits found at start (what workers get back) and the soft limit now.
struct NoFileLimits {
  rlimit original{};
  rlim_t soft_now = 0;
};
NoFileLimits RaiseNoFileLimit();

/// Descriptors kept free for what must never starve: per worker its log file, two pipes while
/// it starts and the status pipe of vfork, its pidfd, the error file when it exits; plus the
/// agent's own (connections to the master, resolver, guardian, signals). The metrics
/// endpoint's listener and connections (and one it refuses) come on top.
size_t DescriptorReserve(const JobSpec& spec);

/// The sockets the transport may hold under the soft limit `soft_nofile` once the reserve and
/// the `inherited_fds` are kept (never fewer than 16, so that agents can still join), and a
/// warning for the console when that leaves little room ("" when it does not).
struct SocketBudget {
  size_t max_sockets = 0;
  std::string warning;
};
SocketBudget BudgetSockets(const JobSpec& spec, rlim_t soft_nofile, size_t inherited_fds);

}  // namespace ddprun::io
