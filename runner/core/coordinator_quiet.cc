// The coordinator's side of the simulator's quiet stretches (sim/quiet.cc): what it has under
// way when only heartbeats would happen, and what a computed stretch of them leaves it.
#include "base/assert.h"
#include "runner/core/coordinator.h"

namespace ddprun::core {

bool Coordinator::MayBeQuiet() const {
  // Waiting for nodes, a backoff's end or the round's: a heartbeat does what it does while the
  // round runs, and what ends the wait is a deadline or a message.
  return phase() == Phase::kRendezvous || phase() == Phase::kBackoff || phase() == Phase::kRunning;
}

std::optional<Coordinator::Quiet> Coordinator::QuietNow() const {
  if (!MayBeQuiet()) return std::nullopt;
  Quiet quiet{QuietState{next_heartbeat_, std::nullopt, {}}, {}, {}};
  for (const AgentSlot& slot : roster_.slots()) {
    if (!slot.conn) continue;
    const Links::Conn* conn = links_.Find(*slot.conn);
    if (!conn) return std::nullopt;
    quiet.broadcast.push_back(*slot.conn);
    quiet.heard.push_back(conn->last_heard);
  }
  // A connection that is not a joined agent's (a join under way, a stale one) is not quiet.
  if (quiet.broadcast.size() != links_.size()) return std::nullopt;
  for (int k = 0; k < static_cast<int>(Deadline::kCount); ++k) {
    const auto deadline = static_cast<Deadline>(k);
    if (deadline == Deadline::kHeartbeat || deadline == Deadline::kSilence) continue;
    const auto at = DeadlineOf(deadline);
    if (at && (!quiet.state.other_deadline || *at < *quiet.state.other_deadline))
      quiet.state.other_deadline = at;
  }
  return quiet;
}

void Coordinator::SkipQuiet(const CoordinatorQuietStretch& stretch, std::vector<CoordinatorEffect>& out) {
  DDPRUN_ASSERT(MayBeQuiet() && stretch.next_beat >= next_heartbeat_ && stretch.last_input >= last_input_);
  next_heartbeat_ = stretch.next_beat;
  for (const auto& [at, conn] : stretch.heard) links_.Heard(conn, at);
  links_.Trim();
  last_input_ = stretch.last_input;
  if (stretch.beat && record_running_) out.push_back(RecordWorkers{true});
}

}  // namespace ddprun::core
