#pragma once
// The preflight worker: what `ddprun preflight` launches as every rank's command (through the
// hidden `ddprun __preflight-worker`). It reads the torchrun environment ddprun gives every
// worker, exchanges what each rank found through worker rank 0, tests TCP between nodes, runs
// an NCCL all-reduce when every rank has a GPU, and rank 0 prints the verdict.

#include <chrono>

#include "preflight/report.h"

namespace ddprun::preflight {

struct WorkerOptions {
  Expectations expect;                              // from the job file, passed on the command line
  std::chrono::seconds join_timeout{60};            // every rank must have joined the exchange by then
  std::chrono::seconds run_timeout{900};            // reachability and the all-reduce must finish by then
  std::chrono::milliseconds connect_timeout{3000};  // one node-to-node TCP test
};

/// Runs this rank's part; returns the process exit code: rank 0 returns 0 when the verdict has
/// no problems and 1 otherwise; other ranks return 1 only when their own step failed.
int RunPreflightWorker(const WorkerOptions& options);

}  // namespace ddprun::preflight
