#include "runner/io/warm_template.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "runner/io/guardian.h"
#include "runner/io/kernel_compat.h"
#include "runner/io/process_tree.h"

namespace ddprun::io {

namespace asio = boost::asio;
using boost::system::error_code;
using Json = nlohmann::json;

namespace {

// The template's end of the socket, as the template script expects it.
constexpr int kTemplateControlFd = 3;
constexpr size_t kMaxAnswer = 64 * 1024;

std::string DescribeStatus(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  return "ended";
}

}  // namespace

struct WarmTemplate::Watch {
  explicit Watch(asio::io_context& io) : descriptor(io), answer_timer(io) {}
  asio::posix::stream_descriptor descriptor;
  asio::steady_timer answer_timer;  // the oldest request's answer limit
};

struct WarmTemplate::FirstWait {
  explicit FirstWait(asio::io_context& io) : timer(io) {}
  asio::steady_timer timer;
};

WarmTemplate::WarmTemplate(asio::io_context& io, Options options) : io_(io), options_(std::move(options)) {}

WarmTemplate::~WarmTemplate() { Kill(); }

void WarmTemplate::Start() {
  if (const Status launched = Launch(); !launched) {
    cold_reason_ = launched.error();
    state_ = State::kRefused;
    if (options_.say) options_.say(true, "workers start cold: " + cold_reason_);
    return;
  }
  // Imports that never end must not hold round 0 for ever.
  first_wait_ = std::make_unique<FirstWait>(io_);
  first_wait_->timer.expires_after(kFirstWaitLimit);
  first_wait_->timer.async_wait([this](error_code ec) {
    if (ec || state_ != State::kStarting || attempt_ != 1) return;
    first_wait_over_ = true;
    if (options_.say) {
      options_.say(true,
                   fmt::format("warm starts: the template is still importing after {} s; the workers that "
                               "waited for it start cold, and later rounds are forked once it is ready",
                               kFirstWaitLimit.count()));
    }
    Settle();
  });
}

Status WarmTemplate::Launch() {
  ++attempt_;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return Fail(fmt::format("cannot create the template's socket: {}", std::strerror(errno)));
  }
  UniqueFd ours(pair[0]), theirs(pair[1]);
  UniqueFd log;
  if (options_.open_log) {
    if (auto opened = options_.open_log(attempt_)) log = *std::move(opened);
  }
  if (!log.valid()) log.Reset(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  UniqueFd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));

  Json config;
  config["module"] = options_.command.module;
  config["target"] = options_.command.target;
  config["preload"] = options_.preload;
  std::vector<std::string> args;
  args.push_back(options_.executable);
  args.insert(args.end(), options_.command.options.begin(), options_.command.options.end());
  args.push_back(options_.template_script);
  // The settings go through the socket, not argv: `ps` shows a plain command line.
  const std::string config_text = config.dump();
  std::vector<std::string> env = options_.env;
  // Everything the child needs is prepared before fork: the agent may have threads, so the
  // child only makes system calls until exec.
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int guardian_fd = options_.guardian ? options_.guardian->write_fd() : -1;
  const char* workdir = options_.workdir.c_str();
  const int sock = theirs.get(), out = log.get(), in = dev_null.get();

  const pid_t child = ::fork();
  if (child == 0) {
    // Its own process group, like a worker: Ctrl-C at the agent's terminal does not reach it.
    ::setpgid(0, 0);
    if (!(guardian_fd >= 0 && Guardian::RegisterFromChild(guardian_fd, ::getpid()))) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    }
    if (in >= 0) ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    if (sock == kTemplateControlFd) {
      ::fcntl(sock, F_SETFD, 0);
    } else {
      ::dup2(sock, kTemplateControlFd);
    }
    CloexecFrom(kTemplateControlFd + 1);
    if (::chdir(workdir) != 0) ::_exit(126);
    // The dispositions a cold worker gets from exec: the agent handles SIGINT, SIGTERM and
    // SIGHUP (asio's signal_set, which may not be installed yet when the template starts) and
    // ignores SIGPIPE, so a cold worker starts with all four at SIG_DFL, whatever the agent
    // inherited (nohup, a background job's ignored SIGINT).
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (const int signal : {SIGPIPE, SIGINT, SIGTERM, SIGHUP}) ::sigaction(signal, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (child < 0) return Fail(fmt::format("cannot start the template: {}", std::strerror(errno)));
  pid_ = child;
  if (options_.guardian) options_.guardian->Watch(child);
  control_ = std::move(ours);
  // Queued in the socket until the template reads it; a failed send shows as its exit.
  [[maybe_unused]] const ssize_t sent =
      ::send(control_.get(), config_text.data(), config_text.size(), MSG_NOSIGNAL);
  state_ = State::kStarting;
  cold_reason_ = "the template is still importing " + fmt::format("{}", fmt::join(options_.preload, ", "));
  started_at_ = std::chrono::steady_clock::now();
  watch_ = std::make_unique<Watch>(io_);
  error_code ec;
  watch_->descriptor.assign(::dup(control_.get()), ec);
  WatchSocket();
  return {};
}

