#pragma once
// The job file as plain structs: what schema/loader.cc produces and every other layer reads.

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "schema/duration.h"

namespace ddprun {

/// A 1-based position in the job file; line 0 means "not written in the file" (a default).
struct SourceLoc {
  uint32_t line = 0;
  uint32_t column = 0;
  bool operator==(const SourceLoc&) const = default;
};

/// A [trainer] array that is not a plain list of integers, or an inline table (e.g.
/// max_time = { days = 1 }), kept in the two spellings ddprun needs: the loader renders them
/// (a tree of values would need a recursive variant, which some compilers reject).
struct TrainerLiteral {
  std::string python;     // what PL_TRAINER_<KEY> holds: "['a', 2.0]", "{'days': 1}"
  std::string canonical;  // its canonical-form spelling: "[\"a\", 2f]", "{\"days\" = 1}"
  bool operator==(const TrainerLiteral&) const = default;
};

/// A value of [trainer], kept typed so it can be forwarded as PL_TRAINER_<KEY> in the
/// Python-literal spelling Lightning's `literal_eval` reads back as the same type.
/// Lists of integers (device ids) keep their own alternative.
struct TrainerValue {
  std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, TrainerLiteral> value;
  bool operator==(const TrainerValue&) const = default;
};

/// Which global ranks' output the console shows live.
struct ConsoleFilter {
  enum class Mode { kAll, kNone, kRanks };
  Mode mode = Mode::kAll;
  std::vector<int> ranks;  // sorted, unique; only for kRanks
  bool Shows(int global_rank) const;
  bool operator==(const ConsoleFilter&) const = default;
};

/// The kinds of fault the simulator can inject (DESIGN.md section 7).
enum class FaultKind {
  kNodeCrash,
  kAgentHang,
  kWorkerExit,
  kWorkerHang,
  kPartition,
  kMasterPortBlocked,
  kSlowJoiner,
  kJobFileDiffers,
  kDuplicateNodeRank,
  kWorkerSlow,
  // rendezvous.backend = "etcd" only: faults of the modelled etcd cluster (sim/sim_store.h).
  kEtcdMemberDown,
  kEtcdLeaderLost,
  kEtcdPartition,
};

/// One scheduled fault of [[simulate.faults]] or `--fault kind@time:key=value,...`.
struct FaultSpec {
  FaultKind kind = FaultKind::kNodeCrash;
  Duration at{};                         // virtual time since the simulation started
  int node = 0;                          // the node it hits
  std::optional<int> local_rank;         // worker faults: which worker (default 0)
  int exit_code = 1;                     // worker-exit
  std::optional<Duration> duration;      // partition / hang / port block: heals after this
  std::optional<Duration> reboot_after;  // node-crash: the node comes back after this
  std::vector<int> peers;                // partition: the nodes cut off from `node` (default: node 0)
  int percent = 100;                     // worker-slow: how much more work per step (100: twice)
  bool operator==(const FaultSpec&) const = default;
};

/// Agent `agent` of a job of `nnodes` nodes as it was started and as every log line names it:
/// "node 1", or "spare 0" (spares are numbered after the nodes).
inline std::string AgentLabel(int agent, int nnodes) {
  return agent >= nnodes ? "spare " + std::to_string(agent - nnodes) : "node " + std::to_string(agent);
}

struct JobSpec {
  int version = 1;

  /// What job.code_check (and job.library_check) do with a node that differs from node 0 at
  /// join (see cli/code_identity.h and cli/library_identity.h).
  enum class CodeCheck { kOff, kWarn, kRefuse };

