#include "runner/io/driver.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

#include "base/host_name.h"
#include "base/parse_int.h"
#include "ddprun_version.h"
#include "runner/core/exit_code.h"
#include "runner/host/node_host.h"
#include "runner/io/asio_transport.h"
#include "runner/io/console_writer.h"
#include "runner/io/controller_link.h"
#include "runner/io/node_identity_slurm.h"
#include "runner/io/etcd_store.h"
#include "runner/io/event_file.h"
#include "runner/io/guardian.h"
#include "runner/io/journal.h"
#include "runner/io/metrics_server.h"
#include "runner/io/net_interfaces.h"
#include "runner/io/probe_listener.h"
#include "runner/io/process_launcher.h"
#include "runner/io/worker_module.h"
#include "schema/canonical.h"
#include "schema/diagnostics.h"
#include "schema/duration.h"
#include "schema/worker_env.h"

extern char** environ;

namespace ddprun::io {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

// At exit the console gets this long to take what is still queued (the summary); a console
// nobody reads does not hold the exit longer.
constexpr int kExitFlushLimitMs = 2000;

class RealClock final : public host::Clock {
 public:
  TimePoint Now() const override {
    return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
  }
};

class AsioTimer final : public host::Timer {
 public:
  explicit AsioTimer(asio::io_context& io) : timer_(io) {}
  void SetCallback(std::function<void()> on_fire) { on_fire_ = std::move(on_fire); }
  void ArmAt(TimePoint when) override {
    const uint64_t generation = ++generation_;
    timer_.expires_at(std::chrono::steady_clock::time_point(when.time_since_epoch()));
    timer_.async_wait([this, generation](error_code ec) {
      if (ec || generation != generation_) return;  // replaced or cancelled
      on_fire_();
    });
  }
  void Disarm() override {
    ++generation_;
    timer_.cancel();
  }

 private:
  asio::steady_timer timer_;
  std::function<void()> on_fire_;
  uint64_t generation_ = 0;
};

// The node's metrics with the wall clock, for the `_timestamp_seconds` families.
host::NodeMetrics MetricsNow(const host::NodeHost& node) {
  host::NodeMetrics metrics = node.Metrics();
  metrics.unix_time_seconds =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return metrics;
}

class TerminalConsole final : public host::Console {
 public:
  // Colour as `check` has it: only on a terminal, and never with NO_COLOR set (no-color.org).
  TerminalConsole(ConsoleWriter& writer, int node_rank, bool verbose)
      : writer_(writer), node_rank_(node_rank), verbose_(verbose),
        color_(::isatty(STDERR_FILENO) == 1 && std::getenv("NO_COLOR") == nullptr) {}
  void Log(core::LogLevel level, std::string_view source, std::string_view text) override {
    if (level == core::LogLevel::kDebug && !verbose_) return;
    const char* tag = level == core::LogLevel::kError  ? "error: "
                      : level == core::LogLevel::kWarn ? "warning: "
                                                       : "";
    // The coordinator speaks for the job; the agent for this node.
    const std::string who = source == "coordinator" ? "coordinator" : fmt::format("n{}", node_rank_);
    const bool paint = color_ && *tag != '\0';
    Print(fmt::format("[ddprun {} {}] {}{}{}{}\n", Clock(), who,
                      !paint ? "" : level == core::LogLevel::kError ? "\x1b[1;31m" : "\x1b[1;35m",
                      tag, paint ? "\x1b[0m" : "", EscapeLinesForTerminal(text)));
  }
  void Summary(std::string_view text) override {
    const std::string rule(72, '=');
    // This node's own facts (its log folder, logs it could not write) follow the job's words.
    std::string footer = footer_ ? footer_() : "";
    if (!footer.empty() && footer.back() == '\n') footer.pop_back();
    if (!job_summary_) {
      if (!footer.empty()) Log(core::LogLevel::kInfo, "agent", footer);
      return;
    }
    // The summary carries text from other nodes and from workers (tracebacks, a peer's
    // reason): escaped, like every line this console prints.
    Print(fmt::format("{}\n{}\n{}{}{}\n", rule, EscapeLinesForTerminal(text),
                      EscapeLinesForTerminal(footer), footer.empty() ? "" : "\n", rule));
  }
  void SetSummaryFooter(std::function<std::string()> footer) { footer_ = std::move(footer); }
  void OmitJobSummary() { job_summary_ = false; }

