// The key table (schema/keys.h) against its three readers: the loader, the --fault parser and
// the JSON Schema generator.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "schema/canonical.h"
#include "schema/json_schema.h"
#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

using testing::Diags;
using testing::Parse;

// Every key of every section written once (faults: every key in one of four faults).
constexpr std::string_view kEveryKey = R"(version = 1
[job]
name = "t"
command = ["python", "train.py"]
workdir = "."
env = { A = "1" }
code_check = "off"
preload = ["torch"]
library_check = "off"
[cluster]
nodes = ["a", "b"]
nnodes = 2
master_addr = "a"
master_port = 29500
nproc_per_node = 2
store_port = 29501
spares = ["c"]
min_nodes = 1
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 2
strategy = "ddp"
precision = "32-true"
[restart]
max_restarts = 1
backoff = "10s"
backoff_max = "1m"
never_on = ["SyntaxError", "exit:2"]
[rendezvous]
backend = "etcd"
endpoints = ["https://a:2379", "https://b:2379"]
prefix = "/jobs"
lease = "5s"
ca_file = "ca.pem"
cert_file = "client.pem"
key_file = "client-key.pem"
user = "ddprun"
probe = "warn"
[timeouts]
rendezvous = "15m"
heartbeat = "2s"
stop_grace = "30s"
progress = "5m"
progress_start = "10m"
replace = "1m"
[quarantine]
failures = 3
window = "1h"
cooldown = "30m"
[stragglers]
slower_percent = 50
window = "2m"
[logs]
dir = "logs"
console = [0]
[metrics]
listen = "0.0.0.0:9400"
ports = "per-node"
linger = "20s"
[simulate]
seed = 1
node_mtbf = "30d"
node_never_returns_percent = 10
worker_mtbf = "30d"
worker_hang_mtbf = "30d"
train_time = "10m"
checkpoint_every = "30m"
worker_startup = "20s"
step_time = "1s"
max_time = "60d"
sigterm = "ignored"
[[simulate.faults]]
at = "1m"
kind = "partition"
node = 1
duration = "30s"
peers = [0]
[[simulate.faults]]
at = "1m"
kind = "worker-exit"
local_rank = 1
exit_code = 3
[[simulate.faults]]
at = "1m"
kind = "node-crash"
reboot_after = "5m"
[[simulate.faults]]
at = "1m"
kind = "worker-slow"
percent = 100
)";

// "simulate.faults[2].node" -> "simulate.faults.node", "job.env.A" -> "job.env".
std::string TableKeyOf(std::string path) {
  for (size_t open = path.find('['); open != std::string::npos; open = path.find('[')) {
    path.erase(open, path.find(']', open) - open + 1);
  }
  if (path.starts_with("job.env.")) return "job.env";
  return path;
}

std::set<std::string> TableKeys() {
  std::set<std::string> keys;
  for (const SectionSpec& section : Sections()) {
    for (const KeySpec& key : section.keys) {
      keys.insert(section.name.empty() ? std::string(key.name)
                                       : fmt::format("{}.{}", section.name, key.name));
    }
  }
  return keys;
}

TEST(KeyTable, TheLoaderReadsExactlyTheTablesKeys) {
  auto r = Parse(kEveryKey);
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(Diags(r), "");
  std::set<std::string> read;
  for (const auto& [path, loc] : r.spec->locations) read.insert(TableKeyOf(path));
  // cluster.hosts_from excludes cluster.nodes, so it has a job of its own.
  auto slurm =
      Parse("version = 1\n[job]\nname = \"t\"\ncommand = [\"true\"]\n[cluster]\nhosts_from = \"slurm\"\n");
  ASSERT_TRUE(slurm.spec) << Diags(slurm);
  for (const auto& [path, loc] : slurm.spec->locations) read.insert(TableKeyOf(path));
  EXPECT_EQ(read, TableKeys());
}

TEST(KeyTable, KeysOutsideTheTableAreUnknown) {
  for (const SectionSpec& section : Sections()) {
    if (section.open || section.name.empty()) continue;
    // [job] and [cluster] are in the base already: defining them twice is a TOML error.
    if (section.name == "job" || section.name == "cluster") continue;
    const bool array = section.name == "simulate.faults";
    const std::string text = fmt::format("{}\n{}{}{}\nnot_a_key_here = 1\n", testing::kBaseJob,
                                         array ? "[[" : "[", section.name, array ? "]]" : "]");
    const std::string diags = Diags(Parse(text));
    EXPECT_NE(diags.find(fmt::format("unknown key `{}{}.not_a_key_here`", section.name, array ? "[0]" : "")),
              std::string::npos)
        << section.name << ":\n"
        << diags;
  }
  EXPECT_NE(Diags(Parse(testing::WithBase("not_a_key_here = 1\n")))
                .find("warning: trainer.not_a_key_here is not an argument of Lightning's Trainer"),
            std::string::npos)
      << "[trainer] accepts any name, but warns about one Lightning does not know";
}

