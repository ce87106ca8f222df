#include "runner/io/node_identity.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "base/host_name.h"
#include "base/parse_int.h"
#include "runner/io/net_interfaces.h"
#include "runner/io/node_identity_slurm.h"

namespace ddprun::io {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

std::optional<int> ParseRank(const char* text) {
  if (!text) return std::nullopt;
  const auto value = ParseNonNegative(text, 1'000'000);
  if (!value) return std::nullopt;
  return static_cast<int>(*value);
}

std::vector<std::string> LocalAddresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf, sizeof buf);
    } else {
      continue;
    }
    out.emplace_back(buf);
  }
  ::freeifaddrs(list);
  return out;
}

bool IsLoopback(const asio::ip::address& address) {
  if (address.is_v6() && address.to_v6().is_v4_mapped()) return address.to_v6().to_v4().is_loopback();
  return address.is_loopback();
}

/// The first address `name` resolves to here, as Listen binds it; nullopt if it does not.
std::optional<asio::ip::address> FirstAddress(const std::string& name) {
  asio::io_context io;
  asio::ip::tcp::resolver resolver(io);
  error_code ec;
  auto results = resolver.resolve(name, "", ec);
  if (ec || results.empty()) return std::nullopt;
  return results.begin()->endpoint().address();
}

}  // namespace

bool IsAddressLike(const std::string& text) {
  return text.find(':') != std::string::npos || text.find_first_not_of("0123456789.") == std::string::npos;
}

std::string HostsFileEntry(std::istream& hosts, const std::string& name) {
  std::string line;
  auto lower = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text;
  };
  const std::string wanted = lower(name);
  for (int lines = 0; lines < 10000 && std::getline(hosts, line); ++lines) {
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    std::string address, alias;
    if (!(fields >> address)) continue;
    while (fields >> alias) {
      if (lower(alias) == wanted) return address;
    }
  }
  return "";
}

uint64_t NewAgentInstance() {
  uint64_t value = 0;
  if (::getrandom(&value, sizeof value, 0) == static_cast<ssize_t>(sizeof value)) return value;
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return (static_cast<uint64_t>(::getpid()) << 32) ^ static_cast<uint64_t>(now);
}

std::vector<asio::ip::address> AllowedPeers(asio::io_context& io, const JobSpec& spec,
                                            const std::function<void(const std::string&)>& warn) {
  std::vector<asio::ip::address> allowed;
  if (spec.cluster.nodes.empty()) return allowed;
  asio::ip::tcp::resolver resolver(io);
  for (const std::string& node : spec.cluster.nodes) {
    error_code ec;
    auto results = resolver.resolve(node, "", ec);
    if (ec) {
      warn(fmt::format("cannot resolve cluster.nodes entry \"{}\" ({}); connections from it will be refused",
                       node, ec.message()));
      continue;
    }
    for (const auto& entry : results) allowed.push_back(entry.endpoint().address());
  }
  // Node 0's own agent may reach master_addr over loopback, or from any address of this host:
  // on a stock host its own name in cluster.nodes resolves to 127.0.1.1 here, while its agent
  // connects to master_addr (an address of a NIC) from that NIC's address.
  allowed.push_back(asio::ip::address_v4::loopback());
  allowed.push_back(asio::ip::address_v6::loopback());
  for (const LocalInterface& local : LocalInterfaces()) {
    error_code ec;
    const auto address = asio::ip::make_address(local.address, ec);
    if (!ec) allowed.push_back(address);
  }
  return allowed;
}

Result<DetectedRank> DetectNodeRank(const JobSpec& spec, std::optional<int> flag) {
  const int nnodes = spec.cluster.nnodes;
  const int agents = spec.cluster.Agents();
  auto in_range = [&](int rank, const std::string& source) -> Result<DetectedRank> {
    if (rank >= 0 && rank < agents) return DetectedRank{rank, source, ""};
    if (spec.cluster.spares > 0) {
      return Fail(
          fmt::format("node rank {} from {} is out of range: the job has {} node{} (ranks "
                      "0..{}) and {} spare{} (ranks {}..{})",
                      rank, source, nnodes, nnodes == 1 ? "" : "s", nnodes - 1, spec.cluster.spares,
                      spec.cluster.spares == 1 ? "" : "s", nnodes, agents - 1));
    }
    return Fail(fmt::format("node rank {} from {} is out of range: the job has {} node{} (ranks 0..{})", rank,
                            source, nnodes, nnodes == 1 ? "" : "s", nnodes - 1));
  };
  if (flag) return in_range(*flag, "--node-rank");
  // An empty variable counts as unset, as shells and schedulers often leave them.
  if (const char* value = std::getenv("DDPRUN_NODE_RANK"); value && *value) {
    if (auto rank = ParseRank(value)) return in_range(*rank, "DDPRUN_NODE_RANK");
    return Fail(fmt::format("DDPRUN_NODE_RANK=\"{}\" is not a node rank (a non-negative integer)", value));
  }
  if (const char* value = std::getenv("SLURM_NODEID"); value && *value) {
    auto rank = RankFromSlurmNodeId(spec, value, DetectNodeRankByHost(spec));
    if (!rank) return rank;
    auto checked = in_range(rank->rank, rank->how);
    if (checked) checked->warning = rank->warning;
    return checked;
  }
  return DetectNodeRankByHost(spec);
}