 private:
  static std::string Clock() {
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm tm{};
    ::localtime_r(&t, &tm);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    return fmt::format("{:02}:{:02}:{:02}.{:03}", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  }
  void Print(const std::string& text) { writer_.Write(ConsoleWriter::Stream::kErr, text); }
  ConsoleWriter& writer_;
  int node_rank_;
  bool verbose_;
  bool color_;
  bool job_summary_ = true;
  std::function<std::string()> footer_;
};

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

std::optional<int> ParseRank(const char* text) {
  if (!text) return std::nullopt;
  const auto value = ParseNonNegative(text, 1'000'000);
  if (!value) return std::nullopt;
  return static_cast<int>(*value);
}

std::vector<std::string> LocalAddresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf, sizeof buf);
    } else {
      continue;
    }
    out.emplace_back(buf);
  }
  ::freeifaddrs(list);
  return out;
}

bool IsAddressLike(const std::string& text) {
  return text.find(':') != std::string::npos ||
         text.find_first_not_of("0123456789.") == std::string::npos;
}

uint64_t MakeInstance() {
  // Unpredictable: it also seeds the coordinator's challenge nonces.
  uint64_t value = 0;
  if (::getrandom(&value, sizeof value, 0) == static_cast<ssize_t>(sizeof value)) return value;
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return (static_cast<uint64_t>(::getpid()) << 32) ^ static_cast<uint64_t>(now);
}

/// Addresses the listed nodes may connect from; empty (anyone) when nodes are not listed.
std::vector<asio::ip::address> AllowedPeers(asio::io_context& io, const JobSpec& spec,
                                            host::Console& console) {
  std::vector<asio::ip::address> allowed;
  if (spec.cluster.nodes.empty()) return allowed;
  asio::ip::tcp::resolver resolver(io);
  for (const std::string& node : spec.cluster.nodes) {
    error_code ec;
    auto results = resolver.resolve(node, "", ec);
    if (ec) {
      console.Log(core::LogLevel::kWarn, "coordinator",
                  fmt::format("cannot resolve cluster.nodes entry \"{}\" ({}); connections from it "
                              "will be refused",
                              node, ec.message()));
      continue;
    }
    for (const auto& entry : results) allowed.push_back(entry.endpoint().address());
  }
  // Node 0's own agent may reach master_addr over loopback, or from any address of this host:
  // on a stock host its own name in cluster.nodes resolves to 127.0.1.1 here, while its agent
  // connects to master_addr (an address of a NIC) from that NIC's address.
  allowed.push_back(asio::ip::address_v4::loopback());
  allowed.push_back(asio::ip::address_v6::loopback());
  for (const LocalInterface& local : LocalInterfaces()) {
    error_code ec;
    const auto address = asio::ip::make_address(local.address, ec);
    if (!ec) allowed.push_back(address);
  }
  return allowed;
}

// Descriptors kept free for what must never starve: per worker its log file, two pipes while
// it starts and the status pipe of vfork, its pidfd, the error file when it exits; plus the
// agent's own (connections to the master, resolver, guardian, signals).
// The metrics endpoint's listener and connections (and one it refuses) come on top.
size_t DescriptorReserve(const JobSpec& spec) {
  const size_t metrics = spec.metrics.Served() ? MetricsServer::Limits{}.max_connections + 2 : 0;
  return 64 + metrics + 8 * static_cast<size_t>(std::max(spec.cluster.nproc_per_node, 1));
}

/// Raises the soft RLIMIT_NOFILE to the hard limit: an agent holds one descriptor per
/// connection and several per worker, and distributions default to a soft limit of 1024.
/// Returns the limits found at start (what workers get back) and the soft limit now.
struct NoFileLimits {
  rlimit original{};
  rlim_t soft_now = 0;
};
NoFileLimits RaiseNoFileLimit() {
  NoFileLimits out;
  if (::getrlimit(RLIMIT_NOFILE, &out.original) != 0) return out;
  out.soft_now = out.original.rlim_cur;
  if (out.original.rlim_cur < out.original.rlim_max) {
    rlimit raised = out.original;
    raised.rlim_cur = out.original.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) out.soft_now = raised.rlim_cur;
  }
  return out;
}

/// The job's log folder as the user can open it: relative to the current directory when it
/// lies below it ("logs/resnet50/"), else absolute.
std::string LogsHint(const std::string& run_folder) {
  const std::filesystem::path folder = run_folder;
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  if (!ec) {
    const auto relative = folder.lexically_relative(cwd);
    if (!relative.empty() && *relative.begin() != "..") return relative.string() + "/";
  }
  return folder.string() + "/";
}

