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

namespace {

/// Marks the restart `used` on the job's row of the event log.
void MarkRestart(SimLog& log, int used) {
  log.AddMark(Mark::kJob, MarkKind::kRestart, fmt::format("restart {}", used));
}

/// rendezvous.backend = "static": node 0's coordinator is the job's; an extra agent that claims
/// rank 0 runs another job. Each incarnation of it numbers its rounds and counts its restarts
/// from 0 again.
class StaticCount final : public CountedRole {
 public:
  explicit StaticCount(Handles handles)
      : log_(handles.log), stats_(handles.stats), invariants_(handles.invariants) {}

  bool AnyAgentLeads() const override { return false; }
  bool Counts(uint32_t index) const override { return index == 0; }
  void HostStarted(uint32_t index, bool coordinator) override {
    // Every coordinator that listens is a fresh one (a rebooted node 0, or an extra agent that
    // claims rank 0 once node 0 is gone): its rounds are numbered from 0 again.
    if (!coordinator) return;
    ++incarnation_;
    if (index == 0) node0_incarnation_ = incarnation_;
  }
  void Took(SeenCoordinator& seen, uint32_t) override { seen.launch = node0_incarnation_; }
  void Gone(const SeenCoordinator&) override {}
  void RoundStarted(SeenCoordinator&, uint32_t, int) override {}
  void Ended(SeenCoordinator&, uint32_t, int) override {}
  void Restarts(SeenCoordinator& seen, int used) override {
    // Node 0's coordinator: its count starts again from 0 when node 0 reboots.
    invariants_.CoordinatorRestarts(used);
    if (used <= seen.restarts) return;
    stats_.restarts_used += used - seen.restarts;
    seen.restarts = used;
    MarkRestart(log_, used);
  }
  uint64_t RoundEpochOf(uint32_t) const override { return incarnation_; }

 private:
  SimLog& log_;
  SimStats& stats_;
  Invariants& invariants_;
  uint64_t incarnation_ = 0;        // +1 per coordinator a host started with
  uint64_t node0_incarnation_ = 0;  // the incarnation of node 0's own coordinator
};

/// rendezvous.backend = "etcd": whichever agent holds the role runs the job's coordinator; rounds
/// and the budget go on across holders, and a launch of the job is told apart by the record in
/// the modelled store.
class ElectedCount final : public CountedRole {
 public:
  ElectedCount(Handles handles, SimEtcd& etcd)
      : loop_(handles.loop),
        nodes_(handles.nodes),
        log_(handles.log),
        stats_(handles.stats),
        invariants_(handles.invariants),
        etcd_(etcd) {
    invariants_.SetRankZeroAnywhere();
  }

  bool AnyAgentLeads() const override { return true; }
  bool Counts(uint32_t) const override { return true; }
  void HostStarted(uint32_t, bool) override {}
  void Took(SeenCoordinator& seen, uint32_t index) override {
    seen.epoch = ++epochs_;
    seen.launch = LaunchOf(nodes_[index].host->role().RecordKey());
    invariants_.SetCoordinatorNode(index);
  }
  void Gone(const SeenCoordinator& seen) override { invariants_.CoordinatorGone(seen.epoch); }
  void RoundStarted(SeenCoordinator& seen, uint32_t index, int round) override {
    if (round == seen.started) return;
    seen.started = round;
    invariants_.CoordinatorStartedRound(seen.epoch, nodes_.Label(index), RoundKey{seen.launch, round});
  }
  void Ended(SeenCoordinator& seen, uint32_t index, int exit_code) override {
    if (seen.ended) return;
    seen.ended = true;
    invariants_.CoordinatorEnded(loop_.now_ns, seen.launch, nodes_.Label(index), exit_code);
  }
  void Restarts(SeenCoordinator&, int used) override {
    // The budget is the job's: a coordinator that takes over counts on from what is in etcd.
    if (used <= most_restarts_) return;
    most_restarts_ = used;
    stats_.restarts_used = used;
    invariants_.CoordinatorRestarts(used);
    MarkRestart(log_, used);
  }
  uint64_t RoundEpochOf(uint32_t index) const override {
    const Node& n = nodes_[index];
    if (!n.host || n.host->role().RecordKey().empty()) return 0;
    auto it = launch_of_key_.find(n.host->role().RecordKey());
    return it == launch_of_key_.end() ? 0 : it->second;
  }

