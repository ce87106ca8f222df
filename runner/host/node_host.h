#pragma once
// One node's agent (and, on node 0, the coordinator) wired to the ports. The same code runs
// under the real driver and the simulator: it decodes frames, feeds the state machines and
// executes their effects, and never branches on their internals.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "runner/core/agent.h"
#include "runner/core/coordinator.h"
#include "runner/host/coordinator_role.h"
#include "runner/host/event_recorder.h"
#include "runner/host/metrics_text.h"
#include "runner/host/ports.h"

namespace ddprun::host {

struct Ports {
  Clock* clock = nullptr;
  Timer* timer = nullptr;
  Transport* transport = nullptr;
  ProcessLauncher* launcher = nullptr;
  Console* console = nullptr;
  Journal* journal = nullptr;    // node 0's; null: the host keeps no journal (unit tests)
  EventLog* events = nullptr;    // null: no event log (the simulator draws its own timeline)
  Store* store = nullptr;        // rendezvous.backend = "etcd"; null: the coordinator lives on node 0
  Observer* observer = nullptr;  // null: nobody but the event log takes the observations
};

class NodeHost final : public TransportEvents, public ProcessEvents, public StoreEvents {
 public:
  /// `on_exit` is called once, when this node is finished, with the process exit code.
  NodeHost(const JobSpec& spec, core::Agent::Config config, Ports ports, std::function<void(int)> on_exit);
  ~NodeHost() override;

  /// Node 0 listens on master_addr:master_port and starts the coordinator; then the agent
  /// starts connecting. Fails with why node 0 cannot listen (the caller exits 3). With etcd
  /// (Ports::store), no node starts a coordinator here: the agent looks the holder of the role
  /// up when it connects, and campaigns for it when there is none.
  Status Start();

  /// The driver calls this when the armed time has come.
  void OnTimer();
  /// SIGINT or SIGTERM reached the process.
  void OnSignal(int signal);

  bool finished() const { return finished_; }
  const core::Agent& agent() const { return agent_; }
  const core::Coordinator* coordinator() const { return coordinator_.get(); }
  /// This node's metrics now (on node 0 the job's too), for the driver's metrics endpoint.
  NodeMetrics Metrics() const;

  // ---- The simulator's quiet stretches (sim/quiet.cc, docs/performance.md) ----
  /// The agent's quiet state and, where the coordinator runs, the coordinator's; nullopt when
  /// either has more under way than heartbeats, or the host itself waits on something (a store
  /// call, probes, its exit).
  struct Quiet {
    core::QuietState agent;
    ConnId master_conn = 0;
    std::optional<core::Coordinator::Quiet> coordinator;
    std::optional<TimePoint> role_deadline;  // the role's next deadline (etcd: a keep-alive)
  };
  std::optional<Quiet> QuietNow() const;
  /// Feeds the stretch to the cores, an input of each (core::AgentQuietStretch,
  /// core::CoordinatorQuietStretch), and executes what they renew (the workers' lease, the
  /// record); re-arms the timer. True when the record was renewed that workers may run (as
  /// of the coordinator's last beat in the stretch, which the caller's journal is told).
  bool SkipQuiet(const core::AgentQuietStretch& agent,
                 const std::optional<core::CoordinatorQuietStretch>& coordinator);

  // TransportEvents
  void OnAccepted(ConnId conn, std::string peer_addr) override;
  void OnConnected(ConnId conn) override;
  void OnConnectFailed(ConnId conn, core::ConnectError error, std::string detail) override;
  void OnData(ConnId conn, std::span<const uint8_t> bytes) override;
  void OnClosed(ConnId conn, std::string reason) override;
  // ProcessEvents
  void OnWorkerExited(const core::WorkerExited& exited) override;
  void OnWorkerSpawnFailed(const core::WorkerSpawnFailed& failed) override;
  void OnBeacon(const core::Beacon& beacon) override;
  // StoreEvents
  void OnStoreResult(const StoreResult& result) override;
  /// Where the coordinator runs (static: node 0; etcd: the elected holder).
  const CoordinatorRole& role() const { return *role_; }

 private:
  void RunAgent(const core::AgentInput& input);
  /// This agent now holds the coordinator role (elected: it won the campaign).
  void Lead();
  /// The new coordinator starts from what its record's keeper read (record_->Inherited());
  /// false when there was nothing to start from.
  bool Inherit(TimePoint now);
  void StepDown(const std::string& why);
  /// Connects the agent to its coordinator.
  void ConnectTo(const CoordinatorAt& at);
  void RunCoordinator(const core::CoordinatorInput& input);
  void Rearm();
  void MaybeFinish();

  const JobSpec& spec_;
  Ports ports_;
  std::function<void(int)> on_exit_;
  core::Agent agent_;
  EventRecorder recorder_;
  std::unique_ptr<core::Coordinator> coordinator_;
  // Where the coordinator runs, and where its records go.
  std::unique_ptr<CoordinatorRole> role_;
  bool listening_ = false;
  bool awaiting_coordinator_ = false;  // the agent's connect waits for the role's lookup
  std::optional<ConnId> master_conn_;  // the agent's connection to the coordinator
  // Looked up per frame and never iterated, so hashing is safe for determinism and O(1) at
  // 16,384 connections on node 0.
  std::unordered_map<ConnId, wire::Decoder> decoders_;
  // Accepted connections whose agent has not joined yet, with the bytes each has buffered:
  // they get small frames (UnprovenFrameLimit) and share kUnprovenBudget, so that peers that
  // proved nothing cannot take node 0's memory (issue 36). Ordered: the oldest is dropped first.
  std::map<ConnId, size_t> unproven_;
  size_t unproven_bytes_ = 0;
  uint32_t unproven_frame_limit_ = 0;
  void Unproven(ConnId conn, size_t buffered);
  void Proven(ConnId conn);
  void ForgetUnproven(ConnId conn);
  // The agent's probe of the other nodes (core::ProbeEndpoints): connections in flight, by
  // connection, and the targets that could not be reached so far.
  std::map<ConnId, wire::ProbeTarget> probe_conns_;
  std::vector<wire::ProbeFailure> probe_failures_;
  void ProbeAnswered(ConnId conn, const std::string& error);
  std::optional<int> agent_exit_;
  bool coordinator_done_ = false;
  // When this host saw the coordinator's latest root cause appear, for the metrics: the
  // coordinator keeps the failure, not its time (a display fact, never a decision).
  std::optional<int> failure_round_seen_;
  std::optional<TimePoint> failure_seen_at_;
  bool finished_ = false;
  std::vector<core::AgentEffect> start_effects_;  // the agent's, until RunAgent runs them
  std::vector<core::CoordinatorEffect> coordinator_effects_;
};

}  // namespace ddprun::host
