#pragma once
// The metrics endpoint's text: the state machines' snapshots (runner/core/metrics.h) as
// Prometheus text exposition format 0.0.4. Pure functions: the driver's HTTP server asks the
// NodeHost for the text and serves it; nothing here reads a clock or a socket.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runner/core/metrics.h"

namespace ddprun::host {

/// The Content-Type of RenderPrometheusText's output.
inline constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

enum class MetricType { kGauge, kCounter };

/// One sample of a family: its labels, in the order they are written, and its value.
struct MetricSample {
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

/// A metric family: `# HELP`, `# TYPE` and its samples. Names and label names must be valid
/// Prometheus names (a programmer error otherwise); label values and help text may hold
/// anything and are escaped.
struct MetricFamily {
  std::string name;
  MetricType type = MetricType::kGauge;
  std::string help;
  std::vector<MetricSample> samples;
};

/// The families in order, each as `# HELP name help`, `# TYPE name gauge|counter` and one
/// `name{label="value",...} value` line per sample; a family without samples is left out.
/// Integral values are written without a fraction ("3"), others in the shortest form that
/// reads back the same ("0.25"); NaN and infinities as the format spells them.
std::string RenderPrometheusText(const std::vector<MetricFamily>& families);

/// What one node serves: its agent, and on node 0 the job as the coordinator sees it.
struct NodeMetrics {
  std::string job;  // job.name
  core::AgentMetrics agent;
  std::optional<core::CoordinatorMetrics> coordinator;  // node 0 only
  /// Node 0, once a failure happened: since node 0 learnt of the latest root cause.
  std::optional<Duration> since_last_failure;
  /// The wall clock at the snapshot (Unix time), which the real driver reads; the
  /// `_timestamp_seconds` families are left out without it.
  std::optional<double> unix_time_seconds;
};

/// The families of `metrics`: `ddprun_node_*` for the agent on every node, `ddprun_job_*`
/// for the job on node 0 (docs/metrics.md lists them), each series with `job_name` and `node`.
std::vector<MetricFamily> MetricFamilies(const NodeMetrics& metrics);

/// RenderPrometheusText(MetricFamilies(metrics)).
std::string RenderMetricsText(const NodeMetrics& metrics);

}  // namespace ddprun::host
