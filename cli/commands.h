#pragma once
// The subcommands of the `ddprun` executable. main.cc parses the command line (CLI11) into
// these option structs and calls one function; each returns the process exit code
// (DESIGN.md section 1: 0 ok, 1 job failed, 2 usage/job file, 3 rendezvous, 129/130/143, 70).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runner/core/exit_code.h"

namespace ddprun::cli {

// The names the CLI uses for core's ExitCode (runner/core/exit_code.h), the one definition.
inline constexpr int kExitOk = core::ToInt(core::ExitCode::kOk);
inline constexpr int kExitJobFailed = core::ToInt(core::ExitCode::kJobFailed);
inline constexpr int kExitUsage = core::ToInt(core::ExitCode::kUsage);
inline constexpr int kExitRendezvous = core::ToInt(core::ExitCode::kRendezvous);
inline constexpr int kExitInternal = core::ToInt(core::ExitCode::kInternal);
inline constexpr int kExitSigint = core::InterruptedExitCode(2);
inline constexpr int kExitSigterm = core::InterruptedExitCode(15);

struct CheckOptions {
  std::string job_path;
  std::vector<std::string> script_args;  // after `--`: appended to job.command
  std::optional<int> node_rank;
  bool json = false;
  bool color = false;
  bool full = false;  // the whole plan even above kPlanSummaryAboveNodes nodes
};

struct RunOptions {
  std::string job_path;
  std::vector<std::string> script_args;  // after `--`: appended to job.command on this node
  std::optional<int> node_rank;          // --node-rank; else DDPRUN_NODE_RANK, SLURM_NODEID, host match
  bool verbose = false;
  bool under_up = false;  // hidden --under-up: started by `ddprun up` (stdin is its link)
};

struct SimulateOptions {
  std::string job_path;
  std::optional<uint64_t> seed;     // overrides [simulate].seed
  std::vector<std::string> faults;  // --fault kind@time:key=value,...
  std::optional<int> nodes;         // --nodes N: override cluster size (scale runs)
  std::string trace_path;           // --trace FILE (Chrome trace JSON)
  std::string report_path;          // --report FILE.html
  std::optional<int> swarm;         // --swarm N seeds
  bool vary_shape = false;          // --vary-shape with --swarm: each seed its own job shape
  std::vector<std::string> sets;    // --set key=value: change the job file's key
  std::vector<std::string> sweeps;  // --sweep key=v1,v2,...: the grid of settings
  std::optional<int> seeds;         // --seeds N with --sweep
  std::string chart_path;           // --chart FILE (.svg or .html) with --sweep
  bool quiet = false;               // summary only, no per-event lines
  bool beat_by_beat = false;        // --beat-by-beat: run quiet stretches one heartbeat at a time
  std::string replay_dir;           // --replay LOGDIR: predicted versus actual
  std::optional<int> run;           // --run N with --replay: the Nth run found, oldest first
};

/// `ddprun report LOGDIR`: a real run's page (and trace) from its event logs.
struct ReportOptions {
  std::string log_dir;                   // a folder with events-node<k>.jsonl files below it
  std::string out_path = "report.html";  // --out
  std::string trace_path;                // --trace FILE (Chrome trace JSON); "" none
  std::optional<int> run;                // --run N: the Nth run found, oldest first
};

struct PreflightOptions {
  std::string job_path;
  std::vector<std::string> script_args;  // after `--`: part of the job, as for run
  std::optional<int> node_rank;
};

/// `ddprun up`: every node's agent from this machine, over ssh.
struct UpOptions {
  std::string job_path;
  std::vector<std::string> script_args;  // after `--`: passed to every agent
  std::string remote_ddprun;   // --remote-ddprun: the program on the hosts ("" io::RemoteProgram's default)
  bool install = false;        // --install: this ddprun into ~/.ddprun/<id> where a host needs it
  bool copy = false;           // --copy: the job file to the same path on every host
  int connect_timeout_s = 10;  // --connect-timeout
  bool detach = false;         // --detach: leave the agents running (own session)
};

/// `ddprun init`: a starter job file.
struct InitOptions {
  std::string output = "job.toml";
  std::string name;                 // default: from the script's file name
  std::string script = "train.py";  // *.py runs as `python3 script`
  std::vector<std::string> nodes;   // --nodes a,b: listed hosts
  int nnodes = 1;                   // --nnodes N: unlisted nodes
  int gpus_per_node = 1;            // 0: a CPU job with one worker per node
  int master_port = 29500;
  bool force = false;  // overwrite an existing file
  bool slurm = false;  // --slurm: hosts from the allocation, and an sbatch script
};

/// The hidden `ddprun __preflight-worker`: what `preflight` runs as every rank.
struct PreflightWorkerOptions {
  std::string job_name;
  int nnodes = 1;
  int nproc_per_node = 1;
  std::string accelerator;
  std::vector<std::string> nodes;  // cluster.nodes, in order
  int master_port = 0;             // cluster.master_port, for messages
  std::string python;              // the job's interpreter, for its versions
};

int CheckCommand(const CheckOptions& options);
int InitCommand(const InitOptions& options);
int SchemaCommand();
int RunCommand(const RunOptions& options);
int UpCommand(const UpOptions& options);
/// `ddprun status job.toml` / `ddprun down job.toml`: the agents `up --detach` left running.
int StatusCommand(const UpOptions& options);
int DownCommand(const UpOptions& options);
/// `ddprun __up-remote ACTION ...` (hidden): the host's side of up --detach, status, down, --copy.
int UpRemoteCommand(const std::vector<std::string>& args);
int SimulateCommand(const SimulateOptions& options);
int ReportCommand(const ReportOptions& options);
int PreflightCommand(const PreflightOptions& options);
int PreflightWorkerCommand(const PreflightWorkerOptions& options);

}  // namespace ddprun::cli
