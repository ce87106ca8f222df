#pragma once
// `--swarm N`: N seeds, each with its own random mix of faults (TigerBeetle's swarm testing).
// Every run is checked for invariant and liveness violations; a failure is reported with the
// one command line that reproduces it without --swarm.

#include <cstdint>
#include <map>
#include <ostream>
#include <vector>

#include "schema/job_spec.h"
#include "sim/simulation.h"

namespace ddprun::sim {

/// The random faults swarm run `seed` adds to the job's own (a pure function of the seed).
std::vector<FaultSpec> DrawSwarmFaults(const JobSpec& spec, uint64_t seed);

struct SwarmResult {
  int runs = 0;
  int failures = 0;
  std::vector<uint64_t> failed_seeds;
  double mean_goodput = 0;          // useful training / wall time, averaged over the seeds
  std::map<int, int> exit_codes;    // the jobs' exit codes: how many seeds ended with each
};

/// Runs seeds base.seed .. base.seed + count - 1. One line per seed goes to `out` (with
/// base.quiet, only the failed seeds'), then the count of failures, then a line with the
/// goodput across the seeds (mean, p10, median, p90) and how many seeds ended with each exit
/// code.
SwarmResult RunSwarm(const JobSpec& spec, const SimOptions& base, int count, std::ostream& out);

}  // namespace ddprun::sim
