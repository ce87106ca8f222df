// `ddprun --simulate` end to end: the real binary on examples/laptop.toml.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int code = -1;
  std::string output;
};

Result RunDdprun(const std::string& args) {
  const std::string command = std::string(DDPRUN_BINARY) + " " + args + " 2>&1";
  Result result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

const std::string kLaptop = std::string(DDPRUN_SOURCE_DIR) + "/examples/laptop.toml";

TEST(CliTest, LaptopExampleRecoversFromANodeCrash) {
  const Result run = RunDdprun("--simulate " + kLaptop);
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("] node 1: crashed (fault node-crash); reboots in 2m"));
  EXPECT_THAT(run.output,
              HasSubstr("] coordinator: round 0 failed: node 1 (node-0001) was lost: silent for"));
  EXPECT_THAT(run.output,
              HasSubstr("succeeded: all 4 ranks on 2 nodes exited 0 in round 1 (1 restart used)"));
  EXPECT_THAT(run.output, HasSubstr("restarts used: 1 of 3"));
  EXPECT_THAT(run.output, HasSubstr("goodput:"));
}

TEST(CliTest, RunsTwiceIdentically) {
  const Result a =
      RunDdprun("--simulate " + kLaptop + " --seed 99 --fault worker-exit@3m:node=0,exit_code=5");
  const Result b =
      RunDdprun("--simulate " + kLaptop + " --seed 99 --fault worker-exit@3m:node=0,exit_code=5");
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.output, b.output);
}

TEST(CliTest, WorkerSlowFlagReportsAStraggler) {
  const Result run =
      RunDdprun("--simulate " + std::string(DDPRUN_SOURCE_DIR) +
                "/examples/lightning-2x8.toml --fault worker-slow@5m:node=1,local_rank=2,percent=100");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("] node 1: local rank 2's GPU slows down: 100% more own work per step"));
  EXPECT_THAT(run.output,
              HasSubstr("] coordinator: rank 10 (node 1 (10.10.10.17), local rank 2) is a straggler: its "
                        "own work per step is"));
  EXPECT_THAT(run.output, HasSubstr("stragglers (more than 50% slower than the median rank for 2m):"));
}

TEST(CliTest, BadFaultFlagIsAUsageError) {
  const Result run = RunDdprun("--simulate " + kLaptop + " --fault node-crash@soon");
  EXPECT_EQ(run.code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("is not a duration"));
  const Result out_of_range = RunDdprun("--simulate " + kLaptop + " --fault node-crash@1m:node=9");
  EXPECT_EQ(out_of_range.code, 2) << out_of_range.output;
}

TEST(CliTest, QuietPrintsOnlyTheSummary) {
  const Result run = RunDdprun("--simulate " + kLaptop + " --quiet");
  EXPECT_EQ(run.code, 0);
  EXPECT_EQ(run.output.find("] node 1: crashed"), std::string::npos);
  EXPECT_THAT(run.output, HasSubstr("simulation summary: job \"laptop\""));
}

TEST(CliTest, WritesTraceAndReport) {
  const std::string dir = ::testing::TempDir();
  const Result run =
      RunDdprun("--simulate " + kLaptop + " --quiet --trace " + dir + "/t.json --report " + dir + "/r.html");
  EXPECT_EQ(run.code, 0) << run.output;
  std::ifstream trace(dir + "/t.json");
  std::stringstream text;
  text << trace.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("\"traceEvents\""));
  std::ifstream report(dir + "/r.html");
  std::stringstream html;
  html << report.rdbuf();
  EXPECT_THAT(html.str(), HasSubstr("<svg"));
}