void WarmTemplate::WatchSocket() {
  if (!watch_) return;
  Watch* watch = watch_.get();
  watch_->descriptor.async_wait(asio::posix::stream_descriptor::wait_read, [this, watch](error_code ec) {
    if (ec || watch != watch_.get()) return;  // closed or replaced
    OnReadable();
  });
}

void WarmTemplate::OnReadable() {
  std::string buffer(kMaxAnswer, '\0');
  const ssize_t n = ::recv(control_.get(), buffer.data(), buffer.size(), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
    WatchSocket();
    return;
  }
  if (n <= 0) {
    Down("the template exited", /*replace=*/true);
    return;
  }
  buffer.resize(static_cast<size_t>(n));
  const Json message = Json::parse(buffer, nullptr, /*allow_exceptions=*/false);
  if (state_ == State::kReady && message.is_object() && message.contains("started")) {
    OnAnswer(message);
    return;
  }
  if (state_ != State::kStarting || !message.is_object() || !message.contains("ready")) {
    WatchSocket();  // nothing else comes unasked
    return;
  }
  if (message["ready"] == true) {
    state_ = State::kReady;
    cold_reason_.clear();
    const double import_s = message.value("import_s", 0.0);
    if (options_.say) {
      options_.say(false, fmt::format("workers start warm: a template (pid {}) imported {} in {:.2f} s; "
                                      "each worker is forked from it",
                                      pid_, fmt::join(options_.preload, ", "), import_s));
    }
    WatchSocket();
    Settle();
    return;
  }
  // A refusal is the same for every template of this job: say it once and run cold.
  cold_reason_ = message.value("reason", std::string("the template refused"));
  Down(cold_reason_, /*replace=*/false);
  state_ = State::kRefused;
}

void WarmTemplate::Down(const std::string& why, bool replace) {
  const pid_t pid = pid_;
  std::string status_text;
  if (pid > 0) {
    int status = 0;
    pid_t reaped = ::waitpid(pid, &status, WNOHANG);
    if (reaped == 0) {
      ::kill(pid, SIGKILL);  // our child, not reaped yet: the pid is still its own
      reaped = ::waitpid(pid, &status, 0);
    }
    if (reaped == pid && replace) status_text = " (" + DescribeStatus(status) + ")";
    if (options_.guardian) options_.guardian->Forget(pid);
  }
  pid_ = -1;
  control_.Reset();
  watch_.reset();
  const bool was_starting = state_ == State::kStarting;
  state_ = State::kDown;
  // What was asked of this template starts cold, for the same reason.
  std::deque<Outstanding> lost;
  lost.swap(outstanding_);
  const std::string lost_why = why + status_text;
  for (Outstanding& request : lost) {
    Finish(std::move(request.done), std::vector<Result<pid_t>>(request.count, Fail(lost_why)));
  }
  if (!replace) {
    if (options_.say) options_.say(true, "workers start cold: " + why);
    if (was_starting) Settle();
    return;
  }
  ++failures_;
  cold_reason_ = why + status_text;
  const bool again = failures_ < kMaxTemplateFailures;
  if (options_.say) {
    options_.say(
        true, fmt::format(
                  "warm starts: {}; {}", cold_reason_,
                  again ? "a new template is starting, and workers start cold until it is ready"
                        : fmt::format("that is {} templates lost: workers start cold for the rest of the job",
                                      failures_)));
  }
  if (was_starting) Settle();
  if (again) {
    if (const Status launched = Launch(); !launched) {
      cold_reason_ = launched.error();
      if (options_.say) options_.say(true, "workers start cold: " + cold_reason_);
    }
  }
}

