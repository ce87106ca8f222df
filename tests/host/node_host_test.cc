// NodeHost, the glue between the ports and the state machines, with hand-driven ports: a
// one-node job whose agent reaches its own coordinator over an in-memory loopback. What is
// tested here is the wiring: node 0's journal read at start and written by the coordinator's
// effects, the event log written from the inputs and effects, and the exit once the job ends.

#include "runner/host/node_host.h"

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "schema/canonical.h"
#include "tests/core/core_test_util.h"

namespace ddprun::host {
namespace {

using namespace std::chrono_literals;
using core::test::At;
using core::test::SpecFromToml;

constexpr std::string_view kOneNodeJob = R"(version = 1
[job]
name = "solo"
command = ["python", "train.py"]
[cluster]
nnodes = 1
master_port = 50000
nproc_per_node = 2
[timeouts]
heartbeat = "2s"
stop_grace = "30s"
)";

/// Every port of one node, driven by the test. Callbacks are queued, never made from inside
/// a port call (the ports' contract), and run by Pump().
class FakePorts final : public Clock,
                        public Timer,
                        public Transport,
                        public ProcessLauncher,
                        public Console,
                        public Journal,
                        public EventLog {
 public:
  // Clock and Timer
  TimePoint Now() const override { return now; }
  void ArmAt(TimePoint when) override { armed = when; }
  void Disarm() override { armed.reset(); }
  // Transport: one listener; a connect to it is accepted on a second connection id.
  void SetEvents(TransportEvents* events) override { transport_events = events; }
  Status Listen(const std::string&, uint16_t) override { return {}; }
  ConnId Connect(const std::string&, uint16_t) override {
    const ConnId client = next_conn++;
    const ConnId server = next_conn++;
    peer[client] = server;
    peer[server] = client;
    later.push_back([this, server] { transport_events->OnAccepted(server, "127.0.0.1:40000"); });
    later.push_back([this, client] { transport_events->OnConnected(client); });
    return client;
  }
  void Send(ConnId conn, std::vector<uint8_t> bytes) override {
    auto it = peer.find(conn);
    if (it == peer.end()) return;
    later.push_back([this, to = it->second, bytes = std::move(bytes)] {
      if (peer.count(to)) transport_events->OnData(to, bytes);
    });
  }
  void Close(ConnId conn) override {
    auto it = peer.find(conn);
    if (it == peer.end()) return;
    const ConnId other = it->second;
    peer.erase(conn);
    peer.erase(other);
    later.push_back([this, other] { transport_events->OnClosed(other, "closed"); });
  }
  uint16_t ReserveStorePort() override { return 41000; }
  // ProcessLauncher
  void SetEvents(ProcessEvents* events) override { process_events = events; }
  void Spawn(int round, const core::WorkerLaunch& launch) override {
    spawned.emplace_back(round, launch.local_rank);
  }
  void SignalAll(int, int) override {}
  void SignalForStacks(int, const std::vector<std::pair<int, int>>&) override {}
  std::vector<std::string> ReadStacks(int) override { return {}; }
  void RenewLease(TimePoint kill_at) override { leases.push_back(kill_at); }
  // Console
  void Log(core::LogLevel, std::string_view source, std::string_view text) override {
    lines.push_back(std::string(source) + ": " + std::string(text));
  }
  void Summary(std::string_view text) override { lines.push_back("summary: " + std::string(text)); }
  // Journal
  std::optional<Duration> SinceRoundsMayRun() override { return journal_since; }
  void Record(bool rounds_may_run) override { records.push_back(rounds_may_run); }
  std::vector<core::QuarantinedHost> Quarantined() override { return quarantined; }
  void RecordQuarantine(const std::vector<core::QuarantinedHost>& hosts) override { quarantined = hosts; }
  // EventLog: "type key=value ..." per record, the values as the file would hold them.
  void Record(TimePoint, const Event& event) override {
    std::string line(event.type);
    for (const auto& [key, value] : event.fields) {
      line += " " + std::string(key) + "=";
      std::visit(
          [&line](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, std::string>) {
              line += v;
            } else if constexpr (std::is_same_v<T, bool>) {
              line += v ? "true" : "false";
            } else if constexpr (std::is_same_v<T, int64_t>) {
              line += std::to_string(v);
            } else {
              std::string list;
              for (const auto& item : v) {
                if constexpr (std::is_same_v<std::decay_t<decltype(item)>, std::string>) {
                  list += (list.empty() ? "" : ",") + item;
                } else {
                  list += (list.empty() ? "" : ",") + std::to_string(item);
                }
              }
              line += "[" + list + "]";
            }
          },
          value);
    }
    logged.push_back(line);
  }