TEST(CliTest, ASpareReplacesAHostThatNeverReturns) {
  // bench/swarm-spares.toml: 4 nodes and 2 spares; node 2 crashes for good (no reboot_after).
  const std::string job = std::string(DDPRUN_SOURCE_DIR) + "/bench/swarm-spares.toml";
  const Result run = RunDdprun("--simulate " + job + " --seed 7 --fault node-crash@8m:node=2");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("] node 2: crashed (fault node-crash); stays down"));
  EXPECT_THAT(run.output, HasSubstr("replaces node 2 (node-0002) as node rank 2"));
  EXPECT_THAT(run.output, HasSubstr("  replaced:          at "));
  EXPECT_THAT(run.output,
              HasSubstr("simulation summary: job \"swarm-spares\", 4 nodes x 4 workers, 2 spares, seed 7"));
}

// Issue 40: `--swarm` and `--sweep` dropped --report and --trace without a word. They draw one
// run: refused, with how to draw one of the swarm's runs.
TEST(CliTest, ASwarmOrASweepWithAReportIsRefusedWithTheWayToDrawOneRun) {
  const std::string dir = ::testing::TempDir();
  const Result swarm = RunDdprun("--simulate " + kLaptop + " --swarm 3 --report " + dir + "/swarm.html");
  EXPECT_EQ(swarm.code, 2) << swarm.output;
  EXPECT_THAT(swarm.output,
              HasSubstr("ddprun simulate: --report draws one run and --swarm runs many: run one of "
                        "them again with --report (a failing seed's command line is printed as "
                        "`reproduce with:`; any other is `--seed S` with the same options)"));
  EXPECT_FALSE(std::ifstream(dir + "/swarm.html").good());
  const Result sweep =
      RunDdprun("--simulate " + kLaptop + " --sweep restart.max_restarts=1,2 --trace " + dir + "/sweep.json");
  EXPECT_EQ(sweep.code, 2) << sweep.output;
  EXPECT_THAT(sweep.output, HasSubstr("--trace draws one run and --sweep runs many"));
}

TEST(CliTest, SwarmReportsEverySeed) {
  const Result run = RunDdprun("--simulate " + kLaptop + " --swarm 5 --seed 40");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("swarm: 5 seeds (40..44), 0 failed"));
  EXPECT_THAT(run.output, HasSubstr("swarm goodput: mean "));
}

}  // namespace

namespace {

const std::string kScale = std::string(DDPRUN_SOURCE_DIR) + "/bench/sim_scale.toml";

// --nodes re-derives what follows from the node count: the file's 16 nodes with no min_nodes
// means every node is needed at 64 too (a lost node is waited for, not left out).
TEST(CliTest, NodesOverrideScalesTheDefaultMinNodes) {
  const Result run = RunDdprun("--simulate " + kScale + " --nodes 64 --fault node-crash@1m:node=5");
  EXPECT_EQ(run.code, 3) << run.output;
  EXPECT_THAT(run.output, Not(HasSubstr("cluster.min_nodes")));
  EXPECT_THAT(run.output, Not(HasSubstr("of the job's 64 nodes")));
  EXPECT_THAT(run.output, HasSubstr("rendezvous failed: 63/64 nodes joined within timeouts.rendezvous = 15m"))
      << run.output.substr(run.output.size() > 3000 ? run.output.size() - 3000 : 0);
}

// A min_nodes the file sets keeps its share of the nodes, and the change is said.
TEST(CliTest, NodesOverrideScalesAnExplicitMinNodes) {
  std::ifstream in(kScale);
  std::stringstream text;
  text << in.rdbuf();
  std::string toml = text.str();
  toml.replace(toml.find("nnodes = 16\n"), 12, "nnodes = 16\nmin_nodes = 12\n");
  const std::string path = ::testing::TempDir() + "/sim_scale_min_nodes.toml";
  std::ofstream(path) << toml;
  const Result run = RunDdprun("--simulate " + path + " --nodes 64 --fault node-crash@1m:node=5");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(
      run.output,
      HasSubstr("ddprun simulate: --nodes 64: cluster.min_nodes = 12 of 16 nodes becomes 48 of 64\n"));
  EXPECT_THAT(run.output,
              HasSubstr("] coordinator: round 1: starting 504 workers on 63 of the job's 64 nodes "
                        "(cluster.min_nodes = 48): without node 5 (node-0005)"));
}

}  // namespace
