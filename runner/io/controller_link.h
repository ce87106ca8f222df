#pragma once
// The link from `ddprun up` to an agent it started over ssh: the agent's stdin. `up` writes
// one line, "stop <signal number>", when the user interrupts it, then closes the pipe; ssh
// carries both to the agent. End of file without that line means the controlling machine or
// its connection is gone. Either way the agent stops the job as if it had got the signal
// itself, so every node ends within stop_grace and nothing is left running.
//
// Why stdin and not `ssh -tt`: with a remote terminal, only the terminal's foreground process
// group gets SIGHUP when the connection drops, stdout and stderr arrive merged with "\r\n", and
// the agent's own exit code and summary are lost when ssh is killed. A pipe that reaches end of
// file is noticed however the connection ends (ssh killed, the client machine gone once TCP
// notices, sshd restarted), needs no help from the remote shell, and keeps the streams intact.

#include <functional>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "base/result.h"

namespace ddprun::io {

/// The other way, on the agent's stdout: the line (without its newline) that an agent started
/// by `up` prints when the job's first round has started (the agent that runs the coordinator
/// says it). `up` keeps it out of the stream; until some agent said it, an agent that exits 2
/// or 3 ends the job (docs/running.md, "From one machine"). It starts with ASCII RS, which no
/// line of the agent's console starts with.
inline constexpr std::string_view kJobStartedLine =
    "\x1e"
    "ddprun-up: job-started";

/// The line `up` writes to ask for a stop, for signal `signal` (SIGINT, SIGTERM, SIGHUP).
std::string StopRequestLine(int signal);

/// The signal asked for by everything read so far on the link, or 0 while no complete stop
/// line has arrived. Unknown lines are ignored; the text is bounded by the caller.
int ParseStopRequest(std::string_view received);

class ControllerLink {
 public:
  /// Watches stdin on `io`; `on_stop(signal)` is called once: with the signal of the first stop
  /// line, or SIGHUP at end of file or on a read error. Fails when stdin cannot be watched (a
  /// regular file or a terminal that epoll refuses).
  static Result<std::unique_ptr<ControllerLink>> Watch(boost::asio::io_context& io,
                                                       std::function<void(int)> on_stop);
  ~ControllerLink();
  ControllerLink(const ControllerLink&) = delete;
  ControllerLink& operator=(const ControllerLink&) = delete;

 private:
  ControllerLink(boost::asio::io_context& io, int fd, std::function<void(int)> on_stop);
  void ReadMore();
  void Stop(int signal);

  boost::asio::posix::stream_descriptor stdin_;
  std::function<void(int)> on_stop_;
  std::string received_;
  char buffer_[256];
  bool stopped_ = false;
};

}  // namespace ddprun::io
