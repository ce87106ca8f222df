#pragma once
// Helpers shared by the simulator tests: a small job, and one call that runs it with faults.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/simulation.h"

namespace ddprun::testing {

/// 2 nodes x 2 CPU workers, 2 restarts, 20 minutes of training, checkpoints every 5 minutes.
/// `extra` is appended (more [[simulate.faults]], or sections the base leaves out).
std::string SmallJob(std::string_view extra = "", int nnodes = 2, int nproc = 2, int max_restarts = 2,
                     std::string_view rendezvous = "5m");

/// The text of examples/<name> (a test failure when it cannot be read).
std::string ExampleJob(const std::string& name);

/// `job` with `simulate.sigterm = "exits"`: its workers end on SIGTERM, as every simulated worker
/// did before issue 37 (runs found then keep their scenario under that model).
std::string WithWorkersThatExitOnSigterm(std::string job);

struct SimRun {
  sim::SimResult result;
  std::string output;  // the event lines and the summary, as `ddprun --simulate` prints them
  sim::Timeline timeline;
};

/// Parses `job` (must be valid), adds `faults` in --fault syntax, runs the simulation.
SimRun Simulate(const std::string& job, const std::vector<std::string>& faults = {},
                std::optional<uint64_t> seed = std::nullopt, bool record = false,
                sim::SimOptions::Sabotage sabotage = sim::SimOptions::Sabotage::kNone);

}  // namespace ddprun::testing
