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

/// A node's observer port: its coordinator's observations, for the watch.
class CoordinatorWatch::Sink final : public host::Observer {
 public:
  Sink(CoordinatorWatch& watch, uint32_t index) : watch_(watch), index_(index) {}
  void Observe(TimePoint, const core::Observation& what) override { watch_.Observed(index_, what); }

 private:
  CoordinatorWatch& watch_;
  uint32_t index_;
};

CoordinatorWatch::CoordinatorWatch(Handles handles, SimEtcd* etcd)
    : loop_(handles.loop),
      nodes_(handles.nodes),
      log_(handles.log),
      stats_(handles.stats),
      invariants_(handles.invariants),
      etcd_(etcd) {}

CoordinatorWatch::~CoordinatorWatch() = default;

host::Observer* CoordinatorWatch::ObserverOf(uint32_t index) {
  if (!etcd_ && index != 0) return nullptr;
  if (sinks_.size() <= index) sinks_.resize(index + 1);
  if (!sinks_[index]) sinks_[index] = std::make_unique<Sink>(*this, index);
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

void CoordinatorWatch::Observed(uint32_t index, const core::Observation& what) {
  namespace o = core::observed;
  // What the checks need: rounds, restarts, hang verdicts and the end; joins and losses are
  // the timeline's, which the simulator draws from the nodes themselves.
  if (!std::holds_alternative<o::RoundStarted>(what) && !std::holds_alternative<o::RestartSpent>(what) &&
      !std::holds_alternative<o::HangJudged>(what) && !std::holds_alternative<o::JobEnded>(what)) {
    return;
  }
  heard_.push_back(Heard{index, what});
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
    seen.launch = LaunchOf(nodes_[index].host->role().RecordKey());
    invariants_.SetCoordinatorNode(index);
  } else {
    seen.launch = node0_incarnation_;
  }
  // With etcd a coordinator that takes over counts on from the budget in the store, and may
  // end the job at once (the lost round was the last): what it took over is read here.
  Restarts(seen, coordinator->restarts_used());
}

void CoordinatorWatch::Apply(const Heard& heard) {
  namespace o = core::observed;
  Seen& seen = seen_[heard.node];
  // A coordinator that left the role in this same event is gone; what it said is forgotten.
  const core::Coordinator* coordinator = CoordinatorOf(heard.node);
  if (!coordinator || coordinator != seen.coordinator) return;
  if (const auto* started = std::get_if<o::RoundStarted>(&heard.what)) {
    if (etcd_ && started->round != seen.started) {
      seen.started = started->round;
      invariants_.CoordinatorStartedRound(seen.epoch, nodes_.Label(heard.node),
                                          RoundKey{seen.launch, started->round});
    }
    Restarts(seen, started->restarts_used);
  } else if (const auto* restart = std::get_if<o::RestartSpent>(&heard.what)) {
    Restarts(seen, restart->restart);
  } else if (const auto* hang = std::get_if<o::HangJudged>(&heard.what)) {
    ++stats_.hangs_judged;
    invariants_.HangJudged(RoundKey{seen.launch, hang->round}, hang->culprits, hang->with_stack);
  } else if (const auto* ended = std::get_if<o::JobEnded>(&heard.what)) {
    ended_by_rule_ = ended_by_rule_ || ended->by_rule;
    if (!first_verdict_ns_) first_verdict_ns_ = loop_.now_ns;
    if (etcd_ && !seen.ended) {
      seen.ended = true;
      invariants_.CoordinatorEnded(loop_.now_ns, seen.launch, nodes_.Label(heard.node), ended->exit_code);
    }
    Restarts(seen, ended->restarts_used);
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
  if (!n.host || n.host->role().RecordKey().empty()) return 0;
  auto it = launch_of_key_.find(std::string(n.host->role().RecordKey()));
  return it == launch_of_key_.end() ? 0 : it->second;
}

uint64_t CoordinatorWatch::LaunchOf(std::string_view record_key) {
  // The new holder read the state just before it took the role, and nothing has written it
  // since: its own first writes are still on their way.
  const std::string key(record_key);
  const auto entry = etcd_->Peek(key);
  const auto state = entry ? core::ParseJobRecord(entry->value) : std::nullopt;
  uint64_t& launch = launch_of_key_[key];
  // No state yet is the first launch still (its first holder may have gone before writing).
  if (launch == 0 || (state && state->done)) launch = ++launches_;
  return launch;
}

}  // namespace ddprun::sim
