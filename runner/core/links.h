#pragma once
// The coordinator's connections and when each was last heard from. A connection silent for
// longer than the loss bound is lost; finding those is O(1) amortised per input at 16,384
// nodes: `heard_` lists (time, connection) in the order heard, which inputs in time order keep
// sorted, and an entry whose connection was heard again later, or closed, is skipped as stale.

#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runner/core/events.h"
#include "runner/core/time.h"

namespace ddprun::core {

class Links {
 public:
  struct Conn {
    std::string peer_addr;
    int node_rank = -1;  // the agent it joined as; -1 until joined
    TimePoint last_heard;
    std::string nonce;    // the Challenge sent to it, with a secret
    int hello_rank = -1;  // the node rank its hello claimed (unproven), with a secret
  };

  void Accept(ConnId id, std::string peer_addr, TimePoint now);
  /// nullptr when `id` is not (or no longer) open.
  Conn* Find(ConnId id);
  const Conn* Find(ConnId id) const;
  size_t size() const { return conns_.size(); }
  void Erase(ConnId id) { conns_.erase(id); }
  /// A word from `id` at `now`.
  void Heard(ConnId id, TimePoint now);
  /// Every open connection counts as heard at `now` (our own stall was the silence).
  void HearAll(TimePoint now);
  /// When the least recently heard open connection was heard.
  std::optional<TimePoint> OldestHeard() const;
  /// Takes out of the index the connections silent at `now` for longer than `bound`, oldest
  /// first, then by id (not the hash map's order). They stay open until erased.
  std::vector<std::pair<TimePoint, ConnId>> TakeSilent(TimePoint now, Duration bound);
  /// Drops stale entries from the front of the index; after each input.
  void Trim();

 private:
  // Looked up by id; iterated only where the order cannot matter (HearAll renews them all),
  // so a hash map keeps decisions deterministic and lookups O(1).
  std::unordered_map<ConnId, Conn> conns_;
  std::deque<std::pair<TimePoint, ConnId>> heard_;
};

}  // namespace ddprun::core
