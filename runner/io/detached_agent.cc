#include "runner/io/detached_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/hex.h"
#include "runner/io/process_tree.h"
#include "runner/io/safe_file.h"

namespace ddprun::io {
namespace {

using Json = nlohmann::json;

bool IsHex32(std::string_view text) {
  if (text.size() != 32) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

/// The whole of a small /proc file (`limit` bytes at most); nullopt when it cannot be read.
std::optional<std::string> ReadProcFile(const std::string& path, size_t limit) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return std::nullopt;
  std::string text;
  char piece[4096];
  while (text.size() < limit) {
    const ssize_t n = ::read(fd.get(), piece, sizeof piece);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    text.append(piece, static_cast<size_t>(n));
  }
  return text;
}

/// Creates `name` in `dir_fd` afresh: an exclusive temporary name beside it, renamed over it.
/// Returns the open descriptor (for writing, close-on-exec).
Result<UniqueFd> CreateFresh(int dir_fd, const std::string& shown_dir, const std::string& name,
                             int extra_flags) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string temp = fmt::format(".{}.{}", name, NewLaunchToken().substr(0, 12));
    UniqueFd fd(::openat(dir_fd, temp.c_str(),
                         O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | extra_flags, 0644));
    if (!fd.valid()) {
      if (errno == EEXIST) continue;  // someone else's name: draw another
      return Fail(fmt::format("cannot create {}/{}: {}", shown_dir, temp, std::strerror(errno)));
    }
    if (::renameat(dir_fd, temp.c_str(), dir_fd, name.c_str()) != 0) {
      const int error = errno;
      ::unlinkat(dir_fd, temp.c_str(), 0);
      return Fail(
          fmt::format("cannot rename {0}/{1} to {0}/{2}: {3}", shown_dir, temp, name, std::strerror(error)));
    }
    return fd;
  }
  return Fail(fmt::format("cannot create a temporary file in {}: every name drawn was taken", shown_dir));
}

Status WriteAll(int fd, std::string_view text, const std::string& shown) {
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Fail(fmt::format("cannot write {}: {}", shown, std::strerror(n < 0 ? errno : ENOSPC)));
    written += static_cast<size_t>(n);
  }
  return {};
}

}  // namespace

std::string FormatIdentity(const AgentIdentity& identity) {
  Json record;
  record["pid"] = identity.pid;
  record["start_ticks"] = identity.start_ticks;
  record["boot_id"] = identity.boot_id;
  record["token"] = identity.token;
  return record.dump() + "\n";
}

Result<AgentIdentity> ParseIdentity(std::string_view text) {
  const Json record = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object()) return Fail("not a pid file written by `ddprun up --detach`");
  AgentIdentity identity;
  const auto pid = record.find("pid");
  if (pid == record.end() || !pid->is_number_integer()) return Fail("it names no pid");
  const int64_t value = pid->get<int64_t>();
  if (value <= 1 || value > 0x3fffffff) {
    return Fail(
        fmt::format("it names pid {}, which no ddprun agent has (ddprun never signals pid 0, 1 or a "
                    "negative pid: they stand for a group, init, or every process)",
                    value));
  }
  identity.pid = static_cast<pid_t>(value);
  const auto ticks = record.find("start_ticks");
  const auto boot = record.find("boot_id");
  const auto token = record.find("token");
  if (ticks == record.end() || !ticks->is_number_unsigned() || boot == record.end() || !boot->is_string() ||
      token == record.end() || !token->is_string()) {
    return Fail("it lacks the agent's start time, boot or launch token (not written by this ddprun)");
  }
  identity.start_ticks = ticks->get<uint64_t>();
  identity.boot_id = boot->get<std::string>();
  identity.token = token->get<std::string>();
  if (!IsHex32(identity.token)) return Fail("its launch token is not 32 hex digits");
  return identity;
}

std::string BootId() {
  auto text = ReadProcFile("/proc/sys/kernel/random/boot_id", 128);
  if (!text) return "";
  while (!text->empty() && (text->back() == '\n' || text->back() == ' ')) text->pop_back();
  return *text;
}

