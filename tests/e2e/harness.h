#pragma once
// Runs real `ddprun` agents as separate processes on 127.0.0.1 for end-to-end tests: a
// scratch job directory, a master port no other test takes, agents with captured output,
// bounded waits.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::e2e {

/// A TCP port on 127.0.0.1 that is free now and that no other test process on this machine
/// is handed while this one runs; outside the ephemeral range. See harness.cc for how.
uint16_t FreePort();

/// A job file for agents on 127.0.0.1, as TOML by Toml(). The defaults are what most e2e jobs
/// share; a test sets what its job needs. A key left empty (or unset) is left out of the file,
/// so the job keeps ddprun's default for it.
struct TestJob {
  std::string name = "e2e";
  std::string command;  // job.command as a TOML array; "" runs ["sh", "-c", script]
  std::string script = "true";
  std::string workdir;             // job.workdir
  std::string code_check;          // job.code_check
  std::string job_extra;           // more [job] lines, e.g. "preload = [\"torch\"]\n"
  std::string library_check;       // job.library_check
  int nnodes = 2;                  // cluster.nnodes (left out with `nodes`) and trainer.num_nodes
  std::vector<std::string> nodes;  // cluster.nodes, in place of cluster.nnodes
  uint16_t master_port = 0;
  uint16_t store_port = 0;  // cluster.store_port; 0 leaves it out
  std::string accelerator = "cpu";
  int devices = 2;                  // trainer.devices: workers per node
  std::string trainer_extra;        // more [trainer] lines, e.g. "max_epochs = 3\n"
  std::optional<int> max_restarts;  // [restart] is written when one of these three is set
  std::string backoff;
  std::string backoff_max;
  std::vector<std::string> never_on;  // restart.never_on
  std::string rendezvous = "20s";
  std::string heartbeat = "250ms";  // short, so that losses show within a second
  std::string stop_grace = "2s";
  std::string extra;  // TOML appended at the end: more tables, e.g. "[logs]\n..."

  std::string Toml() const;
};

/// `text` as a TOML basic string, quotes included.
std::string TomlString(const std::string& text);

/// A fresh directory under the system temp dir, removed by the destructor.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const;
  std::string Read(const std::string& name) const;
  bool Exists(const std::string& name) const;

 private:
  std::string path_;
};

/// One `ddprun` process; output (stdout and stderr together) goes to a file.
class AgentProcess {
 public:
  /// Runs `ddprun args...`, or `prefix... ddprun args...` (e.g. `ip netns exec A`).
  /// With `own_process_group`, the agent leads a new process group (as a shell job would), so
  /// a test can signal the whole group without signalling itself.
  AgentProcess(const std::vector<std::string>& args, const std::string& output_path,
               const std::map<std::string, std::string>& extra_env = {},
               const std::vector<std::string>& prefix = {}, bool own_process_group = false);
  /// Runs `argv` (argv[0] looked up on PATH) in place of ddprun: torchrun beside it, say.
  struct OtherProgram {};
  AgentProcess(OtherProgram, const std::vector<std::string>& argv, const std::string& output_path,
               const std::map<std::string, std::string>& extra_env = {});
  ~AgentProcess();  // SIGKILLs the agent if it still runs
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// Waits up to `limit` for the exit; returns the exit code (128+signal when killed),
  /// or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds limit);
  void Signal(int signal) const;
  std::string Output() const;

 private:
  void Spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra_env,
             bool own_process_group);
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string output_path_;
};

/// Every agent's output, each under a "---- agent i ----" header, for failure messages.
std::string DescribeAgents(const std::vector<std::unique_ptr<AgentProcess>>& agents);

/// True while `pid` exists and is not a zombie.
bool ProcessAlive(pid_t pid);

/// The live children of `parent` whose command name (/proc/<pid>/comm) is `comm`.
std::vector<pid_t> ChildrenNamed(pid_t parent, const std::string& comm);

/// Polls `predicate` every 20 ms for up to `limit`.
template <typename Predicate>
bool WaitFor(Predicate predicate, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    struct timespec ts {
      0, 20'000'000
    };
    nanosleep(&ts, nullptr);
  }
  return predicate();
}

/// The pid a daemon writes into `name` in `dir`, once the file holds one (a daemon may create
/// the file before it writes the number: slurmctld and sshd do); 0 when none came within
/// `within`.
pid_t WaitForPidFile(const ScratchDir& dir, const std::string& name, std::chrono::milliseconds within);

/// Reads `KEY=VALUE` lines (as `env` prints them) into a map.
std::map<std::string, std::string> ParseEnvDump(const std::string& text);

/// What an HTTP server on addr:port (IPv4) answered to `GET path`, headers and body, read until
/// it closes or is silent for 5 s; "" when it could not connect.
std::string HttpGet(const std::string& addr, uint16_t port, const std::string& path);

/// Runs `command` with sh, its output discarded; its exit status.
int Shell(const std::string& command);

/// Two hosts on one machine: network namespaces A and B joined by a veth pair, with the
/// addresses 10.<net>.<k>.1 and .2 (k from the pid, so that test processes do not collide) and
/// loopback up; deleted by the destructor. Needs root and iproute2.
class NetnsPair {
 public:
  /// nullptr and `why` when this machine cannot make them (for DDPRUN_REQUIRE_OR_SKIP).
  static std::unique_ptr<NetnsPair> Create(const std::string& tag, int net, std::string* why);
  ~NetnsPair();
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;

  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& addr_a() const { return addr_a_; }
  const std::string& addr_b() const { return addr_b_; }

 private:
  NetnsPair() = default;
  std::string a_, b_, addr_a_, addr_b_;
  bool a_made_ = false, b_made_ = false;
};

}  // namespace ddprun::e2e
