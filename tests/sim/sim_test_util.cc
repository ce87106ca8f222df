#include "tests/sim/sim_test_util.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "schema/loader.h"

namespace ddprun::testing {

std::string SmallJob(std::string_view extra, int nnodes, int nproc, int max_restarts,
                     std::string_view rendezvous) {
  return fmt::format(R"(version = 1
[job]
name = "t"
command = ["python", "train.py"]
[cluster]
nnodes = {0}
master_addr = "127.0.0.1"
nproc_per_node = {1}
[trainer]
accelerator = "cpu"
devices = {1}
num_nodes = {0}
[restart]
max_restarts = {2}
backoff = "10s"
[timeouts]
rendezvous = "{3}"
[simulate]
seed = 3
train_time = "20m"
checkpoint_every = "5m"
worker_startup = "20s"
{4}
)",
                     nnodes, nproc, max_restarts, rendezvous, extra);
}

std::string ExampleJob(const std::string& name) {
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/examples/" + name);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << name;
  return text.str();
}

std::string WithWorkersThatExitOnSigterm(std::string job) {
  const size_t at = job.find("\n[simulate]\n");
  if (at == std::string::npos) return job + "\n[simulate]\nsigterm = \"exits\"\n";
  return job.insert(at + 12, "sigterm = \"exits\"\n");
}

SimRun Simulate(const std::string& job, const std::vector<std::string>& faults, std::optional<uint64_t> seed,
                bool record, sim::SimOptions::Sabotage sabotage) {
  LoadResult loaded = ParseJobText(job, "job.toml");
  SimRun run;
  if (!loaded.spec) {
    ADD_FAILURE() << "test job does not load: " << loaded.diagnostics.items.front().message;
    return run;
  }
  JobSpec spec = *loaded.spec;
  sim::SimOptions options;
  options.seed = seed.value_or(spec.simulate.seed);
  options.record_timeline = record;
  options.sabotage = sabotage;
  for (const std::string& text : faults) {
    auto fault = ParseFaultFlag(text);
    if (!fault) {
      ADD_FAILURE() << text << ": " << fault.error();
      continue;
    }
    spec.simulate.faults.push_back(*fault);
    options.flag_faults.push_back(*fault);
  }
  std::ostringstream out;
  run.result = sim::RunSimulation(spec, options, &out, record ? &run.timeline : nullptr);
  run.output = out.str();
  return run;
}

}  // namespace ddprun::testing
