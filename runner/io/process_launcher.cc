#include "runner/io/process_launcher.h"
#include "runner/io/launcher_worker.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/process/v2/process.hpp>
#include <nlohmann/json.hpp>

#include "runner/io/beacon_socket.h"
#include "runner/io/console_writer.h"
#include "runner/io/guardian.h"
#include "runner/io/log_files.h"
#include "runner/io/output_splitter.h"
#include "runner/io/process_tree.h"
#include "runner/io/safe_file.h"
#include "runner/io/warm_template.h"
#include "schema/worker_env.h"

namespace ddprun::io {

namespace asio = boost::asio;
namespace bp = boost::process::v2;
using boost::system::error_code;

namespace {

// A worker's exit is reported once its pipes are drained; a grandchild that keeps them open
// (a daemon it started) gets this long before the exit is reported anyway.
constexpr auto kDrainLimit = std::chrono::seconds(2);
constexpr size_t kMaxErrorFile = 64 * 1024;
// What ReadStacks takes of one rank's dump: all threads of a large program fit.
constexpr size_t kMaxStacksRead = 256 * 1024;
// Where the kernel has no pidfd (before 5.3), how often a running worker is polled for its exit.
constexpr auto kExitPoll = std::chrono::milliseconds(20);
// How often orphans that ended below the agent are reaped while workers run.
constexpr auto kReapInterval = std::chrono::seconds(1);

}  // namespace

RealProcessLauncher::RealProcessLauncher(asio::io_context& io, Options options)
    : io_(io),
      options_(std::move(options)),
      reap_timer_(std::make_unique<asio::steady_timer>(io)),
      round_starts_(!options_.preload.empty()) {
  if (!options_.preload.empty()) {
    if (auto parsed = ParsePythonCommand(options_.command)) python_command_ = *std::move(parsed);
  }
  auto beacons = BeaconSocket::Open(io_, [this](const core::Beacon& beacon) {
    if (beacon.kind == core::BeaconKind::kStep)
      round_starts_.Stepped(beacon.round, std::chrono::steady_clock::now());
    if (events_) events_->OnBeacon(beacon);
  });
  if (beacons) {
    beacons_ = std::move(*beacons);
  } else if (options_.report) {
    options_.report(beacons.error() + "; hung ranks will not be detected on this node");
  }
}

std::string RealProcessLauncher::ProgressAddress() const { return beacons_ ? beacons_->address() : ""; }
std::string RealProcessLauncher::ProgressToken() const { return beacons_ ? beacons_->token() : ""; }

RealProcessLauncher::~RealProcessLauncher() {
  if (!killed_all_) KillAll();
}

void RealProcessLauncher::SetEvents(host::ProcessEvents* events) { events_ = events; }

Status RealProcessLauncher::OpenRunFolder() {
  if (run_fd_.valid()) return {};
  // logs.dir is the user's choice and may be a link; create it as the user would.
  std::error_code fs_ec;
  std::filesystem::create_directories(options_.logs_root, fs_ec);
  UniqueFd root(::open(options_.logs_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) {
    return Fail(fmt::format("cannot open logs.dir {}: {}", options_.logs_root, std::strerror(errno)));
  }
  // "<job>/<run>": the run's own folder must be new, so no earlier run's file is ever written
  // again (and a link in its place is refused).
  const std::string& folder = options_.run_folder;
  const size_t slash = folder.rfind('/');
  const std::string job = slash == std::string::npos ? "" : folder.substr(0, slash);
  const std::string run = folder.substr(slash == std::string::npos ? 0 : slash + 1);
  auto job_folder = OpenFolderBelow(root.get(), options_.logs_root, job, /*last_must_be_new=*/false);
  if (!job_folder) return Fail(job_folder.error());
  const UniqueFd job_fd = *std::move(job_folder);
  const std::string job_path = job.empty() ? options_.logs_root : options_.logs_root + "/" + job;
  auto run_folder = OpenFolderBelow(job_fd.get(), job_path, run, /*last_must_be_new=*/true);
  if (!run_folder) return Fail(run_folder.error());
  run_fd_ = *std::move(run_folder);
  // `latest` is replaced in one rename, so a reader sees the old run or the new one, never no
  // link; its target is relative, so it also works where logs.dir is mounted elsewhere. On a
  // logs.dir that several nodes share (an NFS home), `latest` names whichever node started
  // last: `latest-n<node>` names this node's newest run whatever the others do, and it is what
  // summaries point at (schema/worker_env.h, NodeLatestLink).
  for (const std::string& name : {std::string("latest"), NodeLatestLink(options_.node_rank)}) {
    const std::string temp = "." + name + "-" + run;
    const bool linked = ::symlinkat(run.c_str(), job_fd.get(), temp.c_str()) == 0 &&
                        ::renameat(job_fd.get(), temp.c_str(), job_fd.get(), name.c_str()) == 0;
    if (!linked) {
      const int link_errno = errno;
      ::unlinkat(job_fd.get(), temp.c_str(), 0);
      if (options_.report) {
        options_.report(
            fmt::format("cannot point {}/{} at this run: {}", job_path, name, std::strerror(link_errno)));
      }
    }
  }
  return {};
}

Result<UniqueFd> RealProcessLauncher::OpenLogFile(const std::string& relative) {
  return CreateFileBelow(run_fd_.get(), options_.logs_root + "/" + options_.run_folder, relative);
}

void RealProcessLauncher::Spawn(int round, const core::WorkerLaunch& launch) {
  const bool show = options_.raw_console_rank ? launch.global_rank == *options_.raw_console_rank
                                              : options_.console.Shows(launch.global_rank);
  const std::string prefix =
      options_.raw_console_rank ? "" : fmt::format("[n{} r{}] ", options_.node_rank, launch.global_rank);
  auto worker = std::make_shared<Worker>(io_, prefix, show);
  worker->round = round;
  worker->local_rank = launch.local_rank;
  worker->global_rank = launch.global_rank;
  // The round's start is timed from its first worker to its last (runner/io/warm_rounds.h);
  // the effect asks for all of them in one go, so a posted handler runs once it is done.
  if (round_starts_.Requested(round, std::chrono::steady_clock::now())) {
    asio::post(io_, [this, round] { round_starts_.Closed(round, std::chrono::steady_clock::now()); });
  }

  auto fail = [&](const std::string& why) {
    round_starts_.Started(round, std::chrono::steady_clock::now(), false, true, "");
    asio::post(io_, [this, round, local = launch.local_rank, why] {
      if (events_) events_->OnWorkerSpawnFailed(core::WorkerSpawnFailed{round, local, why});
    });
  };

  if (!run_fd_.valid()) {
    if (const Status opened = OpenRunFolder(); !opened) {
      fail(opened.error());
      return;
    }
  }
  worker->log_path = options_.logs_root + "/" + options_.run_folder + "/" + launch.log_path;
  auto log = OpenLogFile(launch.log_path);
  if (!log) {
    fail(log.error());
    return;
  }
  worker->log_fd = *std::move(log);
  worker->error_path = launch.error_path;
  auto plan = PrepareLaunch(options_.command, options_.workdir, options_.inherited_env, launch.env,
                            [](const std::string& path) { return ::access(path.c_str(), X_OK) == 0; });
  if (!plan) {
    fail(plan.error());
    return;
  }
  auto pending = std::make_unique<PendingStart>();
  pending->plan = *std::move(plan);
  for (size_t s = 0; s < 2; ++s) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      fail(fmt::format("cannot create pipes: {}", std::strerror(errno)));
      return;
    }
    pending->read_ends[s].Reset(fds[0]);
    pending->write_ends[s].Reset(fds[1]);
  }
  worker->pending = std::move(pending);
  workers_[{round, launch.local_rank}] = worker;
  // The first template may still be importing: its workers wait for it (a cold start would
  // import the same modules meanwhile); a replacement's do not.
  if (warm_ && warm_->FirstStarting()) {
    waiting_.push_back(worker);
    return;
  }
  Queue(worker);
}

