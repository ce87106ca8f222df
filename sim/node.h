#pragma once
// One simulated machine: its agent (a real host::NodeHost over the simulated ports) and the
// state the parts of the simulator share about it (up or down, hung, finished). The network
// keeps its connections and the workers their processes; this is what all of them read.
// Internal to sim/.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runner/host/node_host.h"
#include "sim/sim_ports.h"
#include "sim/sim_store.h"
#include "sim/timeline.h"

namespace ddprun::sim {

struct Node {
  Node(Cluster* cluster, uint32_t at)
      : timer(cluster, at),
        transport(cluster, at),
        launcher(cluster, at),
        console(cluster, at),
        journal(cluster),
        store(cluster, at) {}
  uint32_t index = 0;
  int rank = 0;        // the node rank its agent claims (a spare: nnodes + its index)
  bool extra = false;  // duplicate-node-rank impostor
  bool spare = false;  // an entry of cluster.spares: joins and waits to replace a node
  int plays = -1;      // the node rank its workers last played (-1: none yet)
  std::string host_name;
  std::string addr;
  std::string label;  // "node 3", "spare 0" or "node 1 (extra agent on node-0004)"
  const JobSpec* spec = nullptr;
  std::unique_ptr<JobSpec> own_spec;  // job-file-differs
  SimTimer timer;
  SimTransport transport;
  SimLauncher launcher;
  SimConsole console;
  SimJournal journal;    // the node's disk: kept across crashes
  SimStoreClient store;  // its etcd client (rendezvous.backend = "etcd")
  std::unique_ptr<host::NodeHost> host;
  host::TransportEvents* tevents = nullptr;
  host::ProcessEvents* pevents = nullptr;
  uint32_t incarnation = 0;  // +1 per crash: what an older incarnation left is stale
  bool up = false;
  bool pending_start = false;  // a start or reboot is scheduled
  bool started_once = false;
  int64_t started_ns = 0;   // when its agent last started
  int64_t down_entry = -1;  // its open outage in Cluster::down_, if it is down after a crash
  bool finished = false;
  std::optional<int> exit_code;
  int64_t hung_until_ns = 0;  // agent hang: its events wait until then
  bool hung_forever = false;
  int64_t last_hang_end_ns = -1;
  /// The lease its agent last gave its workers (core::RenewLease): its guardian SIGKILLs them
  /// then if the agent is hung. -1: none yet.
  int64_t lease_kill_at_ns = -1;
  uint64_t timer_gen = 0;
  std::optional<int64_t> armed_ns;
  std::optional<int64_t> queued_ns;
  bool focus = false;  // touched by a fault: its lines are shown at scale
  uint64_t condensed_stamp = 0;
  NodePhase phase = NodePhase::kOff;

  /// The agent processes events now (not crashed, not hung).
  bool Hung(int64_t now_ns) const { return hung_until_ns > now_ns; }
};

/// The node table: every machine of the run by index (the nodes, the spares, then extra agents
/// in the order they appeared). The parts look nodes up here; only the Cluster adds them.
class Nodes {
 public:
  Node& operator[](uint32_t index) { return *nodes_[index]; }
  const Node& operator[](uint32_t index) const { return *nodes_[index]; }
  uint32_t size() const { return static_cast<uint32_t>(nodes_.size()); }
  bool empty() const { return nodes_.empty(); }
  /// How the event log names it: "node 3", "spare 0", "node 1 (extra agent on node-0004)".
  const std::string& Label(uint32_t index) const { return nodes_[index]->label; }
  Node& Add(std::unique_ptr<Node> node) {
    nodes_.push_back(std::move(node));
    return *nodes_.back();
  }
  auto begin() const { return nodes_.begin(); }
  auto end() const { return nodes_.end(); }

 private:
  std::vector<std::unique_ptr<Node>> nodes_;
};

}  // namespace ddprun::sim
