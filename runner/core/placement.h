#pragma once
// Who plays the next round: every node rank's own agent when it is there; with spares, a
// waiting spare for a node rank whose agent has been away for timeouts.replace or whose host is
// quarantined; with cluster.min_nodes, fewer nodes once the missing ones cannot come in time.
// And the quarantine book that keeps hosts whose failures ended too many rounds out.

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/roster.h"
#include "runner/core/round_failure.h"
#include "runner/core/time.h"
#include "schema/job_spec.h"

namespace ddprun::core {

/// Failures and cooldowns by host name: a host that reboots comes back with a new agent, and
/// is the same host.
class QuarantineBook {
 public:
  explicit QuarantineBook(const JobSpec::Quarantine& policy) : policy_(policy) {}

  /// Whether `host` sits out at `now`.
  bool Holds(const std::string& host, TimePoint now) const;
  /// When `host`'s quarantine ends; nullopt if it never sat out.
  std::optional<TimePoint> Until(const std::string& host) const;
  /// A quarantine that began: how long it lasts and how many `host` has had.
  struct Sentence {
    Duration cooldown{};
    int times = 0;
  };
  /// Counts a round's root cause against `host`: past policy.failures within policy.window it
  /// sits out, for twice as long as the time before (up to a year).
  std::optional<Sentence> Count(const std::string& host, TimePoint now);
  /// The hosts that were ever quarantined, for the state file or the job's store.
  RecordQuarantine Record(TimePoint now) const;
  /// Takes over what an earlier launch recorded; "host for 5m more" for each that sits out.
  std::vector<std::string> Restore(const std::vector<QuarantinedHost>& hosts, TimePoint now);
  /// "quarantined: a for 5m more, b for 1h more"; "" when no host sits out.
  std::string Note(TimePoint now) const;
  /// How many hosts sit out at `now`.
  int Sitting(TimePoint now) const;

 private:
  struct HostRecord {
    std::deque<TimePoint> failures;  // rounds whose root cause was on it, within the window
    std::optional<TimePoint> until;  // quarantined until then
    int times = 0;                   // quarantines so far
  };
  const JobSpec::Quarantine& policy_;
  std::map<std::string, HostRecord> hosts_;
};

class Placement {
 public:
  Placement(const JobSpec& spec, Roster& roster) : spec_(spec), roster_(roster), book_(spec.quarantine) {}

  /// Whether `agent`'s host sits out now (node 0's agent never does: it hosts the coordinator).
  bool Quarantined(int agent, TimePoint now) const;
  /// Fills roster.players() for round `round`, moving node ranks to spares where due. False:
  /// the round must wait, at most until replace_at(). `absence_origin` is where the absence of
  /// an agent that has not joined this rendezvous counts from.
  bool Place(TimePoint now, TimePoint absence_origin, int round, std::vector<CoordinatorEffect>& out);
  /// When Place may decide differently without any input: a spare may take a rank then.
  std::optional<TimePoint> replace_at() const { return replace_at_; }
  void ForgetReplaceAt() { replace_at_.reset(); }
  /// How the placed round shrank ("without node 2 (gpu-03): away for 5m ..."); "" if it did not.
  const std::string& shrunk_note() const { return shrunk_note_; }

  /// Counts `failure`, the round's root cause, against its host (only where the job can run
  /// without it: spares or cluster.min_nodes).
  void CountFailure(TimePoint now, const RoundFailure& failure, std::vector<CoordinatorEffect>& out);
  void Restore(const std::vector<QuarantinedHost>& hosts, TimePoint now, std::vector<CoordinatorEffect>& out);
  const QuarantineBook& book() const { return book_; }

 private:
  /// With cluster.min_nodes: the node ranks not filled are given up for this round when none
  /// can be filled any more (away longer than timeouts.replace, or quarantined) and enough are
  /// left. False: the round must wait.
  bool Shrink(TimePoint now, TimePoint absence_origin, int round, std::vector<CoordinatorEffect>& out);
  void NoteReplaceAt(TimePoint due);

  const JobSpec& spec_;
  Roster& roster_;
  QuarantineBook book_;
  std::optional<TimePoint> replace_at_;
  std::string shrunk_note_;
};

}  // namespace ddprun::core
