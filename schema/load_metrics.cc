// [metrics]: where each node serves its Prometheus text endpoint. Every node reads the same
// file, so the address must work on each of them: an address every node has (a wildcard, the
// loopback) or "*", each node's own entry of cluster.nodes.
#include <arpa/inet.h>

#include <cstdint>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "base/parse_int.h"
#include "schema/sections.h"

namespace ddprun {
namespace {

constexpr std::string_view kListenHint =
    "write the address and the port, e.g. \"0.0.0.0:9400\" (every interface), "
    "\"127.0.0.1:9400\" (this host only) or \"*:9400\" (each node's address in cluster.nodes)";

// Parsed "ADDR:PORT": the address without brackets, the port as written.
struct ListenParts {
  std::string addr;
  std::string port;
};

// Splits "ADDR:PORT" and "[V6]:PORT"; nullopt when there is no port part or an IPv6 address
// lacks its brackets (its own colons hide where the port begins).
std::optional<ListenParts> SplitListen(std::string_view text) {
  if (text.starts_with('[')) {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return std::nullopt;
    }
    return ListenParts{std::string(text.substr(1, close - 1)), std::string(text.substr(close + 2))};
  }
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos || text.find(':', colon + 1) != std::string_view::npos) {
    return std::nullopt;
  }
  return ListenParts{std::string(text.substr(0, colon)), std::string(text.substr(colon + 1))};
}

enum class AddressKind { kNotAnAddress, kWildcard, kLoopback, kOneHost };

AddressKind KindOf(const std::string& addr, bool bracketed) {
  in_addr v4{};
  in6_addr v6{};
  if (!bracketed && inet_pton(AF_INET, addr.c_str(), &v4) == 1) {
    const uint32_t host_order = ntohl(v4.s_addr);
    if (host_order == 0) return AddressKind::kWildcard;
    if ((host_order >> 24) == 127) return AddressKind::kLoopback;
    return AddressKind::kOneHost;
  }
  if (bracketed && inet_pton(AF_INET6, addr.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_UNSPECIFIED(&v6)) return AddressKind::kWildcard;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return AddressKind::kLoopback;
    return AddressKind::kOneHost;
  }
  return AddressKind::kNotAnAddress;
}

