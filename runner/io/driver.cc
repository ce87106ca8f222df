// The real driver's composition root: RunNode builds this node's real ports on one io_context,
// hands them to one NodeHost and runs the loop until the job ends. It composes and decides
// nothing of its own: the process's set-up is process_hygiene.h, the shared secret secrets.h,
// who this node is node_identity.h, the workers' interface net_interfaces.h, and each port
// has its own file (real_time.h, asio_transport.h, process_launcher.h, terminal_console.h,
// journal.h, event_file.h, etcd_store.h).
#include "runner/io/driver.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "ddprun_version.h"
#include "runner/core/exit_code.h"
#include "runner/host/node_host.h"
#include "runner/io/asio_transport.h"
#include "runner/io/console_writer.h"
#include "runner/io/controller_link.h"
#include "runner/io/etcd_store.h"
#include "runner/io/event_file.h"
#include "runner/io/guardian.h"
#include "runner/io/journal.h"
#include "runner/io/metrics_server.h"
#include "runner/io/net_interfaces.h"
#include "runner/io/node_identity.h"
#include "runner/io/node_identity_slurm.h"
#include "runner/io/probe_listener.h"
#include "runner/io/process_hygiene.h"
#include "runner/io/process_launcher.h"
#include "runner/io/real_time.h"
#include "runner/io/secrets.h"
#include "runner/io/terminal_console.h"
#include "runner/io/worker_module.h"
#include "schema/canonical.h"
#include "schema/duration.h"
#include "schema/worker_env.h"

extern char** environ;

namespace ddprun::io {

namespace asio = boost::asio;
using boost::system::error_code;
using core::ExitCode;

namespace {

// At exit the console gets this long to take what is still queued (the summary); a console
// nobody reads does not hold the exit longer.
constexpr int kExitFlushLimitMs = 2000;

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

/// Tells `up` (controller_link.h) on stdout when the job's first round started.
class UpObserver final : public host::Observer {
 public:
  explicit UpObserver(ConsoleWriter& writer) : writer_(writer) {}
  void Observe(TimePoint, const core::Observation& what) override {
    if (told_ || !std::holds_alternative<core::observed::RoundStarted>(what)) return;
    told_ = true;
    writer_.Write(ConsoleWriter::Stream::kOut, std::string(kJobStartedLine) + "\n");
  }

