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

using Labels = std::vector<std::pair<std::string, std::string>>;

MetricFamily Family(MetricType type, std::string name, std::string help) {
  return MetricFamily{std::move(name), type, std::move(help), {}};
}

// Every series carries the job's name and the serving node, so that the series of several jobs
// and nodes in one Prometheus stay apart whatever the scrape configuration adds. `job_name`, not
// `job`: Prometheus sets `job` to the scrape job's name and would rename ours `exported_job`.
class Families {
 public:
  Families(const NodeMetrics& metrics, std::vector<MetricFamily>& out)
      : common_{{"job_name", metrics.job}, {"node", std::to_string(metrics.agent.node_rank)}}, out_(out) {}

  Labels With(Labels extra) const {
    Labels labels = common_;
    labels.insert(labels.end(), extra.begin(), extra.end());
    return labels;
  }
  void One(MetricType type, std::string name, std::string help, double value) {
    MetricFamily family = Family(type, std::move(name), std::move(help));
    family.samples.push_back({common_, value});
    out_.push_back(std::move(family));
  }
  void Gauge(std::string name, std::string help, double value) {
    One(MetricType::kGauge, std::move(name), std::move(help), value);
  }
  // A state set: one sample per state, 1 for the current one.
  template <size_t N>
  void Phase(std::string name, std::string help, const std::array<std::string_view, N>& phases,
             std::string_view current) {
    MetricFamily family = Family(MetricType::kGauge, std::move(name), std::move(help));
    for (std::string_view phase : phases) {
      family.samples.push_back({With({{"phase", std::string(phase)}}), phase == current ? 1.0 : 0.0});
    }
    out_.push_back(std::move(family));
  }
  void Add(MetricFamily family) { out_.push_back(std::move(family)); }

 private:
  Labels common_;
  std::vector<MetricFamily>& out_;
};

void AddNodeFamilies(const NodeMetrics& metrics, Families& out) {
  const core::AgentMetrics& a = metrics.agent;
  MetricFamily info = Family(MetricType::kGauge, "ddprun_node_info",
                             "This node's agent: its job, node rank, host and ddprun version.");
  info.samples.push_back({out.With({{"host", a.host}, {"version", a.version}}), 1});
  out.Add(std::move(info));
  out.Phase("ddprun_node_phase", "The agent's phase: 1 for the one it is in.", core::kAgentPhaseNames,
            a.phase);
  out.Gauge("ddprun_node_round", "The round this node last started; -1 before its first.", a.round);
  out.Gauge("ddprun_node_plays_node_rank",
            "The node rank this agent plays in that round: its own, or for a spare the one it "
            "replaced; -1 before its first.",
            a.plays);
  out.Gauge("ddprun_node_workers_running", "Workers of this node that run now.", a.workers_running);
  if (a.exit_code) {
    out.Gauge("ddprun_node_exit_code", "The exit code this agent exits with, once decided.", *a.exit_code);
  }
  MetricFamily step = Family(MetricType::kGauge, "ddprun_node_rank_last_step",
                             "A running rank's last step, from its progress beacons.");
  MetricFamily beacon = Family(MetricType::kGauge, "ddprun_node_rank_last_beacon_timestamp_seconds",
                               "When a running rank sent its last step or phase beacon (Unix time).");
  MetricFamily step_time = Family(MetricType::kGauge, "ddprun_node_rank_step_seconds",
                                  "A running rank's time per step over the straggler window.");
  MetricFamily work_time = Family(MetricType::kGauge, "ddprun_node_rank_work_seconds",
                                  "A running rank's own work per step (without waiting for the others).");
  for (const core::RankMetrics& rank : a.ranks) {
    const Labels labels = out.With({{"rank", std::to_string(rank.global_rank)}});
    if (rank.last_step >= 0) step.samples.push_back({labels, static_cast<double>(rank.last_step)});
    if (rank.since_beacon && metrics.unix_time_seconds) {
      beacon.samples.push_back({labels, *metrics.unix_time_seconds - SecondsOf(*rank.since_beacon)});
    }
    if (rank.step_time) step_time.samples.push_back({labels, SecondsOf(*rank.step_time)});
    if (rank.work_time) work_time.samples.push_back({labels, SecondsOf(*rank.work_time)});
  }
  out.Add(std::move(step));
  out.Add(std::move(beacon));
  out.Add(std::move(step_time));
  out.Add(std::move(work_time));
}