 private:
  /// The launch of the job a coordinator that just took the role runs, from what etcd holds
  /// under its state key: the current one, or a new one when the state says it ended.
  uint64_t LaunchOf(std::string_view record_key) {
    // The new holder read the state just before it took the role, and nothing has written it
    // since: its own first writes are still on their way.
    const std::string key(record_key);
    const auto entry = etcd_.Peek(key);
    const auto state = entry ? core::ParseJobRecord(entry->value) : std::nullopt;
    uint64_t& launch = launch_of_key_[key];
    // No state yet is the first launch still (its first holder may have gone before writing).
    if (launch == 0 || (state && state->done)) launch = ++launches_;
    return launch;
  }

  Loop& loop_;
  Nodes& nodes_;
  SimLog& log_;
  SimStats& stats_;
  Invariants& invariants_;
  SimEtcd& etcd_;
  uint64_t epochs_ = 0;
  int most_restarts_ = 0;                                       // the most restarts any coordinator counted
  std::map<std::string, uint64_t, std::less<>> launch_of_key_;  // state key -> its current launch
  uint64_t launches_ = 0;
};

}  // namespace

CoordinatorWatch::CoordinatorWatch(Handles handles, SimEtcd* etcd)
    : loop_(handles.loop),
      nodes_(handles.nodes),
      invariants_(handles.invariants),
      stats_(handles.stats),
      role_(etcd ? std::unique_ptr<CountedRole>(std::make_unique<ElectedCount>(handles, *etcd))
                 : std::make_unique<StaticCount>(handles)) {}

CoordinatorWatch::~CoordinatorWatch() = default;

host::Observer* CoordinatorWatch::ObserverOf(uint32_t index) {
  if (!role_->Counts(index)) return nullptr;
  if (sinks_.size() <= index) sinks_.resize(index + 1);
  if (!sinks_[index]) sinks_[index] = std::make_unique<Sink>(*this, index);
  return sinks_[index].get();
}

void CoordinatorWatch::HostStarted(uint32_t index, bool coordinator) {
  role_->HostStarted(index, coordinator);
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
  if (!role_->Counts(index)) return nullptr;
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
  SeenCoordinator& seen = seen_[index];
  const core::Coordinator* coordinator = CoordinatorOf(index);
  if (coordinator == seen.coordinator) return;
  // A coordinator stepped down, its host crashed, or one took the role here: a pointer is
  // compared with the one seen after an earlier event only, never kept past its end.
  if (seen.coordinator) role_->Gone(seen);
  seen = SeenCoordinator{};
  seen.coordinator = coordinator;
  if (!coordinator) return;
  role_->Took(seen, index);
  // An elected coordinator that takes over counts on from the budget in the store, and may end
  // the job at once (the lost round was the last): what it took over is read here.
  role_->Restarts(seen, coordinator->restarts_used());
}

void CoordinatorWatch::Apply(const Heard& heard) {
  namespace o = core::observed;
  SeenCoordinator& seen = seen_[heard.node];
  // A coordinator that left the role in this same event is gone; what it said is forgotten.
  const core::Coordinator* coordinator = CoordinatorOf(heard.node);
  if (!coordinator || coordinator != seen.coordinator) return;
  if (const auto* started = std::get_if<o::RoundStarted>(&heard.what)) {
    role_->RoundStarted(seen, heard.node, started->round);
    role_->Restarts(seen, started->restarts_used);
  } else if (const auto* restart = std::get_if<o::RestartSpent>(&heard.what)) {
    role_->Restarts(seen, restart->restart);
  } else if (const auto* hang = std::get_if<o::HangJudged>(&heard.what)) {
    ++stats_.hangs_judged;
    invariants_.HangJudged(RoundKey{seen.launch, hang->round}, hang->culprits, hang->with_stack);
  } else if (const auto* ended = std::get_if<o::JobEnded>(&heard.what)) {
    ended_by_rule_ = ended_by_rule_ || ended->by_rule;
    if (!first_verdict_ns_) first_verdict_ns_ = loop_.now_ns;
    role_->Ended(seen, heard.node, ended->exit_code);
    role_->Restarts(seen, ended->restarts_used);
  }
}

uint64_t CoordinatorWatch::RoundEpochOf(uint32_t index) const { return role_->RoundEpochOf(index); }

}  // namespace ddprun::sim
