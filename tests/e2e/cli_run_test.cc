// The real `ddprun job.toml` as users type it: one-node jobs, [trainer] values as Python literals
// of their own type, `--` arguments, restart.backoff_max, job.code_check and colour on a terminal.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <optional>

#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// One node, one worker; `command` is the TOML array.
TestJob SingleNodeJob(const std::string& command, uint16_t port) {
  TestJob job;
  job.name = "single";
  job.command = command;
  job.nnodes = 1;
  job.master_port = port;
  job.devices = 1;
  job.rendezvous = "10s";
  return job;
}

TEST(CliRun, SingleNodeJobRunsAsNodeZeroWithoutNodeRank) {
  ScratchDir dir;
  const std::string job =
      dir.Write("job.toml", SingleNodeJob("[\"sh\", \"-c\", \"echo node=$NODE_RANK\"]", FreePort()).Toml());
  AgentProcess agent({job}, dir.path() + "/out.txt", {{"DDPRUN_NODE_RANK", ""}});
  const auto code = agent.Wait(30s);
  ASSERT_TRUE(code.has_value()) << agent.Output();
  EXPECT_EQ(*code, 0) << agent.Output();
  EXPECT_THAT(agent.Output(), HasSubstr("node=0")) << agent.Output();
}

// The worker reads the job file with Python's own TOML reader and checks, for every [trainer]
// key, that PL_TRAINER_<KEY> read the way Lightning reads it (literal_eval, else the string)
// equals the TOML value and has its type, recursively. Exit 0 only when all match.
constexpr std::string_view kRoundTripScript = R"PY(
import ast, os, sys, tomllib
def lightning(text):
    try:
        return ast.literal_eval(text)
    except Exception:
        return text
def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b
trainer = tomllib.load(open(sys.argv[1], "rb"))["trainer"]
bad = 0
for key, want in trainer.items():
    text = os.environ["PL_TRAINER_" + key.upper()]
    got = lightning(text)
    if not same(got, want):
        bad += 1
        print(f"MISMATCH {key}: {text!r} reads as {got!r}, the file has {want!r}")
print(f"checked {len(trainer)} keys, {bad} mismatches")
sys.exit(1 if bad else 0)
)PY";

TEST(CliRun, EveryTrainerValueRoundTripsThroughLiteralEval) {
  ScratchDir dir;
  dir.Write("check.py", std::string(kRoundTripScript));
  // Every kind of TOML value [trainer] accepts; the keys are Lightning's where one fits.
  const std::string trainer =
      "limit_train_batches = 1.0\n"
      "val_check_interval = 0.25\n"
      "gradient_clip_val = 1e-3\n"
      "limit_val_batches = 1e16\n"
      "overfit_batches = -0.0\n"
      "max_epochs = 90\n"
      "min_epochs = -1\n"
      "deterministic = true\n"
      "benchmark = false\n"
      "precision = \"bf16-mixed\"\n"
      "strategy = \"ddp\"\n"
      "profiler = \"32\"\n"
      "default_root_dir = \"runs/it's \\\"here\\\"\\n\"\n"
      "gradient_clip_algorithm = \"True\"\n"
      "log_every_n_steps = 1_000\n"
      "max_time = { days = 1, hours = 5, note = \"x\" }\n"
      "plugins = [\"a\", 1, 2.0, true, [1, 2], { k = 0.5 }]\n"
      "callbacks = []\n"
      "logger = \"\"\n"
      "barebones = \"None\"\n";
  TestJob spec = SingleNodeJob("[\"python3\", \"check.py\", \"job.toml\"]", FreePort());
  spec.trainer_extra = trainer;
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess agent({job}, dir.path() + "/out.txt");
  const auto code = agent.Wait(30s);
  ASSERT_TRUE(code.has_value()) << agent.Output();
  EXPECT_EQ(*code, 0) << agent.Output();
  EXPECT_THAT(agent.Output(), HasSubstr("checked 23 keys, 0 mismatches")) << agent.Output();
}

