#include "runner/host/metrics_text.h"

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "base/assert.h"

namespace ddprun::host {

namespace {

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// [a-zA-Z_:][a-zA-Z0-9_:]* for metric names; label names do not take ':'.
bool ValidName(std::string_view name, bool metric) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (i == 0 ? IsNameStart(c) : IsNameChar(c)) || (metric && c == ':');
    if (!ok) return false;
  }
  return true;
}

// The format escapes a backslash and a line feed in help text, and a double quote too in
// label values.
std::string Escape(std::string_view text, bool label_value) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && label_value) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers up to 2^53 are exact in a double: written as integers.
  if (value == std::trunc(value) && std::fabs(value) < 9007199254740992.0) {
    return fmt::format("{}", static_cast<int64_t>(value));
  }
  return fmt::format("{}", value);
}

double SecondsOf(Duration d) { return std::chrono::duration<double>(d).count(); }

MetricFamily Gauge(std::string name, std::string help) {
  return MetricFamily{std::move(name), MetricType::kGauge, std::move(help), {}};
}

MetricFamily OneGauge(std::string name, std::string help, double value) {
  MetricFamily family = Gauge(std::move(name), std::move(help));
  family.samples.push_back({{}, value});
  return family;
}

// A state set: one sample per state, 1 for the current one.
template <size_t N>
MetricFamily PhaseFamily(std::string name, std::string help,
                         const std::array<std::string_view, N>& phases, std::string_view current) {
  MetricFamily family = Gauge(std::move(name), std::move(help));
  for (std::string_view phase : phases) {
    family.samples.push_back({{{"phase", std::string(phase)}}, phase == current ? 1.0 : 0.0});
  }
  return family;
}

void AddNodeFamilies(const NodeMetrics& metrics, std::vector<MetricFamily>& out) {
  const core::AgentMetrics& a = metrics.agent;
  MetricFamily info = Gauge("ddprun_node_info", "This node's agent: its job, node rank, host and ddprun version.");
  info.samples.push_back({{{"job_name", metrics.job},
                           {"node", std::to_string(a.node_rank)},
                           {"host", a.host},
                           {"version", a.version}},
                          1});
  out.push_back(std::move(info));
  out.push_back(PhaseFamily("ddprun_node_phase", "The agent's phase: 1 for the one it is in.",
                            core::kAgentPhaseNames, a.phase));
  out.push_back(OneGauge("ddprun_node_round", "The round this node last started; -1 before its first.",
                         a.round));
  out.push_back(OneGauge("ddprun_node_plays_node_rank",
                         "The node rank this agent plays in that round: its own, or for a spare the one it "
                         "replaced; -1 before its first.",
                         a.plays));
  out.push_back(OneGauge("ddprun_node_workers_running", "Workers of this node that run now.",
                         a.workers_running));
  MetricFamily step = Gauge("ddprun_node_rank_last_step", "A running rank's last step, from its progress beacons.");
  MetricFamily since = Gauge("ddprun_node_rank_seconds_since_beacon",
                             "Seconds since a running rank's last step or phase beacon.");
  MetricFamily step_time = Gauge("ddprun_node_rank_step_seconds",
                                 "A running rank's time per step over the straggler window.");
  MetricFamily work_time = Gauge("ddprun_node_rank_work_seconds",
                                 "A running rank's own work per step (without waiting for the others).");
  for (const core::RankMetrics& rank : a.ranks) {
    const std::vector<std::pair<std::string, std::string>> labels = {{"rank", std::to_string(rank.global_rank)}};
    if (rank.last_step >= 0) step.samples.push_back({labels, static_cast<double>(rank.last_step)});
    if (rank.since_beacon) since.samples.push_back({labels, SecondsOf(*rank.since_beacon)});
    if (rank.step_time) step_time.samples.push_back({labels, SecondsOf(*rank.step_time)});
    if (rank.work_time) work_time.samples.push_back({labels, SecondsOf(*rank.work_time)});
  }
  out.push_back(std::move(step));
  out.push_back(std::move(since));
  out.push_back(std::move(step_time));
  out.push_back(std::move(work_time));
}

