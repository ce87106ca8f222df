// The store relay in the model (DESIGN.md section 5). PyTorch's env:// init has worker rank 0
// host a TCP store that every other rank connects to at MASTER_ADDR:MASTER_PORT. ddprun keeps
// master_port for itself: node 0's agent gives rank 0 a fresh port P each round and relays the
// other ranks' store connections from master_port to 127.0.0.1:P, ending them when the round
// ends. The real relay lives in the Asio transport; here the same decisions are made on the
// simulated network, so partitions, crashes, a blocked port and round changes reach it, and
// the invariants see which round's store each client reached.
#include <algorithm>

#include "sim/network.h"
#include "sim/node.h"

namespace ddprun::sim {

void Network::SetStoreRelay(uint32_t node, uint16_t port) {
  if (relay_port_[node] == port) return;
  relay_port_[node] = port;
  // A new round (or the end of the job): the relayed connections of the previous one close.
  relayed_[node].clear();
}

void Network::OpenStore(uint32_t node, uint16_t port, RoundKey round, uint64_t pid) {
  // A port still held by an older store (its rank 0 hung) cannot be bound: the new store fails.
  stores_.emplace(std::make_pair(node, port), Store{round, pid});
}

void Network::CloseStore(uint32_t node, uint16_t port, uint64_t pid) {
  auto it = stores_.find({node, port});
  if (it != stores_.end() && it->second.pid == pid) stores_.erase(it);
}

Network::StoreReach Network::ReachStore(uint32_t from, const std::string& addr, uint16_t port,
                                        uint64_t client_pid) {
  StoreReach reach;
  // The store client dials MASTER_ADDR: node 0's machine, or with etcd the host of the agent
  // that holds the coordinator role.
  const auto machine = MachineOf(addr);
  if (!machine) return reach;
  const uint32_t server = *machine;
  const Node& host = nodes_[server];
  const bool blocked =
      port == spec_.cluster.master_port && from != server && port_blocked_until_ns_ > loop_.now_ns;
  if (!host.up || blocked || Cut(from, server)) return reach;  // PyTorch retries the connect
  uint16_t store_port = port;
  uint32_t store_machine = server;
  if (port == spec_.cluster.master_port) {
    auto listener = listeners_.find({addr, port});
    if (listener == listeners_.end()) return reach;
    const uint32_t relay = listener->second;
    const Node& agent = nodes_[relay];
    // A hung agent's relay does not run; one that finished or refuses store clients closes them.
    if (agent.Hung(loop_.now_ns) || agent.finished || relay_port_[relay] == 0) return reach;
    store_port = relay_port_[relay];
    store_machine = relay;
    reach.relay = relay;
  }
  auto store = stores_.find({store_machine, store_port});
  if (store == stores_.end()) return reach;  // rank 0 does not listen yet: the relay retries
  reach.result = StoreReach::Result::kConnected;
  reach.store = store->second.round;
  reach.store_port = store_port;
  if (port == spec_.cluster.master_port) {
    relayed_[reach.relay].push_back(client_pid);
    ++relayed_total_;
  }
  return reach;
}

}  // namespace ddprun::sim
