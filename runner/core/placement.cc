#include "runner/core/placement.h"

#include <algorithm>

#include <fmt/format.h>

#include "schema/duration.h"

namespace ddprun::core {

// ---- The quarantine book ------------------------------------------------------------------

bool QuarantineBook::Holds(const std::string& host, TimePoint now) const {
  // Asked for every node on every join (Placement::Place): a book with nothing in it answers
  // without a lookup (16,384 nodes: 10^8 lookups per rendezvous otherwise).
  if (hosts_.empty()) return false;
  const auto until = Until(host);
  return until && *until > now;
}

std::optional<TimePoint> QuarantineBook::Until(const std::string& host) const {
  auto it = hosts_.find(host);
  return it == hosts_.end() ? std::nullopt : it->second.until;
}

std::optional<QuarantineBook::Sentence> QuarantineBook::Count(const std::string& host, TimePoint now) {
  HostRecord& record = hosts_[host];
  record.failures.push_back(now);
  while (!record.failures.empty() && now - record.failures.front() > policy_.window)
    record.failures.pop_front();
  if (static_cast<int>(record.failures.size()) < policy_.failures) return std::nullopt;
  record.failures.clear();
  Duration cooldown = policy_.cooldown;  // doubled per earlier quarantine, up to a year
  for (int i = 0; i < record.times && cooldown < Hours(24 * 365); ++i) cooldown *= 2;
  record.until = now + cooldown;
  ++record.times;
  return Sentence{cooldown, record.times};
}

RecordQuarantine QuarantineBook::Record(TimePoint now) const {
  RecordQuarantine record;
  for (const auto& [host, h] : hosts_) {
    if (h.times == 0) continue;
    record.hosts.push_back({host, h.until ? *h.until - now : Duration::zero(), h.times});
  }
  return record;
}

std::vector<std::string> QuarantineBook::Restore(const std::vector<QuarantinedHost>& hosts, TimePoint now) {
  std::vector<std::string> sitting;
  for (const QuarantinedHost& q : hosts) {
    if (q.host.empty() || q.times <= 0) continue;
    HostRecord& record = hosts_[q.host];
    record.times = std::max(record.times, q.times);
    if (q.left > Duration::zero()) {
      record.until = now + q.left;
      sitting.push_back(fmt::format("{} for {} more", q.host, HumanDuration(q.left)));
    }
  }
  return sitting;
}

std::string QuarantineBook::Note(TimePoint now) const {
  std::vector<std::string> names;
  for (const auto& [host, h] : hosts_) {
    if (h.until && *h.until > now)
      names.push_back(fmt::format("{} for {} more", host, HumanDuration(*h.until - now)));
  }
  if (names.empty()) return "";
  return fmt::format("quarantined: {}", fmt::join(names, ", "));
}

int QuarantineBook::Sitting(TimePoint now) const {
  int n = 0;
  for (const auto& [host, h] : hosts_) n += h.until && *h.until > now ? 1 : 0;
  return n;
}

// ---- Placement ----------------------------------------------------------------------------

bool Placement::Quarantined(int agent, TimePoint now) const {
  const AgentSlot& slot = roster_.at(agent);
  if (slot.host.empty() || agent == 0) return false;
  return book_.Holds(slot.host, now);
}

void Placement::NoteReplaceAt(TimePoint due) {
  if (!replace_at_ || due < *replace_at_) replace_at_ = due;
}

bool Placement::Place(TimePoint now, TimePoint absence_origin, int round,
                      std::vector<CoordinatorEffect>& out) {
  replace_at_.reset();
  shrunk_note_.clear();
  const std::vector<int>& holders = roster_.holders();
  auto playable = [&](int agent) { return roster_.at(agent).conn && !Quarantined(agent, now); };
  bool all = true;
  for (int agent : holders) all = all && playable(agent);
  if (!all && spec_.cluster.spares > 0) {
    // Waiting spares, lowest agent first (a returned node whose rank went to a spare is one).
    std::vector<int> waiting;
    for (int i = 0; i < roster_.agents(); ++i) {
      if (roster_.at(i).position < 0 && playable(i)) waiting.push_back(i);
    }
    size_t next = 0;
    // Node 0 hosts the coordinator and rank 0's store: it is never replaced.
    for (size_t p = 1; p < holders.size(); ++p) {
      const AgentSlot& away = roster_.at(holders[p]);
      if (playable(holders[p])) continue;
      // A quarantined host gives its rank up at once; an absent one after timeouts.replace.
      const bool quarantined = away.conn.has_value();
      const TimePoint since = away.absent_since.value_or(absence_origin);
      const TimePoint due = quarantined ? now : since + spec_.timeouts.replace;
      if (next >= waiting.size()) break;
      if (now < due) {
        NoteReplaceAt(due);
        continue;
      }
      const int spare = waiting[next++];
      const std::string before = roster_.AgentName(holders[p]);
      const std::string taker = roster_.AgentName(spare);
      roster_.MoveRank(static_cast<int>(p), spare);
      out.push_back(
          LogLine{LogLevel::kWarn,
                  quarantined ? fmt::format("{} takes node rank {} in place of {}, whose host is quarantined",
                                            taker, p, before)
                              : fmt::format("{} takes node rank {} in place of {}, away for {} (more than "
                                            "timeouts.replace = {})",
                                            taker, p, before, HumanDuration(now - since),
                                            FormatDuration(spec_.timeouts.replace))});
    }
  }
  std::vector<int>& players = roster_.players();
  players.clear();
  for (int agent : holders) {
    if (playable(agent)) players.push_back(agent);
  }
  if (players.size() == holders.size()) return true;
  return Shrink(now, absence_origin, round, out);
}

bool Placement::Shrink(TimePoint now, TimePoint absence_origin, int round,
                       std::vector<CoordinatorEffect>& out) {
  const int nnodes = spec_.cluster.nnodes;
  const bool can_shrink = spec_.cluster.min_nodes < nnodes;
  const std::vector<int>& holders = roster_.holders();
  std::vector<int>& players = roster_.players();
  std::vector<std::string> without;  // the node ranks given up, and why
  bool kept_out = false;             // a connected node is left out (quarantined)
  bool pending = false;              // an absent node may still come back in time
  for (size_t p = 0; p < holders.size(); ++p) {
    const int agent = holders[p];
    const AgentSlot& slot = roster_.at(agent);
    if (slot.conn && !Quarantined(agent, now)) continue;
    if (slot.conn) {
      // A spare may still be on its way (agents start in any order): wait for one as long
      // as for an absent node, from the start of this rendezvous.
      const TimePoint spare_due = absence_origin + spec_.timeouts.replace;
      if (spec_.cluster.spares > 0 && now < spare_due) {
        NoteReplaceAt(spare_due);
        pending = true;
        continue;
      }
      kept_out = true;
      without.push_back(fmt::format("{}: its host is quarantined", roster_.NodeName(agent)));
      continue;
    }
    if (p == 0) {
      // Rank 0 is the coordinator's own agent (it hosts rank 0's store): it is never left
      // out, however late it joins (a slow start of its own process is not an absence).
      pending = true;
      continue;
    }
    const TimePoint since = slot.absent_since.value_or(absence_origin);
    const TimePoint due = since + spec_.timeouts.replace;
    if (!can_shrink || now < due) {
      if (can_shrink) NoteReplaceAt(due);
      pending = true;
      continue;
    }
    without.push_back(fmt::format("{}: away for {} (more than timeouts.replace = {})",
                                  roster_.NodeName(agent), HumanDuration(now - since),
                                  FormatDuration(spec_.timeouts.replace)));
  }
  if (pending) return false;
  const auto enough = [&] { return static_cast<int>(players.size()) >= spec_.cluster.min_nodes; };
  const char* no_spare = spec_.cluster.spares > 0 ? ", and no spare waits" : "";
  if (can_shrink && enough()) {
    shrunk_note_ = fmt::format("without {}{}", fmt::join(without, "; "), no_spare);
    return true;
  }
  if (!kept_out) return false;
  // Nothing can take the quarantined hosts' places: they play after all.
  players.clear();
  for (int agent : holders) {
    if (roster_.at(agent).conn) players.push_back(agent);
  }
  out.push_back(LogLine{
      LogLevel::kWarn,
      fmt::format(
          "round {}: quarantined hosts take part after all: no spare "
          "waits{} to run without them",
          round,
          can_shrink ? fmt::format(" and cluster.min_nodes = {} needs them", spec_.cluster.min_nodes) : "")});
  if (players.size() == holders.size()) return true;
  if (!can_shrink || !enough()) return false;
  without.clear();
  for (int agent : holders) {
    if (!roster_.at(agent).conn) without.push_back(roster_.NodeName(agent) + ": away");
  }
  shrunk_note_ = fmt::format("without {}{}", fmt::join(without, "; "), no_spare);
  return true;
}

void Placement::CountFailure(TimePoint now, const RoundFailure& failure,
                             std::vector<CoordinatorEffect>& out) {
  const auto& q = spec_.quarantine;
  if (q.failures <= 0 || !spec_.cluster.CanReplace()) return;
  if (failure.node_rank <= 0 || failure.node_rank >= roster_.agents()) return;
  const AgentSlot& slot = roster_.at(failure.node_rank);
  if (slot.host.empty() || Quarantined(failure.node_rank, now)) return;
  const auto sentence = book_.Count(slot.host, now);
  if (!sentence) return;
  out.push_back(
      LogLine{LogLevel::kWarn,
              fmt::format("quarantine: host {} ({}) sits out for {}: {} rounds failed "
                          "because of it within quarantine.window = {}, the last with "
                          "{}; quarantine {} of this host (each lasts twice as long as "
                          "the one before)",
                          slot.host, roster_.NodeName(failure.node_rank), HumanDuration(sentence->cooldown),
                          q.failures, FormatDuration(q.window), failure.what, sentence->times)});
  out.push_back(book_.Record(now));
}

void Placement::Restore(const std::vector<QuarantinedHost>& hosts, TimePoint now,
                        std::vector<CoordinatorEffect>& out) {
  const std::vector<std::string> sitting = book_.Restore(hosts, now);
  if (sitting.empty()) return;
  out.push_back(LogLine{
      LogLevel::kWarn,
      fmt::format("quarantine (kept from an earlier launch of this job): {}{}", fmt::join(sitting, ", "),
                  spec_.cluster.CanReplace() ? ""
                                             : "; without spares or cluster.min_nodes they take part "
                                               "anyway")});
}

}  // namespace ddprun::core