/// Descriptors above stderr that the agent was started with (a parent that leaks them): they
/// count against RLIMIT_NOFILE like our own.
size_t InheritedDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return 0;
  size_t count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const auto fd = ParseNonNegative(entry->d_name, std::numeric_limits<int>::max());
    if (fd && *fd > 2 && *fd != ::dirfd(dir)) ++count;
  }
  ::closedir(dir);
  return count;
}

/// The interface this node's workers bind their own sockets to (gloo, NCCL, TensorPipe): the
/// one that holds this node's cluster.nodes address, else the one it sends from towards
/// master_addr. nullopt for a job of one agent (its workers talk among themselves) and when
/// neither is found.
std::optional<SocketInterface> WorkerSocketInterface(const JobSpec& spec, int node_rank) {
  if (spec.cluster.Agents() <= 1) return std::nullopt;
  std::vector<std::string> hosts = spec.cluster.nodes;
  hosts.insert(hosts.end(), spec.cluster.spare_hosts.begin(), spec.cluster.spare_hosts.end());
  std::vector<std::string> listed;
  std::string listed_as;
  if (node_rank >= 0 && static_cast<size_t>(node_rank) < hosts.size()) {
    listed = ResolveAll(hosts[static_cast<size_t>(node_rank)]);
    listed_as = node_rank < spec.cluster.nnodes
                    ? fmt::format("cluster.nodes[{}]", node_rank)
                    : fmt::format("cluster.spares[{}]", node_rank - spec.cluster.nnodes);
  }
  std::string route_source;
  if (const auto master = ResolveAll(spec.cluster.master_addr); !master.empty()) {
    route_source = RouteSourceAddress(master.front(), spec.cluster.master_port);
  }
  return ChooseSocketInterface(LocalInterfaces(), listed, listed_as, route_source,
                               fmt::format("master_addr {}", spec.cluster.master_addr));
}

}  // namespace

Result<SharedSecret> ReadSharedSecret() {
  if (const char* value = std::getenv("DDPRUN_SECRET"); value && *value) {
    return SharedSecret{std::string(value), ""};
  }
  const char* path = std::getenv("DDPRUN_SECRET_FILE");
  if (!path || !*path) return SharedSecret{};
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(fmt::format("cannot read DDPRUN_SECRET_FILE {}: {}", path, std::strerror(errno)));
  SharedSecret shared;
  shared.secret.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  while (!shared.secret.empty() && (shared.secret.back() == '\n' || shared.secret.back() == '\r')) {
    shared.secret.pop_back();
  }
  if (shared.secret.empty()) return Fail(fmt::format("DDPRUN_SECRET_FILE {} is empty", path));
  struct stat st {};
  if (::stat(path, &st) == 0 && (st.st_mode & 077) != 0) {
    shared.warning = fmt::format("DDPRUN_SECRET_FILE {} is readable by other users (chmod 600 it)", path);
  }
  return shared;
}

Result<DetectedRank> DetectNodeRank(const JobSpec& spec, std::optional<int> flag) {
  const int nnodes = spec.cluster.nnodes;
  const int agents = spec.cluster.Agents();
  auto in_range = [&](int rank, const std::string& source) -> Result<DetectedRank> {
    if (rank >= 0 && rank < agents) return DetectedRank{rank, source, ""};
    if (spec.cluster.spares > 0) {
      return Fail(fmt::format("node rank {} from {} is out of range: the job has {} node{} (ranks "
                              "0..{}) and {} spare{} (ranks {}..{})",
                              rank, source, nnodes, nnodes == 1 ? "" : "s", nnodes - 1,
                              spec.cluster.spares, spec.cluster.spares == 1 ? "" : "s", nnodes,
                              agents - 1));
    }
    return Fail(fmt::format("node rank {} from {} is out of range: the job has {} node{} (ranks 0..{})",
                            rank, source, nnodes, nnodes == 1 ? "" : "s", nnodes - 1));
  };
  if (flag) return in_range(*flag, "--node-rank");
  // An empty variable counts as unset, as shells and schedulers often leave them.
  if (const char* value = std::getenv("DDPRUN_NODE_RANK"); value && *value) {
    if (auto rank = ParseRank(value)) return in_range(*rank, "DDPRUN_NODE_RANK");
    return Fail(fmt::format("DDPRUN_NODE_RANK=\"{}\" is not a node rank (a non-negative integer)", value));
  }
  if (const char* value = std::getenv("SLURM_NODEID"); value && *value) {
    auto rank = RankFromSlurmNodeId(spec, value, DetectNodeRankByHost(spec));
    if (!rank) return rank;
    auto checked = in_range(rank->rank, rank->how);
    if (checked) checked->warning = rank->warning;
    return checked;
  }
  return DetectNodeRankByHost(spec);
}

