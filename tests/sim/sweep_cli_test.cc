// `ddprun --simulate --sweep` and the shape swarm end to end: the table word for word, a row
// checked against the single runs it summarises, usage errors, the chart as SVG and as a page
// headless Chromium renders (skipped without Chromium unless DDPRUN_REQUIRE lists "chromium"),
// shaped seeds the loader accepts and a failed seed's repro line; --nodes on a fixed-size job.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct Result {
  int code = -1;
  std::string output;
};

Result Shell(const std::string& command) {
  Result result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Run from the source folder, so that the job file is named as a user in the repository names it.
Result Ddprun(const std::string& args) {
  return Shell(std::string("cd ") + DDPRUN_SOURCE_DIR + " && " + DDPRUN_BINARY + " " + args);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ddprun-sweep-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Each worker fails about once an hour, so that the seeds differ.
const std::string kSmallSweep =
    "--simulate examples/laptop.toml --set simulate.worker_mtbf=1h --sweep restart.backoff=10s,3m "
    "--sweep simulate.checkpoint_every=1m,10m --seeds 3 --seed 7";

TEST(SweepCliTest, PrintsTheGoodputTableWordForWord) {
  const Result run = Ddprun(kSmallSweep);
  EXPECT_EQ(run.code, 0);
  EXPECT_EQ(
      run.output,
      "sweep of examples/laptop.toml (with --set simulate.worker_mtbf=1h): 4 settings x 3 seeds (7..9), the "
      "job's own faults only\n"
      "\n"
      "| restart.backoff | simulate.checkpoint_every | runs | finished (exit 0) | other exits | goodput mean "
      "| p10 "
      "| median | p90 | restarts (mean) | work lost (mean) | downtime (mean) | training kept |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
      "| 10s | 1m | 3 | 3 | - | 76.2% | 74.0% | 76.2% | 78.3% | 3.0 | 1m31s | 4m44s | 100.0% |\n"
      "| 10s | 10m | 3 | 2 | exit 1: 1 | 48.3% | 34.9% | 53.3% | 56.7% | 3.0 | 12m14s | 4m54s | 83.3% |\n"
      "| 3m | 1m | 3 | 3 | - | 64.8% | 58.8% | 67.3% | 68.2% | 2.3 | 1m34s | 9m26s | 100.0% |\n"
      "| 3m | 10m | 3 | 2 | exit 1: 1 | 35.5% | 0.0% | 52.2% | 54.4% | 2.3 | 15m58s | 9m36s | 66.7% |\n"
      "\n"
      "goodput: useful training / wall time of each run (a run that ended early counts until it ended); "
      "training kept: the training done at the end over simulate.train_time\n");
}

TEST(SweepCliTest, ARowSummarisesTheSingleRunsOfItsSetting) {
  // The last row of the table above, from the three runs one by one (--set, --seed).
  double goodput_sum = 0;
  int finished = 0;
  int restarts = 0;
  for (int seed = 7; seed <= 9; ++seed) {
    const Result one = Ddprun(
        "--simulate examples/laptop.toml --set simulate.worker_mtbf=1h --set restart.backoff=3m "
        "--set simulate.checkpoint_every=10m --quiet --seed " +
        std::to_string(seed));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(one.output, m, std::regex(R"(goodput: +([0-9.]+)%)"))) << one.output;
    goodput_sum += std::stod(m[1]);
    ASSERT_TRUE(std::regex_search(one.output, m, std::regex(R"(restarts used: (\d+) of)"))) << one.output;
    restarts += std::stoi(m[1]);
    finished += one.code == 0;
  }
  EXPECT_EQ(finished, 2);
  EXPECT_EQ(restarts, 7);  // 2.3 a run
  EXPECT_NEAR(goodput_sum / 3, 35.5, 0.1);
}

TEST(SweepCliTest, ABadKeyOrValueIsAUsageError) {
  const Result unknown = Ddprun("--simulate examples/laptop.toml --sweep no_such_key=1,2");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.output,
              HasSubstr("--sweep no_such_key=1,2: no section of a job file has a key \"no_such_key\""));
  const Result ambiguous = Ddprun("--simulate examples/laptop.toml --sweep window=1h");
  EXPECT_EQ(ambiguous.code, 2);
  EXPECT_THAT(ambiguous.output, HasSubstr("is a key of several sections"));
  // The loader judges each setting as it judges a file a user wrote.
  const Result bad = Ddprun("--simulate examples/laptop.toml --sweep timeouts.heartbeat=2s,5m --seeds 1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.output, HasSubstr("with timeouts.heartbeat=5m, the job file is not valid:"));
  EXPECT_THAT(bad.output,
              HasSubstr("error: timeouts.heartbeat = 5m is too long for timeouts.rendezvous = 5m"));
  const Result chart = Ddprun("--simulate examples/laptop.toml --sweep spares=0 --chart out.png");
  EXPECT_EQ(chart.code, 2);
  EXPECT_THAT(chart.output, HasSubstr("name the file .svg (the chart) or .html (chart and table)"));
}

// Issue 40: the README's sweep form on examples/lightning-2x8.toml gave equal rows without a
// word (the job has nothing that fails). The sweep says so; a job with failure rates, or a
// sweep over them, does not.
TEST(SweepCliTest, AJobWithNothingThatFailsIsNamedBeforeItsEqualRows) {
  const Result quiet =
      Ddprun("--simulate examples/lightning-2x8.toml --sweep restart.max_restarts=1,3 --seeds 2");
  EXPECT_EQ(quiet.code, 0) << quiet.output;
  EXPECT_THAT(quiet.output,
              HasSubstr("note: examples/lightning-2x8.toml has nothing that fails (no "
                        "[[simulate.faults]], no simulate.node_mtbf, worker_mtbf or worker_hang_mtbf)"));
  const Result rates = Ddprun(
      "--simulate examples/lightning-2x8.toml --set simulate.worker_mtbf=6h --sweep "
      "restart.max_restarts=1,3 --seeds 2");
  EXPECT_EQ(rates.code, 0) << rates.output;
  EXPECT_THAT(rates.output, Not(HasSubstr("has nothing that fails")));
  const Result swept =
      Ddprun("--simulate examples/lightning-2x8.toml --sweep simulate.worker_mtbf=6h,12h --seeds 2");
  EXPECT_THAT(swept.output, Not(HasSubstr("has nothing that fails")));
}

TEST(SweepCliTest, WritesTheChartAsSvg) {
  ScratchDir dir;
  const std::string svg = dir.path() + "/chart.svg";
  const Result run = Ddprun(
      "--simulate examples/laptop.toml --sweep simulate.checkpoint_every=1m,10m --seeds 2 --chart " + svg);
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("wrote the chart to " + svg));
  const std::string text = ReadFile(svg);
  EXPECT_THAT(text, StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"sweep-chart\""));
  EXPECT_THAT(text, HasSubstr(">simulate.checkpoint_every=1m</text>"));
  EXPECT_THAT(text, HasSubstr(">simulate.checkpoint_every=10m</text>"));
}

