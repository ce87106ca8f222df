#include "runner/io/driver.h"

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

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

#include "ddprun_version.h"
#include "runner/host/node_host.h"
#include "runner/io/asio_transport.h"
#include "runner/io/guardian.h"
#include "runner/io/process_launcher.h"
#include "schema/canonical.h"

extern char** environ;

namespace ddprun::io {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

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

class TerminalConsole final : public host::Console {
 public:
  // Colour as `check` has it: only on a terminal, and never with NO_COLOR set (no-color.org).
  TerminalConsole(int node_rank, bool verbose)
      : node_rank_(node_rank), verbose_(verbose),
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
                      tag, paint ? "\x1b[0m" : "", text));
  }
  void Summary(std::string_view text) override {
    const std::string rule(72, '=');
    Print(fmt::format("{}\n{}\n{}\n", rule, text, rule));
  }

 private:
  static std::string Clock() {
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm tm{};
    ::localtime_r(&t, &tm);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    return fmt::format("{:02}:{:02}:{:02}.{:03}", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  }
  static void Print(const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
  int node_rank_;
  bool verbose_;
  bool color_;
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
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < 0 || value > 1'000'000) return std::nullopt;
  return static_cast<int>(value);
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
  // Node 0's own agent may reach master_addr over loopback.
  allowed.push_back(asio::ip::address_v4::loopback());
  allowed.push_back(asio::ip::address_v6::loopback());
  return allowed;
}

}  // namespace

std::optional<std::string> ReadSharedSecret(std::string& error, std::string& warning) {
  if (const char* value = std::getenv("DDPRUN_SECRET"); value && *value) return std::string(value);
  const char* path = std::getenv("DDPRUN_SECRET_FILE");
  if (!path || !*path) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = fmt::format("cannot read DDPRUN_SECRET_FILE {}: {}", path, std::strerror(errno));
    return std::nullopt;
  }
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) {
    error = fmt::format("DDPRUN_SECRET_FILE {} is empty", path);
    return std::nullopt;
  }
  struct stat st {};
  if (::stat(path, &st) == 0 && (st.st_mode & 077) != 0) {
    warning = fmt::format("DDPRUN_SECRET_FILE {} is readable by other users (chmod 600 it)", path);
  }
  return secret;
}

std::string LocalHostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

std::optional<int> DetectNodeRank(const JobSpec& spec, std::optional<int> flag, std::string& error,
                                  std::string& how) {
  const int nnodes = spec.cluster.nnodes;
  auto in_range = [&](int rank, const std::string& source) -> std::optional<int> {
    if (rank >= 0 && rank < nnodes) {
      how = source;
      return rank;
    }
    error = fmt::format("node rank {} from {} is out of range: the job has {} node{} (ranks 0..{})",
                        rank, source, nnodes, nnodes == 1 ? "" : "s", nnodes - 1);
    return std::nullopt;
  };
  if (flag) return in_range(*flag, "--node-rank");
  for (const char* var : {"DDPRUN_NODE_RANK", "SLURM_NODEID"}) {
    // An empty variable counts as unset, as shells and schedulers often leave them.
    if (const char* value = std::getenv(var); value && *value) {
      if (auto rank = ParseRank(value)) return in_range(*rank, var);
      error = fmt::format("{}=\"{}\" is not a node rank (a non-negative integer)", var, value);
      return std::nullopt;
    }
  }
  if (spec.cluster.nodes.empty()) {
    error = "cannot tell this node's rank: cluster.nodes is not listed (only nnodes); pass "
            "--node-rank N or set DDPRUN_NODE_RANK on each node";
    return std::nullopt;
  }
  const std::string host = LocalHostName();
  const std::string short_host = host.substr(0, host.find('.'));
  const auto addresses = LocalAddresses();
  std::vector<int> matches;
  for (size_t i = 0; i < spec.cluster.nodes.size(); ++i) {
    const std::string& node = spec.cluster.nodes[i];
    const std::string short_node = node.substr(0, node.find('.'));
    const bool name_match = !host.empty() && (node == host || (short_node == short_host && !IsAddressLike(node)));
    const bool addr_match = std::find(addresses.begin(), addresses.end(), node) != addresses.end();
    if (name_match || addr_match) matches.push_back(static_cast<int>(i));
  }
  if (matches.size() == 1) {
    how = fmt::format("this host ({}) is cluster.nodes[{}]", host, matches[0]);
    return matches[0];
  }
  if (matches.empty()) {
    error = fmt::format("cannot tell this node's rank: this host ({}, addresses {}) is not in "
                        "cluster.nodes [{}]; pass --node-rank N or set DDPRUN_NODE_RANK",
                        host, fmt::join(addresses, ", "), fmt::join(spec.cluster.nodes, ", "));
  } else {
    error = fmt::format("cannot tell this node's rank: this host matches several entries of "
                        "cluster.nodes (positions {}); pass --node-rank N",
                        fmt::join(matches, ", "));
  }
  return std::nullopt;
}