void LoadListen(const toml::node& node, TomlReader& reader, const JobSpec::Cluster& cluster,
                JobSpec::Metrics& metrics) {
  constexpr std::string_view kPath = "metrics.listen";
  const auto text = reader.String(node, std::string(kPath));
  if (!text) return;
  Diagnostics& diags = reader.diags();
  const SourceLoc loc = LocOf(node);
  const std::string shown = Show(node);
  const auto parts = SplitListen(*text);
  if (!parts) {
    diags.Error(loc, std::string(kPath), fmt::format("metrics.listen = {} is not ADDR:PORT", shown),
                text->find(':') != text->rfind(':') ? "an IPv6 address goes in brackets: \"[::]:9400\""
                                                    : std::string(kListenHint));
    return;
  }
  const IntRange range = *Key("cluster.master_port").range;
  const auto port = ParseNonNegative(parts->port, std::numeric_limits<int32_t>::max());
  if (!port || parts->port.find_first_not_of("0123456789") != std::string::npos) {
    diags.Error(loc, std::string(kPath),
                fmt::format("metrics.listen = {}: the port \"{}\" is not a number", shown, parts->port),
                std::string(kListenHint));
    return;
  }
  if (!range.Contains(*port)) {
    diags.Error(loc, std::string(kPath),
                fmt::format("metrics.listen = {}: port {} is out of range ({}..{})", shown, *port, range.min,
                            range.max));
    return;
  }
  const bool own_node = parts->addr == JobSpec::Metrics::kOwnNodeAddress;
  const AddressKind kind = own_node ? AddressKind::kWildcard : KindOf(parts->addr, text->starts_with('['));
  if (kind == AddressKind::kNotAnAddress) {
    diags.Error(
        loc, std::string(kPath),
        fmt::format("metrics.listen = {}: \"{}\" is neither an IP address nor \"*\"", shown, parts->addr),
        "every node reads this address: write \"0.0.0.0\" (every interface), \"127.0.0.1\" "
        "(this host only) or \"*\" (each node's own entry of cluster.nodes)");
    return;
  }
  if (own_node && cluster.nodes.empty()) {
    diags.Error(loc, std::string(kPath),
                fmt::format("metrics.listen = {}: \"*\" is each node's entry of cluster.nodes, and "
                            "cluster.nodes is not listed",
                            shown),
                fmt::format("list the nodes in cluster.nodes, or write \"0.0.0.0:{}\" to listen on "
                            "every interface",
                            *port));
    return;
  }
  if (*port == cluster.master_port || (cluster.store_port && *port == *cluster.store_port)) {
    const bool master = *port == cluster.master_port;
    diags.Error(loc, std::string(kPath),
                fmt::format("metrics.listen = {}: port {} is cluster.{}, where {} listens", shown, *port,
                            master ? "master_port" : "store_port",
                            master ? "node 0's coordinator" : "worker rank 0's store"),
                "metrics need a port of their own");
    return;
  }
  if (*port < 1024) {
    diags.Warning(loc, std::string(kPath),
                  fmt::format("metrics.listen = {}: port {} is a privileged port", shown, *port),
                  "binding it needs root; ports 1024..65535 do not");
  }
  const int last_agent = cluster.nnodes + cluster.spares - 1;
  if (metrics.port_per_node && *port + last_agent > range.max) {
    diags.Error(loc, std::string(kPath),
                fmt::format("metrics.listen = {} with metrics.ports = \"per-node\": agent {} would "
                            "listen on port {}, out of range",
                            shown, last_agent, *port + last_agent));
    return;
  }
  if (kind == AddressKind::kLoopback && last_agent > 0 && !metrics.port_per_node) {
    diags.Warning(loc, std::string(kPath),
                  fmt::format("metrics.listen = {}: every node is listed at http://{}/metrics; "
                              "agents that share a host cannot both listen there",
                              shown, *text),
                  fmt::format("set metrics.ports = \"per-node\" (node k listens on port {} + k), "
                              "or listen on \"*:{}\" or \"0.0.0.0:{}\" when each node has a host "
                              "of its own",
                              *port, *port, *port));
  }
  if (kind == AddressKind::kOneHost && cluster.nnodes > 1) {
    diags.Warning(loc, std::string(kPath),
                  fmt::format("metrics.listen = {}: {} is one host's address, but every node "
                              "listens on it",
                              shown, parts->addr),
                  fmt::format("the other nodes cannot, and serve no metrics; write \"*:{}\" for "
                              "each node's own address in cluster.nodes, or \"0.0.0.0:{}\"",
                              *port, *port));
  }
  metrics.addr = parts->addr;
  metrics.port = static_cast<uint16_t>(*port);
}

}  // namespace

void LoadMetrics(const toml::table& root, TomlReader& reader, const JobSpec::Cluster& cluster,
                 JobSpec::Metrics& metrics) {
  const toml::table* table = reader.Table(root, "metrics", "metrics");
  if (!table) return;
  reader.CheckKeys(*table, SectionNamed("metrics"), "metrics");
  if (const toml::node* node = reader.Node(table, "ports", "metrics.ports")) {
    if (const auto ports = reader.String(*node, "metrics.ports")) {
      if (*ports == "per-node") {
        metrics.port_per_node = true;
      } else if (*ports != "same") {
        reader.diags().Error(
            LocOf(*node), "metrics.ports",
            fmt::format("metrics.ports = {} is neither \"same\" nor \"per-node\"", Show(*node)),
            "\"per-node\": node k listens on the port + k");
      }
    }
  }
  reader.ReadDuration(table, "linger", "metrics", metrics.linger);
  if (const toml::node* node = reader.Node(table, "listen", "metrics.listen")) {
    LoadListen(*node, reader, cluster, metrics);
  }
}

}  // namespace ddprun