// restart.backoff_max: the wait doubles after each restart, up to the cap.
TEST(CliRun, RestartBackoffDoublesUpToBackoffMax) {
  ScratchDir dir;
  TestJob spec = SingleNodeJob("[\"sh\", \"-c\", \"exit 3\"]", FreePort());
  spec.max_restarts = 3;
  spec.backoff = "100ms";
  spec.backoff_max = "200ms";
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess agent({job}, dir.path() + "/out.txt");
  const auto code = agent.Wait(60s);
  ASSERT_TRUE(code.has_value()) << agent.Output();
  EXPECT_EQ(*code, 1) << agent.Output();
  const std::string out = agent.Output();
  const size_t first = out.find("restart 1 of 3 in 100ms");
  const size_t second = out.find("restart 2 of 3 in 200ms");
  const size_t third = out.find("restart 3 of 3 in 200ms");
  EXPECT_NE(first, std::string::npos) << out;
  EXPECT_NE(second, std::string::npos) << out;
  EXPECT_NE(third, std::string::npos) << out;
  EXPECT_LT(first, second);
  EXPECT_LT(second, third);
}

// `ddprun job.toml -- args`: the arguments reach every worker after job.command.
TEST(CliRun, ArgumentsAfterDashesAreAppendedToTheCommand) {
  ScratchDir dir;
  const std::string job = dir.Write(
      "job.toml", SingleNodeJob("[\"sh\", \"-c\", \"echo args: \\\"$*\\\"\", \"sh\"]", FreePort()).Toml());
  AgentProcess agent({job, "--", "--lr", "0.1", "--help"}, dir.path() + "/out.txt");
  const auto code = agent.Wait(30s);
  ASSERT_TRUE(code.has_value()) << agent.Output();
  EXPECT_EQ(*code, 0) << agent.Output();
  EXPECT_THAT(agent.Output(), HasSubstr("args: --lr 0.1 --help")) << agent.Output();
}

// They are part of the job: a node given other arguments is refused, naming job.command.
TEST(CliRun, NodesWithDifferentScriptArgumentsDisagree) {
  ScratchDir dir;
  const uint16_t port = FreePort();
  TestJob spec = SingleNodeJob("[\"true\"]", port);
  spec.nnodes = 2;
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess node0({job, "--node-rank", "0", "--", "--lr", "0.1"}, dir.path() + "/n0.txt");
  AgentProcess node1({job, "--node-rank", "1", "--", "--lr", "0.2"}, dir.path() + "/n1.txt");
  const auto code1 = node1.Wait(30s);
  ASSERT_TRUE(code1.has_value()) << node1.Output();
  EXPECT_EQ(*code1, 3) << node1.Output();
  EXPECT_THAT(node1.Output(), HasSubstr("arguments after `--`: node 1 has [\"--lr\", \"0.2\"], node 0 has "
                                        "[\"--lr\", \"0.1\"]"))
      << node1.Output();
  // Node 0 would wait for a node 1 until the rendezvous timeout; the destructor stops it.
}

// A two-node job with job.code_check = `mode`. Each node has its own folder (as on two
// machines): the same job file, its own train.sh, which differ ("echo v1" and "echo v2").
std::pair<std::string, std::string> TwoNodesWithTheirOwnScript(const ScratchDir& dir,
                                                               const std::string& mode) {
  TestJob spec = SingleNodeJob("[\"sh\", \"train.sh\"]", FreePort());
  spec.nnodes = 2;
  spec.code_check = mode;
  const std::string text = spec.Toml();
  dir.Write("n0/train.sh", "echo v1\n");
  dir.Write("n1/train.sh", "echo v2\n");
  return {dir.Write("n0/job.toml", text), dir.Write("n1/job.toml", text)};
}

