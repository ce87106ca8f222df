// [metrics] with Debian's real Prometheus and promtool: two agents on one host (a port per
// node) scraped by a prometheus server on 127.0.0.1, the job's end read back through its HTTP
// API after ddprun exited, `promtool check metrics` on the live endpoint, and the shipped alert
// rules and dashboard queries checked against the real server. Skipped without the programs.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/harness.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kPromtool = "/usr/bin/promtool";

std::string UrlEncode(const std::string& text) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string BodyOf(const std::string& answer) {
  const size_t at = answer.find("\r\n\r\n");
  return at == std::string::npos ? "" : answer.substr(at + 4);
}

/// A prometheus server on 127.0.0.1 with its data in `dir`, stopped (SIGTERM to its own pid,
/// then SIGKILL) by the destructor.
class PrometheusServer {
 public:
  PrometheusServer(const ScratchDir& dir, const std::vector<uint16_t>& targets) : port_(FreePort()) {
    std::string config = "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                         "  - job_name: ddprun\n    static_configs:\n      - targets: [";
    for (size_t i = 0; i < targets.size(); ++i) {
      config += (i == 0 ? "'" : ", '") + std::string("127.0.0.1:") + std::to_string(targets[i]) + "'";
    }
    config += "]\n";
    const std::string config_path = dir.Write("prometheus.yml", config);
    const std::string data = dir.path() + "/prometheus-data";
    const std::string log = dir.path() + "/prometheus.log";
    const std::string listen = "127.0.0.1:" + std::to_string(port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::execl(kPrometheus, kPrometheus, ("--config.file=" + config_path).c_str(),
              ("--storage.tsdb.path=" + data).c_str(), ("--web.listen-address=" + listen).c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    log_path_ = log;
  }
  ~PrometheusServer() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    if (!WaitFor([&] { return ::waitpid(pid_, nullptr, WNOHANG) == pid_; }, 10s)) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  bool Ready() const {
    return WaitFor([&] { return HttpGet("127.0.0.1", port_, "/-/ready").starts_with("HTTP/1.1 200"); }, 30s);
  }
  /// The JSON answer of an instant query.
  nlohmann::json Query(const std::string& promql) const {
    const std::string body = BodyOf(HttpGet("127.0.0.1", port_, "/api/v1/query?query=" + UrlEncode(promql)));
    return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  }
  /// The single value an instant query gives; NaN when it gives none or several.
  double Value(const std::string& promql) const {
    const nlohmann::json answer = Query(promql);
    if (answer.is_discarded() || answer.value("status", "") != "success") return std::nan("");
    const auto& result = answer["data"]["result"];
    if (result.size() != 1) return std::nan("");
    return std::stod(result[0]["value"][1].get<std::string>());
  }
  std::string Log() const {
    std::ifstream in(log_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  uint16_t port_;
  pid_t pid_ = -1;
  std::string log_path_;
};

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* program : {kPrometheus, kPromtool}) {
      DDPRUN_REQUIRE_OR_SKIP("prometheus", ::access(program, X_OK) == 0,
                             program << " is not installed (apt-get install prometheus; scripts/install-deps.sh)");
    }
  }

  /// Both agents of a 2-node job on 127.0.0.1, metrics on `metrics_port_` + node rank.
  TestJob Job(const std::string& name, const std::string& script, int max_restarts) {
    TestJob job;
    job.name = name;
    job.master_port = FreePort();
    job.script = script;
    job.max_restarts = max_restarts;
    job.backoff = "0s";
    job.extra = "[metrics]\nlisten = \"127.0.0.1:" + std::to_string(metrics_port_) +
                "\"\nports = \"per-node\"\nlinger = \"30s\"\n";
    return job;
  }
  std::vector<std::unique_ptr<AgentProcess>> Start(const TestJob& job) {
    const std::string path = dir_.Write(job.name + ".toml", job.Toml());
    std::vector<std::unique_ptr<AgentProcess>> agents;
    for (int node : {0, 1}) {
      agents.push_back(std::make_unique<AgentProcess>(
          std::vector<std::string>{path, "--node-rank", std::to_string(node)},
          dir_.path() + "/" + job.name + "-" + std::to_string(node) + ".out"));
    }
    return agents;
  }

  ScratchDir dir_;
  // A pair of free ports: FreePort hands out distinct ones, and the test needs P and P + 1.
  uint16_t metrics_port_ = PortPair();

  static uint16_t PortPair() {
    for (int i = 0; i < 50; ++i) {
      const uint16_t a = FreePort();
      const uint16_t b = FreePort();
      if (b == a + 1) return a;
    }
    return FreePort();
  }
};

TEST_F(PrometheusTest, ARealServerReadsTheEndOfASucceededAndAFailedJob) {
  PrometheusServer prometheus(dir_, {metrics_port_, static_cast<uint16_t>(metrics_port_ + 1)});
  ASSERT_TRUE(prometheus.Ready()) << prometheus.Log();

  // Round 0: rank 3 fails after 3 s; round 1 trains 4 s and succeeds.
  auto agents = Start(Job("prom-ok",
                          "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 3 ]; then sleep 3; "
                          "exit 1; fi; sleep 4",
                          1));
  // Both agents serve, on one host: node 1 on the next port.
  std::string live;
  ASSERT_TRUE(WaitFor([&] {
    live = HttpGet("127.0.0.1", metrics_port_, "/metrics");
    return live.find("ddprun_job_round{job_name=\"prom-ok\",node=\"0\"} 1") != std::string::npos;
  }, 30s)) << live << DescribeAgents(agents);
  EXPECT_THAT(HttpGet("127.0.0.1", static_cast<uint16_t>(metrics_port_ + 1), "/metrics"),
              HasSubstr("ddprun_node_info{job_name=\"prom-ok\",node=\"1\","));
  // promtool lints the live text: names, types, units, HELP.
  dir_.Write("live.prom", BodyOf(live));
  EXPECT_EQ(Shell(std::string(kPromtool) + " check metrics < " + dir_.path() + "/live.prom"), 0)
      << BodyOf(live);
  for (auto& agent : agents) EXPECT_EQ(agent->Wait(60s), 0) << DescribeAgents(agents);
  EXPECT_THAT(agents[0]->Output(), HasSubstr("GET /metrics shows the job's end until one scrape has read it, "
                                             "for at most 30s (metrics.linger)"));

  // The job failed for good: no restarts allowed.
  auto failing = Start(Job("prom-fail", "if [ \"$RANK\" = 3 ]; then sleep 2; exit 1; fi; sleep 30", 0));
  for (auto& agent : failing) EXPECT_EQ(agent->Wait(60s), 1) << DescribeAgents(failing);

  // After ddprun exited, Prometheus holds the final scrape. The series went stale when the
  // targets vanished, so an instant query at "now" finds them through last_over_time.
  EXPECT_EQ(prometheus.Value("last_over_time(ddprun_job_phase{job_name=\"prom-ok\",phase=\"succeeded\"}[5m])"), 1)
      << prometheus.Query("ddprun_job_phase").dump();
  EXPECT_EQ(prometheus.Value("last_over_time(ddprun_job_restarts_total{job_name=\"prom-ok\"}[5m])"), 1);
  EXPECT_EQ(prometheus.Value("last_over_time(ddprun_job_failures_total{job_name=\"prom-ok\"}[5m])"), 1);
  EXPECT_EQ(prometheus.Value("last_over_time(ddprun_job_phase{job_name=\"prom-fail\",phase=\"failed\"}[5m])"), 1);
  EXPECT_EQ(prometheus.Value("last_over_time(ddprun_job_phase{job_name=\"prom-fail\",phase=\"running\"}[5m])"), 0);
  EXPECT_EQ(prometheus.Value("last_over_time(ddprun_job_exit_code{job_name=\"prom-fail\"}[5m])"), 1);
  EXPECT_EQ(prometheus.Value("count(last_over_time(ddprun_node_info{job_name=\"prom-ok\"}[5m]))"), 2)
      << "both agents on one host served";

  // The shipped alert rules pass promtool, and every dashboard query runs on the real server.
  EXPECT_EQ(Shell(std::string(kPromtool) + " check rules " DDPRUN_SOURCE_DIR "/docs/monitoring/ddprun-alerts.yml"), 0);
  std::ifstream dashboard_file(DDPRUN_SOURCE_DIR "/docs/monitoring/ddprun-dashboard.json");
  const nlohmann::json dashboard = nlohmann::json::parse(dashboard_file, nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded());
  int queries = 0;
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel["targets"]) {
      std::string expr = target["expr"];
      for (const auto& [from, to] : {std::pair<std::string, std::string>{"$job_name", "prom-.*"},
                                     {"$__rate_interval", "1m"}}) {
        for (size_t at; (at = expr.find(from)) != std::string::npos;) expr.replace(at, from.size(), to);
      }
      const nlohmann::json answer = prometheus.Query(expr);
      EXPECT_EQ(answer.value("status", ""), "success") << expr << ": " << answer.dump();
      ++queries;
    }
  }
  EXPECT_GE(queries, 10);
}

}  // namespace
}  // namespace ddprun::e2e