 private:
  ConsoleWriter& writer_;
  bool told_ = false;
};

/// The agent's configuration, and where this run of it writes.
struct AgentSetup {
  core::Agent::Config config;
  std::string logs_root;   // logs.dir, absolute
  std::string run_folder;  // this run's folder, relative to logs_root (RunLogFolder)
};

AgentSetup SetUpAgent(const JobSpec& spec, const NodeRunOptions& options,
                      const std::filesystem::path& job_dir, const SharedSecret& secret,
                      const std::optional<SocketInterface>& socket_interface) {
  AgentSetup setup;
  core::Agent::Config& config = setup.config;
  config.node_rank = options.node_rank;
  config.host = options.host;
  config.canonical = CanonicalForm(spec);
  config.fingerprint = FingerprintOfCanonical(config.canonical);
  config.instance = NewAgentInstance();
  config.ddprun_version = DDPRUN_VERSION;
  // Every run of this agent writes into a new folder of its own (schema/worker_env.h).
  setup.logs_root = std::filesystem::absolute(job_dir / spec.logs.dir).lexically_normal().string();
  setup.run_folder =
      RunLogFolder(spec, RunFolderName(static_cast<int64_t>(std::time(nullptr)), options.node_rank,
                                       static_cast<uint32_t>(config.instance)));
  config.logs_dir = setup.logs_root + "/" + setup.run_folder;
  config.inherited_env = CurrentEnvironment();
  // `import ddprun` (progress beacons) works in every worker without installing anything.
  config.python_dir = DdprunPythonDir().value_or("");
  // Workers run user code: they do not need the job's secret.
  RemoveSharedSecret(config.inherited_env);
  // Nor srun's task layout, which Lightning and Accelerate would read as the process layout.
  RemoveSlurmTaskLayout(config.inherited_env);
  config.secret = secret.secret;
  if (socket_interface) config.socket_ifname = socket_interface->name;
  return setup;
}

RealProcessLauncher::Options LauncherOptionsFor(const JobSpec& spec, const NodeRunOptions& options,
                                                const std::filesystem::path& job_dir, const AgentSetup& setup,
                                                Guardian& guardian, ConsoleWriter& console_writer,
                                                const NoFileLimits& nofile, host::Console& console) {
  const core::Agent::Config& config = setup.config;
  RealProcessLauncher::Options launcher_options;
  launcher_options.command = spec.job.command;
  launcher_options.workdir =
      std::filesystem::absolute(job_dir / spec.job.workdir).lexically_normal().string();
  launcher_options.logs_root = setup.logs_root;
  launcher_options.run_folder = setup.run_folder;
  launcher_options.node_rank = options.node_rank;
  launcher_options.console = spec.logs.console;
  launcher_options.inherited_env = config.inherited_env;
  launcher_options.guardian = &guardian;
  launcher_options.raw_console_rank = options.raw_console_rank;
  launcher_options.console_writer = &console_writer;
  // Workers get the limit the agent was started with, as under torchrun; only the agent
  // needs the raised one.
  launcher_options.worker_nofile = nofile.original;
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
  return launcher_options;
}

/// The event log (docs/report.md) in this run's log folder beside the rank logs. The folder is
/// made now rather than at the first spawn, so that a rendezvous that never completes is
/// recorded too. Without it the job runs as before, with a warning; null then.
std::unique_ptr<FileEventLog> OpenEventLog(RealProcessLauncher& launcher, const core::Agent::Config& config,
                                           const NodeRunOptions& options, host::Console& console) {
  const auto log_warning = [&console](const std::string& text) {
    console.Log(core::LogLevel::kWarn, "agent", text);
  };
  if (const Status opened = launcher.OpenRunFolder(); !opened) {
    log_warning("no event log for this run: " + opened.error());
    return nullptr;
  }
  auto created = FileEventLog::Create(launcher.run_folder_fd(), config.logs_dir, options.node_rank,
                                      options.host, log_warning);
  if (!created) {
    log_warning("no event log for this run: " + created.error());
    return nullptr;
  }
  return *std::move(created);
}

/// The agent's first lines: who and what it runs, where its logs go, the secret's state, and
/// the interface of the workers' sockets.
void LogStart(host::Console& console, const JobSpec& spec, const NodeRunOptions& options,
              const core::Agent::Config& config, const SharedSecret& secret,
              const std::optional<SocketInterface>& socket_interface) {
  const bool spare = options.node_rank >= spec.cluster.nnodes;
  console.Log(
      core::LogLevel::kInfo, "agent",
      fmt::format("ddprun {}: job \"{}\", {} {} of {} ({}), {} worker{} here, master {}:{}, "
                  "job fingerprint {}",
                  DDPRUN_VERSION, spec.job.name, spare ? "spare" : "node",
                  spare ? options.node_rank - spec.cluster.nnodes : options.node_rank,
                  spare ? spec.cluster.spares : spec.cluster.nnodes, options.host,
                  spec.cluster.nproc_per_node, spec.cluster.nproc_per_node == 1 ? "" : "s",
                  spec.cluster.master_addr, spec.cluster.master_port, config.fingerprint.substr(0, 12)));
  console.Log(core::LogLevel::kInfo, "agent",
              fmt::format("logs of this run: {}/ (also {}/{}/{})", config.logs_dir, spec.logs.dir,
                          spec.job.name, NodeLatestLink(options.node_rank)));
  if (!secret.warning.empty()) console.Log(core::LogLevel::kWarn, "agent", secret.warning);
  if (const SocketInterfaceNote note = DescribeSocketInterface(spec, config.inherited_env, socket_interface);
      !note.text.empty()) {
    console.Log(note.warning ? core::LogLevel::kWarn : core::LogLevel::kInfo, "agent", note.text);
  }
  if (config.secret.empty() && options.node_rank == 0) {
    console.Log(core::LogLevel::kWarn, "coordinator",
                "no shared secret (DDPRUN_SECRET or DDPRUN_SECRET_FILE): any host that can reach "
                "the master port can join this job");
  }
}

/// Who may connect, and how many sockets the transport may hold under RLIMIT_NOFILE.
void LimitTransport(AsioTransport& transport, asio::io_context& io, const JobSpec& spec,
                    const NoFileLimits& nofile, size_t inherited_fds, host::Console& console) {
  const auto warn_coordinator = [&console](const std::string& text) {
    console.Log(core::LogLevel::kWarn, "coordinator", text);
  };
  transport.SetAllowedPeers(AllowedPeers(io, spec, warn_coordinator), [&console](const std::string& peer) {
    console.Log(core::LogLevel::kWarn, "coordinator",
                fmt::format("refused a connection from {}: not one of cluster.nodes", peer));
  });
  AsioTransport::Limits limits;
  limits.max_relays = AsioTransport::Limits::kRelaysPerRank * static_cast<size_t>(spec.WorldSize()) + 64;
  const SocketBudget sockets = BudgetSockets(spec, nofile.soft_now, inherited_fds);
  limits.max_sockets = sockets.max_sockets;
  transport.SetLimits(limits);
  transport.SetWarningSink(warn_coordinator);
  if (!sockets.warning.empty()) console.Log(core::LogLevel::kWarn, "agent", sockets.warning);
}

// The node's metrics with the wall clock, for the `_timestamp_seconds` families.
host::NodeMetrics MetricsNow(const host::NodeHost& node) {
  host::NodeMetrics metrics = node.Metrics();
  metrics.unix_time_seconds =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return metrics;
}

/// The metrics endpoint (metrics.listen), an extra: a node that cannot listen says why, serves
/// nothing (null) and runs the job.
std::unique_ptr<MetricsServer> ServeMetrics(asio::io_context& io, const JobSpec& spec, int node_rank,
                                            const host::NodeHost& node, host::Console& console) {
  if (!spec.metrics.Served()) return nullptr;
  auto metrics =
      std::make_unique<MetricsServer>(io, [&node] { return host::RenderMetricsText(MetricsNow(node)); });
  const std::string addr = spec.MetricsAddressOf(node_rank);
  if (const Status listening = metrics->Listen(addr, spec.MetricsPortOf(node_rank)); !listening) {
    console.Log(core::LogLevel::kWarn, "agent",
                fmt::format("metrics.listen = \"{}\": {}; this node serves no metrics, the job goes on",
                            spec.metrics.Listen(), listening.error()));
    return nullptr;
  }
  const bool v6 = addr.find(':') != std::string::npos;
  console.Log(core::LogLevel::kInfo, "agent",
              fmt::format("serving GET /metrics on {}{}{}:{} ({})", v6 ? "[" : "", addr, v6 ? "]" : "",
                          metrics->port(), node_rank == 0 ? "this node's and the job's" : "this node's"));
  return metrics;
}

/// At the job's end with metrics.linger: stops the loop once one scrape has read the final
/// state, or when the linger has passed.
void LingerForScrape(asio::io_context& io, MetricsServer& metrics, asio::steady_timer& linger_timer,
                     Duration linger, host::Console& console) {
  const uint64_t first_final_render = metrics.renders() + 1;
  console.Log(core::LogLevel::kInfo, "agent",
              fmt::format("GET /metrics shows the job's end until one scrape has read it, for at "
                          "most {} (metrics.linger)",
                          FormatDuration(linger)));
  metrics.OnScraped([&io, first_final_render](uint64_t render) {
    if (render >= first_final_render) io.stop();
  });
  linger_timer.expires_after(linger);
  linger_timer.async_wait([&io](error_code ec) {
    if (!ec) io.stop();
  });
}

/// What the other nodes probe before the first round (rendezvous.probe): a port other than
/// master_port at the address the workers' sockets use, as gloo and NCCL will listen.
void OpenProbe(ProbeListener& listener, const JobSpec& spec,
               const std::optional<SocketInterface>& socket_interface, core::Agent::Config& config) {
  if (!socket_interface || spec.rendezvous.probe == JobSpec::Rendezvous::Probe::kOff ||
      spec.cluster.Agents() <= 1) {
    return;
  }
  if (auto endpoint = listener.Open(socket_interface->address)) config.probe_endpoint = *endpoint;
}

/// This agent's real ports on one loop, made in the order they need each other: what
/// host::Ports points into. Node 0's journal lets a coordinator started again here (a reboot, a
/// killed agent) wait for the workers of the previous one to be gone before its first round
/// (docs/running.md).
struct RealPorts {
  RealPorts(asio::io_context& io, const JobSpec& spec, const NodeRunOptions& options,
            const std::filesystem::path& job_dir, const AgentSetup& setup, Guardian& guardian,
            const NoFileLimits& nofile)
      // Every console line of this agent, its workers' included, goes through this writer, so
      // a terminal that stops reading never stops the loop (heartbeats, rank logs).
      : console_writer(io, LogsHint(setup.config.logs_dir)),
        timer(io),
        // A connect attempt waits at most a few heartbeats; the agent retries until the deadline.
        transport(io, spec.timeouts.ConnectTimeout()),
        console(console_writer, options.node_rank, options.verbose),
        launcher(io, LauncherOptionsFor(spec, options, job_dir, setup, guardian, console_writer, nofile,
                                        console)) {
    console.SetSummaryFooter([this] { return launcher.SummaryLines(); });
    if (!options.print_job_summary) console.OmitJobSummary();
    if (options.node_rank == 0) {
      journal.emplace(setup.logs_root + "/" + spec.job.name, [this](const std::string& text) {
        console.Log(core::LogLevel::kWarn, "coordinator", text);
      });
    }
    events = OpenEventLog(launcher, setup.config, options, console);
    if (events) {
      launcher.SetStartEvents([this](const host::Event& event) { events->Record(clock.Now(), event); });
    }
  }
  RealPorts(const RealPorts&) = delete;
  RealPorts& operator=(const RealPorts&) = delete;

