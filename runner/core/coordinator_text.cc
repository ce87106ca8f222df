#include "runner/core/coordinator_text.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/plural.h"
#include "runner/core/failure.h"
#include "runner/core/log_pointers.h"
#include "schema/duration.h"
#include "schema/worker_env.h"

namespace ddprun::core {
namespace {

// The rendezvous summary names at most this many nodes of each kind; the count says the rest.
constexpr size_t kMaxNamed = 16;

// `stderr_tail` without the Python traceback that `error_text` (the error file's traceback)
// already shows: from the last "Traceback (most recent call last):" through the error's last
// line. Unchanged when the two do not share that traceback.
std::string WithoutTraceback(const std::string& stderr_tail, const std::string& error_text) {
  std::string last_line = error_text;
  while (!last_line.empty() && (last_line.back() == '\n' || last_line.back() == ' ')) last_line.pop_back();
  last_line = last_line.substr(last_line.rfind('\n') == std::string::npos ? 0 : last_line.rfind('\n') + 1);
  if (last_line.empty()) return stderr_tail;
  size_t begin = stderr_tail.rfind("Traceback (most recent call last):");
  if (begin == std::string::npos) {
    // The tail was cut inside the traceback (issue 40: a long Lightning traceback printed its
    // frames twice, three times on the failing node): it is a copy when every line up to the
    // error's last line is a line of the error file's traceback.
    const size_t end_line = stderr_tail.rfind(last_line);
    if (end_line == std::string::npos || (end_line > 0 && stderr_tail[end_line - 1] != '\n'))
      return stderr_tail;
    for (size_t at = 0; at < end_line;) {
      size_t eol = stderr_tail.find('\n', at);
      if (eol == std::string::npos || eol > end_line) eol = end_line;
      const std::string_view line = std::string_view(stderr_tail).substr(at, eol - at);
      // The first line may be cut at its start: it need only end a line of the traceback.
      const bool first = at == 0;
      const bool found =
          line.empty() || (first ? error_text.find(std::string(line) + "\n") != std::string::npos
                                 : error_text.find("\n" + std::string(line) + "\n") != std::string::npos ||
                                       error_text.starts_with(std::string(line) + "\n"));
      if (!found) return stderr_tail;
      at = eol + 1;
    }
    begin = 0;
  } else if (begin > 0 && stderr_tail[begin - 1] != '\n') {
    return stderr_tail;
  }
  const size_t end_line = stderr_tail.find(last_line, begin);
  if (end_line == std::string::npos) return stderr_tail;
  size_t end = stderr_tail.find('\n', end_line);
  end = end == std::string::npos ? stderr_tail.size() : end + 1;
  std::string rest = stderr_tail.substr(0, begin) + stderr_tail.substr(end);
  if (rest.find_first_not_of(" \n") == std::string::npos) return "";
  return rest;
}

}  // namespace

RoundFailure WorkerFailure(const Roster& roster, int agent, const wire::WorkerFailed& failed) {
  RoundFailure failure;
  failure.round = failed.round;
  failure.node_rank = agent;
  failure.global_rank = failed.global_rank;
  failure.what = fmt::format("rank {} ({}, local rank {}) {}", failed.global_rank, roster.NodeName(agent),
                             failed.local_rank, DescribeExit(failed.exit_code, failed.signal));
  if (!failed.error_file.empty()) {
    failure.detail = "  error (from TORCHELASTIC_ERROR_FILE):\n" + Indent(failed.error_file, "    | ");
  }
  // Python prints the traceback that the error file already holds to stderr too: show it once.
  const std::string tail = WithoutTraceback(failed.stderr_tail, failed.error_file);
  if (!tail.empty()) {
    failure.detail +=
        fmt::format("  last lines of its stderr{}:\n",
                    tail.size() < failed.stderr_tail.size() ? " (without the traceback shown above)" : "") +
        Indent(tail, "    | ");
  } else if (failed.error_file.empty()) {
    failure.detail = "  (it wrote nothing to stderr)\n";
  }
  failure.mentions_nccl = MentionsNccl(failed.stderr_tail) || MentionsNccl(failed.error_file);
  failure.kinds = FailureKinds(failed.exit_code, failed.signal, failed.error_file, failed.stderr_tail);
  failure.lost_peer = LooksLikeALostPeer(failed.error_file, failed.stderr_tail);
  failure.the_stop = LooksLikeTheStop(failed.error_file, failed.stderr_tail);
  return failure;
}

std::string NeverRestartRule(const JobSpec& spec, const RoundFailure& failure) {
  for (const std::string& rule : spec.restart.never_on) {
    if (RuleMatches(rule, failure.kinds)) return rule;
  }
  return "";
}

std::string RendezvousFailureText(const JobSpec& spec, const Roster& roster) {
  // Say what happened to each missing node: it never came, it was refused (and why), or it
  // joined and left. Only the first kMaxNamed of each kind are named.
  std::vector<std::string> never, refused, left;
  size_t never_count = 0, refused_count = 0, left_count = 0;
  auto add = [](std::vector<std::string>& names, size_t& count, std::string name) {
    if (names.size() < kMaxNamed) names.push_back(std::move(name));
    ++count;
  };
  // The node ranks that had no agent; waiting spares are not missing.
  int filled = 0;
  for (int agent : roster.holders()) {
    const AgentSlot& slot = roster.at(agent);
    if (slot.conn) {
      ++filled;
      continue;
    }
    const std::string name = roster.NodeName(agent);
    if (!slot.refused.empty()) {
      add(refused, refused_count, fmt::format("{}: {}", name, slot.refused));
    } else if (slot.ever_joined) {
      add(left, left_count, fmt::format("{}: {}", name, slot.left));
    } else {
      add(never, never_count, name);
    }
  }
  auto list = [](const std::vector<std::string>& names, size_t count, const char* separator = ", ") {
    std::string text = fmt::format("{}", fmt::join(names, separator));
    if (count > names.size()) text += fmt::format(" and {} more", count - names.size());
    return text;
  };
  std::string text = fmt::format("rendezvous failed: {}/{} nodes joined within timeouts.rendezvous = {}",
                                 filled, roster.holders().size(), FormatDuration(spec.timeouts.rendezvous));
  if (!refused.empty()) text += "; refused: " + list(refused, refused_count, "; ");
  if (!left.empty()) text += "; joined, then left: " + list(left, left_count, "; ");
  if (!never.empty()) text += "; never joined: " + list(never, never_count);
  if (spec.cluster.min_nodes < spec.cluster.nnodes) {
    text += fmt::format("; cluster.min_nodes = {} needs at least that many", spec.cluster.min_nodes);
  }
  const std::string file = spec.source_name.empty() ? "job.toml" : spec.source_name;
  if (!never.empty()) {
    // With `nnodes` (no host list) a node cannot find its rank by itself.
    const std::string command = spec.cluster.nodes.empty() ? fmt::format("ddprun {} --node-rank N", file)
                                                           : fmt::format("ddprun {}", file);
    text += fmt::format(
        "\nhint: start `{}` on the missing nodes, and check that they can reach "
        "{}:{} (the firewall must let TCP port {} through)",
        command, spec.cluster.master_addr, spec.cluster.master_port, spec.cluster.master_port);
  }
  if (!refused.empty())
    text += "\nhint: the refused nodes printed the reason too; fix it and start them again";
  return text;
}

std::string SuccessText(const JobSpec& spec, const Roster& roster, const SuccessFacts& facts) {
  const size_t nodes = roster.players().size();
  const size_t all = roster.holders().size();
  return fmt::format("job \"{}\" succeeded: {} on {} exited 0 in round {} ({} restart{} used){}{}{}{}",
                     spec.job.name, AllOf(nodes * static_cast<size_t>(spec.cluster.nproc_per_node), "rank"),
                     Counted(nodes, "node"), facts.round, facts.restarts_used,
                     facts.restarts_used == 1 ? "" : "s",
                     nodes < all ? fmt::format("\n  the round ran with {} of the job's {} nodes "
                                               "(cluster.min_nodes = {}): {}",
                                               nodes, all, spec.cluster.min_nodes, facts.shrunk_note)
                                 : "",
                     facts.straggler_note.empty() ? "" : "\n" + facts.straggler_note,
                     facts.quarantine_note.empty() ? "" : "\n" + facts.quarantine_note,
                     facts.earlier_causes.empty() ? "" : "\n" + facts.earlier_causes);
}

std::string EarlierCausesNote(const std::vector<std::string>& causes) {
  if (causes.empty()) return "";
  // The newest few; a job restarted a hundred times says how many more there were.
  constexpr size_t kShown = 5;
  const size_t skipped = causes.size() > kShown ? causes.size() - kShown : 0;
  std::string text = "earlier rounds' root causes:";
  if (skipped > 0) text += fmt::format("\n  ({} earlier ones in the event log)", skipped);
  for (size_t i = skipped; i < causes.size(); ++i) text += "\n  " + causes[i];
  return text;
}

std::string FailureText(const JobSpec& spec, const RoundFailure& failure, const FailureFacts& facts) {
  if (spec.job.is_preflight) {
    // The preflight's verdict is its rank's report (quoted below), not a training failure.
    return fmt::format("preflight FAILED: {}\n{}logs: {}/{}/{}/attempt-{}/", failure.what, failure.detail,
                       spec.logs.dir, spec.job.name, NodeLatestLink(failure.node_rank), failure.round);
  }
  const int max_restarts = spec.restart.max_restarts;
  std::string text = fmt::format("job \"{}\" FAILED in round {}", spec.job.name, failure.round);
  if (!facts.never_rule.empty()) {
    text += fmt::format(", not restarted: restart.never_on has \"{}\" ({} of {} restart{} left)",
                        facts.never_rule, max_restarts - facts.restarts_used, max_restarts,
                        max_restarts == 1 ? "" : "s");
  } else if (max_restarts > 0) {
    text += fmt::format(" after using all {} restart{}", max_restarts, max_restarts == 1 ? "" : "s");
  } else {
    text += " (restart.max_restarts = 0)";
  }
  text += fmt::format("\nroot cause (first failure anywhere in the job): {}\n", failure.what);
  if (!failure.kinds.empty()) text += fmt::format("  kind: {}\n", fmt::join(KindTexts(failure.kinds), ", "));
  text += failure.detail;
  const bool hang = HasKind(failure.kinds, FailureKind::Type::kHang);
  text += fmt::format("ddprun then stopped {} {}running rank{} on {} node{}{}.\n", facts.stopped_ranks,
                      hang ? "" : "other ", facts.stopped_ranks == 1 ? "" : "s", facts.stopped_nodes,
                      facts.stopped_nodes == 1 ? "" : "s", hang ? ", the hung ones included" : "");
  if (failure.mentions_nccl) {
    text += "hint: the error mentions NCCL; rerun with NCCL_DEBUG=INFO in job.env to see why.\n";
  }
  if (!facts.straggler_note.empty()) text += facts.straggler_note + "\n";
  if (!facts.quarantine_note.empty()) text += facts.quarantine_note + "\n";
  if (!facts.earlier_causes.empty()) text += facts.earlier_causes + "\n";
  // Each node writes its own run folder (schema/worker_env.h): the root cause's node's, by a
  // link that names the same folder on a logs.dir that the nodes share.
  text += LogsPointer(spec, facts.node_name, failure.node_rank, failure.round, failure.global_rank);
  return text;
}

std::vector<std::string> ReachPairLines(const Roster& roster,
                                        const std::map<std::pair<int, int>, std::string>& problems) {
  std::vector<std::string> lines;
  for (const auto& [pair, line] : problems) {
    if (lines.size() == kReachPairsShown && problems.size() > kReachPairsShown + 1) break;
    lines.push_back(line);
  }
  if (lines.size() == problems.size()) return lines;
  std::map<int, size_t> named;
  for (const auto& [pair, line] : problems) {
    ++named[pair.first];
    ++named[pair.second];
  }
  std::vector<std::pair<int, size_t>> most(named.begin(), named.end());
  std::stable_sort(most.begin(), most.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (most.size() > 5) most.resize(5);
  std::vector<std::string> names;
  for (const auto& [agent, count] : most)
    names.push_back(fmt::format("{} in {}", roster.NodeName(agent), count));
  lines.push_back(fmt::format("... and {} more pairs; the nodes named most often: {}",
                              problems.size() - lines.size(), fmt::join(names, ", ")));
  return lines;
}

}  // namespace ddprun::core