void RealProcessLauncher::StartWaiting() {
  std::vector<std::shared_ptr<Worker>> waiting;
  waiting.swap(waiting_);
  for (const auto& worker : waiting) {
    if (worker->pending && !killed_all_) Queue(worker);
  }
}

void RealProcessLauncher::Queue(const std::shared_ptr<Worker>& worker) {
  // The effect asks for a round's workers in one go: they are started together once it is done.
  if (queued_.empty()) asio::post(io_, [this] { StartQueued(); });
  queued_.push_back(worker);
}

void RealProcessLauncher::StartQueued() {
  std::vector<std::shared_ptr<Worker>> queued;
  queued.swap(queued_);
  std::erase_if(queued, [this](const auto& worker) { return !worker->pending || killed_all_; });
  if (queued.empty()) return;
  if (!warm_ || !python_command_ || warm_->state() != WarmTemplate::State::kReady) {
    const std::string reason = warm_ ? warm_->cold_reason() : "";
    for (const auto& worker : queued) StartCold(worker, reason);
    return;
  }
  // Warm: one request for all of them; the answer comes later, on the loop.
  std::vector<WarmTemplate::ForkStart> starts;
  std::vector<UniqueFd> go_reads;
  for (const auto& worker : queued) {
    PendingStart& pending = *worker->pending;
    int go[2];
    if (::pipe2(go, O_CLOEXEC) != 0) {
      StartCold(worker, fmt::format("cannot create a pipe: {}", std::strerror(errno)));
      continue;
    }
    go_reads.emplace_back(go[0]);
    pending.go.Reset(go[1]);
    starts.push_back(WarmTemplate::ForkStart{
        WarmRequest(*python_command_, pending.plan, options_.workdir, options_.worker_nofile),
        pending.write_ends[0].get(), pending.write_ends[1].get(), go[0]});
  }
  std::erase_if(queued, [](const auto& worker) { return !worker->pending || !worker->pending->go.valid(); });
  const int guardian_fd = options_.guardian ? options_.guardian->write_fd() : -1;
  // The template has its own copies of the descriptors once Fork returns.
  warm_->Fork(std::move(starts), guardian_fd, [this, queued](std::vector<Result<pid_t>> results) {
    for (size_t i = 0; i < queued.size(); ++i) {
      const auto& worker = queued[i];
      if (!worker->pending) continue;
      if (i < results.size() && results[i] && !killed_all_) {
        worker->pid = *results[i];
        round_starts_.Started(worker->round, std::chrono::steady_clock::now(), /*warm=*/true, false, "");
        Attach(worker);
        continue;
      }
      // Not adopted: its fork, if there is one, reads EOF on `go` and exits before job code.
      worker->pending->go.Reset();
      if (killed_all_) continue;
      const std::string reason = i < results.size() ? results[i].error() : "the template did not answer";
      if (reason.starts_with("a fork would differ") && !said_differs_) {
        said_differs_ = true;
        if (options_.note) {
          options_.note(true, fmt::format("warm starts: rank {} starts cold: {} (said once; the event log's "
                                          "workers-started records say it for every round)",
                                          worker->global_rank, reason));
        }
      }
      StartCold(worker, reason);
    }
  });
}

