// Effect filters and readable listings of core effects, for the core tests.

#include "tests/core/core_test_util.h"

#include <fmt/format.h>

#include "runner/core/wire.h"
#include "schema/canonical.h"

namespace ddprun::core::test {
namespace {

std::string Level(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "?";
}

struct CoordinatorNamer {
  std::string operator()(const SendTo& e) const {
    return fmt::format("send {} to conn {}", wire::MessageName(e.message), e.conn);
  }
  std::string operator()(const CloseConn& e) const { return fmt::format("close conn {}", e.conn); }
  std::string operator()(const ReserveStorePort& e) const {
    return fmt::format("reserve store port for round {}", e.round);
  }
  std::string operator()(const LogLine& e) const { return Level(e.level) + ": " + e.text; }
  std::string operator()(const CoordinatorDone& e) const {
    return fmt::format("coordinator done, exit {}", e.exit_code);
  }
  std::string operator()(const RecordJournal& e) const {
    return e.rounds_may_run ? "journal: rounds may run" : "journal: job ended";
  }
  std::string operator()(const RecordQuarantine& e) const {
    std::string text = "quarantine:";
    for (const auto& h : e.hosts) text += fmt::format(" {} ({} times, {} ms left)", h.host, h.times, static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(h.left).count()));
    return text;
  }
  std::string operator()(const CommitRound& e) const {
    return fmt::format("commit round {} ({} restarts used)", e.round, e.restarts_used);
  }
  std::string operator()(const RecordRestart& e) const {
    return fmt::format("record restart: next round {} ({} restarts used)", e.next_round, e.restarts_used);
  }
  std::string operator()(const RecordEnd& e) const {
    return fmt::format("record end: exit {}", e.exit_code);
  }
};

struct AgentNamer {
  std::string operator()(const ConnectToMaster&) const { return "connect to master"; }
  std::string operator()(const SendToMaster& e) const {
    return fmt::format("send {}", wire::MessageName(e.message));
  }
  std::string operator()(const DisconnectFromMaster&) const { return "disconnect"; }
  std::string operator()(const SpawnWorkers& e) const {
    return fmt::format("spawn {} workers of round {}", e.workers.size(), e.round);
  }
  std::string operator()(const SignalWorkers& e) const {
    return fmt::format("signal {} to round {}", e.signal, e.round);
  }
  std::string operator()(const SignalForStacks& e) const {
    return fmt::format("signal {} workers of round {} for stacks", e.targets.size(), e.round);
  }
  std::string operator()(const ReadStacks& e) const {
    return fmt::format("read stacks of round {}", e.round);
  }
  std::string operator()(const ProbeEndpoints& e) const { return fmt::format("probe {} endpoints", e.targets.size()); }
  std::string operator()(const LogLine& e) const { return Level(e.level) + ": " + e.text; }
  std::string operator()(const PrintSummary& e) const { return "summary: " + e.text; }
  std::string operator()(const AgentExit& e) const { return fmt::format("exit {}", e.code); }
  std::string operator()(const RenewLease& e) const {
    return fmt::format("renew lease: kill at {} ms",
                       std::chrono::duration_cast<std::chrono::milliseconds>(e.kill_at.time_since_epoch()).count());
  }
  std::string operator()(const RootCauseKnown& e) const {
    return fmt::format("root cause of round {}: rank {}", e.round, e.cause_rank);
  }
};

template <typename Effect, typename Namer>
std::string List(const std::vector<Effect>& effects, Namer namer) {
  std::string text;
  for (const Effect& e : effects) text += "  " + std::visit(namer, e) + "\n";
  return text.empty() ? "  (no effects)\n" : text;
}

}  // namespace

std::vector<CoordinatorEffect> Meaningful(const std::vector<CoordinatorEffect>& effects) {
  std::vector<CoordinatorEffect> kept;
  for (const CoordinatorEffect& e : effects) {
    const auto* record = std::get_if<RecordJournal>(&e);
    if (record && record->rounds_may_run) continue;
    const auto* send = std::get_if<SendTo>(&e);
    if (send && std::holds_alternative<wire::Heartbeat>(send->message)) continue;
    kept.push_back(e);
  }
  return kept;
}

std::vector<AgentEffect> Meaningful(const std::vector<AgentEffect>& effects) {
  std::vector<AgentEffect> kept;
  for (const AgentEffect& e : effects) {
    const auto* send = std::get_if<SendToMaster>(&e);
    if (send && std::holds_alternative<wire::Heartbeat>(send->message)) continue;
    if (std::holds_alternative<RenewLease>(e)) continue;  // with every word from the coordinator
    kept.push_back(e);
  }
  return kept;
}

std::string Describe(const std::vector<CoordinatorEffect>& effects) {
  return List(effects, CoordinatorNamer{});
}

std::string Describe(const std::vector<AgentEffect>& effects) { return List(effects, AgentNamer{}); }

void CoordinatorDriver::Use(const std::string& toml) {
  spec_ = std::make_unique<JobSpec>(SpecFromToml(toml));
  canonical_ = CanonicalForm(*spec_);
  coordinator_ = std::make_unique<Coordinator>(*spec_, canonical_, At(Duration::zero()));
  last_ = Duration::zero();
}

CoordinatorDriver::Effects CoordinatorDriver::Feed(Duration at, const CoordinatorInput& input) {
  last_ = at;
  Effects out;
  coordinator_->Handle(At(at), input, out);
  if (auto next = coordinator_->NextDeadline()) {
    EXPECT_GT(*next, At(at));
  }
  return out;
}

CoordinatorDriver::Effects CoordinatorDriver::Join(Duration at, int agent, int generation) {
  Feed(at, PeerAccepted{Conn(agent, generation), fmt::format("10.0.0.{}", agent + 1)});
  return Feed(at, PeerMessage{Conn(agent, generation),
                              wire::Join{agent, spec_->cluster.HostOf(agent), spec_->cluster.nproc_per_node,
                                         "0.1.0", FingerprintOfCanonical(canonical_), canonical_,
                                         1000 + static_cast<uint64_t>(agent) + 100 * static_cast<uint64_t>(generation),
                                         "", "", ""}});
}

CoordinatorDriver::Effects CoordinatorDriver::Send(Duration at, int agent, wire::Message m, int generation) {
  return Feed(at, PeerMessage{Conn(agent, generation), std::move(m)});
}

CoordinatorDriver::Effects CoordinatorDriver::BeatUntil(Duration from, Duration to,
                                                        std::vector<std::pair<int, int>> agents) {
  Effects all;
  for (Duration t = from + std::chrono::seconds(1); t <= to; t += std::chrono::seconds(1)) {
    for (auto [agent, generation] : agents) {
      Effects e = Send(t, agent, wire::Heartbeat{}, generation);
      all.insert(all.end(), e.begin(), e.end());
    }
  }
  return all;
}

}  // namespace ddprun::core::test
