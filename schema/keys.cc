#include "schema/keys.h"

#include <algorithm>
#include <array>
#include <cstdlib>

#include <fmt/format.h>

namespace ddprun {
namespace {

using Names = std::span<const std::string_view>;

// The names of `keys`, in table order, for the loader's key checks and hints.
template <size_t N>
constexpr std::array<std::string_view, N> NamesOf(const std::array<KeySpec, N>& keys) {
  std::array<std::string_view, N> names{};
  for (size_t i = 0; i < N; ++i) names[i] = keys[i].name;
  return names;
}

constexpr IntRange kPortRange{1, 65535};
// A global rank: below the largest world (nodes x processes per node).
constexpr int kMaxRank = kMaxNodes * kMaxProcsPerNode - 1;
constexpr IntRange kRankRange{0, kMaxRank};
constexpr IntRange kNodeRankRange{0, kMaxNodes - 1};

constexpr std::array<KeySpec, 12> kTopKeys = {{
    {.name = "version",
     .type = KeyType::kInteger,
     .doc = "Job file format version.",
     .range = IntRange{1, 1},
     .required = true},
    {.name = "job", .type = KeyType::kSection, .doc = "What to run.", .required = true},
    {.name = "cluster",
     .type = KeyType::kSection,
     .doc = "Where to run it: give nodes or nnodes.",
     .required = true},
    {.name = "trainer",
     .type = KeyType::kSection,
     .doc = "Lightning Trainer defaults: each key reaches the script as PL_TRAINER_<KEY>, so "
            "Trainer() with no arguments uses them."},
    {.name = "restart", .type = KeyType::kSection, .doc = "Job-wide restarts after a failure."},
    {.name = "rendezvous",
     .type = KeyType::kSection,
     .doc = "Where the job's coordination state lives: in node 0's agent (the default), or in "
            "etcd, so that the coordinator survives its host."},
    {.name = "timeouts",
     .type = KeyType::kSection,
     .doc = "Rendezvous, heartbeat, stop and progress (hang) timeouts."},
    {.name = "quarantine",
     .type = KeyType::kSection,
     .doc = "Keep a host whose workers fail again and again out of the job for a while, when a "
            "spare or cluster.min_nodes lets the job run without it."},
    {.name = "stragglers",
     .type = KeyType::kSection,
     .doc = "Report ranks that stay slower than the others (from their progress beacons)."},
    {.name = "logs", .type = KeyType::kSection, .doc = "Per-rank log files and the live console."},
    {.name = "metrics",
     .type = KeyType::kSection,
     .doc = "A Prometheus text endpoint on every node (off unless listen is set)."},
    {.name = "simulate", .type = KeyType::kSection, .doc = "Only read by `ddprun --simulate`."},
}};

constexpr std::array<std::string_view, 3> kCodeChecks = {"off", "warn", "refuse"};

constexpr std::array<KeySpec, 7> kJobKeys = {{
    {.name = "name",
     .type = KeyType::kString,
     .doc = "Job name: prefix of TORCHELASTIC_RUN_ID and the log folder.",
     .required = true,
     .max_length = kMaxNameLength,
     .pattern = "^[A-Za-z0-9._-]+$"},
    {.name = "command",
     .type = KeyType::kStringArray,
     .doc = "The worker command, one argument per item, e.g. [\"python\", \"train.py\"].",
     .required = true,
     .min_items = 1},
    {.name = "workdir",
     .type = KeyType::kString,
     .doc = "Working directory of the workers, relative to the job file.",
     .default_value = "."},
    {.name = "env",
     .type = KeyType::kStringMap,
     .doc = "Extra environment variables for every worker. Names ddprun sets itself (RANK, "
            "WORLD_SIZE, MASTER_PORT, PL_TRAINER_*, ...) are not allowed.",
     .pattern = "^[A-Za-z_][A-Za-z0-9_]*$"},
    {.name = "code_check",
     .type = KeyType::kString,
     .doc = "\"refuse\": each node sends the SHA-256 of the script job.command runs and the "
            "git commit (and dirty state) of the workdir; a node whose code differs from node "
            "0's is refused at join, naming what differs. \"warn\": the same comparison, but "
            "the node joins and node 0 logs what differs.",
     .values = kCodeChecks,
     .default_value = "off"},
    {.name = "preload",
     .type = KeyType::kStringArray,
     .doc = "Warm starts: Python modules (e.g. [\"torch\", \"lightning\"]) that a template "
            "interpreter on each node imports while the nodes join; every worker of every round is "
            "forked from it instead of starting Python and importing them again. Only for a "
            "job.command that runs python; unset: workers start cold.",
     .pattern = "^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*$",
     .unique = true,
     .nonempty_items = true},
    {.name = "library_check",
     .type = KeyType::kString,
     .doc =
         "\"refuse\": each node sends what its job.command's Python would use (the Python "
         "version; the torch, lightning and pytorch_lightning versions where Python would import "
         "them from, and NCCL's from its wheel; the CUDA version torch was built with), read once before the "
         "agent starts; a node with other versions than node 0's is refused at join, "
         "naming them. \"warn\": the same comparison, but the node joins and node 0 logs "
         "what differs.",
     .values = kCodeChecks,
     .default_value = "off"},
}};

constexpr std::array<std::string_view, 1> kHostSources = {"slurm"};

constexpr std::array<KeySpec, 9> kClusterKeys = {{
    {.name = "nodes",
     .type = KeyType::kStringArray,
     .doc = "Host names or addresses of the nodes; a node's rank is its position. Give this "
            "or nnodes.",
     .min_items = 1,
     .unique = true,
     .nonempty_items = true},
    {.name = "hosts_from",
     .type = KeyType::kString,
     .doc = "\"slurm\": the nodes are the hosts of the SLURM allocation the job runs in "
            "(SLURM_JOB_NODELIST, expanded by `scontrol show hostnames`), in SLURM's order; "
            "in place of nodes. master_addr defaults to the first; nnodes, when given, must match.",
     .values = kHostSources},
    {.name = "nnodes",
     .type = KeyType::kInteger,
     .doc = "Number of nodes, when they are not listed (each node then needs --node-rank or "
            "DDPRUN_NODE_RANK).",
     .range = IntRange{1, kMaxNodes}},
    {.name = "master_addr",
     .type = KeyType::kString,
     .doc = "Address of node 0, where the coordinator listens. Default: nodes[0], else "
            "127.0.0.1."},
    {.name = "master_port",
     .type = KeyType::kInteger,
     .doc = "The one port node 0 listens on (coordinator and relayed store). Default 29500.",
     .range = kPortRange,
     .default_value = "29500"},
    {.name = "nproc_per_node",
     .type = KeyType::kInteger,
     .doc = "Worker processes per node. Default: the trainer.devices count, else 1.",
     .range = IntRange{1, kMaxProcsPerNode}},
    {.name = "store_port",
     .type = KeyType::kInteger,
     .doc = "Set to let worker rank 0 bind this port for the store instead of relaying it "
            "through master_port.",
     .range = kPortRange},
    {.name = "spares",
     .type = KeyType::kCountOrNames,
     .doc = "Hot spares: hosts whose agents join and wait, and take the node rank of a node "
            "that is lost (or not back within timeouts.replace). With nodes, a list of hosts; "
            "with nnodes, a count (the spares' agents then use --node-rank nnodes, nnodes + 1, ...).",
     .range = IntRange{0, 1'000}},
    {.name = "min_nodes",
     .type = KeyType::kInteger,
     .doc = "Shrinking: when a node is lost (or not back within timeouts.replace) and no spare "
            "waits, the next rounds run with the nodes left, down to this many; the world size "
            "follows, and the job grows back at a later restart when the node returns. "
            "Default: nnodes (every round needs every node).",
     .range = IntRange{1, kMaxNodes}},
}};
constexpr std::array<std::string_view, 3> kClusterNeeds = {"nodes", "nnodes", "hosts_from"};

// Accepted accelerators; "tpu" is known to the loader too, but only to refuse it.
constexpr std::array<std::string_view, 5> kAccelerators = {"cpu", "gpu", "cuda", "auto", "mps"};

// Strategies that work when something else (torchrun, ddprun) starts one process per device:
// Lightning then only joins the process group from the environment. The "popen" DDP family,
// FSDP and DeepSpeed all do that; the spawn/fork/notebook variants start their own processes.
constexpr std::array<std::string_view, 14> kLauncherStrategies = {"auto",
                                                                  "ddp",
                                                                  "ddp_find_unused_parameters_false",
                                                                  "ddp_find_unused_parameters_true",
                                                                  "fsdp",
                                                                  "fsdp_cpu_offload",
                                                                  "deepspeed",
                                                                  "deepspeed_stage_1",
                                                                  "deepspeed_stage_2",
                                                                  "deepspeed_stage_2_offload",
                                                                  "deepspeed_stage_3",
                                                                  "deepspeed_stage_3_offload",
                                                                  "deepspeed_stage_3_offload_nvme",
                                                                  "model_parallel"};

// The [trainer] keys ddprun reads itself; every other key is forwarded as it is.
constexpr std::array<KeySpec, 5> kTrainerKeys = {{
    {.name = "accelerator",
     .type = KeyType::kString,
     .doc = "Lightning accelerator; reaches the script as PL_TRAINER_ACCELERATOR.",
     .values = kAccelerators},
    {.name = "devices",
     .type = KeyType::kDevices,
     .doc = "Devices per node: a count or a list of device ids. Must equal "
            "cluster.nproc_per_node; \"auto\" and -1 are not allowed.",
     .range = IntRange{1, kMaxProcsPerNode},
     .item_range = IntRange{0, 1'000'000},
     .min_items = 1,
     .unique = true},
    {.name = "num_nodes",
     .type = KeyType::kInteger,
     .doc = "Must equal the number of nodes.",
     .range = IntRange{1, kMaxNodes}},
    {.name = "strategy",
     .type = KeyType::kString,
     .doc = "A strategy that works under an external launcher; ddp_spawn, ddp_fork, "
            "ddp_notebook and dp do not.",
     .examples = kLauncherStrategies},
    {.name = "precision",
     .type = KeyType::kStringOrInteger,
     .doc = "Lightning precision, e.g. \"bf16-mixed\"."},
}};

// Lightning 2.x `Trainer.__init__` parameters. Lightning reads PL_TRAINER_<NAME> only for
// these, so any other [trainer] key would be silently ignored by the script: worth a warning.
constexpr std::array<std::string_view, 40> kLightningTrainerArgs = {"accelerator",
                                                                    "strategy",
                                                                    "devices",
                                                                    "num_nodes",
                                                                    "precision",
                                                                    "logger",
                                                                    "callbacks",
                                                                    "fast_dev_run",
                                                                    "max_epochs",
                                                                    "min_epochs",
                                                                    "max_steps",
                                                                    "min_steps",
                                                                    "max_time",
                                                                    "limit_train_batches",
                                                                    "limit_val_batches",
                                                                    "limit_test_batches",
                                                                    "limit_predict_batches",
                                                                    "overfit_batches",
                                                                    "val_check_interval",
                                                                    "check_val_every_n_epoch",
                                                                    "num_sanity_val_steps",
                                                                    "log_every_n_steps",
                                                                    "enable_checkpointing",
                                                                    "enable_progress_bar",
                                                                    "enable_model_summary",
                                                                    "accumulate_grad_batches",
                                                                    "gradient_clip_val",
                                                                    "gradient_clip_algorithm",
                                                                    "deterministic",
                                                                    "benchmark",
                                                                    "inference_mode",
                                                                    "use_distributed_sampler",
                                                                    "profiler",
                                                                    "detect_anomaly",
                                                                    "barebones",
                                                                    "plugins",
                                                                    "sync_batchnorm",
                                                                    "reload_dataloaders_every_n_epochs",
                                                                    "default_root_dir",
                                                                    "model_registry"};

constexpr std::array<KeySpec, 4> kRestartKeys = {{
    {.name = "max_restarts",
     .type = KeyType::kInteger,
     .doc = "Job-wide restart budget: how many times all workers may be restarted after a "
            "failure.",
     .range = IntRange{0, kMaxRestarts},
     .default_value = "0"},
    {.name = "backoff",
     .type = KeyType::kDuration,
     .doc = "Wait before the first restart (before each restart without backoff_max).",
     .default_value = "10s"},
    {.name = "backoff_max",
     .type = KeyType::kDuration,
     .doc = "Set: the wait doubles after each restart, from backoff up to this (not below "
            "backoff)."},
    {.name = "never_on",
     .type = KeyType::kStringArray,
     .doc = "Failures not worth a restart: the job ends at once with the root cause. Each item "
            "is a Python exception type (\"SyntaxError\", \"torch.cuda.OutOfMemoryError\"), "
            "\"exit:N\", \"signal:SIGSEGV\" (or \"signal:11\"), or one of \"oom\", \"nccl\", "
            "\"hang\", \"lost-node\", \"lost-peer\", \"stall\".",
     .pattern = "^([A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*|exit:[0-9]+|"
                "signal:(SIG[A-Z0-9]+|[0-9]+)|oom|nccl|hang|lost-node|lost-peer|stall)$",
     .unique = true,
     .nonempty_items = true},
}};

constexpr std::array<KeySpec, 6> kTimeoutKeys = {{
    {.name = "rendezvous",
     .type = KeyType::kDuration,
     .doc = "All nodes must have joined by then.",
     .default_value = "15m"},
    {.name = "heartbeat",
     .type = KeyType::kDuration,
     .doc = "Heartbeat period; a node silent for 3 beats is lost. 3 x heartbeat must be "
            "shorter than rendezvous.",
     .default_value = "2s"},
    {.name = "stop_grace",
     .type = KeyType::kDuration,
     .doc = "SIGTERM to SIGKILL grace when stopping workers.",
     .default_value = "30s"},
    {.name = "progress",
     .type = KeyType::kDurationOrAuto,
     .doc = "Hang detection: a rank that sends no progress beacon (ddprun.progress(step)) for "
            "this long is hung, and the round fails with it as the root cause. \"auto\" learns "
            "it from the job: 5 x the longest interval between beacons seen, at least 10s. "
            "Unset: no hang detection."},
    {.name = "progress_start",
     .type = KeyType::kDuration,
     .doc = "With timeouts.progress: how long a rank may take to its first beacon after it "
            "starts (imports, checkpoint loads), and to the next one after ddprun.phase().",
     .default_value = "10m"},
    {.name = "replace",
     .type = KeyType::kDuration,
     .doc = "With cluster.spares or cluster.min_nodes: how long a lost node (or one that never "
            "joined) may take to come back before a waiting spare takes its node rank, or the "
            "job goes on without it.",
     .default_value = "1m"},
}};

constexpr std::array<KeySpec, 2> kStragglerKeys = {{
    {.name = "slower_percent",
     .type = KeyType::kInteger,
     .doc = "A rank whose own work per step (or, without it, whose step time) is this many "
            "percent above the median of all ranks over the window is a straggler; 0 turns "
            "the report off.",
     .range = IntRange{0, 10'000},
     .default_value = "50"},
    {.name = "window",
     .type = KeyType::kDuration,
     .doc = "How long a rank must stay that slow before it is reported.",
     .default_value = "2m"},
}};

constexpr std::array<KeySpec, 3> kQuarantineKeys = {{
    {.name = "failures",
     .type = KeyType::kInteger,
     .doc = "A host is quarantined when this many rounds fail because of it (its worker, its "
            "hang, its loss) within the window; 0 turns quarantine off. It applies only when "
            "a waiting spare or cluster.min_nodes lets the next round run without the host; "
            "node 0's host (the coordinator's) is never quarantined.",
     .range = IntRange{0, 1'000},
     .default_value = "3"},
    {.name = "window",
     .type = KeyType::kDuration,
     .doc = "How far back the failures of a host are counted.",
     .default_value = "1h"},
    {.name = "cooldown",
     .type = KeyType::kDuration,
     .doc = "How long the first quarantine of a host lasts; each further one lasts twice as "
            "long as the one before. Kept in <logs.dir>/<job>/quarantine.state across launches.",
     .default_value = "30m"},
}};

constexpr std::array<std::string_view, 2> kBackends = {"agent", "etcd"};
constexpr std::array<std::string_view, 3> kProbeModes = {"refuse", "warn", "off"};
constexpr std::array<std::string_view, 2> kEndpointExamples = {"http://10.0.0.1:2379",
                                                               "https://etcd-1.example:2379"};

constexpr std::array<KeySpec, 9> kRendezvousKeys = {{
    {.name = "backend",
     .type = KeyType::kString,
     .doc = "\"agent\": node 0's agent runs the coordinator and keeps its state; losing node 0's "
            "host stops the job until it returns. \"etcd\": the state (round, restart budget, "
            "quarantine) lives in etcd, any agent may hold the coordinator through an etcd "
            "lease, and another takes over when its host is lost; each round's rank 0 runs on "
            "the coordinator's host. Needs cluster.nodes (and spare hosts) listed.",
     .values = kBackends,
     .default_value = "agent"},
    {.name = "endpoints",
     .type = KeyType::kStringArray,
     .doc = "backend = \"etcd\": the client URLs of the etcd members, http:// or https://.",
     .examples = kEndpointExamples,
     .min_items = 1,
     .unique = true,
     .nonempty_items = true},
    {.name = "prefix",
     .type = KeyType::kString,
     .doc = "backend = \"etcd\": the job's keys live under <prefix>/<job.name>/<run id>/.",
     .default_value = "/ddprun",
     .pattern = "^/[A-Za-z0-9._/-]*$"},
    {.name = "lease",
     .type = KeyType::kDuration,
     .doc = "backend = \"etcd\": the coordinator's etcd lease. When its holder stops renewing it "
            "(its host died, or it is cut off from etcd), it steps down before the lease ends "
            "and another agent takes over once it has ended. At least 2s, and shorter than "
            "timeouts.rendezvous.",
     .default_value = "10s"},
    {.name = "ca_file",
     .type = KeyType::kString,
     .doc = "https endpoints: the CA that signed etcd's certificate (default: the system's)."},
    {.name = "cert_file",
     .type = KeyType::kString,
     .doc = "https endpoints: this agent's client certificate (etcd's --client-cert-auth); "
            "needs key_file."},
    {.name = "key_file", .type = KeyType::kString, .doc = "The private key of cert_file."},
    {.name = "user",
     .type = KeyType::kString,
     .doc = "etcd authentication: the user; its password comes from the environment variable "
            "DDPRUN_ETCD_PASSWORD, never from the job file."},
    {.name = "probe",
     .type = KeyType::kString,
     .doc = "Before the first round every agent connects to every other node on a port other "
            "than master_port, as gloo and NCCL will (a firewall that lets only master_port "
            "through makes them hang). \"refuse\": a pair that cannot connect ends the job with "
            "exit 3, naming the pair, the port and the fix. \"warn\": say so and start the round; "
            "a hang verdict then names it as the likely cause. \"off\": no probe.",
     .values = kProbeModes,
     .default_value = "refuse"},
}};

constexpr std::array<std::string_view, 2> kConsoleModes = {"all", "none"};

constexpr std::array<KeySpec, 2> kLogKeys = {{
    {.name = "dir",
     .type = KeyType::kString,
     .doc = "Per-rank logs go to <dir>/<job>/<run>/attempt-<k>/rank-<r>.log, a new <run> "
            "folder per run, <dir>/<job>/latest the newest (relative to the job file).",
     .default_value = "logs"},
    {.name = "console",
     .type = KeyType::kConsole,
     .doc = "Which global ranks' output is shown live: \"all\", \"none\" or a list of ranks.",
     .item_range = kRankRange,
     .values = kConsoleModes,
     .default_value = "all",
     .unique = true},
}};

constexpr std::array<std::string_view, 3> kListenExamples = {"0.0.0.0:9400", "127.0.0.1:9400", "*:9400"};

constexpr std::array<std::string_view, 2> kMetricsPortModes = {"same", "per-node"};

constexpr std::array<KeySpec, 3> kMetricsKeys = {{
    {.name = "listen",
     .type = KeyType::kString,
     .doc = "ADDR:PORT where each node serves GET /metrics (Prometheus text format) for itself, "
            "node 0 also for the job. Every node reads the same value: ADDR is an IP address "
            "every node listens on (\"0.0.0.0\" every interface, \"127.0.0.1\" this host "
            "only, \"[::]\" for IPv6) or \"*\", each node's own entry of cluster.nodes (a "
            "spare's of cluster.spares); the same PORT on every node. A node that cannot "
            "listen warns and runs the job. Unset: no endpoint.",
     .examples = kListenExamples,
     .pattern = "^(\\*|[0-9.]+|\\[[0-9A-Fa-f:.]+\\]):[0-9]{1,5}$"},
    {.name = "ports",
     .type = KeyType::kString,
     .doc = "\"same\": every node listens on listen's PORT. \"per-node\": node k listens on "
            "PORT + k (spare s on PORT + nnodes + s), so that several agents on one host each serve.",
     .values = kMetricsPortModes,
     .default_value = "same"},
    {.name = "linger",
     .type = KeyType::kDuration,
     .doc = "After the job's end, the endpoint stays up this long, or until one scrape has read "
            "the final phase, whichever is first, so that a scraper sees the end. \"0s\": none.",
     .default_value = "15s"},
}};

constexpr std::array<std::string_view, 3> kSigtermNames = {"auto", "exits", "ignored"};

constexpr std::array<KeySpec, 12> kSimulateKeys = {{
    {.name = "seed",
     .type = KeyType::kInteger,
     .doc = "PRNG seed; the same seed and file give the same run.",
     .range = IntRange{},
     .default_value = "1"},
    {.name = "faults", .type = KeyType::kSectionArray, .doc = "Scheduled faults."},
    {.name = "node_mtbf",
     .type = KeyType::kDuration,
     .doc = "Random node crashes: mean time between failures per host (the nodes and the "
            "spares); a crashed host comes back after 3-10 minutes."},
    {.name = "node_never_returns_percent",
     .type = KeyType::kInteger,
     .doc = "With node_mtbf: the percentage of random node crashes after which the host never "
            "comes back (a spare, if any, takes its node rank after timeouts.replace).",
     .range = IntRange{0, 100},
     .default_value = "0"},
    {.name = "worker_mtbf",
     .type = KeyType::kDuration,
     .doc = "Random worker exits: mean time between failures per worker."},
    {.name = "worker_hang_mtbf",
     .type = KeyType::kDuration,
     .doc = "Random worker hangs: mean time between hangs per worker; a hung worker stays hung "
            "until it is killed."},
    {.name = "train_time",
     .type = KeyType::kDuration,
     .doc = "Training a round needs to finish the job.",
     .default_value = "10m"},
    {.name = "checkpoint_every",
     .type = KeyType::kDuration,
     .doc = "Checkpoint period of the simulated script.",
     .default_value = "30m"},
    {.name = "worker_startup",
     .type = KeyType::kDuration,
     .doc = "Simulated worker start-up time.",
     .default_value = "20s"},
    {.name = "step_time",
     .type = KeyType::kDuration,
     .doc = "One training step of the simulated script (each rank's own work per step). With "
            "timeouts.progress (or a worker-slow fault), each node's workers send progress "
            "beacons every max(step_time, 1s).",
     .default_value = "1s"},
    {.name = "max_time",
     .type = KeyType::kDuration,
     .doc = "The simulation gives up after this.",
     .default_value = "60d"},
    {.name = "sigterm",
     .type = KeyType::kString,
     .doc = "What a simulated worker does with SIGTERM: \"exits\" at once (the default action, a "
            "plain PyTorch script), or \"ignored\" until SIGKILL at timeouts.stop_grace (Lightning's "
            "handler only sets a flag, and a rank waiting in a collective never reads it); "
            "\"auto\": \"ignored\" when the job has a [trainer], else \"exits\".",
     .values = kSigtermNames,
     .default_value = "auto"},
}};

constexpr std::array<std::string_view, 13> kFaultKindNames = {
    "node-crash",       "agent-hang",          "worker-exit",   "worker-hang",      "worker-slow",
    "partition",        "master-port-blocked", "slow-joiner",   "job-file-differs", "duplicate-node-rank",
    "etcd-member-down", "etcd-leader-lost",    "etcd-partition"};

// The ranges are those of any job; the loader lowers the node and rank bounds to the job's.
constexpr std::array<KeySpec, 9> kFaultKeys = {{
    {.name = "at",
     .type = KeyType::kDuration,
     .doc = "Virtual time of the fault since the start.",
     .required = true},
    {.name = "kind",
     .type = KeyType::kString,
     .doc = "What happens.",
     .values = kFaultKindNames,
     .required = true},
    {.name = "node",
     .type = KeyType::kInteger,
     .doc = "The node it hits (etcd-member-down: the etcd member, 0..2).",
     .range = kNodeRankRange,
     .default_value = "0"},
    {.name = "local_rank",
     .type = KeyType::kInteger,
     .doc = "worker-exit, worker-hang, worker-slow: which worker (default 0).",
     .range = IntRange{0, kMaxProcsPerNode - 1}},
    {.name = "exit_code",
     .type = KeyType::kInteger,
     .doc = "worker-exit: the exit code.",
     .range = IntRange{0, 255},
     .default_value = "1"},
    {.name = "duration",
     .type = KeyType::kDuration,
     .doc = "agent-hang, worker-hang, worker-slow, partition, master-port-blocked, slow-joiner, "
            "etcd-member-down, etcd-leader-lost, etcd-partition: heals after this."},
    {.name = "reboot_after",
     .type = KeyType::kDuration,
     .doc = "node-crash: the node comes back after this."},
    {.name = "peers",
     .type = KeyType::kIntegerArray,
     .doc = "partition: the nodes cut off from `node` (default: node 0).",
     .item_range = kNodeRankRange},
    {.name = "percent",
     .type = KeyType::kInteger,
     .doc = "worker-slow: how much more own work per step the worker needs, in percent (100: "
            "twice as much).",
     .range = IntRange{1, 10'000},
     .default_value = "100"},
}};

constexpr auto kTopNames = NamesOf(kTopKeys);
constexpr auto kJobNames = NamesOf(kJobKeys);
constexpr auto kClusterNames = NamesOf(kClusterKeys);
constexpr auto kRestartNames = NamesOf(kRestartKeys);
constexpr auto kTimeoutNames = NamesOf(kTimeoutKeys);
constexpr auto kStragglerNames = NamesOf(kStragglerKeys);
constexpr auto kQuarantineNames = NamesOf(kQuarantineKeys);
constexpr auto kRendezvousNames = NamesOf(kRendezvousKeys);
constexpr auto kLogNames = NamesOf(kLogKeys);
constexpr auto kMetricsNames = NamesOf(kMetricsKeys);
constexpr auto kSimulateNames = NamesOf(kSimulateKeys);
constexpr auto kFaultNames = NamesOf(kFaultKeys);

const std::array<SectionSpec, 13> kSections = {{
    {.name = "", .doc = "", .keys = kTopKeys, .known_names = kTopNames},
    {.name = "job", .doc = "", .keys = kJobKeys, .known_names = kJobNames},
    {.name = "cluster",
     .doc = "",
     .keys = kClusterKeys,
     .known_names = kClusterNames,
     .any_of_required = kClusterNeeds},
    {.name = "trainer", .doc = "", .keys = kTrainerKeys, .known_names = kLightningTrainerArgs, .open = true},
    {.name = "restart", .doc = "", .keys = kRestartKeys, .known_names = kRestartNames},
    {.name = "timeouts", .doc = "", .keys = kTimeoutKeys, .known_names = kTimeoutNames},
    {.name = "quarantine", .doc = "", .keys = kQuarantineKeys, .known_names = kQuarantineNames},
    {.name = "rendezvous", .doc = "", .keys = kRendezvousKeys, .known_names = kRendezvousNames},
    {.name = "stragglers", .doc = "", .keys = kStragglerKeys, .known_names = kStragglerNames},
    {.name = "logs", .doc = "", .keys = kLogKeys, .known_names = kLogNames},
    {.name = "metrics", .doc = "", .keys = kMetricsKeys, .known_names = kMetricsNames},
    {.name = "simulate", .doc = "", .keys = kSimulateKeys, .known_names = kSimulateNames},
    {.name = "simulate.faults",
     .doc = "One scheduled fault.",
     .keys = kFaultKeys,
     .known_names = kFaultNames},
}};

// Which optional fault keys each kind takes.
constexpr std::array<std::string_view, 1> kRebootAfter = {"reboot_after"};
constexpr std::array<std::string_view, 1> kDuration = {"duration"};
constexpr std::array<std::string_view, 2> kWorkerExitKeys = {"local_rank", "exit_code"};
constexpr std::array<std::string_view, 2> kWorkerHangKeys = {"local_rank", "duration"};
constexpr std::array<std::string_view, 2> kPartitionKeys = {"duration", "peers"};
constexpr std::array<std::string_view, 3> kWorkerSlowKeys = {"local_rank", "duration", "percent"};

constexpr std::array<FaultKindSpec, 13> kFaultKindSpecs = {{
    {FaultKind::kNodeCrash, kFaultKindNames[0], kRebootAfter},
    {FaultKind::kAgentHang, kFaultKindNames[1], kDuration},
    {FaultKind::kWorkerExit, kFaultKindNames[2], kWorkerExitKeys},
    {FaultKind::kWorkerHang, kFaultKindNames[3], kWorkerHangKeys},
    {FaultKind::kWorkerSlow, kFaultKindNames[4], kWorkerSlowKeys},
    {FaultKind::kPartition, kFaultKindNames[5], kPartitionKeys},
    {FaultKind::kMasterPortBlocked, kFaultKindNames[6], kDuration},
    {FaultKind::kSlowJoiner, kFaultKindNames[7], kDuration},
    {FaultKind::kJobFileDiffers, kFaultKindNames[8], {}},
    {FaultKind::kDuplicateNodeRank, kFaultKindNames[9], {}},
    {FaultKind::kEtcdMemberDown, kFaultKindNames[10], kDuration},
    {FaultKind::kEtcdLeaderLost, kFaultKindNames[11], kDuration},
    {FaultKind::kEtcdPartition, kFaultKindNames[12], kDuration},
}};

[[noreturn]] void NotInTable(std::string_view what) {
  fmt::print(stderr, "ddprun: internal error: {} is not in the key table\n", what);
  std::abort();
}

}  // namespace

IntRange IntRange::Below(int64_t max_of_job) const { return {min, std::min(max, max_of_job)}; }

std::span<const SectionSpec> Sections() { return kSections; }

const SectionSpec& SectionNamed(std::string_view name) {
  for (const SectionSpec& section : kSections) {
    if (section.name == name) return section;
  }
  NotInTable(name);
}

const KeySpec* FindKey(const SectionSpec& section, std::string_view name) {
  for (const KeySpec& key : section.keys) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

const KeySpec& Key(std::string_view dotted_path) {
  const size_t dot = dotted_path.rfind('.');
  const std::string_view section = dot == std::string_view::npos ? "" : dotted_path.substr(0, dot);
  const std::string_view name = dot == std::string_view::npos ? dotted_path : dotted_path.substr(dot + 1);
  if (const KeySpec* key = FindKey(SectionNamed(section), name)) return *key;
  NotInTable(dotted_path);
}

std::string QuotedAlternatives(std::span<const std::string_view> values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += i + 1 == values.size() ? " or " : ", ";
    out += fmt::format("\"{}\"", values[i]);
  }
  return out;
}

std::span<const FaultKindSpec> FaultKinds() { return kFaultKindSpecs; }

std::string_view FaultKindName(FaultKind kind) {
  for (const FaultKindSpec& spec : kFaultKindSpecs) {
    if (spec.kind == kind) return spec.name;
  }
  return kFaultKindSpecs[0].name;
}

std::optional<FaultKind> ParseFaultKind(std::string_view name) {
  for (const FaultKindSpec& spec : kFaultKindSpecs) {
    if (spec.name == name) return spec.kind;
  }
  return std::nullopt;
}

}  // namespace ddprun
