#include "runner/io/net_interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/unique_fd.h"
#include "schema/worker_env.h"

namespace ddprun::io {

namespace {

/// `address` as text, IPv4-mapped IPv6 written as IPv4; "" for other families.
std::string AddressText(const sockaddr* address) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, buf, sizeof buf);
    return buf;
  }
  if (address->sa_family == AF_INET6) {
    const in6_addr& a6 = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      ::inet_ntop(AF_INET, &a6.s6_addr[12], buf, sizeof buf);
    } else {
      ::inet_ntop(AF_INET6, &a6, buf, sizeof buf);
    }
    return buf;
  }
  return "";
}

bool IsLoopbackText(const std::string& address) { return address.starts_with("127.") || address == "::1"; }

}  // namespace

std::vector<LocalInterface> LocalInterfaces() {
  std::vector<LocalInterface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || !a->ifa_name) continue;
    std::string text = AddressText(a->ifa_addr);
    if (!text.empty()) out.push_back({a->ifa_name, std::move(text)});
  }
  ::freeifaddrs(list);
  return out;
}

std::optional<SocketInterface> ChooseSocketInterface(const std::vector<LocalInterface>& interfaces,
                                                     const std::vector<std::string>& listed,
                                                     const std::string& listed_as,
                                                     const std::string& route_source,
                                                     const std::string& route_as) {
  auto holder = [&](const std::string& address) -> const LocalInterface* {
    const auto it = std::find_if(interfaces.begin(), interfaces.end(),
                                 [&](const LocalInterface& i) { return i.address == address; });
    return it == interfaces.end() ? nullptr : &*it;
  };
  for (const std::string& address : listed) {
    if (IsLoopbackText(address)) continue;
    if (const LocalInterface* i = holder(address)) {
      return SocketInterface{i->name, address, fmt::format("it holds {}, {}", address, listed_as)};
    }
  }
  if (!route_source.empty()) {
    if (const LocalInterface* i = holder(route_source)) {
      return SocketInterface{
          i->name, route_source,
          fmt::format("it holds {}, this host's address towards {}", route_source, route_as)};
    }
  }
  return std::nullopt;
}

std::string RouteSourceAddress(const std::string& address, uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) return "";
  std::string out;
  const UniqueFd fd(::socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  // Connecting a UDP socket sends nothing: it only fixes the peer, and with it the route and
  // the source address, which getsockname then reads.
  if (fd.get() >= 0 && ::connect(fd.get(), found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      out = AddressText(reinterpret_cast<const sockaddr*>(&local));
    }
  }
  ::freeaddrinfo(found);
  return out;
}

std::vector<std::string> ResolveAll(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::vector<std::string> out;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return out;
  for (addrinfo* a = found; a; a = a->ai_next) {
    std::string text = AddressText(a->ai_addr);
    if (!text.empty() && std::find(out.begin(), out.end(), text) == out.end()) out.push_back(std::move(text));
  }
  ::freeaddrinfo(found);
  return out;
}

std::optional<SocketInterface> WorkerSocketInterface(const JobSpec& spec, int node_rank) {
  if (spec.cluster.Agents() <= 1) return std::nullopt;
  std::vector<std::string> hosts = spec.cluster.nodes;
  hosts.insert(hosts.end(), spec.cluster.spare_hosts.begin(), spec.cluster.spare_hosts.end());
  std::vector<std::string> listed;
  std::string listed_as;
  if (node_rank >= 0 && static_cast<size_t>(node_rank) < hosts.size()) {
    listed = ResolveAll(hosts[static_cast<size_t>(node_rank)]);
    listed_as = spec.cluster.HostEntry(node_rank);
  }
  std::string route_source;
  std::string route_as = fmt::format("master_addr {}", spec.cluster.master_addr);
  if (const auto master = ResolveAll(spec.cluster.master_addr); !master.empty()) {
    route_source = RouteSourceAddress(master.front(), spec.cluster.master_port);
  }
  // Node 0 reaches master_addr over its own loopback: where it sends from towards the others
  // is where they reach it.
  if (node_rank == 0 && IsLoopbackText(route_source)) {
    if (auto own = OwnAddressTowardsPeers(spec, node_rank)) {
      route_source = own->address;
      route_as = own->towards;
    }
  }
  return ChooseSocketInterface(LocalInterfaces(), listed, listed_as, route_source, route_as);
}

std::optional<AddressTowardsPeers> OwnAddressTowardsPeers(const JobSpec& spec, int node_rank) {
  for (int agent = 0; agent < spec.cluster.Agents(); ++agent) {
    const std::string host = spec.cluster.HostOf(agent);
    if (agent == node_rank || host.empty()) continue;
    for (const std::string& address : ResolveAll(host)) {
      if (IsLoopbackText(address)) continue;
      std::string source = RouteSourceAddress(address, spec.cluster.master_port);
      if (source.empty() || IsLoopbackText(source)) continue;
      return AddressTowardsPeers{std::move(source),
                                 fmt::format("{} ({})", host, spec.cluster.HostEntry(agent))};
    }
  }
  return std::nullopt;
}

SocketInterfaceNote DescribeSocketInterface(const JobSpec& spec,
                                            const std::map<std::string, std::string>& inherited_env,
                                            const std::optional<SocketInterface>& chosen) {
  SocketInterfaceNote note;
  if (spec.cluster.Agents() <= 1) return note;
  // Which of the three names ddprun sets, and which the user set.
  std::vector<std::string> set, kept;
  for (std::string_view view : kSocketIfnameNames) {
    const std::string name(view);
    const bool user = inherited_env.count(name) > 0 || spec.job.env.count(name) > 0;
    (user ? kept : set).push_back(name);
  }
  if (set.empty()) return note;
  if (chosen) {
    note.text = fmt::format("workers' sockets use interface {} ({}): {} set{}", chosen->name, chosen->reason,
                            fmt::join(set, ", "),
                            kept.empty() ? "" : fmt::format("; {} kept as set", fmt::join(kept, ", ")));
  } else {
    note.warning = true;
    note.text = fmt::format(
        "cannot tell which interface the other nodes reach this node at (no "
        "interface holds this node's cluster.nodes address or routes to "
        "master_addr {}); gloo and NCCL pick their own: if ranks cannot connect, "
        "set {} to that interface in this agent's environment",
        spec.cluster.master_addr, fmt::join(set, ", "));
  }
  return note;
}

}  // namespace ddprun::io
