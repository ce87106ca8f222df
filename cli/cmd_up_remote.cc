// `ddprun __up-remote ACTION ...`: what `ddprun up --detach`, `status`, `down` and `up --copy`
// run on each host through ssh (runner/io/detached_agent.h says why it is ddprun itself and not
// a shell line). Each action prints one JSON line (io::RemoteAnswer) for the local side.
//
//   start  --state-dir D --node-rank K --job PATH [-- ARGS]   start the agent detached
//   status --state-dir D --node-rank K                        is it running? its console's tail
//   down   --state-dir D --node-rank K --wait S               SIGTERM to it, wait up to S s
//   copy   --to PATH                                          stdin to PATH (at most 1 MiB)

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "base/assert.h"
#include "base/parse_int.h"
#include "cli/commands.h"
#include "runner/io/detached_agent.h"
#include "runner/io/ssh_command.h"

extern char** environ;

namespace ddprun::cli {
namespace {

constexpr size_t kMaxCopiedFile = 1u << 20;

struct RemoteArgs {
  std::string action;
  std::map<std::string, std::string> options;
  std::vector<std::string> rest;  // after `--`
};

Result<RemoteArgs> ParseRemoteArgs(const std::vector<std::string>& args) {
  RemoteArgs parsed;
  if (args.empty()) return Fail("no action");
  parsed.action = args[0];
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") {
      parsed.rest.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (!args[i].starts_with("--") || i + 1 >= args.size())
      return Fail(fmt::format("unexpected `{}`", args[i]));
    parsed.options[args[i].substr(2)] = args[i + 1];
    ++i;
  }
  return parsed;
}

int Answer(const io::RemoteAnswer& answer) {
  const std::string line = io::FormatRemoteAnswer(answer);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
  return answer.state == io::RemoteState::kError || answer.state == io::RemoteState::kStillRunning
             ? kExitJobFailed
             : kExitOk;
}

io::RemoteAnswer Error(std::string why) {
  io::RemoteAnswer answer;
  answer.state = io::RemoteState::kError;
  answer.why = std::move(why);
  return answer;
}

struct Located {
  io::DetachedFiles files;
  std::string shown_pid, shown_console;
};

Result<Located> Locate(const RemoteArgs& args) {
  const auto dir = args.options.find("state-dir");
  const auto rank = args.options.find("node-rank");
  if (dir == args.options.end() || rank == args.options.end())
    return Fail("--state-dir and --node-rank are needed");
  const auto k = ParseNonNegative(rank->second, 1 << 20);
  if (!k) return Fail(fmt::format("--node-rank {} is not a node rank", rank->second));
  Located at;
  at.files.state_dir = dir->second;
  at.files.pid_name = fmt::format("up-n{}.pid", *k);
  at.files.console_name = fmt::format("up-n{}.console", *k);
  at.shown_pid = dir->second + "/" + at.files.pid_name;
  at.shown_console = dir->second + "/" + at.files.console_name;
  return at;
}

int Start(const RemoteArgs& args) {
  auto at = Locate(args);
  if (!at) return Answer(Error(at.error()));
  const auto job = args.options.find("job");
  if (job == args.options.end()) return Answer(Error("--job is needed"));
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return Answer(Error("cannot tell where this ddprun is: " + ec.message()));
  std::vector<std::string> argv = {self, "run", job->second, "--node-rank", args.options.at("node-rank")};
  if (!args.rest.empty()) {
    argv.push_back("--");
    argv.insert(argv.end(), args.rest.begin(), args.rest.end());
  }
  std::vector<std::string> env;
  for (char** entry = environ; *entry; ++entry) {
    if (!std::string_view(*entry).starts_with(std::string(io::kLaunchTokenVariable) + "="))
      env.emplace_back(*entry);
  }
  const std::string cwd = std::filesystem::current_path(ec).string();
  auto started = io::StartDetachedAgent(argv, std::move(env), ec ? "/" : cwd, at->files);
  if (!started) return Answer(Error(started.error()));
  io::RemoteAnswer answer;
  answer.state = io::RemoteState::kStarted;
  answer.pid = started->pid;
  return Answer(answer);
}

/// The pid file's identity and what /proc says of it, into `answer`; false when there is
/// nothing more to do (never started, unreadable).
struct Looked {
  std::optional<io::AgentIdentity> identity;
  io::Recognition recognition;
};

std::optional<Looked> Look(const Located& at, int dir_fd, io::RemoteAnswer& answer) {
  auto read = io::ReadPidFile(dir_fd, at.files.pid_name, at.shown_pid);
  if (!read) {
    answer.state = io::RemoteState::kUnreadable;
    answer.why = read.error();
    return std::nullopt;
  }
  if (!*read) {
    answer.state = io::RemoteState::kNeverStarted;
    return std::nullopt;
  }
  Looked looked;
  looked.identity = **read;
  looked.recognition = io::Recognise(**read);
  answer.pid = (*read)->pid;
  answer.why = looked.recognition.why;
  return looked;
}

/// The state folder, open; nullopt once answered for (it cannot be opened, or there is none:
/// nothing was started there), with the exit code in `answered`.
std::optional<UniqueFd> OpenStateDirOrAnswer(const Located& at, int& answered) {
  auto dir = io::OpenStateDir(at.files.state_dir);
  if (!dir) {
    answered = Answer(Error(dir.error()));
    return std::nullopt;
  }
  if (!*dir) {
    io::RemoteAnswer never;
    never.state = io::RemoteState::kNeverStarted;
    answered = Answer(never);
    return std::nullopt;
  }
  return std::move(**dir);
}

int Status(const RemoteArgs& args) {
  auto at = Locate(args);
  if (!at) return Answer(Error(at.error()));
  io::RemoteAnswer answer;
  int answered = 0;
  const std::optional<UniqueFd> dir = OpenStateDirOrAnswer(*at, answered);
  if (!dir) return answered;
  if (auto looked = Look(*at, dir->get(), answer)) {
    using Verdict = io::Recognition::Verdict;
    const Verdict verdict = looked->recognition.verdict;
    answer.state = verdict == Verdict::kOurs   ? io::RemoteState::kRunning
                   : verdict == Verdict::kGone ? io::RemoteState::kExited
                                               : io::RemoteState::kNotOurs;
  }
  auto tail = io::ConsoleTail(dir->get(), at->files.console_name, at->shown_console, 3);
  if (tail) {
    answer.log = *std::move(tail);
  } else {
    answer.log = {"(console not read: " + tail.error() + ")"};
  }
  return Answer(answer);
}

/// SIGTERM to the recorded agent, through a pidfd opened before the last check: between the
/// check and the signal the pid cannot come to name another process.
int Down(const RemoteArgs& args) {
  auto at = Locate(args);
  if (!at) return Answer(Error(at.error()));
  const auto wait = args.options.find("wait");
  const auto wait_s =
      wait == args.options.end() ? std::optional<long>(30) : ParseNonNegative(wait->second, 3600);
  if (!wait_s) return Answer(Error("--wait takes seconds"));
  io::RemoteAnswer answer;
  int answered = 0;
  const std::optional<UniqueFd> dir = OpenStateDirOrAnswer(*at, answered);
  if (!dir) return answered;
  auto looked = Look(*at, dir->get(), answer);
  if (!looked) return Answer(answer);
  using Verdict = io::Recognition::Verdict;
  if (looked->recognition.verdict == Verdict::kGone) {
    answer.state = io::RemoteState::kNotRunning;
    return Answer(answer);
  }
  if (looked->recognition.verdict == Verdict::kNotOurs) {
    answer.state = io::RemoteState::kNotOurs;
    return Answer(answer);
  }
  const pid_t pid = looked->identity->pid;
  DDPRUN_ASSERT(pid > 1);
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  // Kernels before 5.3 (Rocky 8's 4.18) have no pidfd: the agent is signalled by pid, right
  // after it was recognised again by its start time.
  const bool no_pidfd = !pidfd.valid() && errno == ENOSYS;
  const io::Recognition again = io::Recognise(*looked->identity);
  if ((!pidfd.valid() && !no_pidfd) || again.verdict != Verdict::kOurs) {
    answer.state =
        again.verdict == Verdict::kNotOurs ? io::RemoteState::kNotOurs : io::RemoteState::kNotRunning;
    answer.why = again.why.empty() ? fmt::format("pid {} has exited", pid) : again.why;
    return Answer(answer);
  }
  const long signalled =
      no_pidfd ? ::kill(pid, SIGTERM) : ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGTERM, nullptr, 0);
  if (signalled != 0) {
    answer.state = io::RemoteState::kNotRunning;
    answer.why = fmt::format("pid {} has exited", pid);
    return Answer(answer);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(*wait_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (io::Recognise(*looked->identity).verdict == Verdict::kGone) {
      answer.state = io::RemoteState::kStopped;
      answer.why.clear();
      return Answer(answer);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  answer.state = io::RemoteState::kStillRunning;
  answer.why.clear();
  return Answer(answer);
}

int Copy(const RemoteArgs& args) {
  const auto to = args.options.find("to");
  if (to == args.options.end()) return Answer(Error("--to is needed"));
  std::string text;
  char piece[16 * 1024];
  while (true) {
    const ssize_t n = ::read(0, piece, sizeof piece);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return Answer(Error(fmt::format("cannot read the job file from ssh: {}", std::strerror(errno))));
    if (n == 0) break;
    text.append(piece, static_cast<size_t>(n));
    if (text.size() > kMaxCopiedFile) return Answer(Error("the job file sent is larger than 1 MiB"));
  }
  if (auto written = io::ReplaceFileAt(to->second, text); !written) return Answer(Error(written.error()));
  io::RemoteAnswer answer;
  answer.state = io::RemoteState::kCopied;
  return Answer(answer);
}

}  // namespace

int UpRemoteCommand(const std::vector<std::string>& args) {
  auto parsed = ParseRemoteArgs(args);
  if (!parsed) return Answer(Error("ddprun __up-remote: " + parsed.error()));
  if (parsed->action == "start") return Start(*parsed);
  if (parsed->action == "status") return Status(*parsed);
  if (parsed->action == "down") return Down(*parsed);
  if (parsed->action == "copy") return Copy(*parsed);
  return Answer(Error(fmt::format("ddprun __up-remote: no action `{}`", parsed->action)));
}

}  // namespace ddprun::cli