Result<DetectedRank> DetectNodeRankByHost(const JobSpec& spec) {
  const int nnodes = spec.cluster.nnodes;
  if (spec.cluster.nodes.empty()) {
    return Fail("cannot tell this node's rank: cluster.nodes is not listed (only nnodes); pass "
                "--node-rank N or set DDPRUN_NODE_RANK on each node");
  }
  const std::string host = LocalHostName();
  const std::string short_host = host.substr(0, host.find('.'));
  const auto addresses = LocalAddresses();
  std::vector<int> matches;
  // The nodes, then the spares: a spare's rank is nnodes + its position in cluster.spares.
  std::vector<std::string> hosts = spec.cluster.nodes;
  hosts.insert(hosts.end(), spec.cluster.spare_hosts.begin(), spec.cluster.spare_hosts.end());
  for (size_t i = 0; i < hosts.size(); ++i) {
    const std::string& node = hosts[i];
    const std::string short_node = node.substr(0, node.find('.'));
    const bool name_match = !host.empty() && (node == host || (short_node == short_host && !IsAddressLike(node)));
    const bool addr_match = std::find(addresses.begin(), addresses.end(), node) != addresses.end();
    if (name_match || addr_match) matches.push_back(static_cast<int>(i));
  }
  if (matches.size() == 1) {
    if (matches[0] >= nnodes) {
      return DetectedRank{matches[0], fmt::format("this host ({}) is cluster.spares[{}]", host,
                                                  matches[0] - nnodes), ""};
    }
    return DetectedRank{matches[0], fmt::format("this host ({}) is cluster.nodes[{}]", host, matches[0]), ""};
  }
  if (matches.empty()) {
    return Fail(fmt::format("cannot tell this node's rank: this host ({}, addresses {}) is not in "
                            "cluster.nodes [{}]; pass --node-rank N or set DDPRUN_NODE_RANK",
                            host, fmt::join(addresses, ", "), fmt::join(spec.cluster.nodes, ", ")));
  }
  return Fail(fmt::format("cannot tell this node's rank: this host matches several entries of "
                          "cluster.nodes (positions {}); pass --node-rank N",
                          fmt::join(matches, ", ")));
}

namespace {

bool IsLoopback(const asio::ip::address& address) {
  if (address.is_v6() && address.to_v6().is_v4_mapped()) return address.to_v6().to_v4().is_loopback();
  return address.is_loopback();
}

/// The first address `name` resolves to here, as Listen binds it; nullopt if it does not.
std::optional<asio::ip::address> FirstAddress(const std::string& name) {
  asio::io_context io;
  asio::ip::tcp::resolver resolver(io);
  error_code ec;
  auto results = resolver.resolve(name, "", ec);
  if (ec || results.empty()) return std::nullopt;
  return results.begin()->endpoint().address();
}

/// The address /etc/hosts gives `name` ("" if it has no line for it).
std::string HostsFileEntry(const std::string& name) {
  std::ifstream in("/etc/hosts");
  std::string line;
  auto lower = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text;
  };
  const std::string wanted = lower(name);
  for (int lines = 0; lines < 10000 && std::getline(in, line); ++lines) {
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    std::string address, alias;
    if (!(fields >> address)) continue;
    while (fields >> alias) {
      if (lower(alias) == wanted) return address;
    }
  }
  return "";
}

}  // namespace

