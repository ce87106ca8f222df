#pragma once
// The ports: every nondeterministic edge of an agent. Each has exactly two implementations,
// real ones in runner/io/ and simulated ones in sim/ (STYLE.md rule 3); the EventLog, an
// output only, has a real one and none in the simulator, which draws its own timeline.
//
// Contract for every port: a call never invokes an event callback before it returns; results
// arrive later, from the driver's event loop. That keeps the host free of reentrancy.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/result.h"
#include "runner/core/events.h"
#include "runner/core/time.h"

namespace ddprun::host {

using core::ConnId;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

/// One timer per host; arming it again replaces the previous time.
class Timer {
 public:
  virtual ~Timer() = default;
  virtual void ArmAt(TimePoint when) = 0;
  virtual void Disarm() = 0;
};

class TransportEvents {
 public:
  virtual ~TransportEvents() = default;
  virtual void OnAccepted(ConnId conn, std::string peer_addr) = 0;
  virtual void OnConnected(ConnId conn) = 0;
  virtual void OnConnectFailed(ConnId conn, core::ConnectError error, std::string detail) = 0;
  virtual void OnData(ConnId conn, std::span<const uint8_t> bytes) = 0;
  virtual void OnClosed(ConnId conn, std::string reason) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual void SetEvents(TransportEvents* events) = 0;
  /// Listens on addr:port (that address only); a failure says why, for the user.
  virtual Status Listen(const std::string& addr, uint16_t port) = 0;
  /// Starts a connect; OnConnected or OnConnectFailed follows.
  virtual ConnId Connect(const std::string& addr, uint16_t port) = 0;
  virtual void Send(ConnId conn, std::vector<uint8_t> bytes) = 0;
  /// Closes without an OnClosed for this side.
  virtual void Close(ConnId conn) = 0;
  /// A port that is free now on this host, for a round's PyTorch store; 0 if none.
  virtual uint16_t ReserveStorePort() = 0;
  /// From now on, relay connections on the listening port that are not ddprun's (PyTorch store
  /// clients) byte for byte to 127.0.0.1:port, and end the relayed connections of the previous
  /// round; 0 refuses them. The simulator models the relay's decisions (sim/store_relay.cc).
  virtual void SetStoreRelay(uint16_t /*port*/) {}
  /// An accepted connection proved itself (its agent joined): from now on it is not counted
  /// against the bounds on unproven connections, and reads use full-size buffers. The
  /// simulator's peers are all the job's own, so it has nothing to bound.
  virtual void Trust(ConnId /*conn*/) {}
};

class ProcessEvents {
 public:
  virtual ~ProcessEvents() = default;
  /// Reported once per spawned worker, after its output has been drained.
  virtual void OnWorkerExited(const core::WorkerExited& exited) = 0;
  virtual void OnWorkerSpawnFailed(const core::WorkerSpawnFailed& failed) = 0;
  /// A progress beacon from a worker of this host, with the right token.
  virtual void OnBeacon(const core::Beacon& beacon) = 0;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  virtual void SetEvents(ProcessEvents* events) = 0;
  virtual void Spawn(int round, const core::WorkerLaunch& launch) = 0;
  /// Sends `signal` to the process group of each still-running worker of `round`.
  virtual void SignalAll(int round, int signal) = 0;
  /// Asks workers of `round` for their stacks: for each (local rank, signal), notes where the
  /// rank's stacks file ends, then sends `signal` to the worker's own pid only.
  virtual void SignalForStacks(int round, const std::vector<std::pair<int, int>>& targets) = 0;
  /// What each rank's stacks file of `round` got since SignalForStacks, by local rank ("" for
  /// none); bounded per rank. Returns at once (a read of small local files).
  virtual std::vector<std::string> ReadStacks(int round) = 0;
  /// The workers' lease now ends at `kill_at` (core::RenewLease): from then on, unless renewed,
  /// every worker still running is SIGKILLed, even when this agent's own loop does not run (a
  /// stopped or paused agent). The real launcher tells its guardian; the simulator's kills the
  /// workers of a hung agent then.
  virtual void RenewLease(TimePoint kill_at) = 0;
  /// Round `round` stops because of `cause_rank` (core::RootCauseKnown): the console may show
  /// the other ranks' consequence errors as one line. Only a console needs it: the real
  /// launcher (runner/io/consequence_filter.h); the simulator's workers print nothing.
  /// `provisional`: the named rank's own error says it lost a peer, so another RootCauseKnown
  /// may follow with the real cause.
  virtual void RootCauseKnown(int /*round*/, int /*cause_rank*/, bool /*provisional*/) {}
  /// Where workers send progress beacons ("127.0.0.1:port"), and the token they must carry;
  /// "" when this launcher takes none.
  virtual std::string ProgressAddress() const { return ""; }
  virtual std::string ProgressToken() const { return ""; }
};

/// Node 0's record on its own disk that outlives the coordinator's process and host: whether
/// workers of this job may run, and when that was last recorded. A coordinator started again
/// on the same host (a reboot, a killed agent) reads it to learn that a previous one may have
/// left workers running (core::Coordinator::AfterUncleanEnd).
class Journal {
 public:
  virtual ~Journal() = default;
  /// How long ago the previous coordinator recorded that workers may run, if its last record
  /// says so; nullopt when it recorded the end of its job, or there is no record. A record
  /// that cannot be read counts as made just now.
  virtual std::optional<Duration> SinceRoundsMayRun() = 0;
  virtual void Record(bool rounds_may_run) = 0;
  /// The hosts an earlier launch of this job quarantined (quarantine.state), with the time
  /// left counted from now. Unreadable: none, and the problem is said.
  virtual std::vector<core::QuarantinedHost> Quarantined() = 0;
  virtual void RecordQuarantine(const std::vector<core::QuarantinedHost>& hosts) = 0;
};

/// What the job's shared store holds under one key.
struct StoreEntry {
  std::string value;
  int64_t create_revision = 0;  // the revision that created the key; a key made again gets a new one
  int64_t mod_revision = 0;     // the revision of its last write
  int64_t lease = 0;            // the lease it is attached to; 0: none
  bool operator==(const StoreEntry&) const = default;
};

struct StorePut {
  std::string key;
  std::string value;
  int64_t lease = 0;  // attach the key to this lease (it goes when the lease expires); 0: none
};

/// The answer to one Store call, tagged with the id the call returned.
struct StoreResult {
  uint64_t id = 0;
  /// Empty when the store answered; otherwise why it could not (unreachable, no leader, timed
  /// out, refused), in words for the user. The other fields then mean nothing.
  std::string error;
  bool succeeded = false;           // PutIf: the compare held and every put was made
  int64_t lease = 0;                // Grant: the new lease
  Duration ttl{};                   // Grant, KeepAlive: the lease's time left; 0: it is gone
  std::optional<StoreEntry> entry;  // Get, and a PutIf whose compare failed: the key's entry
  int64_t revision = 0;             // the store's revision when it answered
};

class StoreEvents {
 public:
  virtual ~StoreEvents() = default;
  virtual void OnStoreResult(const StoreResult& result) = 0;
};

/// The job's shared store (rendezvous.backend = "etcd"): a linearizable key-value store with
/// leases, as etcd's v3 API offers it: etcd over its JSON gateway (runner/io/etcd_store), and a
/// model of it in the simulator (sim/sim_store). Every call returns an id at once and is
/// answered exactly once, later, through StoreEvents, with a result or an error; a request the
/// store does not answer within the implementation's bound is answered with an error.
class Store {
 public:
  virtual ~Store() = default;
  virtual void SetEvents(StoreEvents* events) = 0;
  /// A new lease of about `ttl` (the store may lengthen it).
  virtual uint64_t Grant(Duration ttl) = 0;
  /// Renews `lease` for its full TTL; the result's ttl is 0 when the lease is gone.
  virtual uint64_t KeepAlive(int64_t lease) = 0;
  /// Ends `lease` and deletes its keys.
  virtual uint64_t Revoke(int64_t lease) = 0;
  virtual uint64_t Get(const std::string& key) = 0;
  /// One transaction: if `key`'s create_revision is `create_revision` (0: the key is absent),
  /// makes every put and succeeds; otherwise changes nothing and returns `key`'s entry.
  virtual uint64_t PutIf(const std::string& key, int64_t create_revision, std::vector<StorePut> puts) = 0;
};

/// One record of a node's event log (docs/report.md): its type ("worker-exit") and its fields
/// in the order they are written. NodeHost builds them (runner/host/event_recorder.h) from the
/// inputs and effects it executes; the log adds the time, the node and the host.
struct Event {
  using Value = std::variant<int64_t, bool, std::string, std::vector<int64_t>, std::vector<std::string>>;
  std::string_view type;  // a literal of the vocabulary
  std::vector<std::pair<std::string_view, Value>> fields;

  Event& Add(std::string_view key, Value value) {
    fields.emplace_back(key, std::move(value));
    return *this;
  }
};

/// Where a node's events go: a JSON-lines file in the run's log folder (runner/io/event_file),
/// or nowhere (the simulator, which draws its own timeline). Writing never fails the job: a log
/// that cannot be written says so once and takes no more records.
class EventLog {
 public:
  virtual ~EventLog() = default;
  /// Appends one record; `now` is the host's clock (monotonic).
  virtual void Record(TimePoint now, const Event& event) = 0;
};

/// What the coordinator observed (core::Observation), typed and as it happens: the simulator's
/// checks (sim/coordinators.h). An output only, like the EventLog; the real driver has none,
/// its event log records the same.
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void Observe(TimePoint now, const core::Observation& what) = 0;
};

/// Where an agent's words go: the terminal (real) or the simulator's event log.
class Console {
 public:
  virtual ~Console() = default;
  virtual void Log(core::LogLevel level, std::string_view source, std::string_view text) = 0;
  virtual void Summary(std::string_view text) = 0;
};

}  // namespace ddprun::host
