#pragma once
// Warm starts (job.preload): a template Python process per agent that has imported the
// preloaded modules, from which every worker is forked (worker/warm/template.py). The worker
// leaves the template by a double fork and is reparented to the agent, a child subreaper, so the
// launcher waits for it, signals it and reads its pipes exactly as for a cold worker.
//
// The template is used only when it said it is safe to fork (one thread, no CUDA context, no
// open files besides stdio and its socket); otherwise it is refused once for the job. A
// template that dies or does not answer a request within kAnswerLimit is killed and replaced;
// workers start cold until the replacement is ready. Whether a worker starts warm or cold is
// this driver's choice: the core only asks for workers.
//
// The agent never waits for the template: a round's workers go out in one request, the
// template forks them together, and its answer is handled by the loop when it comes. A forked
// worker runs no job code until the agent writes a byte on its `go` pipe (once it adopted the
// pid); a worker the agent did not adopt (its template taken for hung) reads EOF and exits.

#include <sys/resource.h>
#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/result.h"
#include "base/unique_fd.h"
#include "runner/io/process_launcher.h"
#include "schema/python_command.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

class Guardian;

/// How long a ready template may take to answer a request before it is taken for hung and its
/// workers start cold (a fork of a large interpreter takes milliseconds; a loaded machine may
/// take far longer, and nothing waits for the answer but that round's start).
inline constexpr std::chrono::seconds kAnswerLimit{10};
/// A request names at most this many workers and about this many bytes (a message must fit in
/// the socket's send buffer, and carries at most 253 descriptors, 3 per worker). A node with
/// more workers sends several requests, one after the other's answer (the template serves
/// them in turn anyway).
inline constexpr size_t kWorkersPerRequest = 16;
inline constexpr size_t kRequestBytes = 64 * 1024;
/// How long round 0's workers wait for the first template's imports; then they start cold and
/// the template, still importing, serves later rounds once it is ready.
inline constexpr std::chrono::seconds kFirstWaitLimit{120};
/// After this many templates that died or hung, workers start cold for the rest of the job.
inline constexpr int kMaxTemplateFailures = 3;

class WarmTemplate {
 public:
  struct Options {
    PythonCommand command;             // job.command read as Python
    std::string executable;            // the interpreter, resolved on PATH
    std::vector<std::string> preload;  // job.preload
    std::string template_script;       // <share>/ddprun/warm/template.py
    std::string workdir;               // absolute
    std::vector<std::string> env;      // NAME=value: the environment the template imports under
    Guardian* guardian = nullptr;
    /// Opens a new file for the template's own output (the run folder's warm-template-<n>.log).
    std::function<Result<UniqueFd>(int attempt)> open_log;
    /// A console line (warnings and the one line that says the template is ready).
    std::function<void(bool warning, const std::string&)> say;
    /// Called when the template became ready, or could not (refused, died, hung): the launcher
    /// starts the workers that waited for it.
    std::function<void()> settled;
    /// How long a request may wait for its answer (kAnswerLimit; tests shorten it).
    std::chrono::milliseconds answer_limit = kAnswerLimit;
    /// Whether `pid` is already a running worker of this agent (a template that reports one
    /// again is broken: two ranks would share a process).
    std::function<bool(pid_t)> is_worker;
  };

  enum class State { kStarting, kReady, kDown, kRefused };

  WarmTemplate(boost::asio::io_context& io, Options options);
  ~WarmTemplate();
  WarmTemplate(const WarmTemplate&) = delete;
  WarmTemplate& operator=(const WarmTemplate&) = delete;

  /// Starts the first template (at agent start: its imports overlap the rendezvous).
  void Start();
  State state() const { return state_; }
  /// Whether a request should wait for the template: only the first one, while it imports.
  bool FirstStarting() const { return state_ == State::kStarting && attempt_ == 1 && !first_wait_over_; }
  /// Why workers start cold now ("" when the template is ready).
  const std::string& cold_reason() const { return cold_reason_; }
  /// The running template's pid, or -1.
  pid_t pid() const { return pid_; }

  struct Request {
    std::vector<std::string> argv;       // sys.argv as the cold interpreter would have it
    std::vector<std::string> orig_argv;  // the exec argv of the cold worker
    std::vector<std::string> env;        // NAME=value
    std::string cwd;
    rlimit nofile{};  // rlim_cur 0: keep the template's
  };
  /// One worker to fork: its request, the descriptors that become its stdout and stderr, and
  /// the read end of its `go` pipe.
  struct ForkStart {
    Request request;
    int out_fd = -1;
    int err_fd = -1;
    int go_fd = -1;
  };
  /// What became of each worker of a request, in its order: its pid (a child of this process,
  /// waiting for its `go` byte) or why it starts cold.
  using Done = std::function<void(std::vector<Result<pid_t>>)>;
  /// Asks the template to fork `starts` (they register with the guardian through `guardian_fd`,
  /// -1: none). `done` runs on the loop, never within this call, once the template answered or
  /// was found at fault (dead, hung, broken: it is then replaced); not at all after Kill().
  void Fork(std::vector<ForkStart> starts, int guardian_fd, Done done);

  /// SIGKILLs the template (the agent exits).
  void Kill();

 private:
  Status Launch();
  void WatchSocket();
  void OnReadable();
  void Down(const std::string& why, bool replace);
  void Settle();
  /// A "started" answer to the oldest request.
  void OnAnswer(const nlohmann::json& answer);
  /// Runs `done` on the loop unless this template object was killed first.
  void Finish(Done done, std::vector<Result<pid_t>> results);
  void ArmAnswerTimer();

  boost::asio::io_context& io_;
  Options options_;
  State state_ = State::kDown;
  int attempt_ = 0;
  int failures_ = 0;
  pid_t pid_ = -1;
  UniqueFd control_;
  std::string cold_reason_ = "the template has not started";
  struct Watch;
  std::unique_ptr<Watch> watch_;
  struct FirstWait;
  std::unique_ptr<FirstWait> first_wait_;
  bool first_wait_over_ = false;
  std::chrono::steady_clock::time_point started_at_{};
  /// Requests not answered yet, oldest first: the oldest is sent, the others wait for its
  /// answer with their own copies of the descriptors they pass.
  struct Outstanding {
    int64_t id = 0;  // echoed by the template's answer
    size_t count = 0;
    Done done;
    std::string text;
    std::vector<UniqueFd> fds;
    bool sent = false;
  };
  std::deque<Outstanding> outstanding_;
  int64_t next_request_id_ = 1;
  /// Sends the oldest request unless it is sent; false when the template was lost doing so.
  bool SendFront();
  /// Replaced by Kill(): callbacks posted before it see theirs expired and do nothing.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

/// Why `pid`, as a template reported it, is not a worker this agent may adopt and signal as a
/// group ("" when it is: this process's child, leading its own process group).
std::string WhyNotOurWorker(int64_t pid);

/// The template's settings for job.command, or why workers start cold (a sentence that says
/// so): not a Python command, the template script not installed, the interpreter not found.
/// `template_env` is added over `inherited`, as a worker's variables are.
Result<WarmTemplate::Options> WarmTemplateOptions(const std::vector<std::string>& command,
                                                  const std::vector<std::string>& preload,
                                                  const std::string& template_script,
                                                  const std::string& workdir,
                                                  const std::map<std::string, std::string>& inherited,
                                                  const EnvList& template_env);

/// What a cold start of `plan` would give the interpreter, as a request to the template.
WarmTemplate::Request WarmRequest(const PythonCommand& command, const LaunchPlan& plan,
                                  const std::string& workdir, const rlimit& nofile);

}  // namespace ddprun::io
