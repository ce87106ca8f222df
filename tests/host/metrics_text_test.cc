// The metrics text (runner/host/metrics_text.h): Prometheus text format 0.0.4, word for word.
#include "runner/host/metrics_text.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace ddprun::host {
namespace {

using namespace std::chrono_literals;

TEST(PrometheusTextTest, EachFamilyHasHelpTypeAndOneLinePerSample) {
  const std::vector<MetricFamily> families = {
      {"a_total", MetricType::kCounter, "Things done.", {{{}, 3}}},
      {"b",
       MetricType::kGauge,
       "A gauge with labels.",
       {{{{"x", "1"}, {"y", "two"}}, 0.25}, {{{"x", "2"}, {"y", ""}}, -1}}},
  };
  EXPECT_EQ(RenderPrometheusText(families),
            "# HELP a_total Things done.\n"
            "# TYPE a_total counter\n"
            "a_total 3\n"
            "# HELP b A gauge with labels.\n"
            "# TYPE b gauge\n"
            "b{x=\"1\",y=\"two\"} 0.25\n"
            "b{x=\"2\",y=\"\"} -1\n");
}

TEST(PrometheusTextTest, AFamilyWithoutSamplesIsLeftOut) {
  EXPECT_EQ(RenderPrometheusText({{"empty", MetricType::kGauge, "Nothing yet.", {}},
                                  {"one", MetricType::kGauge, "One.", {{{}, 1}}}}),
            "# HELP one One.\n# TYPE one gauge\none 1\n");
}

TEST(PrometheusTextTest, LabelValuesEscapeBackslashQuoteAndNewlineAndHelpEscapesTwo) {
  const std::vector<MetricFamily> families = {
      {"m",
       MetricType::kGauge,
       "Help with \\ and\nnewline and \"quotes\".",
       {{{{"host", "a\\b\"c\"\nd"}, {"utf8", "n\xc5\x93ud"}}, 1}}},
  };
  EXPECT_EQ(RenderPrometheusText(families),
            "# HELP m Help with \\\\ and\\nnewline and \"quotes\".\n"
            "# TYPE m gauge\n"
            "m{host=\"a\\\\b\\\"c\\\"\\nd\",utf8=\"n\xc5\x93ud\"} 1\n");
}

TEST(PrometheusTextTest, ValuesAreIntegersWhenIntegralAndShortestOtherwise) {
  auto one = [](double value) {
    const std::string text = RenderPrometheusText({{"v", MetricType::kGauge, "V.", {{{}, value}}}});
    return text.substr(text.rfind("v ") + 2, text.size() - text.rfind("v ") - 3);
  };
  EXPECT_EQ(one(0), "0");
  EXPECT_EQ(one(-1), "-1");
  EXPECT_EQ(one(123456789012), "123456789012");
  EXPECT_EQ(one(0.1), "0.1");
  EXPECT_EQ(one(1.5e-6), "1.5e-06");
  EXPECT_EQ(one(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(one(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(one(-std::numeric_limits<double>::infinity()), "-Inf");
}

TEST(PrometheusTextDeathTest, AnInvalidNameIsAProgrammerError) {
  EXPECT_DEATH(RenderPrometheusText({{"bad name", MetricType::kGauge, "", {{{}, 1}}}}), "assertion failed");
  EXPECT_DEATH(RenderPrometheusText({{"ok", MetricType::kGauge, "", {{{{"bad-label", "x"}}, 1}}}}),
               "assertion failed");
}

core::AgentMetrics NodeOne() {
  core::AgentMetrics a;
  a.node_rank = 1;
  a.host = "gpu-02";
  a.version = "0.1.0";
  a.phase = "running";
  a.round = 2;
  a.plays = 1;
  a.workers_running = 2;
  // Rank 2 sends beacons with its own work; rank 3 has sent none yet.
  a.ranks = {{2, 41, 250ms, 1s, 800ms}, {3, -1, std::nullopt, std::nullopt, std::nullopt}};
  return a;
}

TEST(MetricsTextTest, AnAgentServesItsNodeAndRanks) {
  NodeMetrics metrics;
  metrics.job = "demo \"q\"";
  metrics.agent = NodeOne();
  metrics.unix_time_seconds = 1000.5;
  const std::string common = "job_name=\"demo \\\"q\\\"\",node=\"1\"";
  EXPECT_EQ(
      RenderMetricsText(metrics),
      "# HELP ddprun_node_info This node's agent: its job, node rank, host and ddprun version.\n"
      "# TYPE ddprun_node_info gauge\n"
      "ddprun_node_info{" +
          common +
          ",host=\"gpu-02\",version=\"0.1.0\"} 1\n"
          "# HELP ddprun_node_phase The agent's phase: 1 for the one it is in.\n"
          "# TYPE ddprun_node_phase gauge\n"
          "ddprun_node_phase{" +
          common +
          ",phase=\"connecting\"} 0\n"
          "ddprun_node_phase{" +
          common +
          ",phase=\"retry-wait\"} 0\n"
          "ddprun_node_phase{" +
          common +
          ",phase=\"joining\"} 0\n"
          "ddprun_node_phase{" +
          common +
          ",phase=\"waiting\"} 0\n"
          "ddprun_node_phase{" +
          common +
          ",phase=\"running\"} 1\n"
          "ddprun_node_phase{" +
          common +
          ",phase=\"exited\"} 0\n"
          "# HELP ddprun_node_round The round this node last started; -1 before its first.\n"
          "# TYPE ddprun_node_round gauge\n"
          "ddprun_node_round{" +
          common +
          "} 2\n"
          "# HELP ddprun_node_plays_node_rank The node rank this agent plays in that round: its own, or "
          "for a spare the one it replaced; -1 before its first.\n"
          "# TYPE ddprun_node_plays_node_rank gauge\n"
          "ddprun_node_plays_node_rank{" +
          common +
          "} 1\n"
          "# HELP ddprun_node_workers_running Workers of this node that run now.\n"
          "# TYPE ddprun_node_workers_running gauge\n"
          "ddprun_node_workers_running{" +
          common +
          "} 2\n"
          "# HELP ddprun_node_rank_last_step A running rank's last step, from its progress beacons.\n"
          "# TYPE ddprun_node_rank_last_step gauge\n"
          "ddprun_node_rank_last_step{" +
          common +
          ",rank=\"2\"} 41\n"
          "# HELP ddprun_node_rank_last_beacon_timestamp_seconds When a running rank sent its last step "
          "or phase beacon (Unix time).\n"
          "# TYPE ddprun_node_rank_last_beacon_timestamp_seconds gauge\n"
          "ddprun_node_rank_last_beacon_timestamp_seconds{" +
          common +
          ",rank=\"2\"} 1000.25\n"
          "# HELP ddprun_node_rank_step_seconds A running rank's time per step over the straggler window.\n"
          "# TYPE ddprun_node_rank_step_seconds gauge\n"
          "ddprun_node_rank_step_seconds{" +
          common +
          ",rank=\"2\"} 1\n"
          "# HELP ddprun_node_rank_work_seconds A running rank's own work per step (without waiting for the "
          "others).\n"
          "# TYPE ddprun_node_rank_work_seconds gauge\n"
          "ddprun_node_rank_work_seconds{" +
          common + ",rank=\"2\"} 0.8\n");
  // Without the wall clock (the simulator), no timestamps.
  metrics.unix_time_seconds.reset();
  EXPECT_EQ(RenderMetricsText(metrics).find("timestamp"), std::string::npos);
}

TEST(MetricsTextTest, NodeZeroAlsoServesTheJob) {
  NodeMetrics metrics;
  metrics.job = "demo";
  metrics.agent.node_rank = 0;
  metrics.agent.host = "gpu-01";
  metrics.agent.version = "0.1.0";
  metrics.agent.phase = "waiting";
  metrics.agent.round = -1;
  core::CoordinatorMetrics c;
  c.phase = "backoff";
  c.round = 1;
  c.restarts_used = 1;
  c.rounds_failed = 1;
  c.restarts_allowed = 3;
  c.nodes = 2;
  c.spares = 1;
  c.nodes_joined = 2;
  c.nodes_away = 1;
  c.spares_waiting = 0;
  c.round_nodes = 1;
  c.hosts_quarantined = 1;
  c.last_failure_round = 1;
  c.last_failure_kind = "torch.cuda.OutOfMemoryError";
  c.stragglers = 1;
  c.ranks_reported = 2;
  c.ranks = {{0, 0, 100, 1500ms, 1s, false}, {3, 1, 99, 1500ms, std::nullopt, true}};
  metrics.coordinator = c;
  metrics.since_last_failure = 12s;
  metrics.unix_time_seconds = 2000;
  const std::string text = RenderMetricsText(metrics);
  const std::string job = text.substr(text.find("# HELP ddprun_job_phase"));
  const std::string common = "job_name=\"demo\",node=\"0\"";
  EXPECT_EQ(
      job,
      "# HELP ddprun_job_phase The job's phase: 1 for the one it is in; succeeded, failed or "
      "interrupted once it ended.\n"
      "# TYPE ddprun_job_phase gauge\n"
      "ddprun_job_phase{" +
          common +
          ",phase=\"rendezvous\"} 0\n"
          "ddprun_job_phase{" +
          common +
          ",phase=\"starting\"} 0\n"
          "ddprun_job_phase{" +
          common +
          ",phase=\"running\"} 0\n"
          "ddprun_job_phase{" +
          common +
          ",phase=\"stopping\"} 0\n"
          "ddprun_job_phase{" +
          common +
          ",phase=\"backoff\"} 1\n"
          "ddprun_job_phase{" +
          common +
          ",phase=\"succeeded\"} 0\n"
          "ddprun_job_phase{" +
          common +
          ",phase=\"failed\"} 0\n"
          "ddprun_job_phase{" +
          common +
          ",phase=\"interrupted\"} 0\n"
          "# HELP ddprun_job_round The job's current round (0 for the first).\n"
          "# TYPE ddprun_job_round gauge\n"
          "ddprun_job_round{" +
          common +
          "} 1\n"
          "# HELP ddprun_job_restarts_total Restarts of the job so far.\n"
          "# TYPE ddprun_job_restarts_total counter\n"
          "ddprun_job_restarts_total{" +
          common +
          "} 1\n"
          "# HELP ddprun_job_failures_total Rounds of the job that failed so far (each restart follows "
          "one).\n"
          "# TYPE ddprun_job_failures_total counter\n"
          "ddprun_job_failures_total{" +
          common +
          "} 1\n"
          "# HELP ddprun_job_restarts_left Restarts left of restart.max_restarts.\n"
          "# TYPE ddprun_job_restarts_left gauge\n"
          "ddprun_job_restarts_left{" +
          common +
          "} 2\n"
          "# HELP ddprun_job_nodes Nodes of the job.\n"
          "# TYPE ddprun_job_nodes gauge\n"
          "ddprun_job_nodes{" +
          common +
          "} 2\n"
          "# HELP ddprun_job_nodes_joined Agents (nodes and spares) joined to the coordinator now.\n"
          "# TYPE ddprun_job_nodes_joined gauge\n"
          "ddprun_job_nodes_joined{" +
          common +
          "} 2\n"
          "# HELP ddprun_job_round_nodes Nodes in the current round: fewer than ddprun_job_nodes "
          "when it shrank (cluster.min_nodes); 0 before the first round.\n"
          "# TYPE ddprun_job_round_nodes gauge\n"
          "ddprun_job_round_nodes{" +
          common +
          "} 1\n"
          "# HELP ddprun_job_hosts_quarantined Hosts kept out of the job now (quarantine).\n"
          "# TYPE ddprun_job_hosts_quarantined gauge\n"
          "ddprun_job_hosts_quarantined{" +
          common +
          "} 1\n"
          "# HELP ddprun_job_nodes_away Agents that joined once and are not connected now.\n"
          "# TYPE ddprun_job_nodes_away gauge\n"
          "ddprun_job_nodes_away{" +
          common +
          "} 1\n"
          "# HELP ddprun_job_spares Spares of the job (cluster.spares).\n"
          "# TYPE ddprun_job_spares gauge\n"
          "ddprun_job_spares{" +
          common +
          "} 1\n"
          "# HELP ddprun_job_spares_waiting Joined agents that play no node rank, ready to replace one.\n"
          "# TYPE ddprun_job_spares_waiting gauge\n"
          "ddprun_job_spares_waiting{" +
          common +
          "} 0\n"
          "# HELP ddprun_job_last_failure_info The latest root cause: its round and its most specific kind.\n"
          "# TYPE ddprun_job_last_failure_info gauge\n"
          "ddprun_job_last_failure_info{" +
          common +
          ",round=\"1\",kind=\"torch.cuda.OutOfMemoryError\"} 1\n"
          "# HELP ddprun_job_last_failure_timestamp_seconds When node 0 learnt of the latest root cause "
          "(Unix time).\n"
          "# TYPE ddprun_job_last_failure_timestamp_seconds gauge\n"
          "ddprun_job_last_failure_timestamp_seconds{" +
          common +
          "} 1988\n"
          "# HELP ddprun_job_stragglers Ranks reported as stragglers now.\n"
          "# TYPE ddprun_job_stragglers gauge\n"
          "ddprun_job_stragglers{" +
          common +
          "} 1\n"
          "# HELP ddprun_job_ranks_reported Ranks with a progress report in this round.\n"
          "# TYPE ddprun_job_ranks_reported gauge\n"
          "ddprun_job_ranks_reported{" +
          common +
          "} 2\n"
          "# HELP ddprun_job_rank_last_step A rank's last step, as its node last reported it.\n"
          "# TYPE ddprun_job_rank_last_step gauge\n"
          "ddprun_job_rank_last_step{" +
          common +
          ",rank=\"0\",rank_node=\"0\"} 100\n"
          "ddprun_job_rank_last_step{" +
          common +
          ",rank=\"3\",rank_node=\"1\"} 99\n"
          "# HELP ddprun_job_rank_step_seconds A rank's time per step over the straggler window, as its node "
          "reported it.\n"
          "# TYPE ddprun_job_rank_step_seconds gauge\n"
          "ddprun_job_rank_step_seconds{" +
          common +
          ",rank=\"0\",rank_node=\"0\"} 1.5\n"
          "ddprun_job_rank_step_seconds{" +
          common +
          ",rank=\"3\",rank_node=\"1\"} 1.5\n"
          "# HELP ddprun_job_rank_work_seconds A rank's own work per step, as its node reported it.\n"
          "# TYPE ddprun_job_rank_work_seconds gauge\n"
          "ddprun_job_rank_work_seconds{" +
          common +
          ",rank=\"0\",rank_node=\"0\"} 1\n"
          "# HELP ddprun_job_rank_straggler 1 while a rank is reported as a straggler.\n"
          "# TYPE ddprun_job_rank_straggler gauge\n"
          "ddprun_job_rank_straggler{" +
          common +
          ",rank=\"0\",rank_node=\"0\"} 0\n"
          "ddprun_job_rank_straggler{" +
          common + ",rank=\"3\",rank_node=\"1\"} 1\n");
  // Before its first round the agent has no ranks: their families are left out.
  EXPECT_EQ(text.find("ddprun_node_rank_"), std::string::npos);
  EXPECT_NE(text.find("ddprun_node_round{" + common + "} -1\n"), std::string::npos);
  EXPECT_NE(text.find("ddprun_node_plays_node_rank{" + common + "} -1\n"), std::string::npos);
}

TEST(MetricsTextTest, TheEndedJobSaysItsOutcomeAndExitCode) {
  NodeMetrics metrics;
  metrics.job = "demo";
  core::CoordinatorMetrics c;
  c.phase = "succeeded";
  c.exit_code = 0;
  metrics.coordinator = c;
  metrics.agent.exit_code = 0;
  const std::string text = RenderMetricsText(metrics);
  EXPECT_NE(text.find("ddprun_job_phase{job_name=\"demo\",node=\"0\",phase=\"succeeded\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ddprun_job_phase{job_name=\"demo\",node=\"0\",phase=\"running\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ddprun_job_exit_code{job_name=\"demo\",node=\"0\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ddprun_node_exit_code{job_name=\"demo\",node=\"0\"} 0\n"), std::string::npos) << text;
}

TEST(MetricsTextTest, BeforeAnyFailureNoFailureIsServed) {
  NodeMetrics metrics;
  metrics.job = "demo";
  metrics.coordinator = core::CoordinatorMetrics{};
  const std::string text = RenderMetricsText(metrics);
  EXPECT_EQ(text.find("last_failure"), std::string::npos) << text;
  EXPECT_NE(text.find("ddprun_job_failures_total{job_name=\"demo\",node=\"0\"} 0\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("ddprun_job_phase{job_name=\"demo\",node=\"0\",phase=\"rendezvous\"} 1\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace ddprun::host