void RealProcessLauncher::StartCold(const std::shared_ptr<Worker>& worker, const std::string& cold_reason) {
  PendingStart& pending = *worker->pending;
  const LaunchPlan& plan = pending.plan;
  const int guardian_fd = options_.guardian ? options_.guardian->write_fd() : -1;
  // Everything the child needs is prepared here: between vfork and exec it may not allocate.
  std::vector<std::string> args = plan.argv, env = plan.env;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const StartResult started =
      SpawnWorkerProcess(argv.data(), envp.data(), options_.workdir.c_str(), pending.write_ends[0].get(),
                         pending.write_ends[1].get(), guardian_fd, options_.worker_nofile, worker->pid);
  if (started.step != StartStep::kNone) {
    const std::string why = DescribeStartFailure(started, plan.executable, options_.workdir);
    workers_.erase({worker->round, worker->local_rank});
    worker->pending.reset();
    round_starts_.Started(worker->round, std::chrono::steady_clock::now(), false, true, "");
    asio::post(io_, [this, round = worker->round, local = worker->local_rank, why] {
      if (events_) events_->OnWorkerSpawnFailed(core::WorkerSpawnFailed{round, local, why});
    });
    return;
  }
  round_starts_.Started(worker->round, std::chrono::steady_clock::now(), /*warm=*/false, false, cold_reason);
  Attach(worker);
}