Result<DetectedRank> DetectNodeRankByHost(const JobSpec& spec) {
  if (spec.cluster.nodes.empty()) {
    return Fail(
        "cannot tell this node's rank: cluster.nodes is not listed (only nnodes); pass "
        "--node-rank N or set DDPRUN_NODE_RANK on each node");
  }
  const std::string host = LocalHostName();
  const std::string short_host = host.substr(0, host.find('.'));
  const auto addresses = LocalAddresses();
  std::vector<int> matches;
  // The nodes, then the spares: a spare's rank is nnodes + its position in cluster.spares.
  std::vector<std::string> hosts = spec.cluster.nodes;
  hosts.insert(hosts.end(), spec.cluster.spare_hosts.begin(), spec.cluster.spare_hosts.end());
  for (size_t i = 0; i < hosts.size(); ++i) {
    const std::string& node = hosts[i];
    const std::string short_node = node.substr(0, node.find('.'));
    const bool name_match =
        !host.empty() && (node == host || (short_node == short_host && !IsAddressLike(node)));
    const bool addr_match = std::find(addresses.begin(), addresses.end(), node) != addresses.end();
    if (name_match || addr_match) matches.push_back(static_cast<int>(i));
  }
  if (matches.size() == 1) {
    return DetectedRank{matches[0],
                        fmt::format("this host ({}) is {}", host, spec.cluster.HostEntry(matches[0])), ""};
  }
  if (matches.empty()) {
    return Fail(
        fmt::format("cannot tell this node's rank: this host ({}, addresses {}) is not in "
                    "cluster.nodes [{}]; pass --node-rank N or set DDPRUN_NODE_RANK",
                    host, fmt::join(addresses, ", "), fmt::join(spec.cluster.nodes, ", ")));
  }
  return Fail(
      fmt::format("cannot tell this node's rank: this host matches several entries of "
                  "cluster.nodes (positions {}); pass --node-rank N",
                  fmt::join(matches, ", ")));
}

std::optional<LoopbackMaster> LoopbackNameHere(const JobSpec& spec, const std::string& name) {
  if (spec.cluster.Agents() <= 1 || name.empty() || IsAddressLike(name)) return std::nullopt;
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // "localhost" says on its face that the job stays on this machine (tests, a laptop).
  if (lower == "localhost" || lower.starts_with("localhost.") || lower.ends_with(".localhost") ||
      lower == "ip6-localhost" || lower == "ip6-loopback") {
    return std::nullopt;
  }
  const auto address = FirstAddress(name);
  if (!address || !IsLoopback(*address)) return std::nullopt;
  // Every listed node on this machine's loopback: a one-machine job by design.
  if (!spec.cluster.nodes.empty() &&
      std::all_of(spec.cluster.nodes.begin(), spec.cluster.nodes.end(), [](const std::string& node) {
        const auto a = FirstAddress(node);
        return a && IsLoopback(*a);
      })) {
    return std::nullopt;
  }
  LoopbackMaster found;
  found.ip = address->is_v6() && address->to_v6().is_v4_mapped() ? address->to_v6().to_v4().to_string()
                                                                 : address->to_string();
  std::ifstream hosts_file("/etc/hosts");
  found.hosts_ip = HostsFileEntry(hosts_file, name);
  if (!found.hosts_ip.empty()) {
    found.cause = fmt::format(
        "/etc/hosts maps {} to {}{}", name, found.hosts_ip,
        found.hosts_ip == "127.0.1.1" ? " (Debian and Ubuntu do that for the host's own name)" : "");
  } else {
    found.cause = fmt::format("{} resolves to {} on this host", name, found.ip);
  }
  return found;
}