void AddJobFamilies(const NodeMetrics& metrics, Families& out) {
  const core::CoordinatorMetrics& c = *metrics.coordinator;
  out.Phase("ddprun_job_phase",
            "The job's phase: 1 for the one it is in; succeeded, failed or interrupted once it ended.",
            core::kJobPhaseNames, c.phase);
  if (c.exit_code) out.Gauge("ddprun_job_exit_code", "The job's exit code, once it ended.", *c.exit_code);
  out.Gauge("ddprun_job_round", "The job's current round (0 for the first).", c.round);
  out.One(MetricType::kCounter, "ddprun_job_restarts_total", "Restarts of the job so far.", c.restarts_used);
  out.One(MetricType::kCounter, "ddprun_job_failures_total",
          "Rounds of the job that failed so far (each restart follows one).", c.rounds_failed);
  out.Gauge("ddprun_job_restarts_left", "Restarts left of restart.max_restarts.",
            c.restarts_allowed - c.restarts_used);
  out.Gauge("ddprun_job_nodes", "Nodes of the job.", c.nodes);
  out.Gauge("ddprun_job_nodes_joined", "Agents (nodes and spares) joined to the coordinator now.",
            c.nodes_joined);
  out.Gauge("ddprun_job_round_nodes",
            "Nodes in the current round: fewer than ddprun_job_nodes when it shrank "
            "(cluster.min_nodes); 0 before the first round.",
            c.round_nodes);
  out.Gauge("ddprun_job_hosts_quarantined", "Hosts kept out of the job now (quarantine).",
            c.hosts_quarantined);
  out.Gauge("ddprun_job_nodes_away", "Agents that joined once and are not connected now.", c.nodes_away);
  out.Gauge("ddprun_job_spares", "Spares of the job (cluster.spares).", c.spares);
  out.Gauge("ddprun_job_spares_waiting", "Joined agents that play no node rank, ready to replace one.",
            c.spares_waiting);
  if (c.last_failure_round) {
    MetricFamily failure = Family(MetricType::kGauge, "ddprun_job_last_failure_info",
                                  "The latest root cause: its round and its most specific kind.");
    failure.samples.push_back(
        {out.With({{"round", std::to_string(*c.last_failure_round)}, {"kind", c.last_failure_kind}}), 1});
    out.Add(std::move(failure));
  }
  if (metrics.since_last_failure && metrics.unix_time_seconds) {
    out.Gauge("ddprun_job_last_failure_timestamp_seconds",
              "When node 0 learnt of the latest root cause (Unix time).",
              *metrics.unix_time_seconds - SecondsOf(*metrics.since_last_failure));
  }
  out.Gauge("ddprun_job_stragglers", "Ranks reported as stragglers now.", c.stragglers);
  out.Gauge("ddprun_job_ranks_reported", "Ranks with a progress report in this round.",
            static_cast<double>(c.ranks_reported));
  MetricFamily step = Family(MetricType::kGauge, "ddprun_job_rank_last_step",
                             "A rank's last step, as its node last reported it.");
  MetricFamily step_time =
      Family(MetricType::kGauge, "ddprun_job_rank_step_seconds",
             "A rank's time per step over the straggler window, as its node reported it.");
  MetricFamily work_time = Family(MetricType::kGauge, "ddprun_job_rank_work_seconds",
                                  "A rank's own work per step, as its node reported it.");
  MetricFamily straggler =
      Family(MetricType::kGauge, "ddprun_job_rank_straggler", "1 while a rank is reported as a straggler.");
  for (const core::ReportedRankMetrics& rank : c.ranks) {
    // `node` is the serving node (0) on every series; the rank's own node is `rank_node`.
    const Labels labels =
        out.With({{"rank", std::to_string(rank.global_rank)}, {"rank_node", std::to_string(rank.node_rank)}});
    if (rank.last_step >= 0) step.samples.push_back({labels, static_cast<double>(rank.last_step)});
    if (rank.step_time) step_time.samples.push_back({labels, SecondsOf(*rank.step_time)});
    if (rank.work_time) work_time.samples.push_back({labels, SecondsOf(*rank.work_time)});
    straggler.samples.push_back({labels, rank.straggling ? 1.0 : 0.0});
  }
  out.Add(std::move(step));
  out.Add(std::move(step_time));
  out.Add(std::move(work_time));
  out.Add(std::move(straggler));
}

}  // namespace

std::string RenderPrometheusText(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const MetricFamily& family : families) {
    DDPRUN_ASSERT(ValidName(family.name, /*metric=*/true));
    if (family.samples.empty()) continue;
    out += fmt::format("# HELP {} {}\n", family.name, Escape(family.help, /*label_value=*/false));
    out +=
        fmt::format("# TYPE {} {}\n", family.name, family.type == MetricType::kCounter ? "counter" : "gauge");
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
  Families out(metrics, families);
  AddNodeFamilies(metrics, out);
  if (metrics.coordinator) AddJobFamilies(metrics, out);
  return families;
}

std::string RenderMetricsText(const NodeMetrics& metrics) {
  return RenderPrometheusText(MetricFamilies(metrics));
}

}  // namespace ddprun::host