void RealProcessLauncher::Attach(const std::shared_ptr<Worker>& worker) {
  PendingStart& pending = *worker->pending;
  pending.write_ends[0].Reset();
  pending.write_ends[1].Reset();
  error_code ec;
  worker->out.assign(pending.read_ends[0].Release(), ec);
  worker->err.assign(pending.read_ends[1].Release(), ec);
  const int stop_signal = pending.signal;
  const UniqueFd go = std::move(pending.go);
  worker->pending.reset();
  // Boost.Process waits through a pidfd; kernels before 5.3 (Rocky 8's 4.18) have none, and
  // there the worker is polled with waitpid (kernel_compat.h).
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, worker->pid, 0)));
  if (pidfd.valid()) {
    bp::process process(io_.get_executor(), worker->pid, pidfd.Release());
    worker->process.emplace(std::move(process));
  }
  if (options_.guardian) options_.guardian->Watch(worker->pid);
  TrackForConsole(worker->round, worker);
  ArmReap();
  // A stop that came while the worker waited for the template reaches it now.
  if (stop_signal != 0) SignalGroup(worker->pid, stop_signal);
  // A forked worker runs job code from here on: its pid is ours to wait for and signal.
  if (go.valid()) {
    ssize_t n;
    do {
      n = ::write(go.get(), "g", 1);
    } while (n < 0 && errno == EINTR);
  }

  if (worker->process) {
    worker->process->async_wait([this, worker](error_code wait_ec, int) {
      OnExit(worker, wait_ec ? std::nullopt : std::optional<int>(worker->process->native_exit_code()));
    });
  } else {
    PollExit(worker);
  }
  StartRead(worker, false);
  StartRead(worker, true);
}

void RealProcessLauncher::PollExit(const std::shared_ptr<Worker>& worker) {
  int status = 0;
  const pid_t reaped = ::waitpid(worker->pid, &status, WNOHANG);
  if (reaped == worker->pid || (reaped < 0 && errno != EINTR)) {
    OnExit(worker, reaped == worker->pid ? std::optional<int>(status) : std::nullopt);
    return;
  }
  worker->exit_poll.expires_after(kExitPoll);
  worker->exit_poll.async_wait([this, worker](error_code ec) {
    if (!ec) PollExit(worker);
  });
}

void RealProcessLauncher::OnExit(const std::shared_ptr<Worker>& worker, std::optional<int> status) {
  worker->exited = true;
  if (!status) {
    worker->exit_code = 255;
  } else if (WIFSIGNALED(*status)) {
    worker->signal = WTERMSIG(*status);
  } else {
    worker->exit_code = WEXITSTATUS(*status);
  }
  // Whatever the worker left behind in its group (a daemon, a stuck child) goes with it.
  SignalGroup(worker->pid, SIGKILL);
  if (options_.guardian) options_.guardian->Forget(worker->pid);
  // What left the group (setsid) came back to the agent, a child subreaper, when its parent
  // ended; once no worker runs, nothing below the agent but the guardian has a reason to.
  if (!AnyWorkerRunning()) SweepStrays();
  worker->drain_timer.expires_after(kDrainLimit);
  worker->drain_timer.async_wait([this, worker](error_code timer_ec) {
    if (timer_ec) return;
    worker->drained_or_late = true;
    MaybeReport(worker);
  });
  MaybeReport(worker);
}

void RealProcessLauncher::StartRead(const std::shared_ptr<Worker>& worker, bool is_stderr) {
  auto& pipe = is_stderr ? worker->err : worker->out;
  auto& buffer = worker->buffers[is_stderr ? 1 : 0];
  pipe.async_read_some(asio::buffer(buffer), [this, worker, is_stderr](error_code ec, size_t n) {
    if (n > 0) OnOutput(worker, is_stderr, worker->buffers[is_stderr ? 1 : 0].data(), n);
    if (ec) {
      worker->eof[is_stderr ? 1 : 0] = true;
      MaybeReport(worker);
      return;
    }
    StartRead(worker, is_stderr);
  });
}

void RealProcessLauncher::MaybeReport(const std::shared_ptr<Worker>& worker) {
  if (worker->reported || !worker->exited) return;
  if (!(worker->eof[0] && worker->eof[1]) && !worker->drained_or_late) return;
  worker->reported = true;
  worker->drain_timer.cancel();
  worker->progress_timer.cancel();
  // A last line without a newline is complete now: show it (the file already has it).
  for (size_t s = 0; s < 2; ++s) {
    std::string& console = console_buffer_;
    console.clear();
    worker->splitters[s].Finish(console);
    if (!console.empty()) {
      Show(s == 1, console);
    }
  }
  CloseLog(*worker);
  worker->progress_armed.reset();
  ArmProgress(worker);  // for lines the stderr filter still holds
  error_code ignored;
  worker->out.close(ignored);
  worker->err.close(ignored);

  core::WorkerExited exited;
  exited.round = worker->round;
  exited.local_rank = worker->local_rank;
  exited.exit_code = worker->exit_code;
  exited.signal = worker->signal;
  for (const auto& line : worker->splitters[1].tail()) exited.stderr_tail += line + "\n";
  if (!worker->error_path.empty()) {
    // The worker may have left anything there: a link to a file it may not read itself, a
    // FIFO that no one writes, gigabytes. Only a regular file within the bound is read; the
    // refusal takes the error text's place, so that node 0 says why there is none.
    const auto text = ReadRegularFile(
        run_fd_.get(), worker->error_path,
        options_.logs_root + "/" + options_.run_folder + "/" + worker->error_path, kMaxErrorFile);
    if (!text) {
      exited.error_text = "(not read: " + text.error() + ")";
    } else if (*text) {
      exited.error_text = ReadableErrorFile(**text);
    }
  }
  workers_.erase({worker->round, worker->local_rank});
  if (events_) events_->OnWorkerExited(exited);
  MaybeDigest(worker->round);
}

