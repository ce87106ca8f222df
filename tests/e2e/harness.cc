#include "tests/e2e/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace ddprun::e2e {

namespace {

/// Ports a test may hand out: from kLowestTestPort up, less the kernel's ephemeral range (or
/// all of them where that range leaves none, e.g. a container set to 1024-65535).
std::vector<uint16_t> CandidatePorts() {
  constexpr unsigned kLowestTestPort = 20000;  // above the ports of common services
  unsigned low = 32768, high = 60999;          // Linux's default, where /proc cannot be read
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> low >> high;
  std::vector<uint16_t> ports, all;
  for (unsigned port = kLowestTestPort; port <= 65535; ++port) {
    all.push_back(static_cast<uint16_t>(port));
    if (port < low || port > high) ports.push_back(static_cast<uint16_t>(port));
  }
  return ports.empty() ? all : ports;
}

/// True when a listening socket could take 127.0.0.1:port now.
bool CanBind(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

// Binding port 0, reading the port and closing the socket leaves a gap in which a test binary
// running beside this one (ctest -j) is handed the same port, and the two jobs meet. Instead:
//  - Every test process claims each port it hands out with a lock on byte `port` of one shared
//    lock file (an open-file-description lock, fcntl F_OFD_SETLK), and holds it until the
//    process exits, when the kernel drops it: two test processes never hold the same port.
//  - The ports come from outside net.ipv4.ip_local_port_range, so the kernel never gives one of
//    them to an outgoing connection or to a bind to port 0 (a worker's, a store's, a test's).
//  - A bind just before handing a port out skips ports that another program listens on, or
//    that an earlier test's connections still hold (TIME_WAIT).
//  - A process hands each port out once, so one test's leftovers never meet the next test's.
// The scan starts at an offset taken from the pid, so that processes rarely try the same ports.
uint16_t FreePort() {
  static std::mutex mutex;
  static const std::vector<uint16_t> candidates = CandidatePorts();
  static std::set<uint16_t> handed_out;
  static const int lock_fd =
      ::open((std::filesystem::temp_directory_path() / "ddprun-e2e-ports.lock").c_str(),
             O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  const std::lock_guard<std::mutex> hold(mutex);
  if (lock_fd < 0) throw std::runtime_error("cannot open the port lock file");
  const size_t start = static_cast<size_t>(::getpid()) * 7919 % candidates.size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const uint16_t port = candidates[(start + i) % candidates.size()];
    if (handed_out.count(port) != 0) continue;
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    lock.l_start = port;
    lock.l_len = 1;
    if (::fcntl(lock_fd, F_OFD_SETLK, &lock) != 0) continue;  // another test process has it
    handed_out.insert(port);  // ours until exit, whether or not the bind below succeeds
    if (CanBind(port)) return port;
  }
  throw std::runtime_error("no free test port");
}

std::string TomlString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string TestJob::Toml() const {
  std::ostringstream t;
  t << "version = 1\n[job]\nname = " << TomlString(name)
    << "\ncommand = " << (command.empty() ? "[\"sh\", \"-c\", " + TomlString(script) + "]" : command) << "\n";
  if (!workdir.empty()) t << "workdir = " << TomlString(workdir) << "\n";
  if (!code_check.empty()) t << "code_check = " << TomlString(code_check) << "\n";
  t << job_extra;
  if (!library_check.empty()) t << "library_check = " << TomlString(library_check) << "\n";
  t << "[cluster]\n";
  if (nodes.empty()) {
    t << "nnodes = " << nnodes << "\n";
  } else {
    t << "nodes = [";
    for (size_t i = 0; i < nodes.size(); ++i) t << (i ? ", " : "") << TomlString(nodes[i]);
    t << "]\n";
  }
  t << "master_addr = \"127.0.0.1\"\nmaster_port = " << master_port << "\n";
  if (store_port != 0) t << "store_port = " << store_port << "\n";
  t << "[trainer]\naccelerator = " << TomlString(accelerator) << "\ndevices = " << devices
    << "\nnum_nodes = " << nnodes << "\n"
    << trainer_extra;
  if (max_restarts || !backoff.empty() || !backoff_max.empty() || !never_on.empty()) {
    t << "[restart]\n";
    if (max_restarts) t << "max_restarts = " << *max_restarts << "\n";
    if (!backoff.empty()) t << "backoff = " << TomlString(backoff) << "\n";
    if (!backoff_max.empty()) t << "backoff_max = " << TomlString(backoff_max) << "\n";
    if (!never_on.empty()) {
      t << "never_on = [";
      for (size_t i = 0; i < never_on.size(); ++i) t << (i ? ", " : "") << TomlString(never_on[i]);
      t << "]\n";
    }
  }
  t << "[timeouts]\nrendezvous = " << TomlString(rendezvous) << "\nheartbeat = " << TomlString(heartbeat)
    << "\nstop_grace = " << TomlString(stop_grace) << "\n"
    << extra;
  return t.str();
}

ScratchDir::ScratchDir() {
  std::string templ = (std::filesystem::temp_directory_path() / "ddprun-e2e-XXXXXX").string();
  if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  path_ = templ;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ScratchDir::Write(const std::string& name, const std::string& text) const {
  const auto full = std::filesystem::path(path_) / name;
  std::filesystem::create_directories(full.parent_path());
  std::ofstream(full) << text;
  return full.string();
}

std::string ScratchDir::Read(const std::string& name) const {
  std::ifstream in(std::filesystem::path(path_) / name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool ScratchDir::Exists(const std::string& name) const {
  return std::filesystem::exists(std::filesystem::path(path_) / name);
}

AgentProcess::AgentProcess(const std::vector<std::string>& args, const std::string& output_path,
                           const std::map<std::string, std::string>& extra_env,
                           const std::vector<std::string>& prefix, bool own_process_group)
    : output_path_(output_path) {
  std::vector<std::string> argv = prefix;
  argv.push_back(DDPRUN_BINARY);
  argv.insert(argv.end(), args.begin(), args.end());
  Spawn(argv, extra_env, own_process_group);
}

AgentProcess::AgentProcess(OtherProgram, const std::vector<std::string>& argv, const std::string& output_path,
                           const std::map<std::string, std::string>& extra_env)
    : output_path_(output_path) {
  Spawn(argv, extra_env, false);
}

void AgentProcess::Spawn(const std::vector<std::string>& argv_text,
                         const std::map<std::string, std::string>& extra_env, bool own_process_group) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (extra_env.count(name) == 0) env.push_back(entry);
  }
  for (const auto& [name, value] : extra_env) env.push_back(name + "=" + value);
  const std::string& output_path = output_path_;
  pid_ = ::fork();
  if (pid_ == 0) {
    if (own_process_group) ::setpgid(0, 0);
    const int fd = ::open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (fd > 2) ::close(fd);  // the agent starts with stdio only, as from a shell
    std::vector<char*> argv;
    for (const auto& a : argv_text) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
}

AgentProcess::~AgentProcess() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

std::optional<int> AgentProcess::Wait(std::chrono::milliseconds limit) {
  if (exit_code_) return exit_code_;
  const bool done = WaitFor(
      [&] {
        int status = 0;
        const pid_t r = ::waitpid(pid_, &status, WNOHANG);
        if (r == pid_) {
          exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return true;
        }
        return false;
      },
      limit);
  if (!done) return std::nullopt;
  return exit_code_;
}

void AgentProcess::Signal(int signal) const { ::kill(pid_, signal); }

std::string AgentProcess::Output() const {
  std::ifstream in(output_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string DescribeAgents(const std::vector<std::unique_ptr<AgentProcess>>& agents) {
  std::string text;
  for (size_t i = 0; i < agents.size(); ++i) {
    text += "---- agent " + std::to_string(i) + " ----\n" + agents[i]->Output();
  }
  return text;
}

bool ProcessAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

std::vector<pid_t> ChildrenNamed(pid_t parent, const std::string& comm) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const auto open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 4 >= line.size()) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent || state == 'Z' || line.substr(open + 1, close - open - 1) != comm) continue;
    out.push_back(std::stoi(name));
  }
  return out;
}

pid_t WaitForPidFile(const ScratchDir& dir, const std::string& name, std::chrono::milliseconds within) {
  pid_t pid = 0;
  WaitFor(
      [&] {
        if (!dir.Exists(name)) return false;
        int value = 0;
        if (std::sscanf(dir.Read(name).c_str(), "%d", &value) != 1 || value <= 0) return false;
        pid = value;
        return true;
      },
      within);
  return pid;
}

std::map<std::string, std::string> ParseEnvDump(const std::string& text) {
  std::map<std::string, std::string> env;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

std::string HttpGet(const std::string& addr, uint16_t port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return "";
  }
  timeval limit{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n\r\n";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;)
    answer.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  return answer;
}

int Shell(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()); }

std::unique_ptr<NetnsPair> NetnsPair::Create(const std::string& tag, int net, std::string* why) {
  if (::geteuid() != 0) {
    *why = "needs root to create network namespaces";
    return nullptr;
  }
  if (Shell("command -v ip") != 0) {
    *why = "iproute2 (ip) is not installed";
    return nullptr;
  }
  std::unique_ptr<NetnsPair> pair(new NetnsPair());
  const int k = 1 + ::getpid() % 250;
  const std::string suffix = std::to_string(::getpid());
  pair->a_ = "ddprun-" + tag + "a-" + suffix;
  pair->b_ = "ddprun-" + tag + "b-" + suffix;
  pair->addr_a_ = "10." + std::to_string(net) + "." + std::to_string(k) + ".1";
  pair->addr_b_ = "10." + std::to_string(net) + "." + std::to_string(k) + ".2";
  pair->a_made_ = Shell("ip netns add " + pair->a_) == 0;
  if (!pair->a_made_) {
    *why = "cannot create network namespaces here";
    return nullptr;
  }
  pair->b_made_ = Shell("ip netns add " + pair->b_) == 0;
  const std::string va = "d" + tag + "a" + suffix, vb = "d" + tag + "b" + suffix;
  const std::string& a = pair->a_;
  const std::string& b = pair->b_;
  const bool wired =
      pair->b_made_ && Shell("ip link add " + va + " type veth peer name " + vb) == 0 &&
      Shell("ip link set " + va + " netns " + a) == 0 && Shell("ip link set " + vb + " netns " + b) == 0 &&
      Shell("ip -n " + a + " addr add " + pair->addr_a_ + "/24 dev " + va) == 0 &&
      Shell("ip -n " + b + " addr add " + pair->addr_b_ + "/24 dev " + vb) == 0 &&
      Shell("ip -n " + a + " link set " + va + " up") == 0 &&
      Shell("ip -n " + b + " link set " + vb + " up") == 0 && Shell("ip -n " + a + " link set lo up") == 0 &&
      Shell("ip -n " + b + " link set lo up") == 0;
  if (!wired) {
    *why = "cannot wire two namespaces with a veth pair here";
    return nullptr;
  }
  return pair;
}

NetnsPair::~NetnsPair() {
  if (a_made_) Shell("ip netns del " + a_);
  if (b_made_) Shell("ip netns del " + b_);
}

}  // namespace ddprun::e2e
