#include "runner/io/node_identity_slurm.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/host_name.h"
#include "base/parse_int.h"
#include "runner/io/net_interfaces.h"
#include "runner/io/remote_processes.h"

namespace ddprun::io {

Result<DetectedRank> RankFromSlurmNodeId(const JobSpec& spec, const std::string& value,
                                         const Result<DetectedRank>& by_host) {
  const auto parsed = ParseNonNegative(value, 1'000'000);
  if (!parsed)
    return Fail(fmt::format("SLURM_NODEID=\"{}\" is not a node rank (a non-negative integer)", value));
  const int slurm_rank = static_cast<int>(*parsed);
  if (spec.cluster.nodes.empty()) return DetectedRank{slurm_rank, "SLURM_NODEID", ""};
  const std::string listed = spec.cluster.HostOf(slurm_rank);
  if (!by_host) {
    return Fail(
        fmt::format("SLURM_NODEID={} makes this node {} ({}), but {}\nhint: under SLURM, list "
                    "the allocation's hosts (`scontrol show hostnames`) in cluster.nodes, or "
                    "pass --node-rank",
                    slurm_rank, slurm_rank, listed.empty() ? "not listed" : listed, by_host.error()));
  }
  if (by_host->rank == slurm_rank) {
    return DetectedRank{slurm_rank, fmt::format("SLURM_NODEID={}, and {}", slurm_rank, by_host->how), ""};
  }
  DetectedRank rank = *by_host;
  rank.warning = fmt::format(
      "SLURM_NODEID={} is not used: {}, so this is node {}. SLURM numbers an allocation's hosts in "
      "its own order; the job file's order decides (cluster.nodes[0] is where the coordinator "
      "listens)",
      slurm_rank, by_host->how, by_host->rank);
  return rank;
}

Result<std::vector<std::string>> SlurmAllocationHosts() {
  const char* nodelist = std::getenv("SLURM_JOB_NODELIST");
  if (!nodelist || !*nodelist) return Fail("SLURM_JOB_NODELIST is not set (not in a SLURM allocation)");
  RemoteChild scontrol;
  scontrol.argv = {"scontrol", "show", "hostnames", nodelist};
  RunLimits limits;
  limits.deadline = std::chrono::seconds(10);
  const RunOutcome outcome = RunRemoteChildren({scontrol}, limits);
  const ChildOutcome& ran = outcome.children.front();
  if (ran.exit_status != 0) {
    std::string why = ran.err;
    while (!why.empty() && why.back() == '\n') why.pop_back();
    return Fail(fmt::format("`scontrol show hostnames {}` {}{}", nodelist,
                            ran.exit_status == -1 ? std::string("gave no answer within 10 s")
                            : ran.exit_status == 127
                                ? std::string("could not run (is slurm-client installed?)")
                                : fmt::format("failed (exit {})", ran.exit_status),
                            why.empty() ? "" : ": " + why));
  }
  std::vector<std::string> hosts;
  std::istringstream lines(ran.out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) hosts.push_back(line);
  }
  return hosts;
}

LoadContext MachineLoadContext() {
  LoadContext context;
  if (const char* nodelist = std::getenv("SLURM_JOB_NODELIST"); nodelist && *nodelist) {
    context.slurm_hosts = [] { return SlurmAllocationHosts(); };
  }
  return context;
}

Status CheckListedHostsAgainstAllocation(const JobSpec& spec, const std::vector<std::string>& allocation) {
  std::vector<std::string> listed = spec.cluster.nodes;
  listed.insert(listed.end(), spec.cluster.spare_hosts.begin(), spec.cluster.spare_hosts.end());
  auto short_name = [](const std::string& name) { return name.substr(0, name.find('.')); };
  std::vector<std::string> missing;
  const std::string here = short_name(LocalHostName());
  for (const std::string& host : allocation) {
    std::vector<std::string> addresses = ResolveAll(host);
    // This host's own name resolves to 127.0.1.1 on a stock Debian host: its interfaces say more.
    if (short_name(host) == here) {
      for (const LocalInterface& local : LocalInterfaces()) addresses.push_back(local.address);
    }
    const bool found = std::any_of(listed.begin(), listed.end(), [&](const std::string& entry) {
      return entry == host || short_name(entry) == short_name(host) ||
             std::find(addresses.begin(), addresses.end(), entry) != addresses.end();
    });
    if (!found) missing.push_back(host);
  }
  if (missing.empty() && static_cast<int>(allocation.size()) >= spec.cluster.nnodes) return {};
  std::string why = missing.empty() ? fmt::format("the allocation has {} hosts, the job {} nodes",
                                                  allocation.size(), spec.cluster.nnodes)
                                    : fmt::format("{} {} not in the job file", fmt::join(missing, ", "),
                                                  missing.size() == 1 ? "is" : "are");
  return Fail(
      fmt::format("the SLURM allocation's hosts ({}) are not the job file's (cluster.nodes [{}]{}): {}\n"
                  "hint: list the allocation's hosts (`scontrol show hostnames`), or write "
                  "cluster.hosts_from = \"slurm\" in place of cluster.nodes",
                  fmt::join(allocation, ", "), fmt::join(spec.cluster.nodes, ", "),
                  spec.cluster.spare_hosts.empty()
                      ? ""
                      : fmt::format(", spares [{}]", fmt::join(spec.cluster.spare_hosts, ", ")),
                  why));
}

void RemoveSlurmTaskLayout(std::map<std::string, std::string>& env) {
  static constexpr const char* kTaskLayout[] = {
      "SLURM_NTASKS",         "SLURM_NPROCS",         "SLURM_PROCID",
      "SLURM_LOCALID",        "SLURM_NODEID",         "SLURM_NTASKS_PER_NODE",
      "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
      "SLURM_GTIDS",          "SLURM_TASK_PID",
  };
  for (const char* name : kTaskLayout) env.erase(name);
}

}  // namespace ddprun::io