std::optional<LoopbackMaster> LoopbackMasterHere(const JobSpec& spec) {
  // With etcd, master_addr is not where anyone listens: the role's holder listens on its own
  // host (OwnListenAddress).
  if (spec.cluster.nnodes <= 1 || spec.rendezvous.Etcd()) return std::nullopt;
  auto found = LoopbackNameHere(spec, spec.cluster.master_addr);
  if (!found) return std::nullopt;
  found->what = fmt::format(
      "cluster.master_addr \"{}\"{} is a loopback address on this host: {}", spec.cluster.master_addr,
      spec.locations.count("cluster.master_addr") > 0 ? "" : " (cluster.nodes[0])", found->cause);
  return found;
}

std::string MasterAtNote(const LoopbackMaster& loopback, const std::string& address,
                         const std::string& towards, bool ahead) {
  return fmt::format("{}; node 0 {} on {} instead, this host's address towards {}, and {} MASTER_ADDR={}",
                     loopback.what, ahead ? "will listen" : "listens", address, towards,
                     ahead ? "will give every worker" : "gives every worker", address);
}

std::string LoopbackMasterProblem(const JobSpec& spec) {
  const auto found = LoopbackMasterHere(spec);
  return found ? LoopbackMasterProblem(spec, *found) : "";
}

std::string LoopbackMasterProblem(const JobSpec& spec, const LoopbackMaster& found) {
  const std::string& name = spec.cluster.master_addr;
  std::vector<std::string> reachable;
  for (const std::string& local : LocalAddresses()) {
    error_code ec;
    const auto parsed = asio::ip::make_address(local, ec);
    if (!ec && !parsed.is_loopback() && !(parsed.is_v6() && parsed.to_v6().is_link_local()))
      reachable.push_back(local);
  }
  return fmt::format(
      "{}; node 0 would listen on {}, where no other node can reach it, and another node would connect to "
      "itself\n"
      "hint: set cluster.master_addr to an address of node 0 that the other nodes reach{}, or map {} to "
      "that address in /etc/hosts on every node{}",
      found.what, found.ip,
      reachable.empty() ? "" : fmt::format(" (this host has {})", fmt::join(reachable, ", ")), name,
      // A line added below the 127.0.1.1 one is not enough: resolvers still give 127.0.1.1 first.
      found.hosts_ip.empty() ? "" : fmt::format(" (on this host in place of {})", found.hosts_ip));
}

ListenPlan PlanListen(const JobSpec& spec, int node_rank, bool ahead) {
  ListenPlan plan;
  if (spec.rendezvous.Etcd()) {
    const std::string& own = spec.cluster.HostOf(node_rank);
    const auto loopback = LoopbackNameHere(spec, own);
    if (!loopback) return plan;
    const std::string entry =
        fmt::format("this host's entry \"{}\" ({})", own, spec.cluster.HostEntry(node_rank));
    if (const auto at = OwnAddressTowardsPeers(spec, node_rank)) {
      plan.master_at = at->address;
      plan.text = fmt::format(
          "{} is a loopback address on this host: {}; while this agent holds the coordinator "
          "role it listens on {} instead, this host's address towards {}, and gives every "
          "worker MASTER_ADDR={}",
          entry, loopback->cause, at->address, at->towards, at->address);
    } else {
      plan.warning = true;
      plan.text = fmt::format(
          "{} is a loopback address on this host: {}; while this agent holds the coordinator "
          "role no other host can reach it\nhint: list an address of this host that the "
          "others reach in place of that name, or map the name to that address in /etc/hosts "
          "(on this host in place of {})",
          entry, loopback->cause, loopback->ip);
    }
    return plan;
  }
  const auto loopback = LoopbackMasterHere(spec);
  if (!loopback) return plan;
  if (node_rank == 0) {
    if (const auto at = OwnAddressTowardsPeers(spec, node_rank)) {
      plan.master_at = at->address;
      plan.source = "coordinator";
      plan.text = MasterAtNote(*loopback, at->address, at->towards, ahead);
    } else {
      plan.refusal = LoopbackMasterProblem(spec, *loopback);
    }
    return plan;
  }
  plan.warning = true;  // another node: it would connect to itself
  plan.text = LoopbackMasterProblem(spec, *loopback);
  return plan;
}

}  // namespace ddprun::io
