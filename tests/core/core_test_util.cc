// Effect filters and readable listings of core effects, for the core tests.

#include "tests/core/core_test_util.h"

#include <fmt/format.h>

#include "runner/core/wire.h"
#include "schema/canonical.h"

namespace ddprun::core::test {
namespace {

std::string Level(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
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
  std::string operator()(const GiveUpRole&) const { return "give up the role"; }
  std::string operator()(const RecordWorkers& e) const {
    return e.rounds_may_run ? "journal: rounds may run" : "journal: job ended";
  }
  std::string operator()(const RecordQuarantine& e) const {
    std::string text = "quarantine:";
    for (const auto& h : e.hosts)
      text += fmt::format(
          " {} ({} times, {} ms left)", h.host, h.times,
          static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(h.left).count()));
    return text;
  }
  std::string operator()(const CommitRound& e) const {
    return fmt::format("commit round {} ({} restarts used)", e.round, e.restarts_used);
  }
  std::string operator()(const RecordRestart& e) const {
    return fmt::format("record restart: next round {} ({} restarts used)", e.next_round, e.restarts_used);
  }
  std::string operator()(const RecordEnd& e) const { return fmt::format("record end: exit {}", e.exit_code); }
  std::string operator()(const Observed& e) const {
    return std::visit(
        [](const auto& o) -> std::string {
          using O = std::decay_t<decltype(o)>;
          if constexpr (std::is_same_v<O, observed::NodeJoined>)
            return fmt::format("observed: agent {} joined", o.agent);
          if constexpr (std::is_same_v<O, observed::NodeRefused>)
            return fmt::format("observed: agent {} refused", o.agent);
          if constexpr (std::is_same_v<O, observed::NodeLost>) {
            return fmt::format("observed: agent {} lost ({}: {})", o.agent, LossReasonName(o.reason),
                               o.detail);
          }
          if constexpr (std::is_same_v<O, observed::RoundStarted>)
            return fmt::format("observed: round {} started", o.round);
          if constexpr (std::is_same_v<O, observed::RoundFailed>) {
            return fmt::format("observed: round {} failed: {}", o.round, o.what);
          }
          if constexpr (std::is_same_v<O, observed::RestartSpent>)
            return fmt::format("observed: restart {}", o.restart);
          if constexpr (std::is_same_v<O, observed::HangProbed>)
            return fmt::format("observed: round {} probed", o.round);
          if constexpr (std::is_same_v<O, observed::HangJudged>) {
            return fmt::format("observed: round {} hung: ranks {}", o.round, fmt::join(o.culprits, ","));
          }
          if constexpr (std::is_same_v<O, observed::JobEnded>)
            return fmt::format("observed: job ended, exit {}", o.exit_code);
        },
        e.what);
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
  std::string operator()(const ProbeEndpoints& e) const {
    return fmt::format("probe {} endpoints", e.targets.size());
  }
  std::string operator()(const LogLine& e) const { return Level(e.level) + ": " + e.text; }
  std::string operator()(const PrintSummary& e) const { return "summary: " + e.text; }
  std::string operator()(const AgentExit& e) const { return fmt::format("exit {}", e.code); }
  std::string operator()(const RenewLease& e) const {
    return fmt::format(
        "renew lease: kill at {} ms",
        std::chrono::duration_cast<std::chrono::milliseconds>(e.kill_at.time_since_epoch()).count());
  }
  std::string operator()(const RootCauseKnown& e) const {
    return fmt::format("root cause of round {}: rank {}{}", e.round, e.cause_rank,
                       e.provisional ? " (provisional: its error says it lost a peer)" : "");
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
    const auto* record = std::get_if<RecordWorkers>(&e);
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

}  // namespace ddprun::core::test
