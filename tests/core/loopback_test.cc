// One coordinator and N agents wired together through the real frame codec, with simulated
// workers: whole protocol flows (success, restart, exhausted budget) end to end.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runner/core/agent.h"
#include "runner/core/coordinator.h"
#include "runner/core/wire.h"
#include "schema/canonical.h"
#include "tests/core/core_test_util.h"
#include "tests/core/drivers.h"

namespace ddprun::core {
namespace {

using namespace std::chrono_literals;
using test::Edit;
using test::kTwoNodeJob;
using test::SpecFromToml;

/// Delivers every message through wire::Encode and a per-direction Decoder, in order and
/// without delay; time moves only in Advance. Workers exit when the test says so, or at
/// once when signalled. The state machines are fed through the shared drivers, which check
/// every next deadline.
class Loopback {
 public:
  struct Node {
    test::AgentDriver agent;
    std::optional<ConnId> conn;  // the coordinator's id for this agent's connection
    wire::Decoder from_master;
    std::map<int, bool> running;  // local rank -> running, for the current round
    int round = -1;
    std::vector<SpawnWorkers> spawns;
    std::vector<std::string> summaries;
    std::vector<std::string> logs;
    std::optional<int> exit_code;
  };

  explicit Loopback(const JobSpec& spec) : spec_(spec) {
    coordinator_.Use(spec_);
    for (int n = 0; n < spec_.cluster.nnodes; ++n) {
      Agent::Config config;
      config.node_rank = n;
      config.host = spec_.cluster.nodes.at(static_cast<size_t>(n));
      config.instance = 500 + static_cast<uint64_t>(n);
      config.ddprun_version = "0.1.0";
      config.logs_dir = "/logs";
      nodes_.push_back(std::make_unique<Node>());
      nodes_.back()->agent.Use(spec_, std::move(config));
    }
    for (int n = 0; n < spec_.cluster.nnodes; ++n) Apply(n, node(n).agent.Start(Now()));
    Drain();
  }

  Node& node(int n) { return *nodes_.at(static_cast<size_t>(n)); }
  Coordinator& coordinator() { return *coordinator_.coordinator_; }
  std::optional<int> coordinator_exit() const { return coordinator_exit_; }
  const std::vector<std::string>& coordinator_logs() const { return coordinator_logs_; }
  TimePoint now() const { return now_; }

  /// A worker of the node's current round ends on its own.
  void ExitWorker(int n, int local, int code, std::string stderr_tail = "") {
    ASSERT_TRUE(node(n).running[local]) << "worker " << local << " of node " << n << " is not running";
    node(n).running[local] = false;
    ToAgent(n, WorkerExited{node(n).round, local, code, 0, std::move(stderr_tail), ""});
    Drain();
  }
  /// The node's agent receives a signal, as its host would deliver it.
  void Signal(int n, int signal) {
    ToAgent(n, SignalReceived{signal});
    Drain();
  }
  /// The node's connection to the master breaks (both ends see it).
  void BreakConnection(int n) {
    ASSERT_TRUE(node(n).conn.has_value());
    ToCoordinator(PeerClosed{*node(n).conn, "connection reset by peer"});
    ToAgent(n, MasterClosed{"connection reset by peer"});
    node(n).conn.reset();
    Drain();
  }
  void ExitAllWorkers(int n, int code) {
    for (auto& [local, running] : node(n).running) {
      if (running) ExitWorker(n, local, code);
    }
  }

  /// Moves time forward to `until`, firing every deadline on the way, in order.
  void Advance(Duration by) {
    const TimePoint until = now_ + by;
    for (int guard = 0; guard < 1'000'000; ++guard) {
      std::optional<TimePoint> next = coordinator().NextDeadline();
      for (const auto& n : nodes_) {
        const auto t = n->agent.agent_->NextDeadline();
        if (t && (!next || *t < *next)) next = t;
      }
      if (!next || *next > until) {
        now_ = until;
        return;
      }
      ASSERT_GT(*next, now_ - Duration(1)) << "a deadline in the past";
      now_ = *next;
      if (coordinator().NextDeadline() == now_) ToCoordinator(Tick{});
      for (int n = 0; n < static_cast<int>(nodes_.size()); ++n) {
        if (node(n).agent.agent_->NextDeadline() == now_) ToAgent(n, Tick{});
      }
      Drain();
    }
    FAIL() << "Advance did not reach its end: deadlines do not move forward";
  }