std::string NewLaunchToken() {
  uint8_t bytes[16];
  size_t have = 0;
  while (have < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + have, sizeof bytes - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::abort();  // the kernel has no entropy source at all: nothing safe to do
    have += static_cast<size_t>(n);
  }
  return HexEncode(std::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
}

namespace {

/// Why the recorded agent is gone, or nullopt while a process with its pid and start time lives
/// and has not begun to exit; `entry` is what /proc says of it then.
std::optional<std::string> Gone(const AgentIdentity& identity, ProcessEntry& entry) {
  if (!ReadProcessEntry(identity.pid, entry)) return fmt::format("pid {} has exited", identity.pid);
  if (entry.start_time != identity.start_ticks) {
    return fmt::format("pid {} has exited (the pid now belongs to a process started later)", identity.pid);
  }
  if (entry.exiting()) return fmt::format("pid {} has exited", identity.pid);
  return std::nullopt;
}

bool CarriesToken(std::string_view environment, std::string_view wanted) {
  for (size_t at = 0; at < environment.size();) {
    size_t end = environment.find('\0', at);
    if (end == std::string_view::npos) end = environment.size();
    if (environment.substr(at, end - at) == wanted) return true;
    at = end + 1;
  }
  return false;
}

/// How long a process in the middle of an exec is waited for before it is refused.
constexpr auto kExecWait = std::chrono::seconds(2);

}  // namespace

Recognition Recognise(const AgentIdentity& identity) {
  using Verdict = Recognition::Verdict;
  if (identity.pid <= 1)
    return {Verdict::kNotOurs, fmt::format("pid {} is never a ddprun agent", identity.pid)};
  const std::string here = BootId();
  if (!here.empty() && here != identity.boot_id) {
    return {Verdict::kGone, "the host has restarted since the agent was started"};
  }
  ProcessEntry entry;
  if (auto gone = Gone(identity, entry)) return {Verdict::kGone, *std::move(gone)};
  struct stat owner {};
  if (::stat(fmt::format("/proc/{}", identity.pid).c_str(), &owner) != 0) {
    return {Verdict::kGone, fmt::format("pid {} has exited", identity.pid)};
  }
  if (owner.st_uid != ::geteuid()) {
    return {Verdict::kNotOurs,
            fmt::format("pid {} belongs to uid {}, not to this user", identity.pid, owner.st_uid)};
  }
  // The environment is read, then the process looked at again, since what the read saw may be
  // a stage of a change rather than the process:
  // - an agent that exits gives up its memory, and with it the environment, before /proc shows
  //   it a zombie, and once reaped its entry goes: it is gone, never "not ours" (the kernel marks
  //   a process exiting before it frees the memory, so the look after sees every exit the read
  //   saw);
  // - an exec replaces the memory before it lays out the new program's environment: in between
  //   the environment reads empty and field 51 of the stat is 0. The process is looked at again
  //   each millisecond until its exec is done (at most kExecWait), and an empty read is taken
  //   once more after an exec, which may have ended between the read and the look.
  const std::string wanted = fmt::format("{}={}", kLaunchTokenVariable, identity.token);
  const auto deadline = std::chrono::steady_clock::now() + kExecWait;
  for (bool read_after_exec = false;;) {
    const auto environment = ReadProcFile(fmt::format("/proc/{}/environ", identity.pid), 4u << 20);
    if (environment && CarriesToken(*environment, wanted)) return {Verdict::kOurs, ""};
    if (auto gone = Gone(identity, entry)) return {Verdict::kGone, *std::move(gone)};
    if (!environment) {
      return {Verdict::kNotOurs,
              fmt::format("the environment of pid {} cannot be read, so it cannot be told to be the agent",
                          identity.pid)};
    }
    if (!environment->empty() || (entry.env_end != 0 && read_after_exec)) {
      return {
          Verdict::kNotOurs,
          fmt::format("pid {} does not carry the launch token of the agent that was started", identity.pid)};
    }
    read_after_exec = entry.env_end != 0;
    if (read_after_exec) continue;
    if (std::chrono::steady_clock::now() >= deadline) {
      return {Verdict::kNotOurs,
              fmt::format("pid {} has been starting a program for {} s: its environment is not there to "
                          "read, so it cannot be told to be the agent",
                          identity.pid, std::chrono::duration_cast<std::chrono::seconds>(kExecWait).count())};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Result<std::optional<UniqueFd>> OpenStateDir(const std::string& state_dir) {
  UniqueFd fd(::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::optional<UniqueFd>();
    return Fail(fmt::format("cannot open {}: {}", state_dir, std::strerror(errno)));
  }
  return std::optional<UniqueFd>(std::move(fd));
}

Result<AgentIdentity> StartDetachedAgent(const std::vector<std::string>& argv, std::vector<std::string> env,
                                         const std::string& cwd, const DetachedFiles& files) {
  if (argv.empty()) return Fail("no program to start");
  std::error_code ec;
  std::filesystem::create_directories(files.state_dir, ec);
  if (ec) return Fail(fmt::format("cannot create {}: {}", files.state_dir, ec.message()));
  auto dir = OpenStateDir(files.state_dir);
  if (!dir) return Fail(dir.error());
  if (!*dir) return Fail(fmt::format("{} vanished while it was being created", files.state_dir));
  const int dir_fd = (*dir)->get();
  auto console = CreateFresh(dir_fd, files.state_dir, files.console_name, O_APPEND);
  if (!console) return Fail(console.error());
  UniqueFd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null.valid()) return Fail(fmt::format("cannot open /dev/null: {}", std::strerror(errno)));

  AgentIdentity identity;
  identity.token = NewLaunchToken();
  identity.boot_id = BootId();
  env.push_back(fmt::format("{}={}", kLaunchTokenVariable, identity.token));
  // Everything the child uses is prepared before the fork.
  std::vector<std::string> args = argv;
  std::vector<char*> arg_ptrs, env_ptrs;
  for (auto& a : args) arg_ptrs.push_back(a.data());
  arg_ptrs.push_back(nullptr);
  for (auto& e : env) env_ptrs.push_back(e.data());
  env_ptrs.push_back(nullptr);
  // The child reports a failed exec through this pipe; a successful exec closes it.
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0)
    return Fail(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  UniqueFd report_read(report[0]), report_write(report[1]);

  const pid_t child = ::fork();
  if (child < 0) return Fail(fmt::format("cannot fork: {}", std::strerror(errno)));
  if (child == 0) {
    int error = 0;
    if (::setsid() < 0 || ::chdir(cwd.c_str()) != 0 || ::dup2(dev_null.get(), 0) < 0 ||
        ::dup2(console->get(), 1) < 0 || ::dup2(console->get(), 2) < 0) {
      error = errno;
    } else {
      ::signal(SIGHUP, SIG_IGN);  // as nohup: the session's end is not the agent's
      ::execve(arg_ptrs[0], arg_ptrs.data(), env_ptrs.data());
      error = errno;
    }
    [[maybe_unused]] const ssize_t n = ::write(report_write.get(), &error, sizeof error);
    ::_exit(127);
  }
  report_write.Reset();
  int error = 0;
  ssize_t n;
  do {
    n = ::read(report_read.get(), &error, sizeof error);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof error)) {
    int status = 0;
    ::waitpid(child, &status, 0);
    return Fail(fmt::format("cannot start {}: {}", argv[0], std::strerror(error)));
  }
  ProcessEntry stat;
  if (!ReadProcessEntry(child, stat))
    return Fail(fmt::format("the agent (pid {}) exited at once; see {}/{}", child, files.state_dir,
                            files.console_name));
  identity.pid = child;
  identity.start_ticks = stat.start_time;
  auto pid_file = CreateFresh(dir_fd, files.state_dir, files.pid_name, 0);
  if (!pid_file) return Fail(pid_file.error());
  const std::string shown = files.state_dir + "/" + files.pid_name;
  if (auto written = WriteAll(pid_file->get(), FormatIdentity(identity), shown); !written)
    return Fail(written.error());
  if (pid_file->Reset() != 0) return Fail(fmt::format("cannot write {}: {}", shown, std::strerror(errno)));
  return identity;
}

Result<std::optional<AgentIdentity>> ReadPidFile(int dir_fd, const std::string& name,
                                                 const std::string& shown) {
  auto opened = OpenRegularFile(dir_fd, name, shown);
  if (!opened) return Fail(opened.error());
  if (!*opened) return std::optional<AgentIdentity>();
  struct stat st {};
  if (::fstat((*opened)->get(), &st) != 0)
    return Fail(fmt::format("cannot read {}: {}", shown, std::strerror(errno)));
  if (st.st_uid != ::geteuid()) {
    return Fail(fmt::format("{} belongs to uid {}, not to this user: not trusted", shown, st.st_uid));
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxPidFile) {
    return Fail(fmt::format("{} is larger than {} bytes: not a pid file", shown, kMaxPidFile));
  }
  std::string text(kMaxPidFile + 1, '\0');
  ssize_t n;
  do {
    n = ::pread((*opened)->get(), text.data(), text.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Fail(fmt::format("cannot read {}: {}", shown, std::strerror(errno)));
  if (static_cast<size_t>(n) > kMaxPidFile) {
    return Fail(fmt::format("{} is larger than {} bytes: not a pid file", shown, kMaxPidFile));
  }
  text.resize(static_cast<size_t>(n));
  auto identity = ParseIdentity(text);
  if (!identity) return Fail(fmt::format("{}: {}", shown, identity.error()));
  return std::optional<AgentIdentity>(*std::move(identity));
}

Result<std::vector<std::string>> ConsoleTail(int dir_fd, const std::string& name, const std::string& shown,
                                             size_t count) {
  constexpr size_t kTailBytes = 16 * 1024;
  auto opened = OpenRegularFile(dir_fd, name, shown);
  if (!opened) return Fail(opened.error());
  if (!*opened) return std::vector<std::string>();
  struct stat st {};
  if (::fstat((*opened)->get(), &st) != 0)
    return Fail(fmt::format("cannot read {}: {}", shown, std::strerror(errno)));
  const auto size = static_cast<size_t>(st.st_size);
  const size_t from = size > kTailBytes ? size - kTailBytes : 0;
  std::string text(kTailBytes, '\0');
  ssize_t n;
  do {
    n = ::pread((*opened)->get(), text.data(), text.size(), static_cast<off_t>(from));
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Fail(fmt::format("cannot read {}: {}", shown, std::strerror(errno)));
  text.resize(static_cast<size_t>(n));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  std::vector<std::string> lines;
  size_t end = text.size();
  while (lines.size() < count && end > 0) {
    const size_t start = text.rfind('\n', end - 1);
    const size_t begin = start == std::string::npos ? 0 : start + 1;
    // The first line of a cut read may be partial: dropped unless the file starts there.
    if (start == std::string::npos && from > 0) break;
    lines.insert(lines.begin(), text.substr(begin, end - begin));
    if (start == std::string::npos) break;
    end = start;
  }
  return lines;
}

Status ReplaceFileAt(const std::string& path, std::string_view text) {
  const std::filesystem::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Fail(fmt::format("cannot create {}: {}", dir, ec.message()));
  auto opened = OpenStateDir(dir);
  if (!opened) return Fail(opened.error());
  if (!*opened) return Fail(fmt::format("{} vanished while it was being created", dir));
  const std::string name = target.filename().string();
  // Written under the temporary name first, renamed over the target only when complete.
  const int dir_fd = (*opened)->get();
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string temp = fmt::format(".{}.{}", name, NewLaunchToken().substr(0, 12));
    UniqueFd fd(::openat(dir_fd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd.valid()) {
      if (errno == EEXIST) continue;
      return Fail(fmt::format("cannot create {}/{}: {}", dir, temp, std::strerror(errno)));
    }
    Status written = WriteAll(fd.get(), text, dir + "/" + temp);
    if (written && fd.Reset() != 0)
      written = Fail(fmt::format("cannot write {}/{}: {}", dir, temp, std::strerror(errno)));
    if (written && ::renameat(dir_fd, temp.c_str(), dir_fd, name.c_str()) != 0) {
      written = Fail(fmt::format("cannot rename {}/{} to {}: {}", dir, temp, path, std::strerror(errno)));
    }
    if (!written) ::unlinkat(dir_fd, temp.c_str(), 0);
    return written;
  }
  return Fail(fmt::format("cannot create a temporary file in {}: every name drawn was taken", dir));
}

}  // namespace ddprun::io