bool Required(const std::string& what) {
  const char* value = std::getenv("DDPRUN_REQUIRE");
  return value && (" " + std::regex_replace(value, std::regex("[,:]"), " ") + " ").find(" " + what + " ") !=
                      std::string::npos;
}

std::string FindChromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    if (std::system((std::string("command -v ") + name + " >/dev/null 2>&1").c_str()) == 0) return name;
  }
  return "";
}

TEST(SweepCliTest, TheChartPageRendersInHeadlessChromium) {
  const std::string chromium = FindChromium();
  if (chromium.empty()) {
    if (Required("chromium")) FAIL() << "DDPRUN_REQUIRE lists chromium, and it is not installed";
    GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it)";
  }
  ScratchDir dir;
  const std::string page = dir.path() + "/sweep.html";
  const Result run = Ddprun(kSmallSweep + " --chart " + page);
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string browse = "timeout 120 " + chromium +
                             " --headless --disable-gpu --no-sandbox --user-data-dir=" + dir.path() +
                             "/profile";
  // The DOM Chromium built: the SVG parsed as SVG (its elements in the document), one group per
  // setting with the mean it drew, and the table.
  const Result dom = Shell(browse + " --dump-dom 'file://" + page + "' 2>/dev/null");
  ASSERT_EQ(dom.code, 0) << dom.output;
  EXPECT_THAT(dom.output, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"sweep-chart\""));
  const std::regex group(R"re(<g class="setting" data-mean="([0-9.]+)">)re");
  std::vector<std::string> means;
  for (auto it = std::sregex_iterator(dom.output.begin(), dom.output.end(), group);
       it != std::sregex_iterator(); ++it) {
    means.push_back((*it)[1]);
  }
  EXPECT_EQ(means, (std::vector<std::string>{"0.7616", "0.4831", "0.6476", "0.3554"}));
  EXPECT_THAT(dom.output, HasSubstr(">restart.backoff=3m, simulate.checkpoint_every=10m</text>"));
  EXPECT_THAT(dom.output,
              HasSubstr("<td>3m</td><td>10m</td><td>3</td><td>2</td><td>exit 1: 1</td><td>35.5%</td>"));
  // And it paints: a screenshot of the page is a PNG of the window's size.
  const std::string png = dir.path() + "/sweep.png";
  const Result shot =
      Shell(browse + " --window-size=1000,400 --screenshot=" + png + " 'file://" + page + "'");
  ASSERT_EQ(shot.code, 0) << shot.output;
  const std::string image = ReadFile(png);
  ASSERT_GT(image.size(), 24u);
  EXPECT_EQ(image.substr(1, 3), "PNG");
  const auto be32 = [&](size_t at) {
    return (static_cast<unsigned>(static_cast<unsigned char>(image[at])) << 24) |
           (static_cast<unsigned>(static_cast<unsigned char>(image[at + 1])) << 16) |
           (static_cast<unsigned>(static_cast<unsigned char>(image[at + 2])) << 8) |
           static_cast<unsigned>(static_cast<unsigned char>(image[at + 3]));
  };
  EXPECT_EQ(be32(16), 1000u);
  EXPECT_EQ(be32(20), 400u);
}

}  // namespace

