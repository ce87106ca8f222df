#pragma once
// The real ProcessLauncher: workers started with vfork+exec, each in its own process group and
// registered with the guardian before exec; output through pipes into per-rank files (opened
// without following links, never over an existing file) and the console; Boost.Process v2 waits
// for them. Everything a worker leaves behind below the agent is killed once no worker runs.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <boost/asio/steady_timer.hpp>

#include "base/unique_fd.h"
#include "runner/host/ports.h"
#include "runner/io/warm_rounds.h"
#include "runner/io/worker_start.h"
#include "schema/job_spec.h"
#include "schema/python_command.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

class BeaconSocket;
class ConsoleWriter;
class Guardian;
class WarmTemplate;

class RealProcessLauncher final : public host::ProcessLauncher {
 public:
  struct Options {
    std::vector<std::string> command;  // job.command
    std::string workdir;               // absolute
    /// logs.dir, absolute. It may be a link the user made; nothing below it is followed.
    std::string logs_root;
    /// This run's folder relative to logs_root: "<job>/<run>" (RunLogFolder). Created on the
    /// first spawn; must not exist yet. WorkerLaunch::log_path is relative to it.
    std::string run_folder;
    int node_rank = 0;
    ConsoleFilter console;
    std::map<std::string, std::string> inherited_env;  // the agent's environment
    Guardian* guardian = nullptr;
    /// Set: show only this global rank's output, unprefixed, instead of `console`.
    std::optional<int> raw_console_rank;
    /// Says a problem with the logs on the console (an error line).
    std::function<void(const std::string&)> report;
    /// Where shown output goes without ever blocking the loop (null: straight to stdio).
    ConsoleWriter* console_writer = nullptr;
    /// RLIMIT_NOFILE for workers (the agent raises its own); rlim_cur 0: inherit the agent's.
    rlimit worker_nofile{};
    /// job.preload: warm starts (runner/io/warm_template.h) when set and job.command runs python.
    std::vector<std::string> preload;
    /// worker/warm/template.py as installed beside the binary; "" when it was not found.
    std::string template_script;
    /// What the template imports under, over `inherited_env`: a worker's variables (local rank
    /// 0 of round 0), so that imports see what workers would (OMP_NUM_THREADS, PYTHONPATH).
    EnvList template_env;
    /// Says something worth a line that is not an error: warm or cold starts and why, the
    /// digest of a node's consequence errors not shown (runner/io/consequence_filter.h).
    std::function<void(bool warning, const std::string&)> note;
  };

  RealProcessLauncher(boost::asio::io_context& io, Options options);
  ~RealProcessLauncher() override;

  void SetEvents(host::ProcessEvents* events) override;
  void Spawn(int round, const core::WorkerLaunch& launch) override;
  void SignalAll(int round, int signal) override;
  void SignalForStacks(int round, const std::vector<std::pair<int, int>>& targets) override;
  std::vector<std::string> ReadStacks(int round) override;
  /// Tells the guardian; without one (it could not be forked) nothing enforces the lease
  /// while the agent does not run.
  void RenewLease(TimePoint kill_at) override;
  /// The other ranks' held and later stderr stays off the console (consequence_filter.h);
  /// once every worker of the round has reported, one line says what was left out.
  void RootCauseKnown(int round, int cause_rank, bool provisional) override;
  std::string ProgressAddress() const override;
  std::string ProgressToken() const override;

  /// SIGKILLs every worker still running and everything below the agent but the guardian
  /// (the agent is going away; no Spawn after this).
  void KillAll();

  /// Starts the warm-start template when job.preload asks for one (at agent start, after
  /// OpenRunFolder, so that its imports overlap the rendezvous), or says once why workers
  /// start cold.
  void StartWarm();
  /// Where each round's "workers-started" record goes (the event log).
  void SetStartEvents(std::function<void(const host::Event&)> sink) {
    round_starts_.SetSink(std::move(sink));
  }

  /// Creates this run's log folder (and points `latest` at it) unless done already: the first
  /// spawn does it, or the driver earlier, for the event log that lives beside the rank logs.
  Status OpenRunFolder();
  /// This run's log folder, once OpenRunFolder succeeded; -1 before.
  int run_folder_fd() const { return run_fd_.valid() ? run_fd_.get() : -1; }

