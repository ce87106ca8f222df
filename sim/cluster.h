#pragma once
// The simulated cluster: nodes (each a real host::NodeHost over simulated ports), the network
// between them, the worker processes, the training model, faults and invariant checks.
// Internal to sim/; users call RunSimulation (simulation.h).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "runner/host/node_host.h"
#include "sim/event_queue.h"
#include "sim/invariants.h"
#include "sim/prng.h"
#include "sim/sim_ports.h"
#include "sim/simulation.h"
#include "sim/timeline.h"

namespace ddprun::sim {

/// The NCCL watchdog's default: a collective that makes no progress this long kills its rank.
inline constexpr Duration kCollectiveTimeout = Minutes(10);
/// Workers of a failed round must all be gone within stop_grace + 3 heartbeats + this: it
/// covers the SIGTERM delay, the agent's give-up after SIGKILL and peer-failure detection.
/// The same slack bounds a worker's life after its agent last heard from the coordinator.
inline constexpr Duration kStopSlack = Seconds(30);

/// `text` split at newlines (a trailing newline gives a last empty line).
std::vector<std::string> Split(std::string_view text);

class Cluster {
 public:
  Cluster(const JobSpec& spec, const SimOptions& options, std::ostream* out, Timeline* timeline);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  /// Runs until every node is finished (or down for good), the liveness deadline or max_time.
  SimResult Run();

  TimePoint now() const { return TimePoint(Duration(now_ns_)); }

  // ---- called by the ports (sim_ports.h) ----
  void ArmTimer(uint32_t node, TimePoint when);
  void DisarmTimer(uint32_t node);
  void SetTransportEvents(uint32_t node, host::TransportEvents* events);
  std::string Listen(uint32_t node, const std::string& addr, uint16_t port);
  ConnId Connect(uint32_t node, const std::string& addr, uint16_t port);
  void Send(uint32_t node, ConnId conn, std::vector<uint8_t> bytes);
  void Close(uint32_t node, ConnId conn);
  uint16_t ReserveStorePort(uint32_t node);
  void SetProcessEvents(uint32_t node, host::ProcessEvents* events);
  void Spawn(uint32_t node, int round, const core::WorkerLaunch& launch);
  void SignalAll(uint32_t node, int round, int signal);
  void ConsoleLog(uint32_t node, core::LogLevel level, std::string_view source, std::string_view text);
  void ConsoleSummary(uint32_t node, std::string_view text);

 private:
  // ---- network ----
  enum class PacketKind : uint8_t { kData, kFin, kRst };
  struct Packet {
    int64_t ready_ns = 0;
    PacketKind kind = PacketKind::kData;
    std::vector<uint8_t> bytes;
  };
  struct Side {
    uint32_t node = 0;
    uint32_t incarnation = 0;
    ConnId id = 0;
    bool open = false;      // the owning process still has the socket
  };
  /// Packets travelling toward one side, delivered in order (TCP).
  struct Direction {
    // A FIFO as a vector and a read position: empty costs no allocation (a std::deque
    // allocates a kilobyte up front, and there are two per connection).
    std::vector<Packet> queue;
    size_t head = 0;
    bool Empty() const { return head == queue.size(); }
    Packet& Front() { return queue[head]; }
    void PopFront() {
      if (++head == queue.size()) {
        queue.clear();
        head = 0;
      }
    }
    int64_t last_ready_ns = 0;
    bool pump_scheduled = false;
    bool blocked = false;   // held by a partition until it heals
  };
  struct Connection {
    Side side[2];           // 0: the connecting side, 1: the listening side
    Direction toward[2];    // toward[i]: packets for side[i]
    bool connect_ok = false;
    core::ConnectError error = core::ConnectError::kOther;
    std::string error_detail;
  };