  /// An agent that ends before its loop runs records its start and why it ended: the run's
  /// folder then says so instead of holding an empty file (issue 39). Says why in its summary;
  /// returns `code`.
  int EndBeforeStart(const JobSpec& spec, const core::Agent::Config& config, const std::string& why,
                     ExitCode code, bool start_recorded) {
    if (events) {
      host::EventRecorder recorder(spec, config, events.get());
      if (!start_recorded) recorder.Started(clock.Now());
      recorder.StartFailed(clock.Now(), core::ToInt(code), why);
    }
    console.Summary(why);
    console_writer.FlushForExit(kExitFlushLimitMs);
    return core::ToInt(code);
  }

  host::Ports Ports(host::Store* store, host::Observer* observer) {
    return host::Ports{&clock,       &timer, &transport, &launcher, &console, journal ? &*journal : nullptr,
                       events.get(), store,  observer};
  }

  ConsoleWriter console_writer;
  RealClock clock;
  AsioTimer timer;
  AsioTransport transport;
  TerminalConsole console;
  RealProcessLauncher launcher;
  std::optional<FileJournal> journal;
  std::unique_ptr<FileEventLog> events;
};

/// SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session is an interrupt like the
/// others: the job ends everywhere with 129 and a summary, instead of this agent vanishing as
/// if it crashed), and under `up` the controller's word: each reaches the node as a signal.
/// Once the job is over and only the metrics linger, any of them ends the loop.
class Interrupts {
 public:
  Interrupts(asio::io_context& io, host::NodeHost& node, const bool& lingering)
      : io_(io), node_(node), lingering_(lingering), signals_(io, SIGINT, SIGTERM, SIGHUP) {
    Wait();
  }
  /// Started by `up`: its controller's link (controller_link.h) signals too.
  Status WatchController() {
    auto watched = ControllerLink::Watch(io_, [this](int signal) { node_.OnSignal(signal); });
    if (!watched) return Fail(watched.error());
    controller_ = *std::move(watched);
    return {};
  }

