#pragma once
// Who this node is: its rank in the job (from the command line, the environment or this host's
// own entry in cluster.nodes), the incarnation of this agent, which addresses the listed nodes
// connect from, and whether cluster.master_addr is a name that only reaches this host's loopback.
// `run`, `check` and `preflight` read it; under SLURM, node_identity_slurm.h adds its part.

#include <cstdint>
#include <functional>
#include <istream>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/ip/address.hpp>

#include "base/result.h"
#include "schema/job_spec.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

/// This node's rank: `flag` > DDPRUN_NODE_RANK > SLURM_NODEID > this host's name or one of its
/// addresses in cluster.nodes; with how it was found, for the user.
struct DetectedRank {
  int rank = 0;
  std::string how;      // "--node-rank", "DDPRUN_NODE_RANK", "this host (gpu-02) is cluster.nodes[1]"
  std::string warning;  // a source that was overruled (SLURM_NODEID), for the user; "" if none
};
Result<DetectedRank> DetectNodeRank(const JobSpec& spec, std::optional<int> flag);
/// This node's rank from its host name or addresses alone (cluster.nodes and spares).
Result<DetectedRank> DetectNodeRankByHost(const JobSpec& spec);

/// Why cluster.master_addr cannot work for a job of several hosts when seen from this host: a
/// host name (not an address, not "localhost") that resolves here to a loopback address, as
/// Debian and Ubuntu map the host's own name to 127.0.1.1 in /etc/hosts. Node 0 would listen
/// where no other node can reach it; another node would connect to itself. Returns "" when
/// fine, else the problem and a "hint:" line. Node 0 avoids it when it has an address towards
/// the other hosts (MasterAtNote); otherwise `check`, `preflight` and the run say this.
std::string LoopbackMasterProblem(const JobSpec& spec);
/// The same finding in parts; nullopt when master_addr is fine seen from this host.
struct LoopbackMaster {
  std::string ip;        // what master_addr resolves to here: "127.0.1.1"
  std::string hosts_ip;  // what /etc/hosts maps it to ("" when not listed there)
  std::string cause;     // "/etc/hosts maps gpu-01 to 127.0.1.1 (Debian and Ubuntu do that ...)"
  std::string
      what;  // "cluster.master_addr \"gpu-01\" (cluster.nodes[0]) is a loopback address on this host: CAUSE"
};
std::optional<LoopbackMaster> LoopbackMasterHere(const JobSpec& spec);
/// The same for any host name of the job (`what` left empty): an agent's own entry under etcd,
/// where the coordinator role's holder listens on its own host.
std::optional<LoopbackMaster> LoopbackNameHere(const JobSpec& spec, const std::string& name);
/// What node 0 does about it when it has an address towards the other hosts
/// (OwnAddressTowardsPeers: `address`, `towards`): it listens there and gives it as
/// MASTER_ADDR. `ahead`: said by `check`, before the run.
std::string MasterAtNote(const LoopbackMaster& loopback, const std::string& address,
                         const std::string& towards, bool ahead);
/// LoopbackMasterProblem from the finding itself.
std::string LoopbackMasterProblem(const JobSpec& spec, const LoopbackMaster& found);

/// What agent `node_rank` does about a host name that is loopback on this host, decided once
/// before its loop runs: node 0 (with etcd: this agent while it holds the coordinator role)
/// listens at its address towards the other hosts (io::OwnAddressTowardsPeers) and says so;
/// node 0 with no such address cannot start; another node warns that it would connect to
/// itself. `ahead`: worded for `check`, before the run.
struct ListenPlan {
  std::string master_at;  // core::Agent::Config::master_at; "" for the address as written
  std::string refusal;    // node 0 cannot start: the problem and its hint; "" when it can
  std::string text;       // else what the agent says; "" nothing
  bool warning = false;
  std::string source = "agent";  // the line's source: "agent", or "coordinator" for node 0's note
};
ListenPlan PlanListen(const JobSpec& spec, int node_rank, bool ahead);

/// True for an address literal rather than a host name: it holds a colon (IPv6) or only digits
/// and dots (IPv4). A name's short form is compared only for names.
bool IsAddressLike(const std::string& text);

/// The address that `hosts` (read as /etc/hosts is: an address, then its names; `#` starts a
/// comment) gives `name`, compared without case; "" when no line names it. Reads at most
/// 10,000 lines.
std::string HostsFileEntry(std::istream& hosts, const std::string& name);

/// A new number for this run of the agent, which tells its reconnect from an impostor's join.
/// Unpredictable (getrandom): it also seeds the coordinator's challenge nonces.
uint64_t NewAgentInstance();

/// Addresses the listed nodes may connect from (each of cluster.nodes as it resolves here, and
/// this host's own addresses and loopback for node 0's own agent); empty, which lets anyone
/// connect, when nodes are not listed. An entry that does not resolve is left out, and `warn`
/// says so.
std::vector<boost::asio::ip::address> AllowedPeers(boost::asio::io_context& io, const JobSpec& spec,
                                                   const std::function<void(const std::string&)>& warn);

}  // namespace ddprun::io