  /// The code a node would run, as the CLI found it before the agent started; part of the
  /// canonical form (so of the fingerprint) when job.code_check = "refuse".
  struct Code {
    std::string script;         // the job.command argument that names a file ("" if none)
    std::string script_sha256;  // its SHA-256, lower-case hex ("" if none or unreadable)
    std::string git_commit;     // HEAD of the workdir's git repository ("" if not one)
    bool git_dirty = false;     // tracked files differ from HEAD
    /// For people, not compared: what `script` is ("the script python3 runs", "module
    /// pkg.train as python -m finds it", "the program"), or why there is none.
    std::string what;
    bool operator==(const Code&) const = default;
  };

  /// The Python and libraries a node's job.command would use, as the CLI found them before
  /// the agent started (installed package metadata; "" where not found). Part of the canonical
  /// form when job.library_check is on.
  struct Libraries {
    std::string interpreter;        // resolved path ("" when job.command runs no Python)
    std::string python;             // "3.11.2"
    std::string torch;              // "2.3.1+cu121"
    std::string lightning;          // the `lightning` package
    std::string pytorch_lightning;  // the `pytorch_lightning` package
    std::string nccl;               // nvidia-nccl-cu* wheel version
    std::string cuda;               // torch/version.py's cuda (what torch was built with)
    std::string note;               // why something could not be read ("" when all went well)
    bool operator==(const Libraries&) const = default;
  };

  struct Job {
    std::string name;
    std::vector<std::string> command;
    std::string workdir = ".";               // as written; relative to the job file
    std::map<std::string, std::string> env;  // sorted by name
    CodeCheck code_check = CodeCheck::kOff;
    /// Modules a template interpreter imports before the first round; workers are forked
    /// from it (warm starts, runner/io/warm_template.h). Empty: every worker starts cold.
    std::vector<std::string> preload;
    Code code;  // filled by the CLI when code_check is on
    CodeCheck library_check = CodeCheck::kOff;
    Libraries libraries;  // filled by the CLI when library_check is on
    /// Set by `ddprun preflight` for the job it runs (not part of the file): a failure is the
    /// preflight's verdict, not a training job's.
    bool is_preflight = false;
  } job;

  struct Cluster {
    std::vector<std::string> nodes;  // empty when only nnodes is given
    /// cluster.hosts_from = "slurm": `nodes` are the SLURM allocation's hosts (when known).
    bool hosts_from_slurm = false;
    int nnodes = 0;           // always set: len(nodes) or `nnodes`
    std::string master_addr;  // default nodes[0], or 127.0.0.1 without nodes
    uint16_t master_port = 29500;
    int nproc_per_node = 0;              // default trainer.devices (count), else 1
    std::optional<uint16_t> store_port;  // set: no relay, rank 0 binds this port
    /// Hot spares: agents that join and wait, and take the node rank of a node that was lost
    /// (or did not come back within timeouts.replace). Their agents are numbered after the
    /// nodes: nnodes, nnodes + 1, ... (`spare_hosts` is empty when only a count is given).
    int spares = 0;
    std::vector<std::string> spare_hosts;
    /// Shrinking: with no spare left, rounds may run with fewer nodes, down to this many.
    /// Always set: nnodes when the file does not give it.
    int min_nodes = 0;
    /// Whether a node rank can be given up or handed over: spares or shrinking.
    bool CanReplace() const { return spares > 0 || min_nodes < nnodes; }
    /// Every agent of the job: the nodes, then the spares.
    int Agents() const { return nnodes + spares; }
    /// Agent `agent` as it was started and as every log line names it: "node 1", or "spare 0"
    /// (spares are numbered after the nodes).
    std::string AgentLabel(int agent) const { return ddprun::AgentLabel(agent, nnodes); }
    /// Where agent `agent`'s host is written in the job file: "cluster.nodes[1]", or
    /// "cluster.spares[0]" (spares are numbered after the nodes).
    std::string HostEntry(int agent) const {
      return agent < nnodes ? "cluster.nodes[" + std::to_string(agent) + "]"
                            : "cluster.spares[" + std::to_string(agent - nnodes) + "]";
    }
    /// The host of agent `agent` (a node or a spare), "" when the hosts are not listed.
    std::string HostOf(int agent) const {
      if (agent >= 0 && agent < static_cast<int>(nodes.size())) return nodes[static_cast<size_t>(agent)];
      const int spare = agent - nnodes;
      if (spare >= 0 && spare < static_cast<int>(spare_hosts.size()))
        return spare_hosts[static_cast<size_t>(spare)];
      return "";
    }
  } cluster;