 private:
  using Event = std::variant<CoordinatorInput, std::pair<int, AgentInput>>;

  void ToCoordinator(CoordinatorInput input) { queue_.push_back(std::move(input)); }
  void ToAgent(int n, AgentInput input) { queue_.push_back(std::pair<int, AgentInput>(n, std::move(input))); }

  void Drain() {
    for (int guard = 0; !queue_.empty(); ++guard) {
      ASSERT_LT(guard, 100'000) << "messages never settle";
      Event event = std::move(queue_.front());
      queue_.pop_front();
      if (auto* input = std::get_if<CoordinatorInput>(&event)) {
        Apply(coordinator_.Feed(Now(), *input));
      } else {
        auto& [n, agent_input] = std::get<std::pair<int, AgentInput>>(event);
        Apply(n, node(n).agent.Feed(Now(), agent_input));
      }
    }
  }

  int NodeOfConn(ConnId conn) {
    for (int n = 0; n < static_cast<int>(nodes_.size()); ++n) {
      if (node(n).conn == conn) return n;
    }
    return -1;
  }

  // Bytes through the codec, as a transport would carry them.
  static std::vector<wire::Message> Carry(const wire::Message& message, wire::Decoder& decoder) {
    decoder.Feed(wire::Encode(message));
    std::vector<wire::Message> got;
    wire::Message m;
    wire::Decoder::Status status;
    while ((status = decoder.Next(m)) == wire::Decoder::Status::kMessage) got.push_back(m);
    EXPECT_EQ(status, wire::Decoder::Status::kNeedMore) << decoder.error();
    return got;
  }

  void Apply(const std::vector<CoordinatorEffect>& effects) {
    for (const CoordinatorEffect& effect : effects) {
      if (const auto* send = std::get_if<SendTo>(&effect)) {
        const int n = NodeOfConn(send->conn);
        if (n < 0) continue;  // closed meanwhile
        for (wire::Message& m : Carry(send->message, node(n).from_master)) {
          ToAgent(n, MasterMessage{std::move(m)});
        }
      } else if (const auto* close = std::get_if<CloseConn>(&effect)) {
        const int n = NodeOfConn(close->conn);
        if (n < 0) continue;
        node(n).conn.reset();
        ToAgent(n, MasterClosed{"closed by the coordinator"});
      } else if (const auto* reserve = std::get_if<ReserveStorePort>(&effect)) {
        ToCoordinator(StorePortReady{reserve->round, static_cast<uint16_t>(41000 + reserve->round)});
      } else if (const auto* log = std::get_if<LogLine>(&effect)) {
        coordinator_logs_.push_back(log->text);
      } else if (const auto* done = std::get_if<CoordinatorDone>(&effect)) {
        EXPECT_FALSE(coordinator_exit_.has_value()) << "CoordinatorDone twice";
        coordinator_exit_ = done->exit_code;
      }
    }
  }

  void Apply(int n, const std::vector<AgentEffect>& effects) {
    Node& nd = node(n);
    for (const AgentEffect& effect : effects) {
      if (std::holds_alternative<ConnectToMaster>(effect)) {
        const ConnId conn = next_conn_++;
        nd.conn = conn;
        nd.from_master = wire::Decoder();
        to_master_[conn] = wire::Decoder();
        ToCoordinator(PeerAccepted{conn, fmt::format("10.0.0.{}", n + 1)});
        ToAgent(n, MasterConnected{});
      } else if (const auto* send = std::get_if<SendToMaster>(&effect)) {
        ASSERT_TRUE(nd.conn.has_value()) << "node " << n << " sent while not connected";
        for (wire::Message& m : Carry(send->message, to_master_[*nd.conn])) {
          ToCoordinator(PeerMessage{*nd.conn, std::move(m)});
        }
      } else if (std::holds_alternative<DisconnectFromMaster>(effect)) {
        if (nd.conn) ToCoordinator(PeerClosed{*nd.conn, "closed by the agent"});
        nd.conn.reset();
      } else if (const auto* spawn = std::get_if<SpawnWorkers>(&effect)) {
        for (const auto& [local, running] : nd.running) {
          EXPECT_FALSE(running) << "node " << n << " spawned round " << spawn->round << " while local rank "
                                << local << " still runs";
        }
        nd.round = spawn->round;
        nd.running.clear();
        for (const WorkerLaunch& w : spawn->workers) nd.running[w.local_rank] = true;
        nd.spawns.push_back(*spawn);
      } else if (const auto* signal = std::get_if<SignalWorkers>(&effect)) {
        // Simulated workers die of the first signal at once.
        if (signal->round != nd.round) continue;
        for (auto& [local, running] : nd.running) {
          if (!running) continue;
          running = false;
          ToAgent(n, WorkerExited{nd.round, local, 0, signal->signal, "", ""});
        }
      } else if (const auto* log = std::get_if<LogLine>(&effect)) {
        nd.logs.push_back(log->text);
      } else if (const auto* summary = std::get_if<PrintSummary>(&effect)) {
        nd.summaries.push_back(summary->text);
      } else if (const auto* exit = std::get_if<AgentExit>(&effect)) {
        EXPECT_FALSE(nd.exit_code.has_value()) << "node " << n << " exited twice";
        nd.exit_code = exit->code;
        // The process is gone: its connection closes.
        if (nd.conn) ToCoordinator(PeerClosed{*nd.conn, "agent exited"});
        nd.conn.reset();
      }
    }
  }

  /// now_ as the drivers take it.
  Duration Now() const { return now_.time_since_epoch(); }

  const JobSpec& spec_;
  TimePoint now_ = AtOffset(Duration(0));
  test::CoordinatorDriver coordinator_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<ConnId, wire::Decoder> to_master_;
  ConnId next_conn_ = 1;
  std::deque<Event> queue_;
  std::vector<std::string> coordinator_logs_;
  std::optional<int> coordinator_exit_;
};

TEST(LoopbackTest, TwoNodesOfTwoWorkersSucceed) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Loopback net(spec);
  ASSERT_EQ(net.coordinator().phase(), Coordinator::Phase::kRunning);
  for (int n = 0; n < 2; ++n) {
    ASSERT_EQ(net.node(n).spawns.size(), 1u);
    const SpawnWorkers& spawn = net.node(n).spawns[0];
    EXPECT_EQ(spawn.round, 0);
    ASSERT_EQ(spawn.workers.size(), 2u);
    EXPECT_EQ(spawn.workers[0].global_rank, 2 * n);
    EXPECT_EQ(spawn.workers[1].global_rank, 2 * n + 1);
  }
  net.Advance(30min);  // training: heartbeats keep everyone joined
  EXPECT_EQ(net.coordinator().phase(), Coordinator::Phase::kRunning);
  net.ExitAllWorkers(1, 0);
  net.ExitAllWorkers(0, 0);
  const std::string summary =
      "job \"demo\" succeeded: all 4 ranks on 2 nodes exited 0 in round 0 (0 restarts used)";
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(net.node(n).summaries, std::vector<std::string>{summary});
    EXPECT_EQ(net.node(n).exit_code, 0);
  }
  EXPECT_EQ(net.coordinator_exit(), 0);
  EXPECT_EQ(net.coordinator().NextDeadline(), std::nullopt);
}

TEST(LoopbackTest, FailureRestartsEveryNodeThenSucceeds) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Loopback net(spec);
  net.Advance(5min);
  net.ExitWorker(1, 1, 1, "RuntimeError: CUDA out of memory\n");
  // Every worker everywhere is stopped; the round restarts after the backoff.
  for (int n = 0; n < 2; ++n) {
    for (const auto& [local, running] : net.node(n).running) EXPECT_FALSE(running);
  }
  EXPECT_EQ(net.coordinator().phase(), Coordinator::Phase::kBackoff);
  net.Advance(10s - Duration(1));
  EXPECT_EQ(net.node(0).spawns.size(), 1u);
  net.Advance(Duration(1));
  for (int n = 0; n < 2; ++n) {
    ASSERT_EQ(net.node(n).spawns.size(), 2u);
    EXPECT_EQ(net.node(n).spawns[1].round, 1);
  }
  EXPECT_EQ(net.coordinator().restarts_used(), 1);
  EXPECT_EQ(net.node(0).logs.back(),
            "round 1: starting 2 workers (ranks 0..1 of 4), rank 0's store on port 41001, "
            "reached through master_port 50000");
  net.Advance(20min);
  net.ExitAllWorkers(0, 0);
  net.ExitAllWorkers(1, 0);
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(net.node(n).summaries,
              std::vector<std::string>{"job \"demo\" succeeded: all 4 ranks on 2 nodes exited 0 in "
                                       "round 1 (1 restart used)\nearlier rounds' root causes:\n"
                                       "  round 0: rank 3 (node 1 (gpu-02), local rank 1) exited with "
                                       "code 1 (RuntimeError)"});
    EXPECT_EQ(net.node(n).exit_code, 0);
  }
  EXPECT_EQ(net.coordinator_exit(), 0);
}

