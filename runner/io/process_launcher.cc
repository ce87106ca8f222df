#include "runner/io/process_launcher.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <csignal>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/process/v2/process.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runner/io/console_writer.h"
#include "runner/io/guardian.h"

namespace ddprun::io {

namespace asio = boost::asio;
namespace bp = boost::process::v2;
using boost::system::error_code;

namespace {

// What the root-cause summary quotes of a failed worker's stderr.
constexpr size_t kTailLines = 20;
constexpr size_t kTailBytes = 8 * 1024;
// A worker's exit is reported once its pipes are drained; a grandchild that keeps them open
// (a daemon it started) gets this long before the exit is reported anyway.
constexpr auto kDrainLimit = std::chrono::seconds(2);
constexpr size_t kMaxErrorFile = 64 * 1024;

/// Starts one worker with vfork+exec, so starting 8 workers does not copy the agent's page
/// tables 8 times (Boost.Process v2's launcher forks and waits for each exec). Between vfork
/// and exec the child shares our memory: it only makes system calls, no allocation. Returns 0
/// and sets `pid`, or the errno of the failed step.
int SpawnWorkerProcess(char* const argv[], char* const envp[], const char* workdir, int out_fd,
                       int err_fd, const rlimit& nofile, pid_t& pid) {
  int status_pipe[2];  // the child reports a failed step's errno; exec closes it on success
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) return errno;
  const int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (dev_null < 0) {
    const int error = errno;
    ::close(status_pipe[0]);
    ::close(status_pipe[1]);
    return error;
  }
  const pid_t agent = ::getpid();
  const pid_t child = ::vfork();
  if (child == 0) {
    int error = 0;
    // Its own process group, so a stop reaches everything the worker started; and it dies
    // with the agent, even by SIGKILL.
    if (::setpgid(0, 0) != 0) error = errno;
    if (!error) ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (!error && ::getppid() != agent) ::_exit(137);  // the agent died before prctl
    if (!error && (::dup2(dev_null, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0)) error = errno;
    if (!error && ::chdir(workdir) != 0) error = errno;
    if (!error && nofile.rlim_cur != 0) ::setrlimit(RLIMIT_NOFILE, &nofile);
    if (!error) {
      // The agent ignores SIGPIPE, and exec keeps ignored signals ignored.
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(SIGPIPE, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execve(argv[0], argv, envp);
      error = errno;
    }
    [[maybe_unused]] const ssize_t n = ::write(status_pipe[1], &error, sizeof error);
    ::_exit(127);
  }
  const int fork_errno = child < 0 ? errno : 0;
  ::close(status_pipe[1]);
  ::close(dev_null);
  int error = fork_errno;
  if (child > 0) {
    // vfork returns once the child has exec'd (the pipe closed: EOF) or exited (errno written).
    int reported = 0;
    if (::read(status_pipe[0], &reported, sizeof reported) == static_cast<ssize_t>(sizeof reported)) {
      error = reported;
      int status = 0;
      ::waitpid(child, &status, 0);
    } else {
      pid = child;
    }
  }
  ::close(status_pipe[0]);
  return error;
}

bp::filesystem::path ResolveExecutable(const std::string& name, const std::string& workdir,
                                       const std::map<std::string, std::string>& env) {
  if (name.find('/') != std::string::npos) {
    std::filesystem::path p(name);
    if (p.is_relative()) p = std::filesystem::path(workdir) / p;
    return bp::filesystem::path(p.string());
  }
  auto path = env.find("PATH");
  const std::string dirs = path != env.end() ? path->second : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::filesystem::path candidate = std::filesystem::path(dirs.substr(start, end - start)) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return bp::filesystem::path(candidate.string());
    start = end + 1;
  }
  return {};
}

}  // namespace

struct RealProcessLauncher::Worker {
  explicit Worker(asio::io_context& io) : out(io), err(io), drain_timer(io) {}
  int round = 0;
  int local_rank = 0;
  int global_rank = 0;
  std::optional<bp::process> process;
  pid_t pid = -1;
  asio::readable_pipe out;
  asio::readable_pipe err;
  std::array<std::array<char, 64 * 1024>, 2> buffers{};
  std::array<std::string, 2> partial;
  std::array<bool, 2> eof{false, false};
  std::deque<std::string> tail;
  size_t tail_bytes = 0;
  int log_fd = -1;
  bool show = false;
  bool exited = false;
  bool drained_or_late = false;
  bool reported = false;
  int exit_code = 0;
  int signal = 0;
  asio::steady_timer drain_timer;
  std::string error_file;
  std::string prefix;
};

RealProcessLauncher::RealProcessLauncher(asio::io_context& io, Options options)
    : io_(io), options_(std::move(options)) {}

RealProcessLauncher::~RealProcessLauncher() { KillAll(); }

void RealProcessLauncher::SetEvents(host::ProcessEvents* events) { events_ = events; }

void RealProcessLauncher::Spawn(int round, const core::WorkerLaunch& launch) {
  auto worker = std::make_shared<Worker>(io_);
  worker->round = round;
  worker->local_rank = launch.local_rank;
  worker->global_rank = launch.global_rank;
  if (options_.raw_console_rank) {
    worker->show = launch.global_rank == *options_.raw_console_rank;
  } else {
    worker->show = options_.console.Shows(launch.global_rank);
    worker->prefix = fmt::format("[n{} r{}] ", options_.node_rank, launch.global_rank);
  }

  auto fail = [&](const std::string& why) {
    asio::post(io_, [this, round, local = launch.local_rank, why] {
      if (events_) events_->OnWorkerSpawnFailed(core::WorkerSpawnFailed{round, local, why});
    });
  };

  std::map<std::string, std::string> env = options_.inherited_env;
  for (const auto& [name, value] : launch.env) env[name] = value;
  worker->error_file = env["TORCHELASTIC_ERROR_FILE"];

  std::error_code fs_ec;
  const std::filesystem::path log_path = std::filesystem::path(options_.logs_dir) / launch.log_path;
  std::filesystem::create_directories(log_path.parent_path(), fs_ec);
  if (!worker->error_file.empty()) {
    std::filesystem::create_directories(std::filesystem::path(worker->error_file).parent_path(), fs_ec);
    // A leftover error file from an earlier run of the same job would be reported as this
    // worker's error.
    std::filesystem::remove(worker->error_file, fs_ec);
  }
  worker->log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (worker->log_fd < 0) {
    fail(fmt::format("cannot open the log file {}: {}", log_path.string(), std::strerror(errno)));
    return;
  }

  if (options_.command.empty()) {
    fail("job.command is empty");
    return;
  }
  const auto exe = ResolveExecutable(options_.command[0], options_.workdir, env);
  if (exe.empty()) {
    fail(fmt::format("command not found: \"{}\" is not on PATH", options_.command[0]));
    ::close(worker->log_fd);
    return;
  }
  std::vector<std::string> args(options_.command.begin() + 1, options_.command.end());
  std::vector<std::string> env_lines;
  env_lines.reserve(env.size());
  for (const auto& [name, value] : env) env_lines.push_back(name + "=" + value);

  // Everything the child needs is prepared here: between vfork and exec it may not allocate.
  std::vector<std::string> argv_strings;
  argv_strings.push_back(exe.string());
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env_lines) envp.push_back(e.data());
  envp.push_back(nullptr);
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    fail(fmt::format("cannot create pipes: {}", std::strerror(errno)));
    ::close(worker->log_fd);
    return;
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    fail(fmt::format("cannot create pipes: {}", std::strerror(errno)));
    ::close(worker->log_fd);
    return;
  }
  const int start_errno = SpawnWorkerProcess(argv.data(), envp.data(), options_.workdir.c_str(),
                                             out_pipe[1], err_pipe[1], options_.worker_nofile, worker->pid);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  error_code ec;
  worker->out.assign(out_pipe[0], ec);
  worker->err.assign(err_pipe[0], ec);
  if (start_errno != 0) {
    worker->out.close(ec);
    worker->err.close(ec);
    fail(fmt::format("cannot start {}: {}", exe.string(), std::strerror(start_errno)));
    ::close(worker->log_fd);
    return;
  }
  bp::process process(io_.get_executor(), worker->pid);
  worker->process.emplace(std::move(process));
  if (options_.guardian) options_.guardian->Watch(worker->pid);
  workers_[{round, launch.local_rank}] = worker;

  worker->process->async_wait([this, worker](error_code wait_ec, int) {
    worker->exited = true;
    if (wait_ec) {
      worker->exit_code = 255;
    } else {
      const int status = worker->process->native_exit_code();
      if (WIFSIGNALED(status)) {
        worker->signal = WTERMSIG(status);
      } else {
        worker->exit_code = WEXITSTATUS(status);
      }
    }
    // Whatever the worker left behind in its group (a daemon, a stuck child) goes with it.
    ::kill(-worker->pid, SIGKILL);
    if (options_.guardian) options_.guardian->Forget(worker->pid);
    worker->drain_timer.expires_after(kDrainLimit);
    worker->drain_timer.async_wait([this, worker](error_code timer_ec) {
      if (timer_ec) return;
      worker->drained_or_late = true;
      MaybeReport(worker);
    });
    MaybeReport(worker);
  });
  StartRead(worker, false);
  StartRead(worker, true);
}

