#include "sim/coordinators.h"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "base/assert.h"
#include "sim/invariants.h"
#include "sim/node.h"
#include "sim/sim_log.h"
#include "sim/sim_store.h"
#include "sim/simulation.h"

namespace ddprun::sim {
namespace {

// A whole-number field of a record; the recorder writes every one the watch reads.
int IntField(const host::Event& event, std::string_view key) {
  for (const auto& [name, value] : event.fields) {
    if (name != key) continue;
    const auto* number = std::get_if<int64_t>(&value);
    DDPRUN_ASSERT(number != nullptr);
    return static_cast<int>(*number);
  }
  // The event recorder wrote a record without a field the simulator reads.
  DDPRUN_ASSERT(false);
  return 0;
}

}  // namespace

/// A node's event-log port: every record goes on to the caller's log unchanged; the watch
/// keeps the coordinator's observations among them.
class CoordinatorWatch::Sink final : public host::EventLog {
 public:
  Sink(CoordinatorWatch& watch, uint32_t index, host::EventLog* forward)
      : watch_(watch), index_(index), forward_(forward) {}
  void Record(TimePoint now, const host::Event& event) override {
    if (forward_) forward_->Record(now, event);
    watch_.Recorded(index_, event);
  }

 private:
  CoordinatorWatch& watch_;
  uint32_t index_;
  host::EventLog* forward_;
};

CoordinatorWatch::CoordinatorWatch(Handles handles, SimEtcd* etcd)
    : loop_(handles.loop),
      nodes_(handles.nodes),
      log_(handles.log),
      stats_(handles.stats),
      invariants_(handles.invariants),
      etcd_(etcd) {}

CoordinatorWatch::~CoordinatorWatch() = default;

host::EventLog* CoordinatorWatch::PortOf(uint32_t index, host::EventLog* forward) {
  if (!etcd_ && index != 0) return forward;
  if (sinks_.size() <= index) sinks_.resize(index + 1);
  if (!sinks_[index]) sinks_[index] = std::make_unique<Sink>(*this, index, forward);
  return sinks_[index].get();
}

void CoordinatorWatch::HostStarted(uint32_t index, bool coordinator) {
  // Every coordinator that listens is a fresh one (a rebooted node 0, or an extra agent that
  // claims rank 0 once node 0 is gone): its rounds are numbered from 0 again.
  if (coordinator) {
    ++coordinator_incarnation_;
    if (index == 0) node0_incarnation_ = coordinator_incarnation_;
  }
  Touched(index);
}

void CoordinatorWatch::Touched(uint32_t index) {
  if (is_touched_.size() <= index) is_touched_.resize(index + 1, 0);
  if (is_touched_[index]) return;
  is_touched_[index] = 1;
  touched_.push_back(index);
}

void CoordinatorWatch::Recorded(uint32_t index, const host::Event& event) {
  // The records the recorder writes for the coordinator's observations (EventRecorder::Observe);
  // the agent's own records on the same port are not the watch's business.
  Heard heard;
  heard.node = index;
  if (event.type == "round-begin") {
    heard.kind = Heard::Kind::kRoundStarted;
    heard.round = IntField(event, "round");
    heard.restarts = IntField(event, "restarts_used");
  } else if (event.type == "restart") {
    heard.kind = Heard::Kind::kRestartSpent;
    heard.restarts = IntField(event, "restart");
  } else if (event.type == "round-failed") {
    heard.kind = Heard::Kind::kRoundFailed;
    heard.round = IntField(event, "round");
  } else if (event.type == "job-result") {
    heard.kind = Heard::Kind::kJobEnded;
    heard.exit_code = IntField(event, "exit_code");
    heard.restarts = IntField(event, "restarts_used");
  } else {
    return;
  }
  heard_.push_back(heard);
  Touched(index);
}

const core::Coordinator* CoordinatorWatch::CoordinatorOf(uint32_t index) const {
  // Without etcd, node 0's coordinator only: an extra agent that claims rank 0 runs another job.
  if (!etcd_ && index != 0) return nullptr;
  const Node& n = nodes_[index];
  return n.host ? n.host->coordinator() : nullptr;
}

void CoordinatorWatch::AfterEvent() {
  if (touched_.empty()) return;
  if (seen_.size() < nodes_.size()) seen_.resize(nodes_.size());
  // By node, as the invariants' ledger has always had them: who holds the role, then what it
  // observed, in the order it did.
  std::sort(touched_.begin(), touched_.end());
  for (uint32_t index : touched_) {
    CheckRole(index);
    for (const Heard& heard : heard_) {
      if (heard.node == index) Apply(heard);
    }
    is_touched_[index] = 0;
  }
  touched_.clear();
  heard_.clear();
}

void CoordinatorWatch::CheckRole(uint32_t index) {
  Seen& seen = seen_[index];
  const core::Coordinator* coordinator = CoordinatorOf(index);
  if (coordinator == seen.coordinator) return;
  // A coordinator stepped down, its host crashed, or one took the role here: a pointer is
  // compared with the one seen after an earlier event only, never kept past its end.
  if (seen.coordinator && etcd_) invariants_.CoordinatorGone(seen.epoch);
  seen = Seen{};
  seen.coordinator = coordinator;
  if (!coordinator) return;
  if (etcd_) {
    seen.epoch = ++coordinator_epochs_;
    seen.launch = LaunchOf(*nodes_[index].host->election());
    invariants_.SetCoordinatorNode(index);
  } else {
    seen.launch = node0_incarnation_;
  }
  // With etcd a coordinator that takes over counts on from the budget in the store, and may
  // end the job at once (the lost round was the last): what it took over is read here.
  Restarts(seen, coordinator->restarts_used());
  ended_by_rule_ = ended_by_rule_ || coordinator->ended_by_rule();
}

void CoordinatorWatch::Apply(const Heard& heard) {
  Seen& seen = seen_[heard.node];
  // A coordinator that left the role in this same event is gone; what it said is forgotten.
  const core::Coordinator* coordinator = CoordinatorOf(heard.node);
  if (!coordinator || coordinator != seen.coordinator) return;
  switch (heard.kind) {
    case Heard::Kind::kRoundStarted:
      if (etcd_ && heard.round != seen.started) {
        seen.started = heard.round;
        invariants_.CoordinatorStartedRound(seen.epoch, nodes_.Label(heard.node),
                                            RoundKey{seen.launch, heard.round});
      }
      Restarts(seen, heard.restarts);
      return;
    case Heard::Kind::kRestartSpent:
      Restarts(seen, heard.restarts);
      return;
    case Heard::Kind::kRoundFailed:
      // A hang verdict always stops its round; the record does not name the culprits.
      if (coordinator->hang_judgements() != seen.judgements) {
        seen.judgements = coordinator->hang_judgements();
        ++stats_.hangs_judged;
        const core::Coordinator::HangJudgement& judged = coordinator->last_hang_judgement();
        invariants_.HangJudged(RoundKey{seen.launch, judged.round}, judged.culprits, judged.with_stack);
      }
      return;
    case Heard::Kind::kJobEnded:
      ended_by_rule_ = ended_by_rule_ || coordinator->ended_by_rule();
      if (etcd_ && !seen.ended) {
        seen.ended = true;
        invariants_.CoordinatorEnded(loop_.now_ns, seen.launch, nodes_.Label(heard.node), heard.exit_code);
      }
      Restarts(seen, heard.restarts);
      return;
  }
}

void CoordinatorWatch::Restarts(Seen& seen, int used) {
  if (etcd_) {
    // The budget is the job's: a coordinator that takes over counts on from what is in etcd.
    if (used <= most_restarts_) return;
    most_restarts_ = used;
    stats_.restarts_used = used;
    invariants_.CoordinatorRestarts(used);
    log_.AddMark(Mark::kJob, MarkKind::kRestart, fmt::format("restart {}", used));
    return;
  }
  // Node 0's coordinator: its count starts again from 0 when node 0 reboots.
  invariants_.CoordinatorRestarts(used);
  if (used <= seen.restarts) return;
  stats_.restarts_used += used - seen.restarts;
  seen.restarts = used;
  log_.AddMark(Mark::kJob, MarkKind::kRestart, fmt::format("restart {}", used));
}

uint64_t CoordinatorWatch::RoundEpochOf(uint32_t index) const {
  if (!etcd_) return coordinator_incarnation_;
  const Node& n = nodes_[index];
  if (!n.host || !n.host->election()) return 0;
  auto it = launch_of_key_.find(n.host->election()->state_key());
  return it == launch_of_key_.end() ? 0 : it->second;
}

uint64_t CoordinatorWatch::LaunchOf(const host::Election& election) {
  // The new holder read the state just before it took the role, and nothing has written it
  // since: its own first writes are still on their way.
  const auto entry = etcd_->Peek(election.state_key());
  const auto state = entry ? host::ParseJobRecord(entry->value) : std::nullopt;
  uint64_t& launch = launch_of_key_[election.state_key()];
  // No state yet is the first launch still (its first holder may have gone before writing).
  if (launch == 0 || (state && state->done)) launch = ++launches_;
  return launch;
}

}  // namespace ddprun::sim
