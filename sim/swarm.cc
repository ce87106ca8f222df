#include "sim/swarm.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "schema/diagnostics.h"
#include "schema/loader.h"
#include "sim/prng.h"

namespace ddprun::sim {

namespace {

/// etcd's faults and the loss of the first coordinator's host, for jobs that keep their state
/// in etcd: 1 to 3, from `rng` after the others.
void DrawEtcdFaults(Prng& rng, int nnodes, Duration window, std::vector<FaultSpec>& faults) {
  auto seconds_between = [&](Duration lo, Duration hi) {
    return Duration(rng.Between(lo, hi).count() / 1'000'000'000 * 1'000'000'000);
  };
  const uint64_t more = 1 + rng.Below(3);
  for (uint64_t i = 0; i < more; ++i) {
    FaultSpec fault;
    fault.at = Duration(rng.Between(Duration(0), window).count() / 1'000'000 * 1'000'000);
    const uint64_t pick = rng.Below(100);
    if (pick < 25) {
      fault.kind = FaultKind::kEtcdMemberDown;  // a quorum remains: nothing happens
      fault.node = static_cast<int>(rng.Below(static_cast<uint64_t>(kSimulatedEtcdMembers)));
      fault.duration = seconds_between(Seconds(5), Minutes(3));
    } else if (pick < 40) {
      // Two members down at once: no quorum until one returns.
      fault.kind = FaultKind::kEtcdMemberDown;
      fault.node = static_cast<int>(rng.Below(static_cast<uint64_t>(kSimulatedEtcdMembers)));
      fault.duration = seconds_between(Seconds(5), Minutes(2));
      FaultSpec second = fault;
      second.node = (fault.node + 1 + static_cast<int>(rng.Below(2))) % kSimulatedEtcdMembers;
      second.at = fault.at + seconds_between(Duration(0), *fault.duration);
      second.duration = seconds_between(Seconds(5), Minutes(2));
      faults.push_back(second);
    } else if (pick < 60) {
      fault.kind = FaultKind::kEtcdLeaderLost;
      fault.duration = seconds_between(Seconds(1), Seconds(2));
    } else if (pick < 85) {
      fault.kind = FaultKind::kEtcdPartition;
      fault.node = static_cast<int>(rng.Below(static_cast<uint64_t>(nnodes)));
      fault.duration = seconds_between(Seconds(1), Minutes(3));
    } else {
      // Node 0's host dies, for good or for a while: the coordinator's, when node 0's agent
      // won the first campaign (a race).
      fault.kind = FaultKind::kNodeCrash;
      fault.node = 0;
      if (rng.Below(2) == 0) fault.reboot_after = seconds_between(Seconds(20), Minutes(5));
    }
    faults.push_back(fault);
  }
}

/// In a third of the seeds, a rank that stalls for 0.8x-1.2x of timeouts.progress and then
/// goes on: the lengths at which a hang verdict can be wrong (issue 37). From a stream of its
/// own, so that every other mix stays the same.
std::optional<FaultSpec> DrawNearTimeoutStall(Duration progress, uint64_t seed, int nnodes, int nproc,
                                              Duration window) {
  Prng near(seed, 0x4e52);
  if (near.Below(3) != 0) return std::nullopt;
  FaultSpec stall;
  stall.kind = FaultKind::kWorkerHang;
  stall.at = Duration(near.Between(Duration(0), window).count() / 1'000'000 * 1'000'000);
  stall.node = static_cast<int>(near.Below(static_cast<uint64_t>(nnodes)));
  stall.local_rank = static_cast<int>(near.Below(static_cast<uint64_t>(nproc)));
  const int64_t progress_ms = std::chrono::duration_cast<std::chrono::milliseconds>(progress).count();
  stall.duration =
      std::chrono::milliseconds(progress_ms * (800 + static_cast<int64_t>(near.Below(401))) / 1000);
  return stall;
}

}  // namespace

std::vector<FaultSpec> DrawSwarmFaults(const JobSpec& spec, uint64_t seed) {
  Prng rng(seed, 0x5a4d);  // its own stream: the run itself draws from the seed's other streams
  // Faults land on any host of the job: the nodes and the spares (node nnodes + i is spare i).
  const int nnodes = spec.cluster.Agents();
  const int nproc = spec.cluster.nproc_per_node;
  // Faults land while the job can still be hit: rendezvous, startup and training.
  const Duration window = spec.simulate.worker_startup + spec.simulate.train_time + Minutes(2);
  std::vector<FaultSpec> faults;
  const uint64_t count = 1 + rng.Below(4);
  for (uint64_t i = 0; i < count; ++i) {
    FaultSpec fault;
    fault.at = Duration(rng.Between(Duration(0), window).count() / 1'000'000 * 1'000'000);
    fault.node = static_cast<int>(rng.Below(static_cast<uint64_t>(nnodes)));
    const uint64_t pick = rng.Below(100);
    auto short_duration = [&] {
      return Duration(rng.Between(Seconds(1), Minutes(3)).count() / 1'000'000'000 * 1'000'000'000);
    };
    if (pick < 20) {
      fault.kind = FaultKind::kNodeCrash;
      if (rng.Below(10) < 9) {
        fault.reboot_after =
            Duration(rng.Between(Seconds(20), Minutes(5)).count() / 1'000'000'000 * 1'000'000'000);
      }
    } else if (pick < 35) {
      fault.kind = FaultKind::kWorkerExit;
      fault.local_rank = static_cast<int>(rng.Below(static_cast<uint64_t>(nproc)));
      fault.exit_code = 1 + static_cast<int>(rng.Below(255));
    } else if (pick < 47) {
      fault.kind = FaultKind::kWorkerHang;
      fault.local_rank = static_cast<int>(rng.Below(static_cast<uint64_t>(nproc)));
      if (rng.Below(2) == 0) fault.duration = short_duration();
    } else if (pick < 62) {
      fault.kind = FaultKind::kPartition;
      fault.duration = short_duration();
      if (nnodes > 2 && rng.Below(2) == 0) {
        int peer = static_cast<int>(rng.Below(static_cast<uint64_t>(nnodes)));
        if (peer == fault.node) peer = (peer + 1) % nnodes;
        fault.peers.push_back(peer);
      }
    } else if (pick < 75) {
      fault.kind = FaultKind::kAgentHang;
      fault.duration = short_duration();
    } else if (pick < 84) {
      fault.kind = FaultKind::kMasterPortBlocked;
      fault.duration = short_duration();
    } else if (pick < 92) {
      fault.kind = FaultKind::kSlowJoiner;
      fault.at = Duration(0);
      fault.duration = short_duration();
    } else if (pick < 96) {
      fault.kind = FaultKind::kDuplicateNodeRank;
    } else {
      fault.kind = FaultKind::kJobFileDiffers;
      fault.at = Duration(0);
    }
    if (fault.kind == FaultKind::kPartition && nnodes == 1) continue;
    faults.push_back(fault);
  }
  // Jobs that watch their ranks' progress also get stragglers, drawn after the others so that
  // every other job's mix stays what it was.
  if (spec.timeouts.DetectsHangs() && rng.Below(3) == 0) {
    FaultSpec slow;
    slow.kind = FaultKind::kWorkerSlow;
    slow.at = Duration(rng.Between(Duration(0), window).count() / 1'000'000 * 1'000'000);
    slow.node = static_cast<int>(rng.Below(static_cast<uint64_t>(nnodes)));
    slow.local_rank = static_cast<int>(rng.Below(static_cast<uint64_t>(nproc)));
    slow.percent = 20 + static_cast<int>(rng.Below(281));
    if (rng.Below(2) == 0) {
      slow.duration = Duration(rng.Between(Minutes(1), Minutes(10)).count() / 1'000'000'000 * 1'000'000'000);
    }
    faults.push_back(slow);
  }
  // Jobs that keep their state in etcd also get etcd's faults and the loss of the first
  // coordinator's host, drawn last for the same reason.
  if (spec.rendezvous.Etcd()) DrawEtcdFaults(rng, nnodes, window, faults);
  // Jobs with an explicit timeouts.progress also get, in a third of the seeds, a rank that
  // stalls for 0.8x-1.2x of it and then goes on: the lengths at which a hang verdict can be
  // wrong (issue 37). From a stream of its own, drawn last: every other mix stays the same.
  if (spec.timeouts.progress) {
    if (auto stall = DrawNearTimeoutStall(*spec.timeouts.progress, seed, nnodes, nproc, window))
      faults.push_back(*stall);
  }
  return faults;
}

std::vector<JobOverride> DrawSwarmShape(uint64_t seed) {
  Prng rng(seed, 0x5348);  // its own stream, as the faults' is
  auto pick = [&](std::initializer_list<const char*> values) {
    return std::string(values.begin()[rng.Below(values.size())]);
  };
  std::vector<JobOverride> shape;
  auto set = [&](const char* key, std::string value) {
    shape.push_back(JobOverride{key, std::move(value), false});
  };
  // Mostly small jobs (where every node's fault matters), some up to 64 nodes.
  const uint64_t size = rng.Below(100);
  const int nnodes = static_cast<int>(size < 45   ? 1 + rng.Below(4)
                                      : size < 80 ? 5 + rng.Below(12)
                                                  : 17 + rng.Below(48));
  const int nproc = static_cast<int>(1 + rng.Below(8));
  const uint64_t spare_pick = rng.Below(100);
  const int spares = spare_pick < 60 ? 0 : static_cast<int>(1 + rng.Below(3));
  const bool etcd = rng.Below(100) < 20;
  if (etcd) {
    // etcd names every host: the coordinator listens on whichever one holds the role.
    shape.push_back(JobOverride{"cluster.nnodes", "", true});
    shape.push_back(JobOverride{"cluster.master_addr", "", true});
    std::vector<std::string> hosts;
    for (int i = 0; i < nnodes; ++i) hosts.push_back(fmt::format("\"10.0.{}.{}\"", i / 200, 1 + i % 200));
    set("cluster.nodes", fmt::format("[{}]", fmt::join(hosts, ", ")));
    std::vector<std::string> spare_hosts;
    for (int i = 0; i < spares; ++i) spare_hosts.push_back(fmt::format("\"10.1.0.{}\"", 1 + i));
    if (spares > 0) set("cluster.spares", fmt::format("[{}]", fmt::join(spare_hosts, ", ")));
    set("rendezvous.backend", "etcd");
    set("rendezvous.endpoints",
        "[\"http://10.9.0.1:2379\", \"http://10.9.0.2:2379\", \"http://10.9.0.3:2379\"]");
    set("rendezvous.lease", pick({"5s", "10s", "20s"}));
  } else {
    set("cluster.nnodes", std::to_string(nnodes));
    if (spares > 0) set("cluster.spares", std::to_string(spares));
  }
  set("cluster.nproc_per_node", std::to_string(nproc));
  const bool shrinks = nnodes > 1 && rng.Below(100) < 35;
  if (shrinks) {
    set("cluster.min_nodes", std::to_string(1 + rng.Below(static_cast<uint64_t>(nnodes - 1))));
  }
  const std::string heartbeat = pick({"250ms", "500ms", "1s", "2s", "5s", "10s", "30s"});
  set("timeouts.heartbeat", heartbeat);
  set("timeouts.stop_grace", pick({"1s", "5s", "10s", "30s", "1m", "2m"}));
  set("timeouts.rendezvous", pick({"5m", "10m", "30m"}));
  if (spares > 0 || shrinks || rng.Below(2) == 0) {
    set("timeouts.replace", pick({"10s", "1m", "5m"}));
  }
  set("restart.max_restarts", std::to_string(rng.Below(9)));
  set("restart.backoff", pick({"1s", "10s", "30s", "2m"}));
  const uint64_t progress = rng.Below(100);
  if (progress < 20) {
    // The loader wants at least 2 heartbeats: ranks report their progress once per heartbeat.
    set("timeouts.progress", heartbeat == "30s" ? pick({"2m", "5m"}) : pick({"30s", "2m", "5m"}));
  } else if (progress < 30) {
    set("timeouts.progress", "auto");
  }
  // Failure rates for the whole run, besides the swarm's 1-4 scheduled faults.
  set("simulate.checkpoint_every", pick({"1m", "5m", "10m"}));
  const std::string node_mtbf = pick({"", "", "4h", "12h", "48h"});
  if (!node_mtbf.empty()) {
    set("simulate.node_mtbf", node_mtbf);
    set("simulate.node_never_returns_percent", pick({"0", "10", "33"}));
  }
  const std::string worker_mtbf = pick({"", "", "8h", "40h"});
  if (!worker_mtbf.empty()) set("simulate.worker_mtbf", worker_mtbf);
  if (rng.Below(100) < 20) set("simulate.worker_hang_mtbf", pick({"4h", "16h"}));
  // Half the shapes stop like Lightning (their workers outlive SIGTERM until stop_grace's
  // SIGKILL), from a stream of their own so that every other draw is what it was (issue 37).
  Prng stop(seed, 0x5354);
  if (stop.Below(2) == 0) set("simulate.sigterm", "ignored");
  return shape;
}

SwarmResult RunSwarm(const JobSpec& spec, const SimOptions& base, int count, std::ostream& out,
                     const std::string* shape_of) {
  SwarmResult swarm;
  std::vector<double> goodput;
  std::map<int, int> exits;
  for (int i = 0; i < count; ++i) {
    SimOptions options = base;
    options.seed = base.seed + static_cast<uint64_t>(i);
    options.quiet = true;
    JobSpec job = spec;
    if (shape_of) {
      const std::vector<JobOverride> shape = DrawSwarmShape(options.seed);
      LoadResult loaded = ParseJobText(ApplyJobOverrides(*shape_of, shape), base.job_path);
      for (const JobOverride& change : shape) options.overrides.push_back(FormatJobOverride(change));
      if (!loaded.spec) {
        ++swarm.shapes_refused;
        ++swarm.failures;
        swarm.failed_seeds.push_back(options.seed);
        out << fmt::format("seed {}: SHAPE REFUSED by the loader:\n{}  shape: --set {}\n", options.seed,
                           RenderDiagnostics(loaded.diagnostics, base.job_path, loaded.source_text, false),
                           fmt::join(options.overrides, " --set "));
        continue;
      }
      job = std::move(*loaded.spec);
    }
    const JobSpec& shaped = job;
    for (const FaultSpec& fault : DrawSwarmFaults(shaped, options.seed)) {
      job.simulate.faults.push_back(fault);
      options.flag_faults.push_back(fault);
    }
    const SimResult result = RunSimulation(job, options, nullptr);
    ++swarm.runs;
    ++exits[result.exit_code];
    const int64_t wall = result.stats.end_ns;
    goodput.push_back(wall > 0 ? static_cast<double>(result.stats.useful_ns) / static_cast<double>(wall)
                               : 0.0);
    std::vector<std::string> kinds;
    for (const FaultSpec& fault : options.flag_faults) kinds.emplace_back(FaultKindName(fault.kind));
    if (result.violation) {
      ++swarm.failures;
      swarm.failed_seeds.push_back(options.seed);
      out << fmt::format("seed {}: FAILED: {}\n  reproduce with: {}\n", options.seed, *result.violation,
                         result.repro);
    } else if (!base.quiet) {
      out << fmt::format("seed {}: ok: exit {}, {} round{}, {} restart{}; faults: {}\n", options.seed,
                         result.exit_code, result.stats.rounds_started,
                         result.stats.rounds_started == 1 ? "" : "s", result.stats.restarts_used,
                         result.stats.restarts_used == 1 ? "" : "s", fmt::join(kinds, ", "));
      // A drawn shape is in no file: the line that runs this seed alone, as a failed one has.
      if (shape_of) out << fmt::format("  reproduce with: {}\n", result.repro);
    }
  }
  out << fmt::format("swarm: {} seeds ({}..{}), {} failed\n", count, base.seed,
                     base.seed + static_cast<uint64_t>(count) - 1, swarm.failures);
  if (shape_of) out << fmt::format("swarm shapes: {} refused by the loader\n", swarm.shapes_refused);
  // Goodput (useful training / wall time, as each run's summary has it) across the seeds.
  std::sort(goodput.begin(), goodput.end());
  double sum = 0;
  for (double g : goodput) sum += g;
  swarm.mean_goodput = goodput.empty() ? 0 : sum / static_cast<double>(goodput.size());
  auto at = [&](double q) {
    return 100.0 * goodput[static_cast<size_t>(q * static_cast<double>(goodput.size() - 1) + 0.5)];
  };
  std::vector<std::string> codes;
  for (const auto& [code, n] : exits) codes.push_back(fmt::format("exit {}: {}", code, n));
  swarm.exit_codes = exits;
  if (!goodput.empty()) {
    out << fmt::format("swarm goodput: mean {:.1f}%, p10 {:.1f}%, median {:.1f}%, p90 {:.1f}%; {}\n",
                       100.0 * swarm.mean_goodput, at(0.1), at(0.5), at(0.9), fmt::join(codes, ", "));
  }
  return swarm;
}

}  // namespace ddprun::sim