void RealProcessLauncher::SignalAll(int round, int signal) {
  for (auto& [key, worker] : workers_) {
    if (key.first != round || worker->exited) continue;
    if (worker->pending) {
      worker->pending->signal = signal;
    } else if (worker->pid > 0) {
      SignalGroup(worker->pid, signal);
    }
  }
}

namespace {

// "attempt-<k>/rank-<r>.stacks" in the run folder, when it is a regular file (safe_file.h).
UniqueFd OpenStacksFile(int run_fd, int round, int global_rank) {
  if (run_fd < 0) return UniqueFd();
  auto opened = OpenRegularFile(run_fd, fmt::format("attempt-{}/rank-{}.stacks", round, global_rank), "");
  return opened && *opened ? std::move(**opened) : UniqueFd();
}

}  // namespace

void RealProcessLauncher::SignalForStacks(int round, const std::vector<std::pair<int, int>>& targets) {
  for (const auto& [local_rank, signal] : targets) {
    auto it = workers_.find({round, local_rank});
    if (it == workers_.end() || it->second->exited || it->second->pending || it->second->pid <= 0) continue;
    Worker& worker = *it->second;
    struct stat st {};
    UniqueFd fd = OpenStacksFile(run_fd_.get(), round, worker.global_rank);
    worker.stacks_from = fd.valid() && ::fstat(fd.get(), &st) == 0 ? st.st_size : 0;
    // The worker's own pid, never its group: its children (DataLoader workers, compilers)
    // have no handler for it.
    SignalProcess(worker.pid, signal);
  }
}

void RealProcessLauncher::RenewLease(TimePoint kill_at) {
  if (options_.guardian) options_.guardian->RenewLease(kill_at);
}

std::vector<std::string> RealProcessLauncher::ReadStacks(int round) {
  std::vector<std::string> dumps;
  for (auto& [key, worker] : workers_) {
    if (key.first != round || !worker->stacks_from) continue;
    const auto local = static_cast<size_t>(key.second);
    if (dumps.size() <= local) dumps.resize(local + 1);
    UniqueFd fd = OpenStacksFile(run_fd_.get(), round, worker->global_rank);
    if (!fd.valid()) continue;
    std::string text(kMaxStacksRead, '\0');
    const ssize_t n = ::pread(fd.get(), text.data(), text.size(), *worker->stacks_from);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
    dumps[local] = std::move(text);
    worker->stacks_from.reset();
  }
  return dumps;
}

void RealProcessLauncher::KillAll() {
  for (auto& [key, worker] : workers_) {
    if (!worker->exited && !worker->pending && worker->pid > 0) SignalGroup(worker->pid, SIGKILL);
  }
  waiting_.clear();
  queued_.clear();
  if (warm_) warm_->Kill();
  SweepStrays();
  killed_all_ = true;
}