std::string LoopbackMasterProblem(const JobSpec& spec) {
  const std::string& name = spec.cluster.master_addr;
  if (spec.cluster.nnodes <= 1 || name.empty() || IsAddressLike(name)) return "";
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // "localhost" says on its face that the job stays on this machine (tests, a laptop).
  if (lower == "localhost" || lower.starts_with("localhost.") || lower.ends_with(".localhost") ||
      lower == "ip6-localhost" || lower == "ip6-loopback") {
    return "";
  }
  const auto address = FirstAddress(name);
  if (!address || !IsLoopback(*address)) return "";
  // Every listed node on this machine's loopback: a one-machine job by design.
  if (!spec.cluster.nodes.empty() &&
      std::all_of(spec.cluster.nodes.begin(), spec.cluster.nodes.end(), [](const std::string& node) {
        const auto a = FirstAddress(node);
        return a && IsLoopback(*a);
      })) {
    return "";
  }
  const std::string ip = address->is_v6() && address->to_v6().is_v4_mapped() ? address->to_v6().to_v4().to_string()
                                                                            : address->to_string();
  const std::string hosts_ip = HostsFileEntry(name);
  std::string cause;
  if (!hosts_ip.empty()) {
    cause = fmt::format("/etc/hosts maps {} to {}{}", name, hosts_ip,
                        hosts_ip == "127.0.1.1" ? " (Debian and Ubuntu do that for the host's own name)" : "");
  } else {
    cause = fmt::format("{} resolves to {} on this host", name, ip);
  }
  std::vector<std::string> reachable;
  for (const std::string& local : LocalAddresses()) {
    error_code ec;
    const auto parsed = asio::ip::make_address(local, ec);
    if (!ec && !parsed.is_loopback() && !(parsed.is_v6() && parsed.to_v6().is_link_local())) reachable.push_back(local);
  }
  const bool explicit_addr = spec.locations.count("cluster.master_addr") > 0;
  return fmt::format(
      "cluster.master_addr \"{}\"{} is a loopback address on this host: {}; node 0 would listen on {}, "
      "where no other node can reach it, and another node would connect to itself\n"
      "hint: set cluster.master_addr to an address of node 0 that the other nodes reach{}, or map {} to "
      "that address in /etc/hosts on every node{}",
      name, explicit_addr ? "" : " (cluster.nodes[0])", cause, ip,
      reachable.empty() ? "" : fmt::format(" (this host has {})", fmt::join(reachable, ", ")), name,
      // A line added below the 127.0.1.1 one is not enough: resolvers still give 127.0.1.1 first.
      hosts_ip.empty() ? "" : fmt::format(" (on this host in place of {})", hosts_ip));
}