void WarmTemplate::Settle() {
  if (options_.settled) options_.settled();
}

std::string WhyNotOurWorker(int64_t pid) {
  if (pid <= 1 || pid > 0x3fffffff) return "which is no worker's pid";
  ProcessEntry entry;
  if (!ReadProcessEntry(static_cast<pid_t>(pid), entry)) return "which does not exist";
  if (entry.ppid != ::getpid())
    return fmt::format("which is not a child of this agent (its parent is {})", entry.ppid);
  if (entry.pgid != entry.pid)
    return fmt::format("which does not lead its own process group ({})", entry.pgid);
  return "";
}

void WarmTemplate::Finish(Done done, std::vector<Result<pid_t>> results) {
  asio::post(io_, [alive = std::weak_ptr<bool>(alive_), done = std::move(done),
                   results = std::move(results)]() mutable {
    if (alive.lock()) done(std::move(results));
  });
}

namespace {

Json WorkerMessage(const WarmTemplate::Request& request) {
  Json worker;
  worker["argv"] = request.argv;
  worker["orig_argv"] = request.orig_argv;
  Json env = Json::object();
  for (const std::string& entry : request.env) {
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  worker["env"] = std::move(env);
  worker["cwd"] = request.cwd;
  if (request.nofile.rlim_cur != 0) {
    worker["nofile"] = {request.nofile.rlim_cur, request.nofile.rlim_max};
  } else {
    worker["nofile"] = nullptr;
  }
  return worker;
}

UniqueFd Duplicate(int fd) { return UniqueFd(fd >= 0 ? ::fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1); }

}  // namespace

void WarmTemplate::Fork(std::vector<ForkStart> starts, int guardian_fd, Done done) {
  if (starts.empty()) {
    Finish(std::move(done), {});
    return;
  }
  if (state_ != State::kReady) {
    Finish(std::move(done), std::vector<Result<pid_t>>(starts.size(), Fail(cold_reason_)));
    return;
  }
  // Split into requests of at most kWorkersPerRequest workers and about kRequestBytes; `done`
  // runs once, with every answer in order, when the last request is answered (or lost).
  struct Gather {
    std::vector<Result<pid_t>> results;
    size_t left = 0;
    Done done;
  };
  std::vector<Json> workers;
  for (const ForkStart& start : starts) workers.push_back(WorkerMessage(start.request));
  std::vector<std::pair<size_t, size_t>> spans;  // [first, first + count)
  for (size_t first = 0; first < workers.size();) {
    size_t count = 0, bytes = 0;
    while (first + count < workers.size() && count < kWorkersPerRequest) {
      const size_t size = workers[first + count].dump().size();
      if (count > 0 && bytes + size > kRequestBytes) break;
      bytes += size;
      ++count;
    }
    spans.emplace_back(first, count);
    first += count;
  }
  auto gather = std::make_shared<Gather>();
  gather->results.assign(starts.size(), Fail("not answered"));
  gather->left = spans.size();
  gather->done = std::move(done);
  for (const auto& [first, count] : spans) {
    Json message;
    message["agent"] = ::getpid();
    message["guardian"] = guardian_fd >= 0;
    message["workers"] = Json::array();
    Outstanding request;
    request.id = next_request_id_++;
    message["id"] = request.id;
    request.count = count;
    if (guardian_fd >= 0) request.fds.push_back(Duplicate(guardian_fd));
    for (size_t i = first; i < first + count; ++i) {
      message["workers"].push_back(std::move(workers[i]));
      for (const int fd : {starts[i].out_fd, starts[i].err_fd, starts[i].go_fd})
        request.fds.push_back(Duplicate(fd));
    }
    request.text = message.dump();
    request.done = [gather, first = first](std::vector<Result<pid_t>> results) {
      for (size_t i = 0; i < results.size() && first + i < gather->results.size(); ++i) {
        gather->results[first + i] = std::move(results[i]);
      }
      if (--gather->left == 0) gather->done(std::move(gather->results));
    };
    outstanding_.push_back(std::move(request));
  }
  SendFront();
}

bool WarmTemplate::SendFront() {
  if (outstanding_.empty() || outstanding_.front().sent) return true;
  Outstanding& request = outstanding_.front();
  std::vector<int> fds;
  for (const UniqueFd& fd : request.fds) fds.push_back(fd.get());
  std::vector<char> control(CMSG_SPACE(fds.size() * sizeof(int)), 0);
  iovec iov{request.text.data(), request.text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* header = CMSG_FIRSTHDR(&msg);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(header), fds.data(), fds.size() * sizeof(int));
  ssize_t sent;
  do {
    sent = ::sendmsg(control_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0 && errno == EMSGSIZE) {
    // One worker's variables alone do not fit in a message: that worker starts cold; the
    // template is not at fault.
    Outstanding failed = std::move(outstanding_.front());
    outstanding_.pop_front();
    Finish(std::move(failed.done),
           std::vector<Result<pid_t>>(failed.count,
                                      Fail(fmt::format("its request to the template is too large ({} "
                                                       "bytes)",
                                                       failed.text.size()))));
    return SendFront();
  }
  if (sent < 0) {
    // Nothing else is in the socket (one request at a time): a full buffer (EAGAIN) is a
    // template that does not read, as surely as one that does not answer.
    Down(fmt::format("cannot reach the template: {}", std::strerror(errno)), /*replace=*/true);
    return false;
  }
  request.sent = true;
  request.fds.clear();  // the template has its own copies now
  request.text.clear();
  ArmAnswerTimer();
  return true;
}

void WarmTemplate::ArmAnswerTimer() {
  if (!watch_ || outstanding_.empty()) return;
  Watch* watch = watch_.get();
  watch_->answer_timer.expires_after(options_.answer_limit);
  watch_->answer_timer.async_wait([this, watch](error_code ec) {
    if (ec || watch != watch_.get() || outstanding_.empty()) return;
    Down(fmt::format("the template (pid {}) did not answer within {:g} s: taken for hung and killed", pid_,
                     static_cast<double>(options_.answer_limit.count()) / 1000.0),
         /*replace=*/true);
  });
}

void WarmTemplate::OnAnswer(const Json& answer) {
  if (outstanding_.empty()) {
    Down("the template answered a request that was not made: taken for broken and killed", /*replace=*/true);
    return;
  }
  // The template answers its requests in turn, each with the request's id.
  const Json& id = answer["id"];
  if (!outstanding_.front().sent || !id.is_number_integer() || id.get<int64_t>() != outstanding_.front().id) {
    Down("the template answered a request that was not made: taken for broken and killed", /*replace=*/true);
    return;
  }
  Outstanding request = std::move(outstanding_.front());
  outstanding_.pop_front();
  watch_->answer_timer.cancel();
  const Json& started = answer["started"];
  std::vector<Result<pid_t>> results;
  std::vector<int64_t> adopted;
  std::string broken;
  if (!started.is_array() || started.size() != request.count) {
    broken = answer.is_object() && answer.contains("error") && answer["error"].is_string()
                 ? "the template could not read a request (" + answer["error"].get<std::string>() + ")"
                 : fmt::format("the template answered {} workers for a request of {}",
                               started.is_array() ? started.size() : 0, request.count);
  }
  for (size_t i = 0; broken.empty() && i < started.size(); ++i) {
    const Json& entry = started[i];
    if (entry.is_object() && entry.contains("pid") && entry["pid"].is_number_integer()) {
      // Adopted only when it is provably a worker just forked for us: our own child (the
      // template's middle process has exited and we, the subreaper, inherited it) and the
      // leader of its own process group (it called setpgid), since the launcher signals that
      // group. Anything else (1, -1, the template's own pid, someone else's process) is refused.
      const int64_t reported = entry["pid"].get<int64_t>();
      std::string refused = WhyNotOurWorker(reported);
      if (refused.empty() && reported == pid_) refused = "which is the template itself";
      if (refused.empty() && (std::find(adopted.begin(), adopted.end(), reported) != adopted.end() ||
                              (options_.is_worker && options_.is_worker(static_cast<pid_t>(reported))))) {
        refused = "which is already another rank's worker";
      }
      if (!refused.empty()) {
        broken = fmt::format("the template reported pid {} as a forked worker, {}", reported, refused);
        break;
      }
      adopted.push_back(reported);
      results.emplace_back(static_cast<pid_t>(reported));
    } else if (entry.is_object() && entry.contains("cold") && entry["cold"].is_string()) {
      results.push_back(Fail("a fork would differ from a cold start: " + entry["cold"].get<std::string>()));
    } else if (entry.is_object() && entry.contains("error") && entry["error"].is_string()) {
      results.push_back(Fail("the forked worker could not start: " + entry["error"].get<std::string>()));
    } else {
      broken = "the template answered something that is not a worker";
    }
  }
  if (broken.empty()) {
    Finish(std::move(request.done), std::move(results));
    if (SendFront()) WatchSocket();
    return;
  }
  // The workers it did fork for this request are ours and were checked; the rest start cold.
  const std::string why = broken + ": taken for broken and killed";
  results.resize(request.count, Fail(why));
  Finish(std::move(request.done), std::move(results));
  Down(why, /*replace=*/true);
}

void WarmTemplate::Kill() {
  watch_.reset();
  first_wait_.reset();
  outstanding_.clear();
  alive_ = std::make_shared<bool>(true);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);  // our child, not reaped yet: the pid is still its own
    int status = 0;
    ::waitpid(pid_, &status, 0);
    if (options_.guardian) options_.guardian->Forget(pid_);
  }
  pid_ = -1;
  control_.Reset();
  state_ = State::kDown;
}

