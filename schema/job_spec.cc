#include "schema/job_spec.h"

#include <algorithm>

namespace ddprun {

bool ConsoleFilter::Shows(int global_rank) const {
  switch (mode) {
    case Mode::kAll:
      return true;
    case Mode::kNone:
      return false;
    case Mode::kRanks:
      return std::binary_search(ranks.begin(), ranks.end(), global_rank);
  }
  return true;
}

Duration JobSpec::RestartBackoff(int restart_number) const {
  if (!restart.backoff_max) return restart.backoff;
  Duration wait = restart.backoff;
  // Doubling stops at the cap, so the loop is bounded by log2(cap / backoff) (< 64), whatever
  // the restart number.
  for (int i = 1; i < restart_number && wait < *restart.backoff_max; ++i) {
    wait = wait > *restart.backoff_max / 2 ? *restart.backoff_max : 2 * wait;
    if (wait == Duration::zero()) break;
  }
  return std::min(wait, *restart.backoff_max);
}

Duration JobSpec::ProgressReportPeriod() const { return std::max(timeouts.heartbeat, stragglers.window / 8); }

size_t JobSpec::ProgressWindowBuckets() const {
  const Duration period = ProgressReportPeriod();
  if (period <= Duration(0)) return 1;
  return static_cast<size_t>(std::max<int64_t>((stragglers.window + period - Duration(1)) / period, 1));
}

std::string JobSpec::Metrics::Listen() const {
  const bool v6 = addr.find(':') != std::string::npos;
  return (v6 ? "[" + addr + "]" : addr) + ":" + std::to_string(port);
}

uint16_t JobSpec::MetricsPortOf(int node_rank) const {
  return metrics.port_per_node ? static_cast<uint16_t>(metrics.port + node_rank) : metrics.port;
}

std::string JobSpec::MetricsAddressOf(int node_rank) const {
  if (metrics.addr != Metrics::kOwnNodeAddress) return metrics.addr;
  return cluster.HostOf(node_rank);
}

SourceLoc JobSpec::LocationOf(const std::string& key_path) const {
  auto it = locations.find(key_path);
  return it == locations.end() ? SourceLoc{} : it->second;
}

}  // namespace ddprun