  // ---- workers and the training model ----
  struct Worker {
    uint32_t node = 0;
    uint32_t incarnation = 0;
    uint64_t gang = 0;
    int round = 0;
    int local_rank = 0;
    int global_rank = 0;
    uint64_t pid = 0;
    bool running = true;
    bool ready = false;
    bool hung = false;
    bool term_pending = false;   // SIGTERM arrived while hung
    bool signalled = false;
    int64_t exit_at_ns = INT64_MAX;
    uint64_t exit_gen = 0;
    int exit_code = 0;
    int signal = 0;
    std::string stderr_tail;
  };
  /// The workers of one round, job-wide (DDP trains in lockstep: all or nothing).
  struct Gang {
    uint64_t id = 0;
    uint64_t coordinator = 0;    // coordinator incarnation that started the round
    int round = 0;
    int world = 0;
    int running = 0;
    int ready = 0;
    int hung = 0;
    bool broken = false;
    bool completed = false;
    bool training = false;
    int64_t training_since_ns = 0;
    int64_t broken_at_ns = 0;
    uint64_t done_gen = 0;       // invalidates a scheduled kTrainingDone
    uint64_t stall_gen = 0;      // invalidates a scheduled kCollectiveTimeout
    bool stall_timer = false;
    bool peers_notified = false; // peer-failure events were scheduled
    std::vector<uint8_t> rank_state;  // 0 unseen, 1 spawned, 2 exited 0, 3 exited otherwise
    int exited_zero = 0;
    std::vector<uint32_t> workers;
  };

  // ---- nodes ----
  struct Node {
    Node(Cluster* cluster, uint32_t at)
        : timer(cluster, at), transport(cluster, at), launcher(cluster, at), console(cluster, at) {}
    uint32_t index = 0;
    int rank = 0;                // the node rank its agent claims
    bool extra = false;          // duplicate-node-rank impostor
    std::string host_name;
    std::string addr;
    std::string label;           // "node 3" or "node 1 (extra agent on node-0004)"
    const JobSpec* spec = nullptr;
    std::unique_ptr<JobSpec> own_spec;  // job-file-differs
    SimTimer timer;
    SimTransport transport;
    SimLauncher launcher;
    SimConsole console;
    std::unique_ptr<host::NodeHost> host;
    host::TransportEvents* tevents = nullptr;
    host::ProcessEvents* pevents = nullptr;
    uint32_t incarnation = 0;
    bool up = false;
    bool pending_start = false;  // a start or reboot is scheduled
    bool started_once = false;
    bool finished = false;
    std::optional<int> exit_code;
    int64_t hung_until_ns = 0;   // agent hang: events wait until then
    bool hung_forever = false;
    int64_t last_hang_end_ns = -1;
    uint64_t timer_gen = 0;
    std::optional<int64_t> armed_ns;
    std::optional<int64_t> queued_ns;
    std::vector<uint64_t> conns;
    std::vector<uint32_t> workers;  // running workers
    uint64_t ready_gang = 0;     // gang whose startup event is scheduled for this node
    bool focus = false;
    uint64_t condensed_stamp = 0;
    NodePhase phase = NodePhase::kOff;
  };

  /// While a node's bytes (or its connect) are handed to the coordinator, the lines the
  /// coordinator logs are about that node: the subject comes from the data being delivered,
  /// never from the words of the line.
  class Subject {
   public:
    Subject(Cluster* cluster, std::optional<uint32_t> node) : cluster_(cluster), saved_(cluster->subject_) {
      cluster_->subject_ = node;
    }
    ~Subject() { cluster_->subject_ = saved_; }
    Subject(const Subject&) = delete;
    Subject& operator=(const Subject&) = delete;

   private:
    Cluster* cluster_;
    std::optional<uint32_t> saved_;
  };

  // setup
  void BuildNodes();
  uint32_t AddNode(int rank, const JobSpec* spec, bool extra);
  void ScheduleFaults();
  void ScheduleFault(const FaultSpec& fault);
  // One function per fault kind (faults.cc); slow-joiner and job-file-differs act at setup.
  void InjectNodeCrash(const FaultSpec& fault);
  void InjectAgentHang(const FaultSpec& fault);
  void InjectWorkerExit(const FaultSpec& fault);
  void InjectWorkerHang(const FaultSpec& fault);
  void InjectPartition(const FaultSpec& fault);
  void InjectMasterPortBlocked(const FaultSpec& fault);
  void InjectDuplicateNodeRank(const FaultSpec& fault);
  void ScheduleRandomNodeCrash(TimePoint from);
  void ScheduleRandomWorkerExit(TimePoint from);
  void StartNode(uint32_t node);
  void CrashNode(uint32_t node, std::optional<Duration> reboot_after, const std::string& why);
  void OnNodeExit(uint32_t node, int code);
  void ReleaseNode(uint32_t node);

  // event loop
  void Dispatch(const Event& event);
  bool DeferIfHung(uint32_t node, const Event& event);