// job.code_check = "refuse": a node whose script differs is refused, naming the digest; the
// same script on both nodes runs.
TEST(CliRun, CodeCheckRefusesANodeWithAnotherScript) {
  ScratchDir dir;
  const auto [job0, job1] = TwoNodesWithTheirOwnScript(dir, "refuse");
  {
    AgentProcess node0({job0, "--node-rank", "0"}, dir.path() + "/a0.txt");
    AgentProcess node1({job1, "--node-rank", "1"}, dir.path() + "/a1.txt");
    const auto code1 = node1.Wait(30s);
    ASSERT_TRUE(code1.has_value()) << node1.Output();
    EXPECT_EQ(*code1, 3) << node1.Output();
    EXPECT_THAT(node1.Output(), HasSubstr("code.script_sha256 of \"train.sh\": node 1 has \""))
        << node1.Output();
  }  // node 0, still waiting for a node 1, is stopped here
  dir.Write("n1/train.sh", "echo v1\n");
  AgentProcess node0({job0, "--node-rank", "0"}, dir.path() + "/b0.txt");
  AgentProcess node1({job1, "--node-rank", "1"}, dir.path() + "/b1.txt");
  const auto code0 = node0.Wait(30s);
  const auto code1 = node1.Wait(30s);
  ASSERT_TRUE(code0.has_value() && code1.has_value()) << node0.Output() << node1.Output();
  EXPECT_EQ(*code0, 0) << node0.Output();
  EXPECT_EQ(*code1, 0) << node1.Output();
  EXPECT_THAT(node0.Output(), HasSubstr("ddprun: code: train.sh sha256 ")) << node0.Output();
}

// job.code_check = "warn": the node with another script joins and the job runs; node 0 names
// what differs.
TEST(CliRun, CodeCheckWarnLetsANodeWithAnotherScriptJoinAndSaysSo) {
  ScratchDir dir;
  const auto [job0, job1] = TwoNodesWithTheirOwnScript(dir, "warn");
  AgentProcess node0({job0, "--node-rank", "0"}, dir.path() + "/a0.txt");
  AgentProcess node1({job1, "--node-rank", "1"}, dir.path() + "/a1.txt");
  const auto code0 = node0.Wait(30s);
  const auto code1 = node1.Wait(30s);
  ASSERT_TRUE(code0.has_value() && code1.has_value()) << node0.Output() << node1.Output();
  EXPECT_EQ(*code0, 0) << node0.Output();
  EXPECT_EQ(*code1, 0) << node1.Output();
  EXPECT_THAT(node0.Output(),
              HasSubstr("runs different code than node 0 (job.code_check = \"warn\" "
                        "lets it join):\n  code.script_sha256 of \"train.sh\": node 1 has \""))
      << node0.Output();
}

// The output of `command` run on a pseudo-terminal (util-linux `script`), or nullopt without it.
std::optional<std::string> OnTerminal(const std::string& command) {
  if (::access("/usr/bin/script", X_OK) != 0) return std::nullopt;
  FILE* pipe = ::popen(("script -qec '" + command + "' /dev/null 2>&1").c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  ::pclose(pipe);
  return out;
}

// On a terminal, errors and warnings are coloured; NO_COLOR and pipes get plain text.
TEST(CliRun, ColourOnATerminalUnlessNoColor) {
  ScratchDir dir;
  const std::string job =
      dir.Write("job.toml", SingleNodeJob("[\"sh\", \"-c\", \"exit 3\"]", FreePort()).Toml());
  const auto colour = OnTerminal(std::string(DDPRUN_BINARY) + " " + job);
  if (!colour) GTEST_SKIP() << "no `script` to run ddprun on a pseudo-terminal";
  EXPECT_THAT(*colour, HasSubstr("] \x1b[1;31merror: \x1b[0mrank 0 (local rank 0) exited with code 3"))
      << *colour;
  const auto plain = OnTerminal("NO_COLOR=1 " + std::string(DDPRUN_BINARY) + " " + job);
  ASSERT_TRUE(plain.has_value());
  EXPECT_THAT(*plain, HasSubstr("] error: rank 0 (local rank 0) exited with code 3")) << *plain;
  EXPECT_EQ(plain->find("\x1b["), std::string::npos) << *plain;
  AgentProcess piped({job}, dir.path() + "/out.txt");
  ASSERT_TRUE(piped.Wait(30s).has_value());
  EXPECT_EQ(piped.Output().find("\x1b["), std::string::npos) << piped.Output();
}

}  // namespace
}  // namespace ddprun::e2e