// A job with `line` added to [cluster], or to a section of its own.
std::string JobWith(std::string_view section, std::string_view line) {
  if (section == "cluster") {
    return fmt::format(
        "version = 1\n[job]\nname = \"t\"\ncommand = [\"x\"]\n[cluster]\n"
        "nodes = [\"a\", \"b\"]\n{}\n",
        line);
  }
  return fmt::format(
      "version = 1\n[job]\nname = \"t\"\ncommand = [\"x\"]\n[cluster]\n"
      "nodes = [\"a\", \"b\"]\n[{}]\n{}\n",
      section, line);
}

TEST(KeyTable, ValuesJustOutsideARangeAreRejectedWithTheTablesRange) {
  int checked = 0;
  for (std::string_view section : {"cluster", "restart", "simulate"}) {
    for (const KeySpec& key : SectionNamed(section).keys) {
      if (key.type != KeyType::kInteger) continue;
      std::vector<int64_t> outside = {key.range->min - 1};
      if (key.range->max != IntRange{}.max) outside.push_back(key.range->max + 1);
      for (int64_t value : outside) {
        const std::string path = fmt::format("{}.{}", section, key.name);
        const std::string diags = Diags(Parse(JobWith(section, fmt::format("{} = {}", key.name, value))));
        EXPECT_NE(diags.find(fmt::format("error: {} = {} is out of range ({}..{})", path, value,
                                         key.range->min, key.range->max)),
                  std::string::npos)
            << diags;
        ++checked;
      }
      for (int64_t value : {key.range->min, std::min<int64_t>(key.range->max, 29501)}) {
        auto r = Parse(JobWith(section, fmt::format("{} = {}", key.name, value)));
        EXPECT_EQ(Diags(r).find("out of range"), std::string::npos) << Diags(r);
      }
    }
  }
  EXPECT_EQ(checked, 15);
}

TEST(KeyTable, TheFlagAndTheJobFileRejectAFaultValueJustOutsideTheTableRange) {
  // exit_code does not depend on the job, so both readers use the table's range as it is.
  const IntRange range = *Key("simulate.faults.exit_code").range;
  ASSERT_EQ(range, (IntRange{0, 255}));
  auto job_file = [](int64_t code) {
    return Parse(
        testing::WithBase(fmt::format("[[simulate.faults]]\nat = \"1m\"\n"
                                      "kind = \"worker-exit\"\nexit_code = {}\n",
                                      code)));
  };
  EXPECT_EQ(Diags(job_file(range.max + 1)),
            "15:13: error: simulate.faults[0].exit_code = 256 is out of range (0..255)\n");
  auto over = ParseFaultFlag(fmt::format("worker-exit@1m:exit_code={}", range.max + 1));
  ASSERT_FALSE(over);
  // The same sentence as the job file's, after the file's location and key path.
  EXPECT_EQ(over.error(), "exit_code = 256 is out of range (0..255)");

  EXPECT_TRUE(job_file(range.max).spec);
  auto flag = ParseFaultFlag(fmt::format("worker-exit@1m:exit_code={}", range.max));
  ASSERT_TRUE(flag) << flag.error();
  EXPECT_EQ(flag->exit_code, 255);

  // Node and local ranks: the flag knows no job and takes the table's bounds for any job.
  for (std::string_view key : {"node", "local_rank"}) {
    const int64_t max = Key(fmt::format("simulate.faults.{}", key)).range->max;
    auto at_max = ParseFaultFlag(fmt::format("worker-exit@1m:{}={}", key, max));
    EXPECT_TRUE(at_max) << at_max.error();
    auto past = ParseFaultFlag(fmt::format("worker-exit@1m:{}={}", key, max + 1));
    ASSERT_FALSE(past);
    EXPECT_EQ(past.error(), fmt::format("{} = {} is out of range (0..{})", key, max + 1, max));
  }
}

TEST(KeyTable, FaultRangesNarrowToTheJob) {
  EXPECT_EQ(FaultKeyRange("node", FaultBounds{}), (IntRange{0, kMaxNodes - 1}));
  EXPECT_EQ(FaultKeyRange("node", FaultBounds{3, 8}), (IntRange{0, 2}));
  EXPECT_EQ(FaultKeyRange("peers", FaultBounds{3, 8}), (IntRange{0, 2}));
  EXPECT_EQ(FaultKeyRange("local_rank", FaultBounds{3, 8}), (IntRange{0, 7}));
  EXPECT_EQ(FaultKeyRange("exit_code", FaultBounds{3, 8}), (IntRange{0, 255}));
}

// What a loaded job means, for comparing a file that writes a default with one that does not.
std::string Meaning(const JobSpec& spec) {
  const auto& s = spec.simulate;
  return fmt::format(
      "{}\nseed={} never={} train={} checkpoint={} startup={} step={} max={} sigterm={} console={}",
      CanonicalForm(spec), s.seed, s.node_never_returns_percent, FormatDuration(s.train_time),
      FormatDuration(s.checkpoint_every), FormatDuration(s.worker_startup), FormatDuration(s.step_time),
      FormatDuration(s.max_time), static_cast<int>(s.sigterm), static_cast<int>(spec.logs.console.mode));
}

