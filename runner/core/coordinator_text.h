#pragma once
// What the coordinator says at the end of a rendezvous, a round or the job: the summaries
// every node prints, and a worker's failure as a root cause. Words only; nothing here decides.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runner/core/roster.h"
#include "runner/core/round_failure.h"
#include "runner/core/wire.h"
#include "schema/job_spec.h"

namespace ddprun::core {

/// Agent `agent`'s report that a worker of round `failed.round` ended, as a root cause.
RoundFailure WorkerFailure(const Roster& roster, int agent, const wire::WorkerFailed& failed);

/// The restart.never_on entry that matches `failure`; "" when none does.
std::string NeverRestartRule(const JobSpec& spec, const RoundFailure& failure);

/// Why the rendezvous failed: which node ranks never came, were refused (and why), or left.
std::string RendezvousFailureText(const JobSpec& spec, const Roster& roster);

/// The pairs of nodes that the probe before round 0 found unable to connect (by (from, to)
/// agent, each with its line), at most kReachPairsShown of them; beyond that one more line says
/// how many more and which nodes are named most often (a firewall on one node names it in every
/// pair with it): 64 nodes behind a closed firewall would otherwise be 4,032 lines on every
/// console.
inline constexpr size_t kReachPairsShown = 12;
std::vector<std::string> ReachPairLines(const Roster& roster,
                                        const std::map<std::pair<int, int>, std::string>& problems);

/// "earlier rounds' root causes:" and the newest few, one per line ("round 0: rank 3 (node 1
/// (gpu-02), local rank 1) exited with code 1 (exit:1)"); "" when no round was restarted.
std::string EarlierCausesNote(const std::vector<std::string>& causes);

/// The job's success: every rank of the last round exited 0.
struct SuccessFacts {
  int round = 0;
  int restarts_used = 0;
  std::string shrunk_note;      // Placement::shrunk_note()
  std::string straggler_note;   // HangWatch::StragglerNote()
  std::string quarantine_note;  // QuarantineBook::Note()
  std::string earlier_causes;   // EarlierCausesNote()
};
std::string SuccessText(const JobSpec& spec, const Roster& roster, const SuccessFacts& facts);

/// The job's failure, led by its root cause.
struct FailureFacts {
  int stopped_ranks = 0;  // the ranks ddprun stopped in the last round
  int stopped_nodes = 0;
  std::string never_rule;  // the restart.never_on entry that ended it; "" none
  int restarts_used = 0;
  std::string straggler_note;
  std::string quarantine_note;
  std::string node_name;       // the root cause's node as summaries name it: "node 1 (gpu-02)"
  std::string earlier_causes;  // EarlierCausesNote()
};
std::string FailureText(const JobSpec& spec, const RoundFailure& failure, const FailureFacts& facts);

}  // namespace ddprun::core
