#include "sim/simulation.h"

#include <map>
#include <sstream>

#include <fmt/format.h>

#include "schema/loader.h"
#include "sim/cluster.h"

namespace ddprun::sim {

SimResult RunSimulation(const JobSpec& spec, const SimOptions& options, std::ostream* out,
                        Timeline* timeline) {
  Cluster cluster(spec, options, out, timeline);
  SimResult result = cluster.Run();
  if (out) *out << FormatSummary(spec, options, result);
  return result;
}

std::string FormatSimTime(int64_t ns) {
  const int64_t ms_total = ns / 1'000'000;
  const int64_t ms = ms_total % 1000;
  const int64_t s_total = ms_total / 1000;
  const int64_t s = s_total % 60;
  const int64_t m = (s_total / 60) % 60;
  const int64_t h = (s_total / 3600) % 24;
  const int64_t d = s_total / 86400;
  std::string text;
  if (d > 0) {
    text = fmt::format("{}d{:02}h{:02}m{:02}.{:03}s", d, h, m, s, ms);
  } else if (h > 0) {
    text = fmt::format("{}h{:02}m{:02}.{:03}s", h, m, s, ms);
  } else {
    text = fmt::format("{}m{:02}.{:03}s", m, s, ms);
  }
  return fmt::format("[{:>12}]", text);
}

std::string FormatFaultFlag(const FaultSpec& fault) {
  std::vector<std::string> keys;
  keys.push_back(fmt::format("node={}", fault.node));
  if (fault.local_rank) keys.push_back(fmt::format("local_rank={}", *fault.local_rank));
  if (fault.kind == FaultKind::kWorkerExit) keys.push_back(fmt::format("exit_code={}", fault.exit_code));
  if (fault.kind == FaultKind::kWorkerSlow) keys.push_back(fmt::format("percent={}", fault.percent));
  if (fault.duration) keys.push_back("duration=" + FormatDuration(*fault.duration));
  if (fault.reboot_after) keys.push_back("reboot_after=" + FormatDuration(*fault.reboot_after));
  if (!fault.peers.empty()) keys.push_back(fmt::format("peers={}", fmt::join(fault.peers, "+")));
  return fmt::format("{}@{}:{}", FaultKindName(fault.kind), FormatDuration(fault.at), fmt::join(keys, ","));
}

std::string WithoutEventCount(const std::string& output) {
  std::istringstream in(output);
  std::string line;
  std::string kept;
  while (std::getline(in, line)) {
    if (line.rfind("  virtual time:", 0) == 0) line = line.substr(0, line.find(" ("));
    kept += line + "\n";
  }
  return kept;
}

std::string ReproCommand(const SimOptions& options) {
  std::string command = fmt::format("ddprun --simulate {} --seed {}", options.job_path, options.seed);
  if (options.nodes_override) command += fmt::format(" --nodes {}", *options.nodes_override);
  for (const std::string& change : options.overrides) {
    // Host lists and URLs need the shell's quotes; plain values read better without.
    const bool plain = change.find_first_of(" \"'[]$\\`;&|<>(){}*?!#~") == std::string::npos;
    command += plain ? " --set " + change : " --set '" + change + "'";
  }
  for (const FaultSpec& fault : options.flag_faults) command += " --fault " + FormatFaultFlag(fault);
  return command;
}

namespace {

std::string Percent(int64_t part, int64_t whole) {
  if (whole <= 0) return "n/a";
  return fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

// "node 0", "nodes 1-3", "nodes 1, 4, 7-9" for a sorted list of ranks.
std::string RankRanges(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  std::string list = parts.size() <= 12
                         ? fmt::format("{}", fmt::join(parts, ", "))
                         : fmt::format("{}, ... ({} groups)",
                                       fmt::join(parts.begin(), parts.begin() + 12, ", "), parts.size());
  return fmt::format("{} {}", ranks.size() == 1 ? "node" : "nodes", list);
}

}  // namespace

std::string FormatSummary(const JobSpec& spec, const SimOptions& options, const SimResult& result) {
  const SimStats& s = result.stats;
  const int spares = spec.cluster.spares;
  std::string text = fmt::format(
      "\nsimulation summary: job \"{}\", {} node{} x {} worker{}{}, seed {}\n", spec.job.name,
      spec.cluster.nnodes, spec.cluster.nnodes == 1 ? "" : "s", spec.cluster.nproc_per_node,
      spec.cluster.nproc_per_node == 1 ? "" : "s",
      spares == 0 ? "" : fmt::format(", {} spare{}", spares, spares == 1 ? "" : "s"), options.seed);
  // Outcome per node, grouped when identical.
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> extras;
  for (const NodeOutcome& node : result.nodes) {
    std::string what;
    switch (node.state) {
      case NodeOutcome::State::kExited:
        what = fmt::format("exit {}", node.exit_code);
        break;
      case NodeOutcome::State::kDown:
        what = "down (crashed)";
        break;
      case NodeOutcome::State::kHung:
        what = "hung (agent never resumed)";
        break;
      case NodeOutcome::State::kUnfinished:
        what = "still running";
        break;
    }
    if (node.extra) {
      extras.push_back(fmt::format("extra agent for node {} on {}: {}", node.node_rank, node.host, what));
    } else if (node.spare) {
      extras.push_back(fmt::format("spare {} ({}): {}{}", node.node_rank - spec.cluster.nnodes, node.host,
                                   what,
                                   node.plays >= 0 ? fmt::format(", played node rank {}", node.plays)
                                                   : std::string(", never needed")));
    } else {
      groups[what].push_back(node.node_rank);
    }
  }
  if (result.stuck_for_good) {
    text +=
        "  outcome:           the job never ends: every rank of its round hangs for good and "
        "nothing watches progress (set timeouts.progress)\n";
  } else {
    text += fmt::format("  outcome:           job exit code {}{}\n", result.exit_code,
                        result.violation ? " (an invariant broke)" : "");
  }
  for (const auto& [what, ranks] : groups)
    text += fmt::format("                     {}: {}\n", RankRanges(ranks), what);
  for (const auto& line : extras) text += fmt::format("                     {}\n", line);
  for (const auto& line : result.replacements) text += fmt::format("  replaced:          {}\n", line);
  const int64_t wall = s.end_ns;
  text += fmt::format("  virtual time:      {} ({} events, {} messages, at most {} events queued)\n",
                      HumanDuration(Duration(wall)), s.events, s.messages, s.peak_queue);
  text += fmt::format(
      "  first training:    {}\n",
      s.first_training_ns ? "after " + HumanDuration(Duration(*s.first_training_ns)) : std::string("never"));
  text += fmt::format("  rounds:            {} started, {} interrupted; restarts used: {} of {}\n",
                      s.rounds_started, s.interruptions, s.restarts_used, s.max_restarts);
  if (s.node_crashes + s.worker_failures > 0) {
    text +=
        fmt::format("  failures:          {} node crash{}, {} worker failure{}\n", s.node_crashes,
                    s.node_crashes == 1 ? "" : "es", s.worker_failures, s.worker_failures == 1 ? "" : "s");
  }
  const auto& t = spec.timeouts;
  if (t.DetectsHangs() || spec.simulate.worker_hang_mtbf) {
    const std::string detection =
        !t.DetectsHangs() ? fmt::format("no timeouts.progress: the NCCL watchdog ends a hung round after {}",
                                        HumanDuration(kCollectiveTimeout))
                          : fmt::format("{} round{} stopped as hung, timeouts.progress = {}", s.hangs_judged,
                                        s.hangs_judged == 1 ? "" : "s",
                                        t.progress ? FormatDuration(*t.progress) : std::string("\"auto\""));
    text += fmt::format("  hangs:             {} worker{} hung ({})\n", s.worker_hangs,
                        s.worker_hangs == 1 ? "" : "s", detection);
  }
  const int64_t down = std::max<int64_t>(0, wall - s.training_ns);
  text += fmt::format("  training:          {} of {} kept ({} spent training)\n",
                      HumanDuration(Duration(s.useful_ns)), HumanDuration(Duration(s.train_target_ns)),
                      HumanDuration(Duration(s.training_ns)));
  text += fmt::format("  downtime:          {} ({} of the wall time not training)\n",
                      HumanDuration(Duration(down)), Percent(down, wall));
  text += fmt::format("  lost work:         {} (progress since the last checkpoint, every {})\n",
                      HumanDuration(Duration(s.lost_ns)), FormatDuration(spec.simulate.checkpoint_every));
  text += fmt::format("  goodput:           {} (useful training / wall time)\n", Percent(s.useful_ns, wall));
  if (result.violation) {
    text += fmt::format("INVARIANT VIOLATED: {}\nreproduce with: {}\n", *result.violation, result.repro);
  }
  return text;
}

}  // namespace ddprun::sim
