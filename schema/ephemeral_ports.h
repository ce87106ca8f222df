#pragma once
// Whether the ports ddprun listens on may be taken by the kernel for outgoing connections.

#include <optional>
#include <string_view>
#include <vector>

#include "schema/diagnostics.h"
#include "schema/job_spec.h"

namespace ddprun {

/// A range of TCP ports, both ends included.
struct PortRange {
  int first = 32768;  // Linux's default net.ipv4.ip_local_port_range
  int last = 60999;
};

/// Warns when cluster.master_port or cluster.store_port lies in `ephemeral`, the range the
/// kernel picks outgoing connections' local ports from, and not in `reserved` (the caller reads
/// both from /proc/sys/net/ipv4/ip_local_port_range and ip_local_reserved_ports): any outgoing
/// connection on node 0 may hold the port when the agent wants to listen. The same for the
/// port of metrics.listen, which every node listens on.
void CheckEphemeralPorts(const JobSpec& spec, PortRange ephemeral, const std::vector<PortRange>& reserved,
                         Diagnostics& diagnostics);

/// Parses ip_local_port_range ("32768\t60999"); nullopt when malformed.
std::optional<PortRange> ParsePortRange(std::string_view text);
/// Parses ip_local_reserved_ports ("8080,50000-50010"); malformed items are skipped.
std::vector<PortRange> ParseReservedPorts(std::string_view text);

}  // namespace ddprun
