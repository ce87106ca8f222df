#include "runner/core/links.h"

#include <algorithm>

namespace ddprun::core {

void Links::Accept(ConnId id, std::string peer_addr, TimePoint now) {
  conns_[id] = Conn{std::move(peer_addr), -1, now, "", -1};
  heard_.emplace_back(now, id);
}

Links::Conn* Links::Find(ConnId id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : &it->second;
}

const Links::Conn* Links::Find(ConnId id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : &it->second;
}

void Links::Heard(ConnId id, TimePoint now) {
  Conn* conn = Find(id);
  if (!conn || conn->last_heard == now) return;  // its entry for `now` is already there
  conn->last_heard = now;
  heard_.emplace_back(now, id);
}

void Links::HearAll(TimePoint now) {
  for (auto& [id, conn] : conns_) Heard(id, now);
}

std::optional<TimePoint> Links::OldestHeard() const {
  if (heard_.empty()) return std::nullopt;
  return heard_.front().first;
}

std::vector<std::pair<TimePoint, ConnId>> Links::TakeSilent(TimePoint now, Duration bound) {
  std::vector<std::pair<TimePoint, ConnId>> silent;
  while (!heard_.empty() && now - heard_.front().first > bound) {
    const auto [heard, id] = heard_.front();
    heard_.pop_front();
    const Conn* conn = Find(id);
    if (conn && conn->last_heard == heard) silent.emplace_back(heard, id);
  }
  std::sort(silent.begin(), silent.end());
  return silent;
}

void Links::Trim() {
  // NextDeadline reads the front, so the front must be a live entry.
  while (!heard_.empty()) {
    const auto& [heard, id] = heard_.front();
    const Conn* conn = Find(id);
    if (conn && conn->last_heard == heard) return;
    heard_.pop_front();
  }
}

}  // namespace ddprun::core