  /// Lines for the end-of-job summary: this node's log folder and every log file that could
  /// not be written completely.
  std::string SummaryLines() const;

 private:
  struct Worker;
  struct PendingStart;
  /// Queues a prepared worker; the queue is started once the effect that asked is done.
  void Queue(const std::shared_ptr<Worker>& worker);
  /// Starts the queued workers: forked from the template in one request when it is ready (the
  /// answer comes later, on the loop), else cold.
  void StartQueued();
  /// Starts a prepared worker with exec (`cold_reason`: why not warm, "" when not configured).
  void StartCold(const std::shared_ptr<Worker>& worker, const std::string& cold_reason);
  /// Waits for, reads and reports a started worker (warm and cold alike).
  void Attach(const std::shared_ptr<Worker>& worker);
  /// Without a pidfd (kernels before 5.3): waitpid(WNOHANG) every kExitPoll until it exits.
  void PollExit(const std::shared_ptr<Worker>& worker);
  /// The worker has exited (`status` as waitpid gives it; nullopt: it could not be read).
  void OnExit(const std::shared_ptr<Worker>& worker, std::optional<int> status);
  /// Starts the workers that waited for the first template to finish its imports.
  void StartWaiting();
  Result<UniqueFd> OpenLogFile(const std::string& relative);
  void StartRead(const std::shared_ptr<Worker>& worker, bool is_stderr);
  void OnOutput(const std::shared_ptr<Worker>& worker, bool is_stderr, const char* data, size_t size);
  void WriteLog(Worker& worker, const char* data, size_t size);
  void CloseLog(Worker& worker);
  void ArmProgress(const std::shared_ptr<Worker>& worker);
  void MaybeReport(const std::shared_ptr<Worker>& worker);
  bool AnyWorkerRunning() const;
  /// SIGKILLs every process below the agent but the guardian, then reaps what it can.
  void SweepStrays();
  /// Reaps orphaned descendants that ended (they were reparented to the agent).
  void ReapStrays();
  /// Reaps again after kReapInterval, and then as long as workers run.
  void ArmReap();
  void Show(bool is_stderr, std::string_view text);
  void TrackForConsole(int round, const std::shared_ptr<Worker>& worker);
  /// Prints the round's digest of consequences not shown, once it is complete.
  void MaybeDigest(int round);

  /// A round's workers on this node, kept until nothing of theirs waits for the console.
  struct RoundConsole {
    std::vector<std::shared_ptr<Worker>> workers;
    std::optional<int> cause_rank;  // set by RootCauseKnown
    /// While the cause named may still be revised (its own error said it lost a peer), the
    /// digest waits for the revision until then, so that it names the rank that failed.
    std::optional<std::chrono::steady_clock::time_point> provisional_until;
    std::shared_ptr<boost::asio::steady_timer> digest_timer;
    bool digest_told = false;
  };

  boost::asio::io_context& io_;
  Options options_;
  host::ProcessEvents* events_ = nullptr;
  std::map<std::pair<int, int>, std::shared_ptr<Worker>> workers_;  // (round, local rank)
  std::map<int, RoundConsole> rounds_;
  std::string console_buffer_;  // reused for every chunk of output
  UniqueFd run_fd_;             // this run's log folder, once created
  std::vector<std::string> log_problems_;
  std::unique_ptr<boost::asio::steady_timer> reap_timer_;
  bool reap_armed_ = false;
  bool killed_all_ = false;
  std::unique_ptr<BeaconSocket> beacons_;         // null: no progress socket (said at start)
  std::unique_ptr<WarmTemplate> warm_;            // null: every worker starts cold
  std::vector<std::shared_ptr<Worker>> waiting_;  // for the first template's imports
  std::vector<std::shared_ptr<Worker>> queued_;   // asked for, to be started together
  bool said_differs_ = false;  // a worker started cold because a fork would differ: said once
  RoundStartLog round_starts_;
  std::optional<PythonCommand> python_command_;  // job.command read as Python, with job.preload
};

/// Turns a TORCHELASTIC_ERROR_FILE's JSON (torchelastic's nested or flat form) into readable
/// text: the message, then the traceback. Unknown shapes come back as the raw text, cut.
std::string ReadableErrorFile(const std::string& json_text);

}  // namespace ddprun::io
