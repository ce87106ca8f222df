// Quiet stretches: heartbeats computed instead of run, as a method of Cluster (cluster.h).
//
// Between failures a job only beats: every agent sends a Heartbeat each timeouts.heartbeat, the
// coordinator broadcasts one, and each delivery renews a lease. Run one by one that is three
// events per node per beat, and 54 days of 2,048 nodes at a 2 s beat are 10^10 events. So when
// every live node's cores say they have nothing under way but heartbeats and deadlines
// (Agent::Quiet, Coordinator::QuietNow: a round running, a backoff, a rendezvous waiting for
// nodes), nothing but heartbeat frames is in flight, and the queue holds
// nothing else before some time `until` (a fault, a worker's exit, the end of training, an
// invariant's check, another deadline of a core), the stretch up to `until` is computed:
//
//   - every sender beats on its grid (its next beat, then one per period); the k-th heartbeat
//     on a connection's direction has the latency it would have had (Network::BeatLatency
//     draws it from the seed, the direction and k alone, not from a stream shared with other
//     packets), so only the beats near the stretch's ends need drawing (Network::PlanBeats),
//     and TCP's order per direction is kept;
//   - each core is handed what the beats would have left, an input like any other
//     (core::AgentQuietStretch, core::CoordinatorQuietStretch): its next beat, its last word
//     from each peer, its last input;
//   - what is still in flight at `until` waits in the network as it would have.
//
// The run is then the same run: the same latency draws, the same state in every core, the same
// packets in flight; only the event and message counts of the summary differ in how they were
// reached. The stretch is not taken when some receiver would have declared its peer lost inside
// it or when it is shorter than two beats; then the beats run one by one as before.
// tests/sim/quiet_test.cc runs seeds both ways and compares every line they print;
// `--beat-by-beat` turns this off.
#include <algorithm>
#include <unordered_map>

#include "runner/core/wire.h"
#include "sim/cluster.h"

