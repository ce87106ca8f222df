// The real `ddprun job.toml` seen from the worker: a single-node job runs without --node-rank,
// and every [trainer] value reaches Python as a literal of the TOML value's own type.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// One node, one worker; `command` is the TOML array; `trainer` is appended under [trainer].
std::string SingleNodeJob(const std::string& command, const std::string& trainer,
                          uint16_t port) {
  std::ostringstream t;
  t << "version = 1\n[job]\nname = \"single\"\ncommand = " << command << "\n"
    << "[cluster]\nnnodes = 1\nmaster_addr = \"127.0.0.1\"\nmaster_port = " << port << "\n"
    << "[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = 1\n"
    << trainer << "[timeouts]\nrendezvous = \"10s\"\nheartbeat = \"250ms\"\nstop_grace = \"2s\"\n";
  return t.str();
}

TEST(CliRun, SingleNodeJobRunsAsNodeZeroWithoutNodeRank) {
  ScratchDir dir;
  const std::string job =
      dir.Write("job.toml", SingleNodeJob("[\"sh\", \"-c\", \"echo node=$NODE_RANK\"]", "",
                                          FreePort()));
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
  const std::string job = dir.Write(
      "job.toml", SingleNodeJob("[\"python3\", \"check.py\", \"job.toml\"]", trainer, FreePort()));
  AgentProcess agent({job}, dir.path() + "/out.txt");
  const auto code = agent.Wait(30s);
  ASSERT_TRUE(code.has_value()) << agent.Output();
  EXPECT_EQ(*code, 0) << agent.Output();
  EXPECT_THAT(agent.Output(), HasSubstr("checked 23 keys, 0 mismatches")) << agent.Output();
}

}  // namespace
}  // namespace ddprun::e2e
