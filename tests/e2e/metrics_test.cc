// End-to-end tests of [metrics]: real agents on 127.0.0.1 and 127.0.0.2 serve GET /metrics
// (node 0 also for the job), scraped by a plain TCP client during the run and after a forced
// restart; idle clients and a taken port do not hold the job up.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::chrono_literals;

/// A TCP connection to addr:port with a 5 s receive timeout; -1 when refused.
int ConnectTo(const std::string& addr, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  timeval limit{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  return fd;
}

/// A scrape parsed as the text format requires: every line a comment or `name{labels} value`,
/// every sample's name declared by a `# TYPE` line before it, every sample labelled with the
/// job and the serving node first. Samples are keyed by `name{labels}` without those two
/// ("ddprun_job_round", "ddprun_node_info{host=...}").
struct Scrape {
  std::string error;  // "" when the text is well formed
  std::map<std::string, double> samples;
  std::set<std::string> types;

  std::optional<double> Get(const std::string& key) const {
    auto it = samples.find(key);
    return it == samples.end() ? std::nullopt : std::optional<double>(it->second);
  }
  /// The sample of `name` whose labels contain `label_part` (e.g. `node="1"`).
  std::optional<double> Find(const std::string& name, const std::string& label_part) const {
    for (const auto& [key, value] : samples) {
      if (key.starts_with(name + "{") && key.find(label_part) != std::string::npos) return value;
    }
    return std::nullopt;
  }
  bool HasFamily(const std::string& prefix) const {
    for (const auto& [key, value] : samples) {
      if (key.starts_with(prefix)) return true;
    }
    return false;
  }
};

Scrape Parse(const std::string& answer) {
  Scrape scrape;
  const size_t body_at = answer.find("\r\n\r\n");
  if (!answer.starts_with("HTTP/1.0 200 OK\r\n") || body_at == std::string::npos) {
    scrape.error = "not a 200 answer: " + answer.substr(0, 200);
    return scrape;
  }
  if (answer.find("Content-Type: text/plain; version=0.0.4") == std::string::npos) {
    scrape.error = "no text format 0.0.4 content type";
  }
  static const std::regex kType(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter|histogram|summary|untyped))");
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*)?\})? (\S+))");
  std::istringstream body(answer.substr(body_at + 4));
  std::string line;
  int number = 0;
  while (std::getline(body, line)) {
    ++number;
    std::smatch m;
    if (std::regex_match(line, m, kType)) {
      scrape.types.insert(m[1]);
    } else if (line.starts_with("#")) {
      if (line.starts_with("# HELP") && !std::regex_match(line, kHelp)) {
        scrape.error = "bad HELP line " + std::to_string(number) + ": " + line;
      }
    } else if (std::regex_match(line, m, kSample)) {
      const std::string value = m[m.size() - 1];
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (end != value.c_str() + value.size())
        scrape.error = "bad value in line " + std::to_string(number) + ": " + line;
      if (!scrape.types.contains(m[1]))
        scrape.error = "no # TYPE before line " + std::to_string(number) + ": " + line;
      static const std::regex kCommon(R"(\{job_name="[^"]*",node="\d+"(,|\}))");
      std::string key = line.substr(0, line.rfind(' '));
      std::smatch common;
      const std::string labels = key.substr(static_cast<size_t>(m[1].length()));
      if (!std::regex_search(labels, common, kCommon) || common.position(0) != 0) {
        scrape.error = "no job_name and node labels in line " + std::to_string(number) + ": " + line;
      } else {
        key =
            m[1].str() + (common[1] == "}" ? "" : "{" + labels.substr(static_cast<size_t>(common.length(0))));
      }
      scrape.samples[key] = v;
    } else {
      scrape.error = "line " + std::to_string(number) + " is neither a comment nor a sample: " + line;
    }
  }
  return scrape;
}

/// Scrapes until `done` holds for a well-formed scrape, for up to `limit`; the last scrape.
template <typename Done>
Scrape ScrapeUntil(const std::string& addr, uint16_t port, Done done, std::chrono::milliseconds limit) {
  Scrape scrape;
  WaitFor(
      [&] {
        scrape = Parse(HttpGet(addr, port, "/metrics"));
        return scrape.error.empty() && done(scrape);
      },
      limit);
  return scrape;
}