  // network
  int64_t Latency();
  bool Cut(uint32_t a, uint32_t b) const;
  void Enqueue(uint64_t conn, int toward, PacketKind kind, std::vector<uint8_t> bytes);
  void SchedulePump(uint64_t conn, int toward, int64_t at_ns);
  void Pump(uint64_t conn, int toward);
  void ConnectDone(uint64_t conn);
  void Accept(uint64_t conn);
  void HealPaths();
  std::pair<uint64_t, int> Lookup(ConnId id) const;
  void CloseSide(uint64_t conn, int side, bool send_fin);

  // workers
  void Exit(uint32_t worker, int64_t at_ns, int exit_code, int signal, std::string stderr_tail);
  void WorkerExited(uint32_t worker);
  void NotifyExit(uint32_t worker);
  void WorkersReady(uint32_t node, uint64_t gang);
  void BreakGang(Gang& gang, bool by_process_exit, const std::string& why);
  void UpdateTraining();
  void TrainingDone(uint64_t gang, uint64_t done_gen);
  void HangWorker(uint32_t node, int local_rank, std::optional<Duration> duration);
  void PeerFailure(uint32_t node, uint64_t gang);
  void CollectiveTimeout(uint64_t gang, uint64_t stall_gen);
  int64_t Progress() const;
  Gang* CurrentGang();
  void FailWorker(uint32_t node, int local_rank, int exit_code, const std::string& stderr_tail,
                  const std::string& what);

  // output and checks
  void Print(uint32_t node, std::string_view who, std::string_view text);
  void PrintSim(std::optional<uint32_t> node, std::string_view text);
  /// Prints the violation the invariants found (once) to the event log.
  void ReportViolation();
  void SetPhase(uint32_t node);
  void AddMark(uint32_t node, MarkKind kind, std::string text, int64_t end_ns = -1);
  void ObserveCoordinator();
  SimResult Finish(RunEnd& end);
  std::string NodeLabel(uint32_t node) const { return nodes_[node]->label; }

  const JobSpec& spec_;
  SimOptions options_;
  std::ostream* out_;
  Timeline* timeline_;
  EventQueue queue_;
  Prng net_rng_;
  Prng worker_rng_;
  Prng fault_rng_;
  Prng instance_rng_;
  SimClock clock_;
  int64_t now_ns_ = 0;
  int64_t limit_ns_ = 0;
  bool liveness_limit_ = false;  // limit_ns_ is the liveness deadline, not max_time
  int64_t random_faults_until_ns_ = 0;
  bool condense_ = false;
  std::optional<uint32_t> subject_;    // see Subject
  std::vector<std::unique_ptr<Node>> nodes_;
  int job_nodes_ = 0;
  std::map<std::pair<std::string, uint16_t>, uint32_t> listeners_;
  std::vector<Connection> conns_;
  std::vector<uint64_t> conn_of_id_;   // ConnId -> (connection << 1) | side
  ConnId next_conn_id_ = 1;
  std::map<std::pair<uint32_t, uint32_t>, int> cuts_;  // partitioned node pairs (a < b)
  int active_partitions_ = 0;
  int64_t port_blocked_until_ns_ = 0;
  bool port_blocked_forever_ = false;
  uint16_t next_store_port_ = 40000;
  uint64_t next_pid_ = 1000;
  std::vector<Worker> workers_;
  std::vector<uint32_t> free_workers_;
  std::map<uint64_t, Gang> gangs_;     // by id; finished gangs are kept small (workers cleared)
  uint64_t current_gang_ = 0;
  uint64_t next_gang_ = 1;
  uint64_t coordinator_incarnation_ = 0;
  int64_t progress_ns_ = 0;            // training progress banked (excludes the current span)
  int64_t checkpoint_every_ns_ = 0;
  int64_t train_time_ns_ = 0;
  bool job_completed_ = false;
  Invariants invariants_;
  bool violation_printed_ = false;
  int coordinator_world_ = 0;          // world size of the job node 0's coordinator runs
  int last_coordinator_restarts_ = 0;
  uint64_t observed_incarnation_ = 0;
  int64_t unfinished_ = 0;             // nodes that may still act (not exited, not down for good)
  bool rendezvous_fault_ = false;      // a fault that may justify exit 3
  uint64_t condensed_lines_ = 0;
  uint64_t condensed_nodes_ = 0;
  uint64_t condense_epoch_ = 1;
  std::map<std::string, uint32_t> summaries_seen_;
  SimStats stats_;
};

}  // namespace ddprun::sim