  void Pump() {
    while (!later.empty()) {
      auto call = std::move(later.front());
      later.pop_front();
      call();
    }
  }
  bool Logged(const std::string& text) const {
    for (const auto& line : lines) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }

  TimePoint now = At(0s);
  std::optional<TimePoint> armed;
  TransportEvents* transport_events = nullptr;
  ProcessEvents* process_events = nullptr;
  ConnId next_conn = 1;
  std::map<ConnId, ConnId> peer;
  std::deque<std::function<void()>> later;
  std::vector<std::pair<int, int>> spawned;  // (round, local rank)
  std::vector<TimePoint> leases;             // RenewLease, in order
  std::vector<std::string> lines;
  std::optional<Duration> journal_since;
  std::vector<core::QuarantinedHost> quarantined;
  std::vector<bool> records;
  std::vector<std::string> logged;  // the event log's records
};

class NodeHostTest : public ::testing::Test {
 protected:
  void Start() {
    core::Agent::Config config;
    config.node_rank = 0;
    config.host = "solo-host";
    config.canonical = CanonicalForm(spec_);
    config.fingerprint = FingerprintOfCanonical(config.canonical);
    config.instance = 7;
    config.ddprun_version = "test";
    config.logs_dir = "logs";
    Ports ports{&fake_, &fake_, &fake_, &fake_, &fake_, &fake_, with_events_ ? &fake_ : nullptr};
    host_ = std::make_unique<NodeHost>(spec_, config, ports, [this](int code) { exit_ = code; });
    const Status started = host_->Start();
    ASSERT_TRUE(started) << started.error();
    fake_.Pump();
  }
  /// Moves time to the armed deadline (at most `until`) and fires it, as a driver does.
  void RunUntil(TimePoint until) {
    while (fake_.armed && *fake_.armed <= until && !exit_) {
      fake_.now = *fake_.armed;
      host_->OnTimer();
      fake_.Pump();
    }
    fake_.now = until;
  }
  void BothWorkersExit(int code) {
    for (int local = 0; local < 2; ++local) {
      fake_.process_events->OnWorkerExited(core::WorkerExited{0, local, code, 0, "", ""});
      fake_.Pump();
    }
  }

  JobSpec spec_ = SpecFromToml(kOneNodeJob);
  FakePorts fake_;
  std::unique_ptr<NodeHost> host_;
  std::optional<int> exit_;
  bool with_events_ = false;
};

TEST_F(NodeHostTest, ACleanRunRecordsThatWorkersMayRunAndThenTheEnd) {
  Start();
  ASSERT_EQ(fake_.spawned.size(), 2u) << "the one-node round starts at once";
  EXPECT_EQ(fake_.records, std::vector<bool>{true});
  RunUntil(At(5s));  // two heartbeats: the record is refreshed each time
  EXPECT_EQ(fake_.records, (std::vector<bool>{true, true, true}));
  BothWorkersExit(0);
  RunUntil(At(1min));
  EXPECT_EQ(exit_, 0);
  ASSERT_FALSE(fake_.records.empty());
  EXPECT_FALSE(fake_.records.back()) << "the end is recorded once every node confirmed it";
  EXPECT_FALSE(fake_.Logged("previous coordinator"));
}

TEST_F(NodeHostTest, ARecordThatWorkersMayRunDelaysTheFirstRoundUntilItsLeaseEnds) {
  // Lease: loss bound 6s + 1 heartbeat 2s + stop_grace 30s + kill allowance 10s = 48s.
  fake_.journal_since = 40s;
  Start();
  EXPECT_TRUE(
      fake_.Logged("coordinator: the previous coordinator of this job on this host did "
                   "not end it (40s ago it recorded that workers may run)"));
  EXPECT_TRUE(fake_.spawned.empty());
  RunUntil(At(8s) - Duration(1));
  EXPECT_TRUE(fake_.spawned.empty()) << "started before the lease of the last record ended";
  RunUntil(At(8s));
  EXPECT_EQ(fake_.spawned.size(), 2u);
}

