#pragma once
// The coordinator's watch over the ranks' progress beacons during a round: a rank reported
// silent starts a probe (every node is asked where its ranks are), and the stacks that come
// back name the hung ranks; the ranks' step times name stragglers. Its own deadlines: the end
// of the probe's wait and the next straggler check.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/progress.h"
#include "runner/core/roster.h"
#include "runner/core/round_failure.h"
#include "runner/core/time.h"
#include "runner/core/wire.h"
#include "schema/job_spec.h"

namespace ddprun::core {

/// A round the coordinator stopped because ranks hung, as it judged it. For observers (the
/// simulator's invariants check the verdict against the ranks it hung); the protocol never
/// reads it.
struct HangJudgement {
  int round = 0;
  std::vector<int> culprits;    // the ranks it named, ascending
  std::vector<int> with_stack;  // the ranks whose stack it had, ascending
};

class HangWatch {
 public:
  /// A rank's last progress report, and whether it is reported as a straggler.
  struct RankSeen {
    int node_rank = 0;  // the agent that reported it
    wire::RankRate rate;
    bool straggling = false;
  };

  HangWatch(const JobSpec& spec, const Roster& roster) : spec_(spec), roster_(roster) {}

  /// A round starts: the last one's probe and reports are forgotten.
  void NewRound();
  /// Agent `agent` reports a rank of the running round `round` silent. True when that starts a
  /// probe: the caller asks every node for its ranks' stacks.
  bool OnRankHung(TimePoint now, int round, int agent, const wire::RankHung& hung,
                  std::vector<CoordinatorEffect>& out);
  /// Agent `agent`'s stacks. True once `connected` nodes have answered: the verdict is due.
  bool OnRankStacks(int round, int agent, const wire::RankStacks& stacks, int connected);
  void OnRankProgress(TimePoint now, int round, int agent, const wire::RankProgress& progress);

  bool probing() const { return probe_.has_value(); }
  /// The rank whose silence started the probe. Only while probing().
  const wire::RankHung& probed() const { return probe_->first; }
  /// The probe ends without a verdict (something else explains the silence).
  void EndProbe() { probe_.reset(); }
  /// The root cause of the probed hang, from the stacks in; ends the probe. `reach_problems`:
  /// what the probe before round 0 found under rendezvous.probe = "warn" (a likely cause).
  /// Only ranks that are still silent for the timeout that was passed, when the stacks came
  /// back, can be named: nullopt when none is (the silence ended: a rank that stalled for
  /// almost timeouts.progress, then went on), and cleared() says so.
  std::optional<RoundFailure> Verdict(int round, const std::vector<std::string>& reach_problems);
  /// Why the last probe ended without a verdict, one line.
  const std::string& cleared() const { return cleared_; }

  enum class Deadline { kProbe, kStragglers, kCount };
  std::optional<TimePoint> DeadlineOf(Deadline deadline) const;
  /// Compares the ranks' step times; says who became or stopped being a straggler.
  void CheckStragglers(TimePoint now, int round, std::vector<CoordinatorEffect>& out);

  /// "stragglers ..." lines for a summary, without a final newline; "" when none was seen.
  std::string StragglerNote() const;
  /// The job's longest interval between a rank's beacons, learnt from the reports (ms).
  int64_t longest_interval_ms() const { return longest_interval_ms_; }
  uint64_t judgements() const { return judgements_; }
  uint64_t clearances() const { return clearances_; }
  const HangJudgement& last_judgement() const { return last_judgement_; }
  /// This round's progress reports, by global rank.
  const std::unordered_map<int, RankSeen>& ranks_seen() const { return ranks_seen_; }

 private:
  /// A round that stopped making progress: every node was asked for its ranks' stacks, and
  /// the round is stopped once all have answered or the wait is over.
  struct Probe {
    wire::RankHung first;  // the first rank reported silent
    int first_node = 0;
    TimePoint until;
    std::vector<bool> answered;  // by agent
    int answers = 0;
    std::map<int, RankAtHang> ranks;  // by global rank
  };

  // The verdict's detail: the culprits with their stacks, the others grouped by stack, the
  // nodes that did not answer, and a failed probe as the likely cause.
  std::string WhereEachRankWas(const Probe& probe, const HangVerdict& verdict, const RankAtHang& culprit,
                               int round, const std::vector<std::string>& reach_problems) const;

  const JobSpec& spec_;
  const Roster& roster_;
  std::optional<Probe> probe_;
  // Looked up by rank; iterated only to sort or sum.
  std::unordered_map<int, RankSeen> ranks_seen_;
  std::optional<TimePoint> next_straggler_check_;
  std::vector<std::string> stragglers_seen_;  // every straggler reported in the job, for the summary
  int64_t longest_interval_ms_ = 0;
  uint64_t judgements_ = 0;
  uint64_t clearances_ = 0;
  std::string cleared_;
  HangJudgement last_judgement_;
};

}  // namespace ddprun::core