int RunNode(const JobSpec& spec, const NodeRunOptions& options) {
  // Fork the guardian before anything can start a thread (Asio's resolver does).
  Guardian guardian;
  std::signal(SIGPIPE, SIG_IGN);

  const std::filesystem::path job_dir = options.job_dir.empty() ? "." : options.job_dir;
  core::Agent::Config config;
  config.node_rank = options.node_rank;
  config.host = options.host;
  config.canonical = CanonicalForm(spec);
  config.fingerprint = FingerprintOfCanonical(config.canonical);
  config.instance = MakeInstance();
  config.ddprun_version = DDPRUN_VERSION;
  config.logs_dir = std::filesystem::absolute(job_dir / spec.logs.dir).lexically_normal().string();
  config.inherited_env = CurrentEnvironment();
  // Workers run user code: they do not need the job's secret.
  config.inherited_env.erase("DDPRUN_SECRET");
  config.inherited_env.erase("DDPRUN_SECRET_FILE");
  std::string secret_error, secret_warning;
  const auto secret = ReadSharedSecret(secret_error, secret_warning);
  if (!secret) {
    std::fprintf(stderr, "ddprun: error: %s\n", secret_error.c_str());
    return 2;
  }
  config.secret = *secret;

  asio::io_context io;
  RealClock clock;
  AsioTimer timer(io);
  // A connect attempt waits at most a few heartbeats; the agent retries until the deadline.
  AsioTransport transport(io, std::max<Duration>(Seconds(3), 2 * spec.timeouts.heartbeat));
  RealProcessLauncher::Options launcher_options;
  launcher_options.command = spec.job.command;
  launcher_options.workdir = std::filesystem::absolute(job_dir / spec.job.workdir).lexically_normal().string();
  launcher_options.logs_dir = config.logs_dir;
  launcher_options.node_rank = options.node_rank;
  launcher_options.console = spec.logs.console;
  launcher_options.inherited_env = config.inherited_env;
  launcher_options.guardian = &guardian;
  launcher_options.raw_console_rank = options.raw_console_rank;
  RealProcessLauncher launcher(io, launcher_options);
  TerminalConsole console(options.node_rank, options.verbose);

  int exit_code = 70;
  host::Ports ports{&clock, &timer, &transport, &launcher, &console};
  host::NodeHost node(spec, config, ports, [&](int code) {
    exit_code = code;
    io.stop();
  });
  timer.SetCallback([&] { node.OnTimer(); });

  asio::signal_set signals(io, SIGINT, SIGTERM);
  std::function<void(error_code, int)> on_signal = [&](error_code ec, int signal) {
    if (ec) return;
    node.OnSignal(signal);
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);

  console.Log(core::LogLevel::kInfo, "agent",
              fmt::format("ddprun {}: job \"{}\", node {} of {} ({}), {} worker{} here, master {}:{}, "
                          "job fingerprint {}",
                          DDPRUN_VERSION, spec.job.name, options.node_rank, spec.cluster.nnodes,
                          options.host, spec.cluster.nproc_per_node,
                          spec.cluster.nproc_per_node == 1 ? "" : "s", spec.cluster.master_addr,
                          spec.cluster.master_port, config.fingerprint.substr(0, 12)));
  if (!secret_warning.empty()) console.Log(core::LogLevel::kWarn, "agent", secret_warning);
  if (config.secret.empty() && options.node_rank == 0) {
    console.Log(core::LogLevel::kWarn, "coordinator",
                "no shared secret (DDPRUN_SECRET or DDPRUN_SECRET_FILE): any host that can reach "
                "the master port can join this job");
  }
  transport.SetAllowedPeers(AllowedPeers(io, spec, console), [&console](const std::string& peer) {
    console.Log(core::LogLevel::kWarn, "coordinator",
                fmt::format("refused a connection from {}: not one of cluster.nodes", peer));
  });
  const std::string error = node.Start();
  if (!error.empty()) {
    console.Summary("ddprun cannot start node 0's coordinator: " + error);
    return 3;
  }
  io.run();
  launcher.KillAll();
  transport.Shutdown();
  return exit_code;
}

}  // namespace ddprun::io