void RealProcessLauncher::StartWarm() {
  if (options_.preload.empty() || warm_) return;
  auto say = [this](bool warning, const std::string& text) {
    if (options_.note) options_.note(warning, text);
  };
  // The template's variables have the names a worker's have (a preload that walks the names
  // finds the same ones), with this agent's beacon socket; the per-worker values differ anyway.
  EnvList template_env = options_.template_env;
  std::erase_if(template_env, [](const auto& entry) {
    return entry.first.starts_with("DDPRUN_PROGRESS_") || entry.first == "DDPRUN_STACKS_FILE";
  });
  if (beacons_) {
    template_env.emplace_back("DDPRUN_PROGRESS_ADDR", beacons_->address());
    template_env.emplace_back("DDPRUN_PROGRESS_TOKEN", beacons_->token());
    template_env.emplace_back("DDPRUN_STACKS_FILE", "");
  }
  auto warm = WarmTemplateOptions(options_.command, options_.preload, options_.template_script,
                                  options_.workdir, options_.inherited_env, template_env);
  if (!warm) {
    say(true, warm.error());
    return;
  }
  warm->guardian = options_.guardian;
  warm->open_log = [this](int attempt) -> Result<UniqueFd> {
    if (!run_fd_.valid()) return Fail("no run folder");
    return OpenLogFile(fmt::format("warm-template-{}.log", attempt));
  };
  warm->say = say;
  warm->is_worker = [this](pid_t pid) {
    return std::any_of(workers_.begin(), workers_.end(), [pid](const auto& entry) {
      return !entry.second->exited && entry.second->pid == pid;
    });
  };
  warm->settled = [this] { asio::post(io_, [this] { StartWaiting(); }); };
  warm_ = std::make_unique<WarmTemplate>(io_, *std::move(warm));
  warm_->Start();
}

std::string RealProcessLauncher::SummaryLines() const {
  std::string text;
  if (run_fd_.valid())
    text += fmt::format("logs on this node: {}/{}/\n", options_.logs_root, options_.run_folder);
  for (const std::string& problem : log_problems_) text += "log file incomplete: " + problem + "\n";
  text += round_starts_.SummaryLine();
  return text;
}

bool RealProcessLauncher::AnyWorkerRunning() const {
  for (const auto& [key, worker] : workers_) {
    if (!worker->exited) return true;
  }
  return false;
}

void RealProcessLauncher::SweepStrays() {
  const pid_t self = ::getpid();
  const pid_t guardian = options_.guardian ? options_.guardian->pid() : 0;
  // Workers not yet reported are zombies (already waited for by Boost.Process) or running;
  // KillAll has just killed the running ones, and killing a zombie does nothing.
  // The template stays: it serves the next round.
  const pid_t warm_template = warm_ ? warm_->pid() : -1;
  if (KillTrees([&](const ProcessEntry& entry) { return entry.ppid == self && entry.pid != warm_template; },
                guardian) == 0) {
    return;
  }
  ReapStrays();
  ArmReap();  // the killed ones become zombies a moment later
}

void RealProcessLauncher::ArmReap() {
  if (reap_armed_) return;
  reap_armed_ = true;
  reap_timer_->expires_after(kReapInterval);
  reap_timer_->async_wait([this](error_code ec) {
    reap_armed_ = false;
    if (ec) return;
    ReapStrays();
    if (!workers_.empty()) ArmReap();
  });
}

void RealProcessLauncher::ReapStrays() {
  // Orphans that came to the agent are its children: reap the dead ones, or they stay zombies
  // for as long as the agent lives. Workers and the guardian are waited for by their owners.
  const pid_t self = ::getpid();
  const pid_t guardian = options_.guardian ? options_.guardian->pid() : 0;
  for (const ProcessEntry& entry : ReadProcessTable()) {
    if (entry.ppid != self || entry.pid == guardian || entry.state != 'Z') continue;
    if (warm_ && entry.pid == warm_->pid()) continue;  // WarmTemplate waits for its own
    bool is_worker = false;
    for (const auto& [key, worker] : workers_) is_worker = is_worker || worker->pid == entry.pid;
    if (is_worker) continue;
    int status = 0;
    ::waitpid(entry.pid, &status, WNOHANG);
  }
}

std::string ReadableErrorFile(const std::string& json_text) {
  auto raw = [&] { return json_text.size() > 4096 ? json_text.substr(0, 4096) + "..." : json_text; };
  const auto json = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object() || !json.contains("message")) return raw();
  const auto& message = json["message"];
  if (message.is_string()) return message.get<std::string>();  // the flat form
  if (!message.is_object()) return raw();
  std::string text;
  if (message.contains("message") && message["message"].is_string()) {
    text = message["message"].get<std::string>();
  }
  // The traceback ends with the exception line, so it replaces the message rather than
  // repeating it.
  if (message.contains("extraInfo") && message["extraInfo"].is_object()) {
    const auto& extra = message["extraInfo"];
    if (extra.contains("py_callstack") && extra["py_callstack"].is_string()) {
      text = extra["py_callstack"].get<std::string>();
    }
  }
  return text.empty() ? raw() : text;
}

}  // namespace ddprun::io
