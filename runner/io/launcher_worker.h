#pragma once
// The launcher's record of one worker process, shared by process_launcher.cc (starting,
// reaping, signals, stacks) and process_launcher_console.cc (its output on the console and in
// its log file). Internal to runner/io.

#include <array>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/process/v2/process.hpp>

#include "base/unique_fd.h"
#include "runner/io/output_splitter.h"
#include "runner/io/process_launcher.h"

namespace ddprun::io {

struct RealProcessLauncher::Worker {
  Worker(boost::asio::io_context& io, std::string prefix, bool shown)
      : out(io),
        err(io),
        drain_timer(io),
        exit_poll(io),
        progress_timer(io),
        show(shown),
        splitters{OutputSplitter(prefix, shown, false),
                  OutputSplitter(prefix, shown, true, /*triage=*/true)} {}
  int round = 0;
  int local_rank = 0;
  int global_rank = 0;
  std::optional<boost::process::v2::process> process;  // unset without a pidfd (kernels before 5.3)
  pid_t pid = -1;
  boost::asio::readable_pipe out;
  boost::asio::readable_pipe err;
  std::array<std::array<char, 64 * 1024>, 2> buffers{};
  std::array<bool, 2> eof{false, false};
  boost::asio::steady_timer drain_timer;
  boost::asio::steady_timer exit_poll;  // without a pidfd: the waitpid poll
  boost::asio::steady_timer progress_timer;
  std::optional<OutputSplitter::Clock::time_point> progress_armed;
  bool show = false;
  std::array<OutputSplitter, 2> splitters;  // stdout, stderr
  UniqueFd log_fd;
  std::string log_path;     // absolute, for messages
  uint64_t log_bytes = 0;   // written so far
  bool log_failed = false;  // a write failed: the file stops at log_bytes
  bool exited = false;
  bool drained_or_late = false;
  bool reported = false;
  int exit_code = 0;
  int signal = 0;
  std::optional<off_t> stacks_from;       // the stacks file's size when its dump was asked for
  std::string error_path;                 // relative to the run folder; "" none
  std::unique_ptr<PendingStart> pending;  // until started: what starting it needs
};

struct RealProcessLauncher::PendingStart {
  LaunchPlan plan;
  std::array<UniqueFd, 2> read_ends, write_ends;  // stdout, stderr
  int signal = 0;                                 // a stop that came before the worker started
  /// Warm: the agent's end of the worker's `go` pipe (warm_template.h), written once the pid is
  /// adopted; closed unwritten, the forked worker exits without running job code.
  UniqueFd go;
};

}  // namespace ddprun::io
