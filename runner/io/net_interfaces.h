#pragma once
// This host's network interfaces, and which one a node's workers must use for their own
// sockets (gloo, NCCL, TensorPipe): the one that holds the address the other nodes reach this
// node at. Left to themselves, gloo binds whatever the host's own name resolves to (127.0.1.1
// on a stock Debian or Ubuntu host) and NCCL takes the first interface that is not loopback
// (often a management NIC the other nodes cannot reach).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "schema/job_spec.h"

namespace ddprun::io {

/// One address of one interface, as getifaddrs lists them (an interface with two addresses
/// appears twice), in the kernel's order.
struct LocalInterface {
  std::string name;     // "ens3"
  std::string address;  // "10.77.0.1", "fe80::1" (IPv6 without the zone)
};

/// This host's interfaces with an IPv4 or IPv6 address; empty when getifaddrs fails.
std::vector<LocalInterface> LocalInterfaces();

/// The interface a node's workers bind their sockets to, and why (for the agent's log).
struct SocketInterface {
  std::string name;
  std::string address;  // the address it holds that decided it
  std::string reason;   // e.g. "it holds 10.77.0.2, cluster.nodes[1]"
};

/// Pure. `listed`: what this node's cluster.nodes entry resolves to on this host (empty when
/// nodes are not listed); `listed_as` names that entry for the reason ("cluster.nodes[1]").
/// `route_source`: the address this host sends from towards master_addr ("" if unknown),
/// described by `route_as` ("master_addr 10.77.0.1"). Picks the interface that holds the
/// first listed address that is not loopback; else the one that holds `route_source` (a
/// host name that is loopback here, as a stock /etc/hosts maps the host's own name, says
/// nothing about where the others reach it); else nullopt. Loopback is chosen only through
/// `route_source`, that is when the master itself is on this machine's loopback (one machine).
std::optional<SocketInterface> ChooseSocketInterface(const std::vector<LocalInterface>& interfaces,
                                                     const std::vector<std::string>& listed,
                                                     const std::string& listed_as,
                                                     const std::string& route_source,
                                                     const std::string& route_as);

/// The address this host would send from to `address`:`port` (a UDP socket connected there:
/// the kernel picks the route, no packet is sent); "" when there is no route.
std::string RouteSourceAddress(const std::string& address, uint16_t port);

/// The addresses `host` resolves to here (an address stays itself); empty when it does not.
std::vector<std::string> ResolveAll(const std::string& host);

/// This host's address towards the other agents of the job: the one it sends from to the first
/// other host (cluster.nodes, then cluster.spares) that resolves here to an address that is
/// not loopback and has a route. What node 0's peers reach it at when its own name is loopback
/// here (a stock /etc/hosts); nullopt when no other host resolves or routes.
struct AddressTowardsPeers {
  std::string address;  // "10.77.0.1"
  std::string towards;  // "gpu-02 (cluster.nodes[1])"
};
std::optional<AddressTowardsPeers> OwnAddressTowardsPeers(const JobSpec& spec, int node_rank);

/// The interface this node's workers bind their own sockets to (gloo, NCCL, TensorPipe): the
/// one that holds this node's cluster.nodes (or cluster.spares) address, else the one it sends
/// from towards master_addr; for node 0 on whose loopback master_addr lies (its own name on a
/// stock host), the one it sends from towards the other hosts (OwnAddressTowardsPeers). nullopt for a job of
/// one agent (its workers talk among themselves) and when neither is found.
std::optional<SocketInterface> WorkerSocketInterface(const JobSpec& spec, int node_rank);

/// The agent's line at start on the workers' sockets: the interface `chosen` and which of
/// kSocketIfnameNames ddprun sets and which it keeps as the user set them (`inherited_env` or
/// job.env); a warning when none was found and the workers pick their own. text is "" for a
/// job of one agent and when the user set every name.
struct SocketInterfaceNote {
  bool warning = false;
  std::string text;
};
SocketInterfaceNote DescribeSocketInterface(const JobSpec& spec,
                                            const std::map<std::string, std::string>& inherited_env,
                                            const std::optional<SocketInterface>& chosen);

}  // namespace ddprun::io