 private:
  void Wait() {
    signals_.async_wait([this](error_code ec, int signal) {
      if (ec) return;
      if (lingering_) {  // the job is over; only the metrics wait, and not for an interrupt
        io_.stop();
        return;
      }
      node_.OnSignal(signal);
      Wait();
    });
  }

  asio::io_context& io_;
  host::NodeHost& node_;
  const bool& lingering_;
  asio::signal_set signals_;
  std::unique_ptr<ControllerLink> controller_;
};

}  // namespace

int RunNode(const JobSpec& spec, const NodeRunOptions& options) {
  BecomeSubreaper();
  OpenClosedStdio();
  const size_t inherited_fds = InheritedDescriptors();
  // Fork the guardian before anything can start a thread (Asio's resolver does).
  Guardian guardian;
  IgnoreBrokenPipes();
  const NoFileLimits nofile = RaiseNoFileLimit();

  const auto secret = ReadSharedSecret();
  if (!secret) {
    std::fprintf(stderr, "ddprun: error: %s\n", secret.error().c_str());
    return core::ToInt(ExitCode::kUsage);
  }
  const auto socket_interface = WorkerSocketInterface(spec, options.node_rank);
  const std::filesystem::path job_dir = options.job_dir.empty() ? "." : options.job_dir;
  AgentSetup setup = SetUpAgent(spec, options, job_dir, *secret, socket_interface);
  core::Agent::Config& config = setup.config;
  // Node 0 named by a host name that is loopback here (its own name on a stock /etc/hosts)
  // listens where the other nodes reach it instead, and gives that address as MASTER_ADDR.
  const ListenPlan listen = PlanListen(spec, options.node_rank, false);
  config.master_at = listen.master_at;

  asio::io_context io;
  ProbeListener probe_listener(io);
  OpenProbe(probe_listener, spec, socket_interface, config);
  RealPorts real(io, spec, options, job_dir, setup, guardian, nofile);
  TerminalConsole& console = real.console;
  // The template's imports overlap the rendezvous.
  real.launcher.StartWarm();
  auto fail_start = [&](const std::string& why, ExitCode code, bool start_recorded) {
    return real.EndBeforeStart(spec, config, why, code, start_recorded);
  };
  // rendezvous.backend = "etcd": the coordinator role and the job's state live in etcd, reached
  // through its JSON gateway on this loop. Nothing connects yet; files it cannot load (TLS) are
  // the job file's fault.
  std::unique_ptr<EtcdStore> etcd;
  if (spec.rendezvous.Etcd()) {
    auto created = EtcdStore::Create(io, EtcdStore::FromSpec(spec.rendezvous));
    if (!created)
      return fail_start("ddprun cannot use the job's etcd: " + created.error(), ExitCode::kUsage, false);
    etcd = *std::move(created);
  }
  // The job's code comes from the coordinator; a loop that stops without one is a bug.
  int exit_code = core::ToInt(ExitCode::kInternal);
  // Started by `up`: the coordinator's agent tells it when the first round starts.
  UpObserver up_observer(real.console_writer);
  const host::Ports ports = real.Ports(etcd.get(), options.controlled_by_up ? &up_observer : nullptr);
  // With a metrics endpoint that lingers, the end waits for a scrape of the final state.
  std::function<void()> on_job_end = [&io] { io.stop(); };
  bool lingering = false;
  host::NodeHost node(spec, config, ports, [&](int code) {
    exit_code = code;
    on_job_end();
  });
  real.timer.SetCallback([&] { node.OnTimer(); });
  Interrupts interrupts(io, node, lingering);
  if (const Status watched = options.controlled_by_up ? interrupts.WatchController() : Status{}; !watched) {
    std::fprintf(stderr, "ddprun: error: %s\n", watched.error().c_str());
    return core::ToInt(ExitCode::kInternal);
  }

  LogStart(console, spec, options, config, *secret, socket_interface);
  LimitTransport(real.transport, io, spec, nofile, inherited_fds, console);
  // A master that listens on loopback in a job of several hosts fails late and far away
  // ("connection refused" on every other node): node 0 listens where the others reach it, or
  // says why it cannot, at once.
  if (!listen.refusal.empty()) {
    return fail_start("ddprun cannot start node 0's coordinator: " + listen.refusal, ExitCode::kRendezvous,
                      false);
  }
  if (!listen.text.empty()) {
    console.Log(listen.warning ? core::LogLevel::kWarn : core::LogLevel::kInfo, listen.source, listen.text);
  }
  if (const Status started = node.Start(); !started) {
    // NodeHost::Start recorded the agent's start.
    return fail_start(
        "ddprun cannot start node 0's coordinator: " + started.error() +
            (options.rank_source.empty() ? "" : "\n(this agent is node 0: " + options.rank_source + ")"),
        ExitCode::kRendezvous, true);
  }
  const std::unique_ptr<MetricsServer> metrics = ServeMetrics(io, spec, options.node_rank, node, console);
  asio::steady_timer linger_timer(io);
  if (metrics && spec.metrics.linger > Duration::zero()) {
    on_job_end = [&] {
      lingering = true;
      LingerForScrape(io, *metrics, linger_timer, spec.metrics.linger, console);
    };
  }
  guardian.Supervise(
      io, [&console](const std::string& text) { console.Log(core::LogLevel::kWarn, "agent", text); });
  io.run();
  if (metrics) metrics->Shutdown();
  guardian.StopSupervising();
  real.launcher.KillAll();
  guardian.Release();
  real.transport.Shutdown();
  real.console_writer.FlushForExit(kExitFlushLimitMs);
  return exit_code;
}

}  // namespace ddprun::io
