#include "schema/ephemeral_ports.h"

#include <fmt/format.h>

namespace ddprun {

void CheckEphemeralPorts(const JobSpec& spec, PortRange ephemeral, const std::vector<PortRange>& reserved,
                         Diagnostics& diagnostics) {
  auto check = [&](std::string_view key, uint16_t port) {
    if (port < ephemeral.first || port > ephemeral.last) return;
    for (const PortRange& r : reserved) {
      if (port >= r.first && port <= r.last) return;
    }
    const std::string path = fmt::format("cluster.{}", key);
    const bool default_fits = 29500 < ephemeral.first || 29500 > ephemeral.last;
    diagnostics.Warning(spec.LocationOf(path), path,
                        fmt::format("{} = {} is inside this machine's ephemeral port range ({}-{})", path,
                                    port, ephemeral.first, ephemeral.last),
                        fmt::format("an outgoing connection may be given this port, and node 0 then cannot "
                                    "listen on it; use a port outside the range{}, or reserve it with "
                                    "`sysctl net.ipv4.ip_local_reserved_ports={}`",
                                    default_fits ? " (e.g. 29500, as torchrun)" : "", port));
  };
  check("master_port", spec.cluster.master_port);
  if (spec.cluster.store_port) check("store_port", *spec.cluster.store_port);
  // The metrics port is every node's, and a port taken there only costs that node its metrics.
  const uint16_t metrics = spec.metrics.port;
  if (!spec.metrics.Served() || metrics < ephemeral.first || metrics > ephemeral.last) return;
  for (const PortRange& r : reserved) {
    if (metrics >= r.first && metrics <= r.last) return;
  }
  diagnostics.Warning(
      spec.LocationOf("metrics.listen"), "metrics.listen",
      fmt::format("metrics.listen = \"{}\": port {} is inside this machine's ephemeral port range ({}-{})",
                  spec.metrics.Listen(), metrics, ephemeral.first, ephemeral.last),
      fmt::format("an outgoing connection may be given this port, and a node then serves no "
                  "metrics; use a port outside the range, or reserve it with "
                  "`sysctl net.ipv4.ip_local_reserved_ports={}`",
                  metrics));
}

namespace {

// A decimal port 0..65535 in `text`, whitespace around it ignored.
std::optional<int> ParsePort(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\n')) {
    text.remove_suffix(1);
  }
  if (text.empty() || text.size() > 5) return std::nullopt;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value <= 65535 ? std::optional<int>(value) : std::nullopt;
}

}  // namespace

std::optional<PortRange> ParsePortRange(std::string_view text) {
  const size_t split = text.find_first_of(" \t");
  if (split == std::string_view::npos) return std::nullopt;
  auto first = ParsePort(text.substr(0, split));
  auto last = ParsePort(text.substr(split + 1));
  if (!first || !last || *first > *last) return std::nullopt;
  return PortRange{*first, *last};
}

std::vector<PortRange> ParseReservedPorts(std::string_view text) {
  std::vector<PortRange> out;
  // A bounded number of items: the kernel writes a short list, a huge one is not read.
  for (int items = 0; !text.empty() && items < 4096; ++items) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    const size_t dash = item.find('-');
    auto first = ParsePort(item.substr(0, dash));
    auto last = dash == std::string_view::npos ? first : ParsePort(item.substr(dash + 1));
    if (first && last && *first <= *last) out.push_back({*first, *last});
  }
  return out;
}

}  // namespace ddprun
