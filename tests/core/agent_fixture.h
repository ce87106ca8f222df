#pragma once
// The agent tests' fixture: the shared driver (its Feed checks the next deadline) with their
// vocabulary: a joined agent, one running a round with both workers, failed connects, the
// master's heartbeats. Included by agent_test.cc, agent_loss_test.cc, agent_signal_test.cc and
// agent_secret_test.cc.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <utility>
#include <vector>

#include "runner/core/agent.h"
#include "schema/canonical.h"
#include "tests/core/core_test_util.h"
#include "tests/core/drivers.h"

// Not in an anonymous namespace: googletest needs one fixture class per suite across the
// files.
namespace ddprun::core {

using namespace std::chrono_literals;
using test::All;
using test::At;
using test::Edit;
using test::FindLog;
using test::kTwoNodeJob;
using test::Meaningful;
using test::Sent;
using test::SpecFromToml;
using Effects = std::vector<AgentEffect>;

constexpr Duration kNs = Duration(1);

inline std::string EnvOf(const WorkerLaunch& launch, const std::string& name) {
  for (const auto& [key, value] : launch.env) {
    if (key == name) return value;
  }
  return "(unset)";
}

class AgentTest : public ::testing::Test, public test::AgentDriver {
 protected:
  void SetUp() override { UseJob(kTwoNodeJob); }

  void UseJob(std::string_view toml, std::string secret = "") {
    Agent::Config config;
    config.node_rank = 1;
    config.host = "gpu-02";
    config.instance = 4242;
    config.ddprun_version = "0.1.0";
    config.logs_dir = "/var/log/ddprun";
    config.inherited_env = {{"PATH", "/usr/bin"}};
    config.secret = std::move(secret);
    Use(toml, std::move(config));
  }
  Effects Tick(Duration at) { return Feed(at, core::Tick{}); }

  Effects Exit(Duration at, int local, int code, int signal = 0, std::string tail = "", int round = 0) {
    return Feed(at, WorkerExited{round, local, code, signal, std::move(tail), ""});
  }

  /// Heartbeats from the master every second in (from, to]; returns the meaningful effects.
  Effects MasterBeatsUntil(Duration from, Duration to) {
    Effects all;
    for (Duration t = from + 1s; t <= to; t += 1s) {
      Effects e = Meaningful(Msg(t, wire::Heartbeat{}));
      all.insert(all.end(), e.begin(), e.end());
    }
    return all;
  }

  void Joined(Duration at) {
    Start(at);
    Feed(at, MasterConnected{});
    Msg(at, wire::JoinAck{2});
    ASSERT_EQ(agent_->phase(), Agent::Phase::kWaiting);
  }

  /// Joined and running round `round` with both workers.
  SpawnWorkers Running(Duration at, int round = 0, uint16_t port = 41000) {
    Joined(at);
    const Effects e = Msg(at, wire::StartRound{round, port});
    const auto spawns = All<SpawnWorkers>(e);
    EXPECT_EQ(spawns.size(), 1u) << test::Describe(e);
    return spawns.empty() ? SpawnWorkers{} : spawns[0];
  }

  /// Drives connect attempts that all fail with `error` until just before `until`.
  void FailConnectsUntil(Duration until, ConnectError error = ConnectError::kRefused) {
    while (auto next = agent_->NextDeadline()) {
      const Duration at = next->time_since_epoch();
      if (at >= until) break;
      const Effects e = Tick(at);
      if (!All<ConnectToMaster>(e).empty()) Feed(at, MasterConnectFailed{error, "Connection refused"});
    }
  }
};

inline const std::string kRefusedAdvice =
    "connection to gpu-01:50000 refused: node 0's agent is not listening yet, or master_port is "
    "wrong, or a firewall rejects TCP port 50000";

}  // namespace ddprun::core