TEST(LoopbackTest, ExhaustedBudgetEndsEveryNodeWithTheSameSummary) {
  const JobSpec spec = SpecFromToml(Edit(kTwoNodeJob, "max_restarts = 1", "max_restarts = 0"));
  Loopback net(spec);
  net.Advance(1min);
  net.ExitWorker(1, 1, 1, "ncclInternalError: NCCL WARN peer closed\n");
  const std::string summary =
      "job \"demo\" FAILED in round 0 (restart.max_restarts = 0)\n"
      "root cause (first failure anywhere in the job): rank 3 (node 1 (gpu-02), local rank 1) "
      "exited with code 1\n"
      "  kind: ncclInternalError, nccl, exit:1\n"
      "  last lines of its stderr:\n"
      "    | ncclInternalError: NCCL WARN peer closed\n"
      "ddprun then stopped 3 other running ranks on 2 nodes.\n"
      "hint: the error mentions NCCL; rerun with NCCL_DEBUG=INFO in job.env to see why.\n"
      "logs: logs/demo/latest-n1/attempt-0/rank-3.log on node 1 (gpu-02), in its job file's folder; "
      "each node keeps its own runs under logs/demo/latest-n<node>";
  for (int n = 0; n < 2; ++n) {
    SCOPED_TRACE(n);
    ASSERT_EQ(net.node(n).summaries.size(), 1u);
    EXPECT_EQ(net.node(n).summaries[0], summary);
    EXPECT_EQ(net.node(n).exit_code, 1);
  }
  EXPECT_EQ(net.coordinator_exit(), 1);
}