  /// [rendezvous]: where the job's coordination state lives. "agent" (the default): in node
  /// 0's agent, which runs the coordinator. "etcd": in an etcd cluster; any agent may hold the
  /// coordinator through an etcd lease, and another takes over when its host is lost.
  struct Rendezvous {
    enum class Backend { kAgent, kEtcd };
    Backend backend = Backend::kAgent;
    std::vector<std::string> endpoints;  // etcd client URLs: "http://10.0.0.1:2379", "https://..."
    std::string prefix = "/ddprun";      // keys live under <prefix>/<job name>/<run id>/
    /// The coordinator's etcd lease: when its holder stops renewing it (its host died, or it
    /// is cut off from etcd), another agent takes over after at most this long.
    Duration lease = Seconds(10);
    std::string ca_file;    // https: verify etcd's certificate against this CA ("": the system's)
    std::string cert_file;  // https: client certificate (etcd's --client-cert-auth)
    std::string key_file;   // its private key
    std::string user;       // etcd authentication; the password comes from DDPRUN_ETCD_PASSWORD
    /// Before the first round every agent connects to every other node on a port other than
    /// master_port (as gloo and NCCL will): kRefuse ends the job (exit 3) when a pair cannot,
    /// kWarn says so and starts the round, kOff skips the probe.
    enum class Probe { kRefuse, kWarn, kOff };
    Probe probe = Probe::kRefuse;
    bool Etcd() const { return backend == Backend::kEtcd; }
  } rendezvous;

  /// [trainer], in file order. `devices`, `num_nodes` etc. are also mirrored below, typed.
  struct Trainer {
    std::vector<std::pair<std::string, TrainerValue>> settings;
    std::optional<int> devices;  // count (len of a list of ids)
    std::optional<std::vector<int64_t>> device_ids;
    std::optional<int> num_nodes;
    std::string accelerator;  // "" when unset
    std::string strategy;     // "" when unset
  } trainer;

  struct Restart {
    int max_restarts = 0;
    Duration backoff = Seconds(10);
    /// Set: the wait doubles after each restart (backoff, 2 x backoff, 4 x ...) up to this.
    std::optional<Duration> backoff_max;
    /// Failure kinds that end the job without a restart (core::RuleMatches).
    std::vector<std::string> never_on;
  } restart;

  /// The protocol's time bounds are all derived here, so the agent, the coordinator, the
  /// loader's consistency checks, the simulator's invariants and the docs use one definition.
  struct Timeouts {
    Duration rendezvous = Minutes(15);
    Duration heartbeat = Seconds(2);
    Duration stop_grace = Seconds(30);
    /// Hang detection from progress beacons: a rank silent this long is hung. Unset and not
    /// `progress_auto`: off.
    std::optional<Duration> progress;
    bool progress_auto = false;             // "auto": learned from the intervals seen
    Duration progress_start = Minutes(10);  // to the first beacon, and after ddprun.phase()
    /// With spares: how long a lost node (or one that never came) may take to come back
    /// before a waiting spare takes its node rank.
    Duration replace = Minutes(1);
    bool DetectsHangs() const { return progress.has_value() || progress_auto; }
    /// "auto": the learned timeout is this many times the longest interval seen, and at
    /// least kAutoProgressFloor; until enough intervals are seen, progress_start applies.
    static constexpr int kAutoProgressFactor = 5;
    static constexpr Duration kAutoProgressFloor = Seconds(10);
    static constexpr int kAutoProgressWarmup = 10;  // intervals per rank before it is learned