// Every word from the coordinator renews the workers' lease on the launcher (its guardian), the
// loss bound + stop_grace (6 s + 30 s) after it.
TEST_F(NodeHostTest, EveryWordFromTheCoordinatorRenewsTheWorkersLeaseOnTheLauncher) {
  Start();
  ASSERT_EQ(fake_.spawned.size(), 2u);
  ASSERT_FALSE(fake_.leases.empty());
  EXPECT_EQ(fake_.leases.back(), At(36s));
  RunUntil(At(5s));  // heartbeats at 2 s and 4 s
  EXPECT_EQ(fake_.leases.back(), At(40s));
}

TEST_F(NodeHostTest, ARecordOlderThanTheLeaseDelaysNothing) {
  fake_.journal_since = 1h;
  Start();
  EXPECT_EQ(fake_.spawned.size(), 2u);
  EXPECT_FALSE(fake_.Logged("previous coordinator"));
}

// The event log of a one-node job whose rank 1 fails in round 0 and which then succeeds:
// node 0 records the agent's and the coordinator's side, in the order they happened.
TEST_F(NodeHostTest, TheEventLogRecordsRoundsFailuresTheRestartAndTheEnd) {
  spec_.restart.max_restarts = 1;
  spec_.restart.backoff = 0s;
  with_events_ = true;
  Start();
  fake_.process_events->OnWorkerExited(
      core::WorkerExited{0, 1, 3, 0, "Traceback (most recent call last):\nValueError: bad batch\n", ""});
  fake_.Pump();
  RunUntil(At(1s));
  fake_.process_events->OnWorkerExited(core::WorkerExited{0, 0, 0, 15, "", ""});
  fake_.Pump();
  RunUntil(At(2s));
  ASSERT_EQ(fake_.spawned.size(), 4u) << "round 1 started";
  for (int local = 0; local < 2; ++local) {
    fake_.process_events->OnWorkerExited(core::WorkerExited{1, local, 0, 0, "", ""});
    fake_.Pump();
  }
  RunUntil(At(1min));
  ASSERT_EQ(exit_, 0);
  std::vector<std::string> events;
  for (const std::string& e : fake_.logged) {
    if (e.starts_with("job-result") || e.starts_with("job-end") || e.starts_with("summary")) {
      events.push_back(
          e.substr(0, e.find(" summary=") == std::string::npos ? e.find(" text=") : e.find(" summary=")));
    } else {
      events.push_back(e);
    }
  }
  // The agent stops its own workers at its rank's failure, before the coordinator's StopRound
  // comes back; the coordinator starts the round in the batch that acknowledges the join.
  EXPECT_EQ(
      events,
      (std::vector<std::string>{
          "agent-start job=solo fingerprint=" + FingerprintOfCanonical(CanonicalForm(spec_)).substr(0, 12) +
              " nnodes=1 spares=0 nproc=2 max_restarts=1 spare=false hang_detection=false version=test",
          "node-joined peer=0 peer_host=solo-host spare=false",
          "round-begin round=0 restarts_used=0 nodes=1",
          "joined standby=false",
          "workers-start round=0 plays=0 ranks=[0,1]",
          "worker-exit round=0 rank=1 local_rank=1 exit_code=3 signal=0 stopped=false "
          "kinds=[ValueError,exit:3] "
          "error=ValueError: bad batch",
          "signal-workers round=0 signal=SIGTERM",
          "round-failed round=0 peer=0 rank=1 kinds=[ValueError,exit:3] cause=rank 1 (node 0 (solo-host), "
          "local "
          "rank 1) exited with code 3 last=false",
          "stop-round round=0 cause=rank 1 (node 0 (solo-host), local rank 1) exited with code 3 last=false",
          "worker-exit round=0 rank=0 local_rank=0 exit_code=0 signal=15 stopped=true kinds=[signal:SIGTERM] "
          "error=",
          "round-end round=0 outcome=stopped stopped=1",
          "restart restart=1 max_restarts=1 round=1 backoff_ms=0",
          "round-begin round=1 restarts_used=1 nodes=1",
          "workers-start round=1 plays=0 ranks=[0,1]",
          "worker-exit round=1 rank=0 local_rank=0 exit_code=0 signal=0 stopped=false",
          "worker-exit round=1 rank=1 local_rank=1 exit_code=0 signal=0 stopped=false",
          "round-end round=1 outcome=done",
          "job-result exit_code=0 restarts_used=1",
          "job-end exit_code=0",
          "summary",
          "agent-exit exit_code=0",
          "coordinator-done exit_code=0",
      }));
}

}  // namespace
}  // namespace ddprun::host
