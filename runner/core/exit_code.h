#pragma once
// The process exit codes of ddprun, in one place: the core decides them, the CLI returns them,
// README.md and DESIGN.md document them.

namespace ddprun::core {

enum class ExitCode : int {
  kOk = 0,
  kJobFailed = 1,   // a worker failed (or a node was lost) and no restarts were left
  kUsage = 2,       // the job file or the command line is wrong
  kRendezvous = 3,  // a node never came, a node disagreed, the coordinator was lost for good
  kInternal = 70,   // a bug in ddprun
};

/// 128 + the signal, as shells report a process ended by it (130 SIGINT, 143 SIGTERM).
constexpr int InterruptedExitCode(int signal) { return 128 + signal; }

constexpr int ToInt(ExitCode code) { return static_cast<int>(code); }

}  // namespace ddprun::core
