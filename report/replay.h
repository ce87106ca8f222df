#pragma once
// Predicted versus actual (`ddprun --simulate job.toml --replay LOGDIR`): a real run's failures
// become simulator faults, and the sequence of rounds, failures, restarts and the exit code that
// node 0's coordinator recorded is compared with the one the simulator's coordinator records for
// the same faults (the simulator runs the same NodeHost, so the same event recorder).

#include <optional>
#include <string>
#include <vector>

#include "report/event_log.h"
#include "schema/job_spec.h"

namespace ddprun::report {

/// What the simulator needs to replay a real run.
struct ReplayPlan {
  std::vector<FaultSpec> faults;   // in time order, from the run's start (node 0's agent-start)
  Duration train_time{};           // the last round's training, as the real run took it
  Duration worker_startup{};       // short: real workers here start in seconds
  std::vector<std::string> notes;  // what could not be turned into a fault, one sentence each
  /// What SIGTERM did to the workers ddprun stopped in the run (most were SIGKILLed after
  /// stop_grace: kIgnored; most ended on it: kExits); nullopt when none was stopped.
  std::optional<JobSpec::Simulate::Sigterm> sigterm;
};

/// The faults of `run` for a job of `spec`'s shape: a rank's own failure (the root cause of a
/// round) becomes worker-exit at the time its worker exited, a lost node a node-crash (with
/// reboot_after when an agent of that node started again), a hung rank a worker-hang from its
/// last beacon, an agent that started late a slow-joiner.
ReplayPlan PlanReplay(const Run& run, const JobSpec& spec);

/// The run as node 0's coordinator recorded it, one line per step, in the words both sides
/// share: "round 0 begins on 2 nodes", "round 0 fails: rank 3 (node 1), exit:7", "restart 1 of 2",
/// "the job ends with exit code 0". `records` are CoordinatorRecords, in order.
std::vector<std::string> RoundSequence(const std::vector<const EventRecord*>& records);

/// Whether a record of type `type` is the coordinator's (a round, a restart, a node joined or
/// lost, the job's result), not an agent's.
bool IsCoordinatorRecord(std::string_view type);

/// The job as its coordinator recorded it, with node 0's own records, in time order; empty
/// when no file holds them. Without etcd the coordinator is node 0's; with etcd the role moves
/// to another agent when its holder is lost, and that agent records the job from then on.
std::vector<const EventRecord*> CoordinatorRecords(const Run& run);

/// How long each failed round took to stop and to restart, from the coordinator's records:
/// "round 0 stop" from its failure to its restart (every worker gone) or the job's end, "round
/// 0 restart" from its failure to the next round's start. In round order.
struct StepDuration {
  std::string what;
  Duration took{};
};
std::vector<StepDuration> RoundDurations(const std::vector<const EventRecord*>& records);

/// The real and simulated durations side by side: a simulated one within 20% of the real one
/// (or 1 s of it, for the stops that take milliseconds) is a prediction; the others are
/// marked `!`. A step only one side has is listed, not judged (the sequences tell that story).
struct DurationComparison {
  bool within = true;
  std::string text;
};
DurationComparison CompareDurations(const std::vector<StepDuration>& real,
                                    const std::vector<StepDuration>& simulated);

struct SequenceComparison {
  bool match = false;
  std::string text;  // both sequences side by side, and where they part
};
SequenceComparison CompareSequences(const std::vector<std::string>& real,
                                    const std::vector<std::string>& simulated);

}  // namespace ddprun::report