class MetricsTest : public ::testing::Test {
 protected:
  /// Two nodes, 127.0.0.1 and 127.0.0.2, each serving on its own address ("*").
  TestJob Job(const std::string& script) {
    metrics_port_ = FreePort();
    TestJob job;
    job.name = "metrics";
    job.nodes = {"127.0.0.1", "127.0.0.2"};
    job.master_port = FreePort();
    job.script = script;
    job.max_restarts = 1;
    job.backoff = "0s";
    // No linger: these tests are about the run; prometheus_test.cc scrapes the end.
    job.extra = "[metrics]\nlisten = \"*:" + std::to_string(metrics_port_) + "\"\nlinger = \"0s\"\n";
    return job;
  }
  void StartBoth(const TestJob& job) {
    const std::string path = dir_.Write("job.toml", job.Toml());
    for (int node : {0, 1}) {
      agents_.push_back(
          std::make_unique<AgentProcess>(std::vector<std::string>{path, "--node-rank", std::to_string(node)},
                                         dir_.path() + "/agent-" + std::to_string(node) + ".out"));
    }
  }
  std::string Describe() const { return DescribeAgents(agents_); }

  ScratchDir dir_;
  uint16_t metrics_port_ = 0;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

// Each worker runs until the test releases its round (at most 30 s); rank 3 fails when the
// test asks it to, which forces a restart.
constexpr const char* kGatedWorker =
    "r=$TORCHELASTIC_RESTART_COUNT; i=0; while [ ! -e release-$r ] && [ $i -lt 600 ]; do "
    "if [ \"$RANK\" = 3 ] && [ -e fail-$r ]; then echo 'rank 3 fails on purpose' >&2; exit 1; fi; "
    "sleep 0.05; i=$((i + 1)); done";

TEST_F(MetricsTest, EveryNodeServesItselfAndNodeZeroTheJobBeforeAndAfterARestart) {
  StartBoth(Job(kGatedWorker));
  // Round 0 runs everywhere.
  const Scrape job0 = ScrapeUntil(
      "127.0.0.1", metrics_port_,
      [](const Scrape& s) {
        return s.Get("ddprun_job_phase{phase=\"running\"}") == 1 && s.Get("ddprun_node_workers_running") == 2;
      },
      20s);
  ASSERT_EQ(job0.error, "") << Describe();
  ASSERT_EQ(job0.Get("ddprun_job_phase{phase=\"running\"}"), 1) << Describe();
  EXPECT_EQ(job0.Get("ddprun_job_round"), 0);
  EXPECT_EQ(job0.Get("ddprun_job_nodes"), 2);
  EXPECT_EQ(job0.Get("ddprun_job_nodes_joined"), 2);
  EXPECT_EQ(job0.Get("ddprun_job_nodes_away"), 0);
  EXPECT_EQ(job0.Get("ddprun_job_restarts_total"), 0);
  EXPECT_EQ(job0.Get("ddprun_job_failures_total"), 0);
  EXPECT_TRUE(job0.types.contains("ddprun_job_restarts_total"));
  EXPECT_EQ(job0.Get("ddprun_job_restarts_left"), 1);
  EXPECT_FALSE(job0.HasFamily("ddprun_job_last_failure_info"));
  EXPECT_EQ(job0.Get("ddprun_node_round"), 0);
  EXPECT_EQ(job0.Get("ddprun_node_workers_running"), 2);
  EXPECT_EQ(job0.Get("ddprun_node_info{host=\"127.0.0.1\",version=\"0.1.0\"}"), 1);

  const Scrape node1 = ScrapeUntil(
      "127.0.0.2", metrics_port_, [](const Scrape& s) { return s.Get("ddprun_node_workers_running") == 2; },
      10s);
  ASSERT_EQ(node1.error, "") << Describe();
  EXPECT_EQ(node1.Find("ddprun_node_info", "host=\"127.0.0.2\""), 1);
  EXPECT_EQ(node1.Get("ddprun_node_round"), 0);
  EXPECT_EQ(node1.Get("ddprun_node_workers_running"), 2);
  EXPECT_EQ(node1.Get("ddprun_node_phase{phase=\"running\"}"), 1);
  EXPECT_FALSE(node1.HasFamily("ddprun_job_")) << "only node 0 speaks for the job";

  for (const char* addr : {"127.0.0.1", "127.0.0.2"}) {
    EXPECT_THAT(HttpGet(addr, metrics_port_, "/"), StartsWith("HTTP/1.0 404 Not Found\r\n")) << addr;
  }

  // Rank 3 fails: the job restarts once, into round 1.
  dir_.Write("fail-0", "");
  const Scrape job1 = ScrapeUntil(
      "127.0.0.1", metrics_port_,
      [](const Scrape& s) {
        return s.Get("ddprun_job_round") == 1 && s.Get("ddprun_job_phase{phase=\"running\"}") == 1 &&
               s.Get("ddprun_node_workers_running") == 2;
      },
      20s);
  ASSERT_EQ(job1.Get("ddprun_job_round"), 1) << Describe();
  EXPECT_EQ(job1.Get("ddprun_job_restarts_total"), 1);
  EXPECT_EQ(job1.Get("ddprun_job_failures_total"), 1);
  EXPECT_EQ(job1.Get("ddprun_job_restarts_left"), 0);
  EXPECT_EQ(job1.Get("ddprun_job_last_failure_info{round=\"0\",kind=\"exit:1\"}"), 1);
  const auto failed_at = job1.Get("ddprun_job_last_failure_timestamp_seconds");
  ASSERT_TRUE(failed_at.has_value());
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(*failed_at, now + 1);
  EXPECT_GT(*failed_at, now - 30);
  EXPECT_EQ(job1.Get("ddprun_node_round"), 1);
  const Scrape node1_after = ScrapeUntil(
      "127.0.0.2", metrics_port_,
      [](const Scrape& s) {
        return s.Get("ddprun_node_round") == 1 && s.Get("ddprun_node_workers_running") == 2;
      },
      10s);
  EXPECT_EQ(node1_after.Get("ddprun_node_round"), 1) << Describe();

  dir_.Write("release-1", "");
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(30s), 0) << Describe();
  EXPECT_THAT(agents_[0]->Output(),
              HasSubstr("serving GET /metrics on 127.0.0.1:" + std::to_string(metrics_port_) +
                        " (this node's and the job's)"));
  EXPECT_THAT(
      agents_[1]->Output(),
      HasSubstr("serving GET /metrics on 127.0.0.2:" + std::to_string(metrics_port_) + " (this node's)"));
}

