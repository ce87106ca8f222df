// The core tests' coordinator and agent drivers, with the next-deadline check after every input.

#include "tests/core/drivers.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "schema/canonical.h"

namespace ddprun::core::test {

void CoordinatorDriver::Use(std::string_view toml) { Use(SpecFromToml(toml)); }

void CoordinatorDriver::Use(JobSpec spec) {
  spec_ = std::make_unique<JobSpec>(std::move(spec));
  canonical_ = CanonicalForm(*spec_);
  coordinator_ = std::make_unique<Coordinator>(*spec_, canonical_, At(Duration::zero()));
  last_ = Duration::zero();
}

CoordinatorDriver::Effects CoordinatorDriver::Feed(Duration at, const CoordinatorInput& input) {
  last_ = at;
  Effects out;
  coordinator_->Handle(At(at), input, out);
  for (size_t i = 0; i < out.size() && !records_by_hand_; ++i) {
    if (const auto* commit = std::get_if<CommitRound>(&out[i])) {
      const int round = commit->round;
      coordinator_->Handle(At(at), RoundCommitted{round}, out);
    } else if (std::holds_alternative<RecordEnd>(out[i])) {
      coordinator_->Handle(At(at), EndRecorded{}, out);
    }
  }
  // The real driver sleeps until NextDeadline: one at or before now would spin it forever.
  if (auto next = coordinator_->NextDeadline()) {
    EXPECT_GT(*next, At(at)) << "the coordinator's NextDeadline is not in the future after input "
                             << input.index() << " at " << at.count() << " ns";
  }
  return out;
}

wire::Join CoordinatorDriver::JoinOf(int agent, int generation) const {
  return wire::Join{agent,
                    spec_->cluster.HostOf(agent),
                    spec_->cluster.nproc_per_node,
                    "0.1.0",
                    FingerprintOfCanonical(canonical_),
                    canonical_,
                    1000 + static_cast<uint64_t>(agent) + 100 * static_cast<uint64_t>(generation),
                    "",
                    "",
                    ""};
}

CoordinatorDriver::Effects CoordinatorDriver::Join(Duration at, int agent, int generation) {
  Feed(at, PeerAccepted{Conn(agent, generation), fmt::format("10.0.0.{}", agent + 1)});
  return Feed(at, PeerMessage{Conn(agent, generation), JoinOf(agent, generation)});
}

CoordinatorDriver::Effects CoordinatorDriver::Send(Duration at, int agent, wire::Message m, int generation) {
  return Feed(at, PeerMessage{Conn(agent, generation), std::move(m)});
}

CoordinatorDriver::Effects CoordinatorDriver::BeatUntil(Duration from, Duration to,
                                                        std::vector<std::pair<int, int>> agents) {
  Effects all;
  for (Duration t = from + std::chrono::seconds(1); t <= to; t += std::chrono::seconds(1)) {
    for (auto [agent, generation] : agents) Append(all, Send(t, agent, wire::Heartbeat{}, generation));
  }
  return all;
}

void AgentDriver::Use(std::string_view toml, Agent::Config config) {
  Use(SpecFromToml(toml), std::move(config));
}

void AgentDriver::Use(JobSpec spec, Agent::Config config) {
  spec_ = std::make_unique<JobSpec>(std::move(spec));
  config.canonical = CanonicalForm(*spec_);
  config.fingerprint = Fingerprint(*spec_);
  config_ = config;
  agent_ = std::make_unique<Agent>(*spec_, std::move(config));
}

AgentDriver::Effects AgentDriver::Start(Duration at) {
  Effects out;
  agent_->Start(At(at), out);
  CheckDeadline(at);
  return out;
}

AgentDriver::Effects AgentDriver::Feed(Duration at, const AgentInput& input) {
  Effects out;
  agent_->Handle(At(at), input, out);
  CheckDeadline(at);
  return out;
}

void AgentDriver::CheckDeadline(Duration at) const {
  // The real driver sleeps until NextDeadline: one at or before now would spin it forever.
  if (auto next = agent_->NextDeadline()) {
    EXPECT_GT(*next, At(at)) << "the agent's NextDeadline is not in the future after handling at "
                             << at.count() << " ns";
  }
}

}  // namespace ddprun::core::test