namespace {

TEST(ShapeSwarmCliTest, RunsShapesTheLoaderAccepts) {
  const Result run = Ddprun("--simulate bench/swarm-shapes.toml --swarm 40 --vary-shape --seed 1 --quiet");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("swarm: 40 seeds (1..40), 0 failed\n"));
  EXPECT_THAT(run.output, HasSubstr("swarm shapes: 0 refused by the loader\n"));
}

TEST(ShapeSwarmCliTest, ASeedsReproLineRepeatsItsShape) {
  // Seed 50 draws an etcd job of two nodes whose node 1 runs a different job file (it once
  // broke "one round at a time": tests/sim/regression_test.cc). Its repro line, run as printed,
  // must give the same run: the shape travels as --set flags, host lists quoted.
  const Result swarm = Ddprun("--simulate bench/swarm-shapes.toml --swarm 1 --vary-shape --seed 50");
  ASSERT_EQ(swarm.code, 0) << swarm.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      swarm.output, m, std::regex("seed 50: ok: exit (\\d+), (.*)\n  reproduce with: ddprun (.*)\n")))
      << swarm.output;
  const std::string exit_code = m[1];
  const std::string repro = m[3];
  EXPECT_THAT(repro, HasSubstr("--set 'cluster.nodes=[\"10.0.0.1\", \"10.0.0.2\"]'"));
  EXPECT_THAT(repro, HasSubstr("--fault job-file-differs@0s:node=1"));
  const Result again = Ddprun(repro);
  EXPECT_EQ(std::to_string(again.code), exit_code) << again.output;
  EXPECT_THAT(again.output, HasSubstr("outcome:           job exit code " + exit_code));
  EXPECT_THAT(again.output,
              HasSubstr("cluster.nproc_per_node: node 1 has 2, the coordinator (host 10.0.0.1) has 1"));
}

}  // namespace

namespace {

TEST(NodesOverrideCliTest, AFixedSizeJobStaysFixedSizeAtAnotherNodeCount) {
  // examples/llama3-54d.toml has 2,048 nodes and no min_nodes: every round needs all of them.
  // At --nodes 16 every round needs the 16 (the override used to keep "at least 2048 per
  // round", so every agent ignored round 0 and the rendezvous failed a day later).
  const Result run = Ddprun("--simulate examples/llama3-54d.toml --nodes 16 --quiet");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("outcome:           job exit code 0"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("at least 2048 per round")));
}

}  // namespace