int RunNode(const JobSpec& spec, const NodeRunOptions& options) {
  // A child subreaper: whatever a worker starts and leaves behind (a double fork, `setsid
  // cmd &`) is reparented to this agent instead of init, so the agent and its guardian can
  // still find it below the agent and kill it (runner/io/guardian.h).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  // Started with stdin, stdout or stderr closed (`>&-`), the next pipe or socket would get
  // that number and console lines would be written into it.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int null_fd = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null_fd >= 0 && null_fd != fd) {
        ::dup2(null_fd, fd);
        ::close(null_fd);
      }
    }
  }
  const size_t inherited_fds = InheritedDescriptors();
  // Fork the guardian before anything can start a thread (Asio's resolver does).
  Guardian guardian;
  std::signal(SIGPIPE, SIG_IGN);
  const NoFileLimits nofile = RaiseNoFileLimit();

  const std::filesystem::path job_dir = options.job_dir.empty() ? "." : options.job_dir;
  core::Agent::Config config;
  config.node_rank = options.node_rank;
  config.host = options.host;
  config.canonical = CanonicalForm(spec);
  config.fingerprint = FingerprintOfCanonical(config.canonical);
  config.instance = MakeInstance();
  config.ddprun_version = DDPRUN_VERSION;
  // Every run of this agent writes into a new folder of its own (schema/worker_env.h).
  const std::string logs_root = std::filesystem::absolute(job_dir / spec.logs.dir).lexically_normal().string();
  const std::string run_folder = RunLogFolder(
      spec, RunFolderName(static_cast<int64_t>(std::time(nullptr)), options.node_rank,
                          static_cast<uint32_t>(config.instance)));
  config.logs_dir = logs_root + "/" + run_folder;
  config.inherited_env = CurrentEnvironment();
  // `import ddprun` (progress beacons) works in every worker without installing anything.
  config.python_dir = DdprunPythonDir().value_or("");
  // Workers run user code: they do not need the job's secret.
  config.inherited_env.erase("DDPRUN_SECRET");
  config.inherited_env.erase("DDPRUN_SECRET_FILE");
  // Nor srun's task layout, which Lightning and Accelerate would read as the process layout.
  RemoveSlurmTaskLayout(config.inherited_env);
  const auto secret = ReadSharedSecret();
  if (!secret) {
    std::fprintf(stderr, "ddprun: error: %s\n", secret.error().c_str());
    return 2;
  }
  config.secret = secret->secret;
  const std::string secret_warning = secret->warning;
  const auto socket_interface = WorkerSocketInterface(spec, options.node_rank);
  if (socket_interface) config.socket_ifname = socket_interface->name;

  asio::io_context io;
  // Every console line of this agent, its workers' included, goes through this writer, so a
  // terminal that stops reading never stops the loop (heartbeats, rank logs).
  ConsoleWriter console_writer(io, LogsHint(config.logs_dir));
  RealClock clock;
  AsioTimer timer(io);
  // A connect attempt waits at most a few heartbeats; the agent retries until the deadline.
  AsioTransport transport(io, spec.timeouts.ConnectTimeout());
  // What the other nodes probe before the first round (rendezvous.probe): a port other than
  // master_port at the address the workers' sockets use, as gloo and NCCL will listen.
  ProbeListener probe_listener(io);
  if (socket_interface && spec.rendezvous.probe != JobSpec::Rendezvous::Probe::kOff && spec.cluster.Agents() > 1) {
    if (auto endpoint = probe_listener.Open(socket_interface->address)) config.probe_endpoint = *endpoint;
  }
  RealProcessLauncher::Options launcher_options;
  launcher_options.command = spec.job.command;
  launcher_options.workdir = std::filesystem::absolute(job_dir / spec.job.workdir).lexically_normal().string();
  launcher_options.logs_root = logs_root;
  launcher_options.run_folder = run_folder;
  launcher_options.node_rank = options.node_rank;
  launcher_options.console = spec.logs.console;
  launcher_options.inherited_env = config.inherited_env;
  launcher_options.guardian = &guardian;
  launcher_options.raw_console_rank = options.raw_console_rank;
  launcher_options.console_writer = &console_writer;
  // Workers get the limit the agent was started with, as under torchrun; only the agent
  // needs the raised one.
  launcher_options.worker_nofile = nofile.original;
  TerminalConsole console(console_writer, options.node_rank, options.verbose);
  launcher_options.report = [&console](const std::string& text) {
    console.Log(core::LogLevel::kError, "agent", text);
  };
  // job.preload: workers are forked from a template that imported these (warm_template.h).
  // (not for `ddprun preflight`, whose workers are its own program).
  if (!spec.job.is_preflight) launcher_options.preload = spec.job.preload;
  if (!launcher_options.preload.empty()) {
    launcher_options.template_script = DdprunWarmTemplate().value_or("");
    WorkerPosition position;
    position.node_rank = options.node_rank;
    position.run_id = "-";
    position.python_dir = config.python_dir;
    position.socket_ifname = config.socket_ifname;
    launcher_options.template_env = WorkerEnvironment(spec, position, config.inherited_env);
  }
  launcher_options.note = [&console](bool warning, const std::string& text) {
    console.Log(warning ? core::LogLevel::kWarn : core::LogLevel::kInfo, "agent", text);
  };
  RealProcessLauncher launcher(io, launcher_options);
  console.SetSummaryFooter([&launcher] { return launcher.SummaryLines(); });
  if (!options.print_job_summary) console.OmitJobSummary();

  // Node 0's journal lets a coordinator started again here (a reboot, a killed agent) wait for
  // the workers of the previous one to be gone before its first round (docs/running.md).
  std::optional<FileJournal> journal;
  if (options.node_rank == 0) {
    journal.emplace(logs_root + "/" + spec.job.name, [&console](const std::string& text) {
      console.Log(core::LogLevel::kWarn, "coordinator", text);
    });
  }
  // The event log (docs/report.md) lives in this run's log folder beside the rank logs. The
  // folder is made now rather than at the first spawn, so that a rendezvous that never
  // completes is recorded too. Without it the job runs as before, with a warning.
  std::unique_ptr<FileEventLog> events;
  const auto log_warning = [&console](const std::string& text) {
    console.Log(core::LogLevel::kWarn, "agent", text);
  };
  if (const Status opened = launcher.OpenRunFolder(); !opened) {
    log_warning("no event log for this run: " + opened.error());
  } else if (auto created = FileEventLog::Create(launcher.run_folder_fd(), config.logs_dir, options.node_rank,
                                                 options.host, log_warning);
             !created) {
    log_warning("no event log for this run: " + created.error());
  } else {
    events = *std::move(created);
    launcher.SetStartEvents([&events, &clock](const host::Event& event) { events->Record(clock.Now(), event); });
  }
  // The template's imports overlap the rendezvous.
  launcher.StartWarm();
  // rendezvous.backend = "etcd": the coordinator role and the job's state live in etcd, reached
  // through its JSON gateway on this loop. Nothing connects yet; files it cannot load (TLS) are
  // the job file's fault.
  std::unique_ptr<EtcdStore> etcd;
  if (spec.rendezvous.Etcd()) {
    auto created = EtcdStore::Create(io, EtcdStore::FromSpec(spec.rendezvous));
    if (!created) {
      console.Summary("ddprun cannot use the job's etcd: " + created.error());
      console_writer.FlushForExit(kExitFlushLimitMs);
      return core::ToInt(core::ExitCode::kUsage);
    }
    etcd = *std::move(created);
  }
  int exit_code = 70;
  host::Ports ports{&clock, &timer, &transport, &launcher, &console, journal ? &*journal : nullptr,
                    events.get(), etcd.get()};
  // With a metrics endpoint that lingers, the end waits for a scrape of the final state.
  std::function<void()> on_job_end = [&io] { io.stop(); };
  bool lingering = false;
  host::NodeHost node(spec, config, ports, [&](int code) {
    exit_code = code;
    on_job_end();
  });
  timer.SetCallback([&] { node.OnTimer(); });

  // SIGHUP (a closed terminal or ssh session) is an interrupt like the others: the job ends
  // everywhere with 129 and a summary, instead of this agent vanishing as if it crashed.
  asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  std::function<void(error_code, int)> on_signal = [&](error_code ec, int signal) {
    if (ec) return;
    if (lingering) {  // the job is over; only the metrics wait, and not for an interrupt
      io.stop();
      return;
    }
    node.OnSignal(signal);
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);
  std::unique_ptr<ControllerLink> controller;
  if (options.controlled_by_up) {
    auto watched = ControllerLink::Watch(io, [&node](int signal) { node.OnSignal(signal); });
    if (!watched) {
      std::fprintf(stderr, "ddprun: error: %s\n", watched.error().c_str());
      return 70;
    }
    controller = *std::move(watched);
  }

  const bool spare = options.node_rank >= spec.cluster.nnodes;
  console.Log(core::LogLevel::kInfo, "agent",
              fmt::format("ddprun {}: job \"{}\", {} {} of {} ({}), {} worker{} here, master {}:{}, "
                          "job fingerprint {}",
                          DDPRUN_VERSION, spec.job.name, spare ? "spare" : "node",
                          spare ? options.node_rank - spec.cluster.nnodes : options.node_rank,
                          spare ? spec.cluster.spares : spec.cluster.nnodes,
                          options.host, spec.cluster.nproc_per_node,
                          spec.cluster.nproc_per_node == 1 ? "" : "s", spec.cluster.master_addr,
                          spec.cluster.master_port, config.fingerprint.substr(0, 12)));
  console.Log(core::LogLevel::kInfo, "agent",
              fmt::format("logs of this run: {}/ (also {}/{}/{})", config.logs_dir, spec.logs.dir,
                          spec.job.name, NodeLatestLink(options.node_rank)));
  if (!secret_warning.empty()) console.Log(core::LogLevel::kWarn, "agent", secret_warning);
  if (spec.cluster.Agents() > 1) {
    // Which interface the workers' sockets use, and which of the three names the user set.
    std::vector<std::string> set, kept;
    for (std::string_view view : kSocketIfnameNames) {
      const std::string name(view);
      const bool user = config.inherited_env.count(name) > 0 || spec.job.env.count(name) > 0;
      (user ? kept : set).push_back(name);
    }
    if (socket_interface && !set.empty()) {
      console.Log(core::LogLevel::kInfo, "agent",
                  fmt::format("workers' sockets use interface {} ({}): {} set{}", socket_interface->name,
                              socket_interface->reason, fmt::join(set, ", "),
                              kept.empty() ? "" : fmt::format("; {} kept as set", fmt::join(kept, ", "))));
    } else if (!socket_interface && !set.empty()) {
      console.Log(core::LogLevel::kWarn, "agent",
                  fmt::format("cannot tell which interface the other nodes reach this node at (no "
                              "interface holds this node's cluster.nodes address or routes to "
                              "master_addr {}); gloo and NCCL pick their own: if ranks cannot connect, "
                              "set {} to that interface in this agent's environment",
                              spec.cluster.master_addr, fmt::join(set, ", ")));
    }
  }
  if (config.secret.empty() && options.node_rank == 0) {
    console.Log(core::LogLevel::kWarn, "coordinator",
                "no shared secret (DDPRUN_SECRET or DDPRUN_SECRET_FILE): any host that can reach "
                "the master port can join this job");
  }
  transport.SetAllowedPeers(AllowedPeers(io, spec, console), [&console](const std::string& peer) {
    console.Log(core::LogLevel::kWarn, "coordinator",
                fmt::format("refused a connection from {}: not one of cluster.nodes", peer));
  });
  AsioTransport::Limits limits;
  limits.max_relays = AsioTransport::Limits::kRelaysPerRank * static_cast<size_t>(spec.WorldSize()) + 64;
  const size_t reserve = DescriptorReserve(spec) + inherited_fds;
  const size_t soft = nofile.soft_now == RLIM_INFINITY ? size_t{1} << 20 : static_cast<size_t>(nofile.soft_now);
  limits.max_sockets = soft > reserve + 16 ? soft - reserve : 16;
  transport.SetLimits(limits);
  transport.SetWarningSink([&console](const std::string& text) {
    console.Log(core::LogLevel::kWarn, "coordinator", text);
  });
  if (soft < reserve + 64) {
    console.Log(core::LogLevel::kWarn, "agent",
                fmt::format("RLIMIT_NOFILE is {} (hard limit too): {} descriptors are kept for workers and "
                            "logs{}, so at most {} connections are accepted at once; raise it (ulimit -n) "
                            "for a job under load",
                            soft, reserve - inherited_fds,
                            inherited_fds == 0 ? "" : fmt::format(" and {} were open at start", inherited_fds),
                            limits.max_sockets));
  }
  // A master that listens on loopback in a job of several hosts fails late and far away
  // ("connection refused" on every other node): say why here, at once.
  if (const std::string loopback = LoopbackMasterProblem(spec); !loopback.empty()) {
    if (options.node_rank == 0) {
      console.Summary("ddprun cannot start node 0's coordinator: " + loopback);
      console_writer.FlushForExit(kExitFlushLimitMs);
      return 3;
    }
    console.Log(core::LogLevel::kWarn, "agent", loopback);
  }
  if (const Status started = node.Start(); !started) {
    console.Summary("ddprun cannot start node 0's coordinator: " + started.error() +
                    (options.rank_source.empty() ? "" : "\n(this agent is node 0: " + options.rank_source + ")"));
    console_writer.FlushForExit(kExitFlushLimitMs);
    return 3;
  }
  // The metrics endpoint is an extra: a node that cannot listen says why and runs the job.
  std::optional<MetricsServer> metrics;
  if (spec.metrics.Served()) {
    metrics.emplace(io, [&node] { return host::RenderMetricsText(MetricsNow(node)); });
    const std::string addr = spec.MetricsAddressOf(options.node_rank);
    if (const Status listening = metrics->Listen(addr, spec.MetricsPortOf(options.node_rank)); !listening) {
      console.Log(core::LogLevel::kWarn, "agent",
                  fmt::format("metrics.listen = \"{}\": {}; this node serves no metrics, the job goes on",
                              spec.metrics.Listen(), listening.error()));
      metrics.reset();
    } else {
      const bool v6 = addr.find(':') != std::string::npos;
      console.Log(core::LogLevel::kInfo, "agent",
                  fmt::format("serving GET /metrics on {}{}{}:{} ({})", v6 ? "[" : "", addr, v6 ? "]" : "",
                              metrics->port(), options.node_rank == 0 ? "this node's and the job's" : "this node's"));
    }
  }
  asio::steady_timer linger_timer(io);
  if (metrics && spec.metrics.linger > Duration::zero()) {
    on_job_end = [&] {
      lingering = true;
      const uint64_t first_final_render = metrics->renders() + 1;
      console.Log(core::LogLevel::kInfo, "agent",
                  fmt::format("GET /metrics shows the job's end until one scrape has read it, for at "
                              "most {} (metrics.linger)",
                              FormatDuration(spec.metrics.linger)));
      metrics->OnScraped([&io, first_final_render](uint64_t render) {
        if (render >= first_final_render) io.stop();
      });
      linger_timer.expires_after(spec.metrics.linger);
      linger_timer.async_wait([&io](error_code ec) {
        if (!ec) io.stop();
      });
    };
  }
  guardian.Supervise(io, [&console](const std::string& text) {
    console.Log(core::LogLevel::kWarn, "agent", text);
  });
  io.run();
  if (metrics) metrics->Shutdown();
  guardian.StopSupervising();
  launcher.KillAll();
  guardian.Release();
  transport.Shutdown();
  console_writer.FlushForExit(kExitFlushLimitMs);
  return exit_code;
}

}  // namespace ddprun::io