void AddJobFamilies(const NodeMetrics& metrics, std::vector<MetricFamily>& out) {
  const core::CoordinatorMetrics& c = *metrics.coordinator;
  out.push_back(PhaseFamily("ddprun_job_phase", "The coordinator's phase: 1 for the one it is in.",
                            core::kCoordinatorPhaseNames, c.phase));
  out.push_back(OneGauge("ddprun_job_round", "The job's current round (0 for the first).", c.round));
  out.push_back(OneGauge("ddprun_job_restarts_used", "Restarts of the job so far.", c.restarts_used));
  out.push_back(OneGauge("ddprun_job_restarts_left", "Restarts left of restart.max_restarts.",
                         c.restarts_allowed - c.restarts_used));
  out.push_back(OneGauge("ddprun_job_nodes", "Nodes of the job.", c.nodes));
  out.push_back(OneGauge("ddprun_job_nodes_joined", "Agents (nodes and spares) joined to the coordinator now.",
                         c.nodes_joined));
  out.push_back(OneGauge("ddprun_job_round_nodes",
                         "Nodes in the current round: fewer than ddprun_job_nodes when it shrank "
                         "(cluster.min_nodes); 0 before the first round.",
                         c.round_nodes));
  out.push_back(OneGauge("ddprun_job_hosts_quarantined", "Hosts kept out of the job now (quarantine).",
                         c.hosts_quarantined));
  out.push_back(OneGauge("ddprun_job_nodes_away", "Agents that joined once and are not connected now.",
                         c.nodes_away));
  out.push_back(OneGauge("ddprun_job_spares", "Spares of the job (cluster.spares).", c.spares));
  out.push_back(OneGauge("ddprun_job_spares_waiting", "Joined agents that play no node rank, ready to replace one.",
                         c.spares_waiting));
  if (c.last_failure_round) {
    MetricFamily failure = Gauge("ddprun_job_last_failure_info",
                                 "The latest root cause: its round and its most specific kind.");
    failure.samples.push_back({{{"round", std::to_string(*c.last_failure_round)}, {"kind", c.last_failure_kind}}, 1});
    out.push_back(std::move(failure));
  }
  if (metrics.since_last_failure) {
    out.push_back(OneGauge("ddprun_job_seconds_since_last_failure",
                           "Seconds since node 0 learnt of the latest root cause.",
                           SecondsOf(*metrics.since_last_failure)));
  }
  out.push_back(OneGauge("ddprun_job_stragglers", "Ranks reported as stragglers now.", c.stragglers));
  out.push_back(OneGauge("ddprun_job_ranks_reported", "Ranks with a progress report in this round.",
                         static_cast<double>(c.ranks_reported)));
  MetricFamily step = Gauge("ddprun_job_rank_last_step", "A rank's last step, as its node last reported it.");
  MetricFamily step_time = Gauge("ddprun_job_rank_step_seconds",
                                 "A rank's time per step over the straggler window, as its node reported it.");
  MetricFamily work_time = Gauge("ddprun_job_rank_work_seconds",
                                 "A rank's own work per step, as its node reported it.");
  MetricFamily straggler = Gauge("ddprun_job_rank_straggler", "1 while a rank is reported as a straggler.");
  for (const core::ReportedRankMetrics& rank : c.ranks) {
    const std::vector<std::pair<std::string, std::string>> labels = {
        {"rank", std::to_string(rank.global_rank)}, {"node", std::to_string(rank.node_rank)}};
    if (rank.last_step >= 0) step.samples.push_back({labels, static_cast<double>(rank.last_step)});
    if (rank.step_time) step_time.samples.push_back({labels, SecondsOf(*rank.step_time)});
    if (rank.work_time) work_time.samples.push_back({labels, SecondsOf(*rank.work_time)});
    straggler.samples.push_back({labels, rank.straggling ? 1.0 : 0.0});
  }
  out.push_back(std::move(step));
  out.push_back(std::move(step_time));
  out.push_back(std::move(work_time));
  out.push_back(std::move(straggler));
}

}  // namespace

std::string RenderPrometheusText(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const MetricFamily& family : families) {
    DDPRUN_ASSERT(ValidName(family.name, /*metric=*/true));
    if (family.samples.empty()) continue;
    out += fmt::format("# HELP {} {}\n", family.name, Escape(family.help, /*label_value=*/false));
    out += fmt::format("# TYPE {} {}\n", family.name,
                       family.type == MetricType::kCounter ? "counter" : "gauge");
    for (const MetricSample& sample : family.samples) {
      out += family.name;
      if (!sample.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < sample.labels.size(); ++i) {
          const auto& [name, value] = sample.labels[i];
          DDPRUN_ASSERT(ValidName(name, /*metric=*/false));
          out += fmt::format("{}{}=\"{}\"", i == 0 ? "" : ",", name, Escape(value, /*label_value=*/true));
        }
        out += '}';
      }
      out += ' ';
      out += Value(sample.value);
      out += '\n';
    }
  }
  return out;
}

std::vector<MetricFamily> MetricFamilies(const NodeMetrics& metrics) {
  std::vector<MetricFamily> families;
  AddNodeFamilies(metrics, families);
  if (metrics.coordinator) AddJobFamilies(metrics, families);
  return families;
}

std::string RenderMetricsText(const NodeMetrics& metrics) {
  return RenderPrometheusText(MetricFamilies(metrics));
}

}  // namespace ddprun::host
