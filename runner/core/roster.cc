#include "runner/core/roster.h"

#include <fmt/format.h>

#include "base/assert.h"

namespace ddprun::core {

Roster::Roster(const JobSpec& spec, TimePoint start)
    : spec_(spec), slots_(static_cast<size_t>(spec.cluster.Agents())) {
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].host = spec.cluster.HostOf(static_cast<int>(i));
  for (int p = 0; p < spec.cluster.nnodes; ++p) {
    holders_.push_back(p);
    at(p).position = p;
    at(p).absent_since = start;
  }
}

void Roster::SetConn(int agent, std::optional<ConnId> conn) {
  AgentSlot& slot = at(agent);
  const int change = (conn ? 1 : 0) - (slot.conn ? 1 : 0);
  connected_ += change;
  if (slot.position >= 0) filled_ += change;
  slot.conn = conn;
}

void Roster::MoveRank(int p, int agent) {
  AgentSlot& holder = at(holders_[static_cast<size_t>(p)]);
  AgentSlot& taker = at(agent);
  DDPRUN_ASSERT(taker.position < 0);
  filled_ += (taker.conn ? 1 : 0) - (holder.conn ? 1 : 0);
  holder.position = -1;
  taker.position = p;
  holders_[static_cast<size_t>(p)] = agent;
}

void Roster::PlaceRankZero(int agent) {
  DDPRUN_ASSERT(agent >= 0 && agent < agents());
  DDPRUN_ASSERT(connected_ == 0);  // before the first input
  AgentSlot& self = at(agent);
  if (self.position == 0) return;
  AgentSlot& zero = at(holders_[0]);
  zero.position = self.position;
  if (self.position > 0) holders_[static_cast<size_t>(self.position)] = holders_[0];
  self.position = 0;
  holders_[0] = agent;
  self.absent_since = zero.absent_since;
  if (zero.position < 0) zero.absent_since.reset();
}

std::string Roster::NodeName(int agent) const {
  const AgentSlot& slot = at(agent);
  std::string name = spec_.cluster.AgentLabel(agent);
  const bool moved = slot.position >= 0 && slot.position != agent;
  if (!slot.host.empty() || moved) {
    name += fmt::format(" ({}{}{})", slot.host, !slot.host.empty() && moved ? ", " : "",
                        moved ? fmt::format("node rank {}", slot.position) : "");
  }
  return name;
}

std::string Roster::AgentName(int agent) const {
  const AgentSlot& slot = at(agent);
  std::string name = spec_.cluster.AgentLabel(agent);
  if (!slot.host.empty()) name += fmt::format(" ({})", slot.host);
  return name;
}

std::string Roster::RankName(int global_rank) const {
  const int nproc = spec_.cluster.nproc_per_node;
  const auto position = static_cast<size_t>(global_rank / nproc);
  const int agent = position < players_.size() ? players_[position] : static_cast<int>(position);
  return fmt::format("rank {} ({}, local rank {})", global_rank,
                     agent < agents() ? NodeName(agent) : fmt::format("node {}", position),
                     global_rank % nproc);
}

}  // namespace ddprun::core