TEST(KeyTable, DefaultsAreWhatTheLoaderUsesWhenAKeyIsLeftOut) {
  const auto without = Parse(JobWith("restart", ""));
  ASSERT_TRUE(without.spec) << Diags(without);
  int checked = 0;
  for (const SectionSpec& section : Sections()) {
    if (section.name.empty() || section.name.find('.') != std::string_view::npos) continue;
    for (const KeySpec& key : section.keys) {
      if (key.default_value.empty() || section.name == "job") continue;
      const std::string value = key.type == KeyType::kInteger ? std::string(key.default_value)
                                                              : fmt::format("\"{}\"", key.default_value);
      const auto with = Parse(JobWith(section.name, fmt::format("{} = {}", key.name, value)));
      ASSERT_TRUE(with.spec) << key.name << ": " << Diags(with);
      EXPECT_EQ(Meaning(*with.spec), Meaning(*without.spec)) << section.name << "." << key.name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 29);
  // [job] is in every file: its defaults are compared with a [job] that writes them.
  const auto job = Parse(
      "version = 1\n[job]\nname = \"t\"\ncommand = [\"x\"]\nworkdir = \".\"\n"
      "code_check = \"off\"\n[cluster]\nnodes = [\"a\", \"b\"]\n");
  ASSERT_TRUE(job.spec) << Diags(job);
  EXPECT_EQ(Meaning(*job.spec), Meaning(*without.spec));
  EXPECT_EQ(Key("job.workdir").default_value, JobSpec{}.job.workdir);
  // Fault defaults.
  const auto fault =
      Parse(testing::WithBase("[[simulate.faults]]\nat = \"1m\"\n"
                              "kind = \"worker-exit\"\nnode = 0\nexit_code = 1\n"
                              "[[simulate.faults]]\nat = \"1m\"\n"
                              "kind = \"worker-exit\"\n"));
  ASSERT_TRUE(fault.spec) << Diags(fault);
  EXPECT_EQ(fault.spec->simulate.faults[0], fault.spec->simulate.faults[1]);
  EXPECT_EQ(Key("simulate.faults.exit_code").default_value, std::to_string(FaultSpec{}.exit_code));
}

// The JSON Schema's entry for `path`, walking [[simulate.faults]] through its items.
nlohmann::json SchemaOf(const nlohmann::json& schema, std::string_view path) {
  nlohmann::json node = schema;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string name(path.substr(start, dot - start));
    node = node["properties"][name];
    if (node.contains("items") && node["items"].contains("properties")) node = node["items"];
    if (dot == std::string_view::npos) return node;
    start = dot + 1;
  }
}

TEST(KeyTable, TheJsonSchemaHasTheTablesRangesValuesAndDefaults) {
  const auto schema = nlohmann::json::parse(JobFileJsonSchema());
  for (const std::string& path : TableKeys()) {
    const KeySpec& key = Key(path);
    const nlohmann::json s = SchemaOf(schema, path);
    ASSERT_TRUE(s.is_object()) << path;
    if (key.type == KeyType::kInteger && key.range->min != key.range->max) {
      EXPECT_EQ(s["minimum"], key.range->min) << path;
      if (key.range->max != IntRange{}.max) {
        EXPECT_EQ(s["maximum"], key.range->max) << path;
      }
    }
    if (key.type == KeyType::kString && !key.values.empty()) {
      EXPECT_EQ(s["enum"].size(), key.values.size()) << path;
    }
    if (key.type != KeyType::kSection) {
      EXPECT_TRUE(s.contains("description")) << path;
    }
    EXPECT_EQ(s.contains("default"), !key.default_value.empty()) << path;
  }
  EXPECT_EQ(SchemaOf(schema, "trainer.devices")["oneOf"][0]["maximum"], kMaxProcsPerNode);
  EXPECT_EQ(SchemaOf(schema, "simulate.faults.kind")["enum"][0], "node-crash");
}

TEST(KeyTable, NoHeaderOtherLayersIncludePullsInTomlPlusPlus) {
  namespace fs = std::filesystem;
  // The loader's internal headers; only schema/*.cc that parse include them.
  const std::set<std::string> internal = {"toml_access.h", "sections.h"};
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(fs::path(DDPRUN_SOURCE_DIR) / "schema")) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".h") || internal.contains(name)) continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    for (std::string_view include :
         {"#include <toml++", "#include \"schema/toml_access.h\"", "#include \"schema/sections.h\""}) {
      if (text.str().find(include) != std::string::npos) found.push_back(name);
    }
  }
  EXPECT_EQ(found, std::vector<std::string>{});
}

}  // namespace
}  // namespace ddprun