    /// How long a peer may stay silent before it is lost: more than 3 heartbeat intervals
    /// without a message. A stall shorter than 2 intervals is always tolerated (the silence
    /// it causes is the stall plus at most one interval since the peer's last beat).
    Duration LossBound() const { return 3 * heartbeat; }
    /// After SIGKILL a worker is normally gone at once; the agent gives up on one that is not
    /// reaped after this (stuck in the kernel).
    static constexpr Duration kKillAllowance = Seconds(10);
    /// From SIGTERM to the last worker gone: stop_grace, SIGKILL, and the kill allowance.
    Duration StopBound() const { return stop_grace + kKillAllowance; }
    /// The lease of a node rank: once the coordinator stops hearing from a node, that node's
    /// agent notices within the loss bound (plus one interval for a heartbeat in flight) and
    /// has its workers stopped within the stop bound. After this, the previous holder of the
    /// rank is certainly gone, so the rank may be given to another agent.
    Duration LeaseBound() const { return LossBound() + heartbeat + StopBound(); }
    /// The workers' lease, counted from the agent's last word from the coordinator: the agent
    /// stops them at the loss bound and SIGKILLs them stop_grace later. Its guardian, which
    /// runs when the agent does not (a stopped or paused agent), SIGKILLs them at the same time
    /// (core::RenewLease). Counted from the last word, not from when the agent last ran: an
    /// agent paused in the middle of its stop must not extend its workers' lease by the pause.
    Duration GuardianLease() const { return LossBound() + stop_grace; }
    /// How long one connect may take before the agent calls it timed out (a firewall that
    /// drops, a host that is down): a few heartbeats, at least 3 s. The agent then retries.
    Duration ConnectTimeout() const { return std::max(Seconds(3), 2 * heartbeat); }
    /// How long the coordinator waits for every node's probe of the others before the first
    /// round (rendezvous.probe): the probes run at once, each within ConnectTimeout, and the
    /// answer comes over a connection that may be slow.
    Duration ProbeWait() const { return ConnectTimeout() + 2 * heartbeat; }
    /// How long the coordinator waits for every node's stacks before it stops a hung round:
    /// agents wait a second for faulthandler, then answer over a connection that may be slow.
    Duration StacksWait() const { return std::max(Seconds(5), 2 * heartbeat); }
    /// The exit barrier: how long the coordinator waits for every agent to acknowledge the end
    /// of the job, long enough for an agent that lost it (it notices within the loss bound)
    /// to stop its workers within stop_grace and rejoin (a retry takes at most 2 s).
    Duration ExitBarrier() const { return LossBound() + stop_grace + Seconds(5); }
  } timeouts;

  /// [quarantine]: hosts whose workers fail again and again sit out for a cooldown.
  struct Quarantine {
    int failures = 3;  // 0: off
    Duration window = Hours(1);
    Duration cooldown = Minutes(30);
  } quarantine;

  /// [stragglers]: ranks that stay slower than the median, from their beacons.
  struct Stragglers {
    int slower_percent = 50;  // 0: off
    Duration window = Minutes(2);
  } stragglers;

  struct Logs {
    std::string dir = "logs";  // as written; relative to the job file
    ConsoleFilter console;
  } logs;

  /// [metrics]: a Prometheus text endpoint on every node; none unless metrics.listen is set.
  /// Every node reads the same file, so the address is one every node can listen on.
  struct Metrics {
    /// Each node's own entry of cluster.nodes, each spare's of cluster.spares ("*" in the file).
    static constexpr std::string_view kOwnNodeAddress = "*";
    std::string addr;   // an IP address as written ("0.0.0.0", "::", "127.0.0.1"), or "*"
    uint16_t port = 0;  // 0: no endpoint
    /// metrics.ports = "per-node": agent k (a node, or spare nnodes + s) listens on port + k,
    /// so that agents that share a host each serve.
    bool port_per_node = false;
    /// After the job's end, the endpoint stays up this long, or until one scrape has read the
    /// final state, whichever comes first: the end is seen by a scraper. 0: none.
    Duration linger = Seconds(15);
    bool Served() const { return port != 0; }
    /// "ADDR:PORT" as the file writes it ("[::]:9400" for IPv6).
    std::string Listen() const;
  } metrics;