namespace ddprun::sim {
namespace {

// Shorter stretches are not worth their O(nodes) bookkeeping; with two, every sender beats at
// least once in a stretch (its next beat is at most a period away).
constexpr int64_t kMinBeats = 2;

}  // namespace

/// One stretch being weighed: the quiet cores, the end it may reach, and the beats planned.
struct QuietStretch {
  struct QuietNode {
    uint32_t index = 0;
    host::NodeHost::Quiet quiet;
  };
  int64_t now = 0;
  int64_t period = 0;
  int64_t until = 0;                             // the stretch ends before this
  std::vector<QuietNode> quiet;                  // every live node
  size_t coordinator = 0;                        // the one whose host runs the coordinator
  std::vector<std::optional<int64_t>> timer_at;  // by node: its timer's queued time
  Network::BeatPlan plan;                        // agent q sends on direction 2q and hears on 2q + 1
  std::vector<Network::BeatSender> senders;
  std::vector<uint32_t> agent_of_broadcast;  // the coordinator's b-th connection: quiet agent q
  const core::Coordinator::Quiet& boss() const { return *quiet[coordinator].quiet.coordinator; }
};

bool Cluster::SkipQuietStretch() {
  QuietStretch s;
  s.now = loop_.now_ns;
  s.period = Ns(spec_.timeouts.heartbeat);
  // Not quiet now: the next look is a beat later (each costs O(nodes + queue)), or sooner when
  // only messages in flight were in the way.
  next_quiet_try_ns_ = s.now + s.period;
  if (!options_.lazy_heartbeats) {
    next_quiet_try_ns_ = INT64_MAX;
    return false;
  }
  s.until = limit_ns_ + 1;
  if (!QuietCores(s)) return false;
  QuietQueue(s);
  if (s.until - s.now < kMinBeats * s.period) return false;
  const std::vector<uint8_t> frame = wire::Encode(wire::Heartbeat{});
  if (const int64_t others = network_.OthersInFlightUntil(frame); others > 0) {
    // The cores may be quiet once they arrive (the rendezvous's progress lines, say).
    next_quiet_try_ns_ = std::min(next_quiet_try_ns_, std::max(others, s.now + 1));
    return false;
  }
  if (!PlanQuietBeats(s)) return false;
  ApplyQuietStretch(s, frame);
  next_quiet_try_ns_ = s.until;
  stretch_until_ns_ = s.until;
  return true;
}

bool Cluster::QuietCores(QuietStretch& s) const {
  // Every live node is quiet, and so is the coordinator on its host.
  std::optional<size_t> coordinator;
  for (uint32_t index = 0; index < nodes_.size(); ++index) {
    const Node& n = nodes_[index];
    if (!n.up || !n.host || n.finished) continue;
    if (n.Hung(s.now)) return false;
    auto state = n.host->QuietNow();
    if (!state) return false;
    if (const auto& other = state->agent.other_deadline) {
      s.until = std::min(s.until, Ns(other->time_since_epoch()));
    }
    if (state->role_deadline) s.until = std::min(s.until, Ns(state->role_deadline->time_since_epoch()));
    if (state->coordinator) {
      coordinator = s.quiet.size();
      const auto& other = state->coordinator->state.other_deadline;
      if (other) s.until = std::min(s.until, Ns(other->time_since_epoch()));
    }
    s.quiet.push_back(QuietStretch::QuietNode{index, std::move(*state)});
  }
  if (!coordinator) return false;
  s.coordinator = *coordinator;
  return true;
}

void Cluster::QuietQueue(QuietStretch& s) {
  // Nothing else is queued before `until`: timers are the quiet nodes' (their deadlines are
  // accounted for above, and each must be its next beat) and deliveries are checked packet by
  // packet below. An invariant's check (kCheck) changes nothing and cannot fail inside the
  // stretch (every lease is renewed in it, PlanBeats sees to that), so it runs afterwards as it
  // is, and reschedules itself from the leases as they stand then.
  //
  // Worker events that no core sees run inside the stretch, in their places, after it is
  // computed: a store client's connect attempt, and a node's workers getting ready, but for
  // the last of the current round's (it starts training, which schedules more) and any when
  // workers beacon (their first beacon goes to the agent). The cores are a stretch ahead of
  // them then, which they cannot tell.
  s.timer_at.assign(nodes_.size(), std::nullopt);
  std::optional<std::pair<int64_t, uint64_t>> last_ready;
  loop_.queue.ForEach([&](const Event& event) {
    switch (event.kind) {
      case EventKind::kTimer:
        if (event.generation == nodes_[event.node].timer_gen) s.timer_at[event.node] = event.time_ns;
        return;
      case EventKind::kPump:
      case EventKind::kCheck:
      case EventKind::kStoreConnect:
        return;
      case EventKind::kWorkerReady:
        if (!workers_.beacons()) {
          if (event.target == workers_.current_gang())
            last_ready = std::max(last_ready, {{event.time_ns, event.seq}});
          return;
        }
        break;
      default:
        break;
    }
    s.until = std::min(s.until, event.time_ns);
  });
  if (last_ready) s.until = std::min(s.until, last_ready->first);
}

bool Cluster::PlanQuietBeats(QuietStretch& s) {
  // The senders and the directions they write to: agent q sends on direction 2q and hears on
  // 2q + 1; every joined agent is a quiet node.
  const core::Coordinator::Quiet& boss = s.boss();
  if (boss.broadcast.size() != s.quiet.size()) return false;
  Network::BeatPlan& plan = s.plan;
  plan.directions.resize(2 * s.quiet.size());
  s.senders.reserve(s.quiet.size() + 1);
  std::unordered_map<uint64_t, uint32_t> agent_of_connection;
  agent_of_connection.reserve(s.quiet.size());
  for (uint32_t q = 0; q < s.quiet.size(); ++q) {
    const auto sends = network_.SendsOn(s.quiet[q].quiet.master_conn);
    if (!sends) return false;
    agent_of_connection[sends->first] = q;
    plan.directions[2 * q].conn = sends->first;
    plan.directions[2 * q].toward = sends->second;
    plan.directions[2 * q + 1].conn = sends->first;
    plan.directions[2 * q + 1].toward = 1 - sends->second;
    plan.directions[2 * q + 1].heard_ns = Ns(s.quiet[q].quiet.agent.heard.time_since_epoch());
    const int64_t first = Ns(s.quiet[q].quiet.agent.next_beat.time_since_epoch());
    const auto& timer = s.timer_at[s.quiet[q].index];
    if (first < s.now || (q != s.coordinator && timer != first)) return false;  // a timer not on its beat
    s.senders.push_back(Network::BeatSender{first, s.quiet[q].index, false, {2 * q}});
  }
  Network::BeatSender broadcast{
      Ns(boss.state.next_beat.time_since_epoch()), s.quiet[s.coordinator].index, true, {}};
  if (broadcast.first_ns < s.now) return false;
  broadcast.directions.reserve(boss.broadcast.size());
  s.agent_of_broadcast.resize(boss.broadcast.size());
  for (size_t b = 0; b < boss.broadcast.size(); ++b) {
    const auto sends = network_.SendsOn(boss.broadcast[b]);
    if (!sends) return false;
    const auto agent = agent_of_connection.find(sends->first);
    if (agent == agent_of_connection.end()) return false;  // a connection of no quiet agent
    const uint32_t q = agent->second;
    if (plan.directions[2 * q + 1].toward != sends->second) return false;
    s.agent_of_broadcast[b] = q;
    broadcast.directions.push_back(2 * q + 1);
    plan.directions[2 * q].heard_ns = Ns(boss.heard[b].time_since_epoch());
  }
  s.senders.push_back(std::move(broadcast));
  const int64_t silence = Ns(spec_.timeouts.LossBound()) + 1;
  if (!network_.PlanBeats(s.senders, s.period, s.until, silence, invariants_.longest_gap_ns(), plan))
    return false;
  for (size_t q = 0; q < s.quiet.size(); ++q) {
    const Network::BeatDirection& down = plan.directions[2 * q + 1];
    if (down.delivered && invariants_.CutsOff(down.longest_gap_ns)) return false;
  }
  return true;
}

void Cluster::ApplyQuietStretch(const QuietStretch& s, const std::vector<uint8_t>& frame) {
  // It happened: the network, then each core, as the beats would have left them.
  const int64_t until = s.until;
  const int64_t period = s.period;
  const core::Coordinator::Quiet& boss = s.boss();
  network_.CommitBeats(s.plan, frame);
  const auto beats_before = [&](int64_t first) {
    return first >= until ? 0 : (until - 1 - first) / period + 1;
  };
  const auto last_beat = [&](int64_t first) { return first + (beats_before(first) - 1) * period; };
  const auto at = [](int64_t ns) { return TimePoint(Duration(ns)); };
  const int64_t boss_first = Ns(boss.state.next_beat.time_since_epoch());
  const uint32_t boss_node = s.quiet[s.coordinator].index;
  core::CoordinatorQuietStretch boss_skip;
  boss_skip.next_beat = at(boss_first + beats_before(boss_first) * period);
  boss_skip.beat = beats_before(boss_first) > 0;
  int64_t boss_input = last_beat(boss_first);  // and below: the agent's beats and what it heard
  uint64_t beats = static_cast<uint64_t>(beats_before(boss_first));
  std::vector<core::AgentQuietStretch> agent_skips(s.quiet.size());
  for (size_t q = 0; q < s.quiet.size(); ++q) {
    const int64_t first = Ns(s.quiet[q].quiet.agent.next_beat.time_since_epoch());
    const Network::BeatDirection& up = s.plan.directions[2 * q];
    const Network::BeatDirection& down = s.plan.directions[2 * q + 1];
    beats += static_cast<uint64_t>(beats_before(first));
    int64_t input = last_beat(first);
    if (down.delivered) input = std::max(input, down.heard_ns);
    if (s.quiet[q].index == boss_node) {
      // One timer serves both cores of the coordinator's host: each beat is an input of both.
      input = std::max(input, last_beat(boss_first));
      boss_input = std::max(boss_input, last_beat(first));
    }
    agent_skips[q] = {at(first + beats_before(first) * period),
                      down.delivered ? std::optional<TimePoint>(at(down.heard_ns)) : std::nullopt, at(input)};
    if (up.delivered) boss_input = std::max(boss_input, up.heard_ns);
    if (down.delivered) {
      invariants_.HeardThroughout(s.quiet[q].index, down.first_delivery_ns, down.heard_ns,
                                  down.longest_gap_ns);
    }
  }
  // The coordinator's ids of the connections it heard, in time order.
  for (size_t b = 0; b < boss.broadcast.size(); ++b) {
    const Network::BeatDirection& up = s.plan.directions[2 * s.agent_of_broadcast[b]];
    if (up.delivered) boss_skip.heard.emplace_back(at(up.heard_ns), boss.broadcast[b]);
  }
  std::sort(boss_skip.heard.begin(), boss_skip.heard.end());
  boss_skip.last_input = at(boss_input);
  for (size_t q = 0; q < s.quiet.size(); ++q) {
    Node& n = nodes_[s.quiet[q].index];
    const bool recorded =
        n.host->SkipQuiet(agent_skips[q], q == s.coordinator ? std::optional(boss_skip) : std::nullopt);
    // The journal counts from the coordinator's last beat, when the record was renewed.
    if (recorded) n.journal.RecordedAt(last_beat(boss_first));
  }
  // Each host's timer entry (its first beat in the stretch) moves to its next beat now, as it
  // would have popped and moved itself (Dispatch, kTimer), without the pop.
  loop_.queue.Postpone([&](const Event& event) -> std::optional<int64_t> {
    if (event.kind != EventKind::kTimer) return std::nullopt;
    Node& n = nodes_[event.node];
    if (event.generation != n.timer_gen || !n.armed_ns || *n.armed_ns <= event.time_ns) return std::nullopt;
    n.queued_ns = n.armed_ns;
    return n.armed_ns;
  });
  for (const Network::BeatSender& sender : s.senders) {
    quiet_end_ns_ = std::max(quiet_end_ns_, last_beat(sender.first_ns));
  }
  for (const Network::BeatDirection& d : s.plan.directions) {
    if (d.delivered) quiet_end_ns_ = std::max(quiet_end_ns_, d.heard_ns);
  }
  stats_.quiet_beats += beats;
  ++stats_.quiet_stretches;
}

}  // namespace ddprun::sim
