#pragma once
// The one coordinator driver and the one agent driver of the core tests: each owns its job
// spec and state machine, feeds inputs at virtual times and, after every input, checks what
// the real drivers rely on: the next deadline lies after now (one in the past or at now would
// spin runner/io's loop and the simulator forever).

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runner/core/agent.h"
#include "runner/core/coordinator.h"
#include "runner/core/wire.h"
#include "tests/core/core_test_util.h"

namespace ddprun::core::test {

/// A coordinator of one job fed by hand, as its agents (nodes, then spares) would: agent k
/// connects as conn 100 + k + 10 x generation from 10.0.0.(k + 1), and joins with the job's
/// fingerprint, its host from the job file, and an instance per generation. Use it as a test
/// fixture's base or as a local.
class CoordinatorDriver {
 public:
  using Effects = std::vector<CoordinatorEffect>;
  /// A fresh coordinator of `toml`'s job, or of `spec`, started at 0 s.
  void Use(std::string_view toml);
  void Use(JobSpec spec);
  /// Feeds `input` at `at`; the next deadline must lie after it. The job's record answers
  /// CommitRound and RecordEnd at once in the same batch, as node 0's journal does, unless
  /// the test answers them itself (AnswerRecordsByHand, the etcd case).
  Effects Feed(Duration at, const CoordinatorInput& input);
  void AnswerRecordsByHand() { records_by_hand_ = true; }
  static ConnId Conn(int agent, int generation = 0) { return ConnId(100 + agent + 10 * generation); }
  /// The Join agent `agent` of `generation` sends.
  wire::Join JoinOf(int agent, int generation = 0) const;
  Effects Join(Duration at, int agent, int generation = 0);
  Effects Send(Duration at, int agent, wire::Message m, int generation = 0);
  /// Heartbeats from `agents` ({agent, generation}) every second in (from, to]; every effect.
  Effects BeatUntil(Duration from, Duration to, std::vector<std::pair<int, int>> agents);

  std::unique_ptr<JobSpec> spec_;
  std::string canonical_;
  std::unique_ptr<Coordinator> coordinator_;
  Duration last_{};  // the time of the last input
  bool records_by_hand_ = false;
};

/// An agent of one job fed by hand, as its host would. Use it as a test fixture's base or as a
/// local (one per agent). (Neither driver names a member Tick: in a fixture that would hide the
/// input type core::Tick.)
class AgentDriver {
 public:
  using Effects = std::vector<AgentEffect>;
  /// A fresh agent of `toml`'s job, or of `spec`, with `config`, whose canonical form and
  /// fingerprint are the job's.
  void Use(std::string_view toml, Agent::Config config);
  void Use(JobSpec spec, Agent::Config config);
  /// Agent::Start at `at`; the next deadline must lie after it.
  Effects Start(Duration at);
  /// Feeds `input` at `at`; the next deadline must lie after it.
  Effects Feed(Duration at, const AgentInput& input);
  /// A message from the coordinator.
  Effects Msg(Duration at, wire::Message m) { return Feed(at, MasterMessage{std::move(m)}); }

  std::unique_ptr<JobSpec> spec_;
  Agent::Config config_;  // as the agent was made
  std::unique_ptr<Agent> agent_;

 private:
  void CheckDeadline(Duration at) const;
};

/// `more` appended to `all` (for tests that gather effects across inputs).
template <typename Effect>
void Append(std::vector<Effect>& all, const std::vector<Effect>& more) {
  all.insert(all.end(), more.begin(), more.end());
}

}  // namespace ddprun::core::test