TEST_F(MetricsTest, ClientsThatConnectAndSayNothingDoNotHoldTheJob) {
  // Workers run 3 s; heartbeats every 250 ms would lose a node whose loop stalled for 750 ms.
  StartBoth(Job("sleep 3"));
  const auto started = std::chrono::steady_clock::now();
  // More idle clients than the server serves at once, on both nodes, and one that sends half
  // a request; none of them ever reads.
  std::vector<int> idle;
  for (const char* addr : {"127.0.0.1", "127.0.0.2"}) {
    ASSERT_TRUE(WaitFor([&] { return !HttpGet(addr, metrics_port_, "/metrics").empty(); }, 10s))
        << Describe();
    for (int i = 0; i < 6; ++i) {
      const int fd = ConnectTo(addr, metrics_port_);
      ASSERT_GE(fd, 0) << addr;
      idle.push_back(fd);
    }
    const int half = ConnectTo(addr, metrics_port_);
    ::send(half, "GET /metr", 9, MSG_NOSIGNAL);
    idle.push_back(half);
  }
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(20s), 0) << Describe();
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_LT(took, 15s) << "the job should end about 3 s after its workers started";
  for (const auto& agent : agents_) {
    EXPECT_THAT(agent->Output(), HasSubstr("succeeded")) << Describe();
    EXPECT_EQ(agent->Output().find("was lost"), std::string::npos) << Describe();
  }
  for (int fd : idle) ::close(fd);
}

TEST_F(MetricsTest, APortTakenOnOneNodeIsAWarningThereAndTheJobRuns) {
  TestJob job = Job("sleep 1");
  // Node 1's metrics address is held by another listener.
  const int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(metrics_port_);
  ::inet_pton(AF_INET, "127.0.0.2", &sa.sin_addr);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(holder, 1), 0);
  StartBoth(job);
  for (auto& agent : agents_) EXPECT_EQ(agent->Wait(30s), 0) << Describe();
  EXPECT_THAT(agents_[1]->Output(),
              HasSubstr("warning: metrics.listen = \"*:" + std::to_string(metrics_port_) +
                        "\": cannot listen on 127.0.0.2:" + std::to_string(metrics_port_) +
                        ": the port is already in use by pid " + std::to_string(::getpid())));
  EXPECT_THAT(agents_[1]->Output(), HasSubstr("this node serves no metrics, the job goes on"));
  EXPECT_THAT(agents_[0]->Output(), HasSubstr("serving GET /metrics on 127.0.0.1:"));
  ::close(holder);
}

}  // namespace
}  // namespace ddprun::e2e