void RealProcessLauncher::StartRead(const std::shared_ptr<Worker>& worker, bool is_stderr) {
  auto& pipe = is_stderr ? worker->err : worker->out;
  auto& buffer = worker->buffers[is_stderr ? 1 : 0];
  pipe.async_read_some(asio::buffer(buffer), [this, worker, is_stderr](error_code ec, size_t n) {
    if (n > 0) OnOutput(*worker, is_stderr, worker->buffers[is_stderr ? 1 : 0].data(), n);
    if (ec) {
      worker->eof[is_stderr ? 1 : 0] = true;
      MaybeReport(worker);
      return;
    }
    StartRead(worker, is_stderr);
  });
}

void RealProcessLauncher::OnOutput(Worker& worker, bool is_stderr, const char* data, size_t size) {
  // Every byte goes to the rank's file first: the file is the record, the console a view.
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(worker.log_fd, data + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  // Only stderr keeps lines (for the failure summary) and only shown ranks need them split,
  // so a hidden rank's stdout costs nothing beyond the write above.
  if (!worker.show && !is_stderr) return;
  std::string& partial = worker.partial[is_stderr ? 1 : 0];
  std::string& console = console_buffer_;
  console.clear();
  const char* end = data + size;
  const char* start = data;
  while (start < end) {
    const auto* newline = static_cast<const char*>(std::memchr(start, '\n', static_cast<size_t>(end - start)));
    if (!newline) break;
    const std::string_view piece(start, static_cast<size_t>(newline - start));
    if (worker.show) {
      console += worker.prefix;
      console += partial;
      console += piece;
      console += '\n';
    }
    if (is_stderr) {
      std::string line = partial;
      line += piece;
      worker.tail_bytes += line.size();
      worker.tail.push_back(std::move(line));
      while (worker.tail.size() > kTailLines || worker.tail_bytes > kTailBytes) {
        worker.tail_bytes -= worker.tail.front().size();
        worker.tail.pop_front();
      }
    }
    partial.clear();
    start = newline + 1;
  }
  partial.append(start, static_cast<size_t>(end - start));
  if (partial.size() > 64 * 1024) {  // a line without end: show it in pieces
    if (worker.show) console += worker.prefix + partial + "\n";
    partial.clear();
  }
  if (!console.empty()) Show(is_stderr, console);
}

void RealProcessLauncher::Show(bool is_stderr, std::string_view text) {
  if (options_.console_writer) {
    options_.console_writer->Write(is_stderr ? ConsoleWriter::Stream::kErr : ConsoleWriter::Stream::kOut, text);
    return;
  }
  FILE* stream = is_stderr ? stderr : stdout;
  std::fwrite(text.data(), 1, text.size(), stream);
  std::fflush(stream);
}

void RealProcessLauncher::MaybeReport(const std::shared_ptr<Worker>& worker) {
  if (worker->reported || !worker->exited) return;
  if (!(worker->eof[0] && worker->eof[1]) && !worker->drained_or_late) return;
  worker->reported = true;
  worker->drain_timer.cancel();
  // A last line without a newline is complete now: show it (the file already has it).
  for (size_t s = 0; s < 2; ++s) {
    std::string& partial = worker->partial[s];
    if (partial.empty()) continue;
    if (s == 1) worker->tail.push_back(partial);
    if (worker->show) {
      Show(s == 1, worker->prefix + partial + "\n");
    }
    partial.clear();
  }
  if (worker->log_fd >= 0) ::close(worker->log_fd);
  worker->log_fd = -1;
  error_code ignored;
  worker->out.close(ignored);
  worker->err.close(ignored);

  core::WorkerExited exited;
  exited.round = worker->round;
  exited.local_rank = worker->local_rank;
  exited.exit_code = worker->exit_code;
  exited.signal = worker->signal;
  for (const auto& line : worker->tail) exited.stderr_tail += line + "\n";
  if (!worker->error_file.empty()) {
    std::ifstream in(worker->error_file, std::ios::binary);
    if (in) {
      std::string text(kMaxErrorFile, '\0');
      in.read(text.data(), static_cast<std::streamsize>(text.size()));
      text.resize(static_cast<size_t>(in.gcount()));
      exited.error_text = ReadableErrorFile(text);
    }
  }
  workers_.erase({worker->round, worker->local_rank});
  if (events_) events_->OnWorkerExited(exited);
}

void RealProcessLauncher::SignalAll(int round, int signal) {
  for (auto& [key, worker] : workers_) {
    if (key.first == round && !worker->exited && worker->pid > 0) ::kill(-worker->pid, signal);
  }
}

void RealProcessLauncher::KillAll() {
  for (auto& [key, worker] : workers_) {
    if (!worker->exited && worker->pid > 0) ::kill(-worker->pid, SIGKILL);
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