Result<WarmTemplate::Options> WarmTemplateOptions(const std::vector<std::string>& command,
                                                  const std::vector<std::string>& preload,
                                                  const std::string& template_script,
                                                  const std::string& workdir,
                                                  const std::map<std::string, std::string>& inherited,
                                                  const EnvList& template_env) {
  auto parsed = ParsePythonCommand(command);
  if (!parsed) return Fail("workers start cold although job.preload is set: " + parsed.error());
  if (template_script.empty()) {
    return Fail(
        "workers start cold: ddprun's template script (share/ddprun/warm/template.py) is not installed "
        "beside this binary");
  }
  auto plan = PrepareLaunch(command, workdir, inherited, template_env,
                            [](const std::string& path) { return ::access(path.c_str(), X_OK) == 0; });
  if (!plan) return Fail("workers start cold: " + plan.error());
  WarmTemplate::Options options;
  options.command = *std::move(parsed);
  options.executable = plan->executable;
  options.preload = preload;
  options.template_script = template_script;
  options.workdir = workdir;
  options.env = plan->env;
  return options;
}

WarmTemplate::Request WarmRequest(const PythonCommand& command, const LaunchPlan& plan,
                                  const std::string& workdir, const rlimit& nofile) {
  WarmTemplate::Request request;
  // sys.argv as the interpreter leaves it before __main__ runs; for -m, runpy puts the
  // module's path in place of "-m".
  request.argv.push_back(command.module ? "-m" : command.target);
  request.argv.insert(request.argv.end(), command.args.begin(), command.args.end());
  request.orig_argv = plan.argv;
  request.env = plan.env;
  request.cwd = workdir;
  request.nofile = nofile;
  return request;
}

}  // namespace ddprun::io
