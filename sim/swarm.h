#pragma once
// `--swarm N`: N seeds, each with its own random mix of faults (TigerBeetle's swarm testing).
// Every run is checked for invariant and liveness violations; a failure is reported with the
// one command line that reproduces it without --swarm.

#include <cstdint>
#include <map>
#include <ostream>
#include <vector>

#include "schema/job_spec.h"
#include "sim/job_overrides.h"
#include "sim/simulation.h"

namespace ddprun::sim {

/// The random faults swarm run `seed` adds to the job's own (a pure function of the seed).
std::vector<FaultSpec> DrawSwarmFaults(const JobSpec& spec, uint64_t seed);

/// The job shape swarm run `seed` gives the job (--vary-shape): changes to the job file's text,
/// a pure function of the seed: node count (1-64), processes per node (1-8), heartbeat,
/// stop_grace, backoff, max_restarts, spares, cluster.min_nodes, timeouts.progress, failure
/// rates, and the etcd backend (with a listed host per node) on or off.
std::vector<JobOverride> DrawSwarmShape(uint64_t seed);

struct SwarmResult {
  int runs = 0;
  int failures = 0;
  std::vector<uint64_t> failed_seeds;
  double mean_goodput = 0;        // useful training / wall time, averaged over the seeds
  std::map<int, int> exit_codes;  // the jobs' exit codes: how many seeds ended with each
  int shapes_refused = 0;         // --vary-shape: shapes the loader refused (a drawer bug)
};

/// Runs seeds base.seed .. base.seed + count - 1. One line per seed goes to `out` (with
/// base.quiet, only the failed seeds'), then the count of failures, then a line with the
/// goodput across the seeds (mean, p10, median, p90) and how many seeds ended with each exit
/// code.
/// With `shape_of` (--vary-shape: the job file's text), each seed first rewrites that text with
/// DrawSwarmShape(seed) and loads it; the random faults are drawn for the shaped job.
SwarmResult RunSwarm(const JobSpec& spec, const SimOptions& base, int count, std::ostream& out,
                     const std::string* shape_of = nullptr);

}  // namespace ddprun::sim
