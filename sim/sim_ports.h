#pragma once
// The simulated implementations of the host ports (runner/host/ports.h). Each is a thin handle
// that forwards to the Cluster that owns the node; none calls an event back before it returns:
// results are scheduled on the cluster's event queue (the ports' contract).

#include <cstdint>

#include "runner/host/ports.h"

namespace ddprun::sim {

using core::ConnId;

class Cluster;

/// Virtual time: the time of the event being processed.
class SimClock final : public host::Clock {
 public:
  explicit SimClock(const Cluster* cluster) : cluster_(cluster) {}
  TimePoint Now() const override;

 private:
  const Cluster* cluster_;
};

/// One node's timer: a single entry in the global queue, invalidated lazily by a generation.
class SimTimer final : public host::Timer {
 public:
  SimTimer(Cluster* cluster, uint32_t node) : cluster_(cluster), node_(node) {}
  void ArmAt(TimePoint when) override;
  void Disarm() override;

 private:
  Cluster* cluster_;
  uint32_t node_;
};

/// One node's network stack: connections to other nodes' listeners over the simulated network.
class SimTransport final : public host::Transport {
 public:
  SimTransport(Cluster* cluster, uint32_t node) : cluster_(cluster), node_(node) {}
  void SetEvents(host::TransportEvents* events) override;
  Status Listen(const std::string& addr, uint16_t port) override;
  ConnId Connect(const std::string& addr, uint16_t port) override;
  void Send(ConnId conn, std::vector<uint8_t> bytes) override;
  void Close(ConnId conn) override;
  uint16_t ReserveStorePort() override;
  void SetStoreRelay(uint16_t port) override;

 private:
  Cluster* cluster_;
  uint32_t node_;
};

/// One node's simulated worker processes.
class SimLauncher final : public host::ProcessLauncher {
 public:
  SimLauncher(Cluster* cluster, uint32_t node) : cluster_(cluster), node_(node) {}
  void SetEvents(host::ProcessEvents* events) override;
  void Spawn(int round, const core::WorkerLaunch& launch) override;
  void SignalAll(int round, int signal) override;
  void SignalForStacks(int round, const std::vector<std::pair<int, int>>& targets) override;
  std::vector<std::string> ReadStacks(int round) override;
  /// Notes the lease for the node's guardian (Cluster::ScheduleGuardianLease).
  void RenewLease(TimePoint kill_at) override;
  std::string ProgressAddress() const override;
  std::string ProgressToken() const override;

 private:
  Cluster* cluster_;
  uint32_t node_;
};

/// One node's console: lines go to the simulation's event log, stamped with virtual time.
class SimConsole final : public host::Console {
 public:
  SimConsole(Cluster* cluster, uint32_t node) : cluster_(cluster), node_(node) {}
  void Log(core::LogLevel level, std::string_view source, std::string_view text) override;
  void Summary(std::string_view text) override;

 private:
  Cluster* cluster_;
  uint32_t node_;
};

/// One node's disk, for node 0's journal: it survives the node's crash and reboot.
class SimJournal final : public host::Journal {
 public:
  explicit SimJournal(const Cluster* cluster) : cluster_(cluster) {}
  std::optional<Duration> SinceRoundsMayRun() override;
  void Record(bool rounds_may_run) override;
  std::vector<core::QuarantinedHost> Quarantined() override;
  void RecordQuarantine(const std::vector<core::QuarantinedHost>& hosts) override;
  /// A quiet stretch's last beat renewed the record at `at_ns`, earlier than now (sim/quiet.cc).
  void RecordedAt(int64_t at_ns) { may_run_since_ns_ = at_ns; }

 private:
  const Cluster* cluster_;
  std::optional<int64_t> may_run_since_ns_;         // the last record said workers may run, then
  std::vector<core::QuarantinedHost> quarantined_;  // as recorded at quarantined_at_ns_
  int64_t quarantined_at_ns_ = 0;
};

}  // namespace ddprun::sim