TEST(LoopbackTest, InterruptOnOneNodeEndsTheJobEverywhereWith130) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Loopback net(spec);
  net.Advance(1min);
  net.Signal(1, SIGINT);
  const std::string summary =
      "job \"demo\" interrupted: node 1 (gpu-02) received SIGINT; every node stops its workers "
      "(SIGTERM, SIGKILL after stop_grace = 30s) before it exits";
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(net.node(n).summaries, std::vector<std::string>{summary});
    EXPECT_EQ(net.node(n).exit_code, 130);
  }
  EXPECT_EQ(net.coordinator_exit(), 130);
}

TEST(LoopbackTest, BrokenConnectionRestartsTheRoundAfterTheNodeRejoins) {
  const JobSpec spec = SpecFromToml(kTwoNodeJob);
  Loopback net(spec);
  net.Advance(1min);
  net.BreakConnection(1);
  // Node 1 stops its workers and reconnects 250 ms later; the coordinator stops node 0.
  net.Advance(10s + 250ms);
  for (int n = 0; n < 2; ++n) {
    ASSERT_EQ(net.node(n).spawns.size(), 2u) << "node " << n;
    EXPECT_EQ(net.node(n).spawns[1].round, 1);
  }
  net.ExitAllWorkers(0, 0);
  net.ExitAllWorkers(1, 0);
  EXPECT_EQ(net.node(1).exit_code, 0);
  EXPECT_EQ(net.coordinator_exit(), 0);
}

}  // namespace
}  // namespace ddprun::core