  /// [simulate]: only read by --simulate.
  struct Simulate {
    uint64_t seed = 1;
    std::vector<FaultSpec> faults;
    std::optional<Duration> node_mtbf;         // random node crashes, per host (nodes and spares)
    int node_never_returns_percent = 0;        // of those, the share whose host stays down for good
    std::optional<Duration> worker_mtbf;       // random worker exits, per worker
    std::optional<Duration> worker_hang_mtbf;  // random worker hangs (for good), per worker
    Duration train_time = Minutes(10);         // how long a round must train to finish
    Duration checkpoint_every = Minutes(30);
    Duration worker_startup = Seconds(20);
    /// One training step of the simulated script: each rank's own work per step, and (with
    /// progress beacons) how often a rank beacons, at most once a second.
    Duration step_time = Seconds(1);
    Duration max_time = Hours(24 * 60);  // the simulation gives up after this
    /// What a simulated worker does with SIGTERM. kExits: the default action, it ends at once
    /// (a plain PyTorch script). kIgnored: its handler only takes note, and it stays in its
    /// collective until SIGKILL at stop_grace (Lightning, whose SIGTERM handler sets a flag
    /// that its loop reads after the step that never ends). kAuto: kIgnored when the job has a
    /// [trainer], kExits otherwise.
    enum class Sigterm { kAuto, kExits, kIgnored };
    Sigterm sigterm = Sigterm::kAuto;
  } simulate;

  /// What followed `--` on the command line, already appended to job.command (for printing
  /// the command that reproduces this spec).
  std::vector<std::string> script_args;
  /// The file it came from, as given on the command line ("" for in-memory sources).
  std::string source_name;
  /// The absolute folder of that file ("" for in-memory sources): job.workdir is relative to
  /// it, and the plan's torchrun lines `cd` there so they work from any folder.
  std::string source_dir;
  /// Key path ("cluster.master_port", "job.command[1]") -> where the value was written.
  std::map<std::string, SourceLoc> locations;

  int WorldSize() const { return cluster.nnodes * cluster.nproc_per_node; }
  /// simulate.sigterm as the simulator applies it (kAuto resolved from [trainer]).
  bool SimulatedWorkersIgnoreSigterm() const {
    return simulate.sigterm == Simulate::Sigterm::kIgnored ||
           (simulate.sigterm == Simulate::Sigterm::kAuto && !trainer.settings.empty());
  }
  /// The wait before restart number `restart` (1 for the first): restart.backoff, doubled for
  /// each earlier restart while restart.backoff_max is set, never above it.
  Duration RestartBackoff(int restart) const;
  /// How often agents report their ranks' progress (for stragglers and the learnt timeout):
  /// every heartbeat, or an eighth of the straggler window when that is longer.
  Duration ProgressReportPeriod() const;
  /// How many report periods make the straggler window (at least 1).
  size_t ProgressWindowBuckets() const;
  /// The address agent `node_rank` (a node or a spare) binds for metrics: metrics.addr, or for
  /// "*" its entry of cluster.nodes or cluster.spares (the loader refuses "*" without them).
  std::string MetricsAddressOf(int node_rank) const;
  /// The port agent `node_rank` listens on for metrics (metrics.port, or + node_rank per node).
  uint16_t MetricsPortOf(int node_rank) const;
  /// Where `key_path` was written; {0,0} for defaults.
  SourceLoc LocationOf(const std::string& key_path) const;
};

}  // namespace ddprun
