#pragma once
// The real ProcessLauncher: workers through Boost.Process v2, each in its own process group
// with a parent-death signal, output through pipes into per-rank files and the console.

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "runner/host/ports.h"
#include "schema/job_spec.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

class ConsoleWriter;
class Guardian;

class RealProcessLauncher final : public host::ProcessLauncher {
 public:
  struct Options {
    std::vector<std::string> command;                   // job.command
    std::string workdir;                                // absolute
    std::string logs_dir;                               // absolute
    int node_rank = 0;
    ConsoleFilter console;
    std::map<std::string, std::string> inherited_env;   // the agent's environment
    Guardian* guardian = nullptr;
    /// Set: show only this global rank's output, unprefixed, instead of `console`.
    std::optional<int> raw_console_rank;
    /// Where shown output goes without ever blocking the loop (null: straight to stdio).
    ConsoleWriter* console_writer = nullptr;
    /// RLIMIT_NOFILE for workers (the agent raises its own); rlim_cur 0: inherit the agent's.
    rlimit worker_nofile{};
  };

  RealProcessLauncher(boost::asio::io_context& io, Options options);
  ~RealProcessLauncher() override;

  void SetEvents(host::ProcessEvents* events) override;
  void Spawn(int round, const core::WorkerLaunch& launch) override;
  void SignalAll(int round, int signal) override;

  /// SIGKILLs every worker still running (the agent is going away).
  void KillAll();

 private:
  struct Worker;
  void StartRead(const std::shared_ptr<Worker>& worker, bool is_stderr);
  void OnOutput(Worker& worker, bool is_stderr, const char* data, size_t size);
  void MaybeReport(const std::shared_ptr<Worker>& worker);
  void Show(bool is_stderr, std::string_view text);

  boost::asio::io_context& io_;
  Options options_;
  host::ProcessEvents* events_ = nullptr;
  std::map<std::pair<int, int>, std::shared_ptr<Worker>> workers_;  // (round, local rank)
  std::string console_buffer_;  // reused for every chunk of output
};

/// Turns a TORCHELASTIC_ERROR_FILE's JSON (torchelastic's nested or flat form) into readable
/// text: the message, then the traceback. Unknown shapes come back as the raw text, cut.
std::string ReadableErrorFile(const std::string& json_text);

}  // namespace ddprun::io
