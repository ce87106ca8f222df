// Job file rules: every check of schema/loader.cc with its exact message, location and hint.
#include <gtest/gtest.h>

#include "schema/canonical.h"
#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

using testing::Diags;
using testing::Parse;
using testing::WithBase;

TEST(Loader, BaseJobIsValidWithDefaults) {
  auto r = Parse(testing::kBaseJob);
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(Diags(r), "");
  const JobSpec& s = *r.spec;
  EXPECT_EQ(s.job.name, "t");
  EXPECT_EQ(s.job.command, (std::vector<std::string>{"python", "train.py"}));
  EXPECT_EQ(s.job.workdir, ".");
  EXPECT_EQ(s.cluster.nnodes, 2);
  EXPECT_EQ(s.cluster.master_addr, "a");  // default: nodes[0]
  EXPECT_EQ(s.cluster.master_port, 29500);
  EXPECT_EQ(s.cluster.nproc_per_node, 2);  // default: trainer.devices
  EXPECT_FALSE(s.cluster.store_port);
  EXPECT_EQ(s.restart.max_restarts, 0);
  EXPECT_EQ(s.restart.backoff, Seconds(10));
  EXPECT_EQ(s.timeouts.rendezvous, Minutes(15));
  EXPECT_EQ(s.timeouts.heartbeat, Seconds(2));
  EXPECT_EQ(s.timeouts.stop_grace, Seconds(30));
  EXPECT_EQ(s.logs.dir, "logs");
  EXPECT_EQ(s.logs.console.mode, ConsoleFilter::Mode::kAll);
  EXPECT_EQ(s.WorldSize(), 4);
  EXPECT_EQ(s.source_name, "job.toml");
  EXPECT_EQ(s.LocationOf("cluster.master_port"), (SourceLoc{7, 15}));
  EXPECT_EQ(s.LocationOf("job.command[1]"), (SourceLoc{4, 22}));
  EXPECT_EQ(s.LocationOf("cluster.master_addr"), (SourceLoc{}));
  ASSERT_EQ(s.trainer.settings.size(), 3u);
  EXPECT_EQ(s.trainer.settings[0].first, "accelerator");  // file order
  EXPECT_EQ(s.trainer.settings[1].first, "devices");
  EXPECT_EQ(s.trainer.settings[2].first, "num_nodes");
}

TEST(Loader, NnodesWithoutTrainerDefaultsToOneProcessAndLoopback) {
  auto r = Parse("version = 1\n[job]\nname = \"j\"\ncommand = [\"./run.sh\"]\n[cluster]\nnnodes = 3\n");
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(r.spec->cluster.nnodes, 3);
  EXPECT_TRUE(r.spec->cluster.nodes.empty());
  EXPECT_EQ(r.spec->cluster.nproc_per_node, 1);
  EXPECT_EQ(r.spec->cluster.master_addr, "127.0.0.1");
}

TEST(Loader, EmptyFileReportsEveryRequiredKey) {
  auto r = Parse("");
  EXPECT_FALSE(r.spec);
  EXPECT_EQ(Diags(r),
            "0:0: error: missing required key `version`\n"
            "  hint: add `version = 1` at the top of the file\n"
            "0:0: error: missing required table [job]\n"
            "  hint: add [job] with name = \"my-job\" and command = [\"python\", \"train.py\"]\n"
            "0:0: error: missing required table [cluster]\n"
            "  hint: add [cluster] with nodes = [\"host-a\", \"host-b\"] (or nnodes = 2)\n");
}

TEST(Loader, VersionMustBeOne) {
  auto r = Parse("version = 2\n" + std::string(testing::kBaseJob.substr(12)));
  EXPECT_EQ(Diags(r),
            "1:11: error: unsupported job file version 2\n"
            "  hint: this ddprun reads version 1; write `version = 1` or upgrade ddprun\n");
}

TEST(Loader, MissingNameAndCommandPointAtJobTable) {
  auto r = Parse("version = 1\n[job]\n[cluster]\nnnodes = 1\n");
  EXPECT_EQ(Diags(r),
            "2:1: error: missing required key `job.name`\n"
            "  hint: add name = \"my-job\" under [job]\n"
            "2:1: error: missing required key `job.command`\n"
            "  hint: add command = [\"python\", \"train.py\"] under [job]\n");
}

TEST(Loader, JobNameCharacters) {
  auto r = Parse("version = 1\n[job]\nname = \"my job\"\ncommand = [\"x\"]\n[cluster]\nnnodes = 1\n");
  EXPECT_EQ(Diags(r),
            "3:8: error: job.name = \"my job\" is not a valid job name\n"
            "  hint: use 1 to 128 letters, digits, '.', '_' or '-' (it names the run id and the "
            "log folder)\n");
}

TEST(Loader, CommandMustBeANonEmptyArrayOfStrings) {
  EXPECT_EQ(Diags(Parse("version = 1\n[job]\nname = \"j\"\ncommand = \"python train.py\"\n"
                        "[cluster]\nnnodes = 1\n")),
            "4:11: error: job.command must be an array of strings, not a string\n"
            "  hint: write the command as a list of arguments, e.g. [\"python\", \"train.py\"]\n");
  EXPECT_EQ(Diags(Parse("version = 1\n[job]\nname = \"j\"\ncommand = []\n[cluster]\nnnodes = 1\n")),
            "4:11: error: job.command must not be empty\n"
            "  hint: e.g. command = [\"python\", \"train.py\"]\n");
  EXPECT_EQ(Diags(Parse("version = 1\n[job]\nname = \"j\"\ncommand = [\"python\", 90]\n"
                        "[cluster]\nnnodes = 1\n")),
            "4:22: error: job.command[1] must be a string, not an integer\n"
            "  hint: quote it: \"90\"\n");
}

TEST(Loader, UnknownKeysEverywhereWithSuggestions) {
  auto r = Parse(
      "version = 1\nnmae = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\ncomand = 1\n"
      "[cluster]\nnnodes = 1\nnproc_per_nod = 2\ndevices = 2\nzzzzzzzz = 1\n[clustr]\n");
  EXPECT_EQ(Diags(r),
            "2:1: error: unknown key `nmae`\n"
            "  hint: did you mean `job.name`?\n"
            "6:1: error: unknown key `job.comand`\n"
            "  hint: did you mean `command`?\n"
            "9:1: error: unknown key `cluster.nproc_per_nod`\n"
            "  hint: did you mean `nproc_per_node`?\n"
            "10:1: error: unknown key `cluster.devices`\n"
            "  hint: `devices` belongs in [trainer]: did you mean `trainer.devices`?\n"
            "11:1: error: unknown key `cluster.zzzzzzzz`\n"
            "  hint: known keys in [cluster]: nodes, hosts_from, nnodes, master_addr, master_port, "
            "nproc_per_node, store_port, spares, min_nodes\n"
            "12:2: error: unknown table [clustr]\n"
            "  hint: did you mean [cluster]?\n");
}

TEST(Loader, NodesOrNnodesRequired) {
  auto r = Parse("version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nmaster_port = 1234\n");
  EXPECT_EQ(Diags(r),
            "5:1: error: [cluster] needs either `nodes` or `nnodes`\n"
            "  hint: list the hosts, nodes = [\"gpu-01\", \"gpu-02\"], or give their number, "
            "nnodes = 2\n");
}

TEST(Loader, DuplicateNodePointsAtSecondWithNoteAtFirst) {
  auto r = Parse(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
      "nodes = [\"gpu-01\", \"gpu-02\", \"gpu-01\"]\n");
  EXPECT_EQ(Diags(r),
            "6:30: error: host \"gpu-01\" is listed twice in cluster.nodes (nodes 0 and 2)\n"
            "  hint: each node runs one agent; list every host once\n"
            "  note 6:10: first listed here as node 0\n");
}

TEST(Loader, NodesMustBeHostNames) {
  auto r = Parse(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
      "nodes = [\"gpu 01\", \"\", \"10.0.0.300\"]\n");
  EXPECT_EQ(Diags(r),
            "6:10: error: cluster.nodes[0] = \"gpu 01\" is neither an IP address nor a host name\n"
            "  hint: write an address like \"10.10.10.16\" or a host name like \"gpu-01\"\n"
            "6:20: error: cluster.nodes[1] must not be empty\n"
            "6:24: error: cluster.nodes[2] = \"10.0.0.300\" is neither an IP address nor a host "
            "name\n"
            "  hint: write an address like \"10.10.10.16\" or a host name like \"gpu-01\"\n");
}

TEST(Loader, NnodesMustAgreeWithNodes) {
  auto r = Parse(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
      "nodes = [\"a\", \"b\"]\nnnodes = 3\n");
  EXPECT_EQ(Diags(r),
            "7:10: error: cluster.nnodes = 3 does not match the 2 hosts of cluster.nodes\n"
            "  hint: remove cluster.nnodes (it is len(cluster.nodes)) or set it to 2\n");
  EXPECT_TRUE(Parse("version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
                    "nodes = [\"a\", \"b\"]\nnnodes = 2\n")
                  .spec);
}

TEST(Loader, NnodesMustBePositive) {
  auto r = Parse("version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nnnodes = 0\n");
  EXPECT_EQ(Diags(r), "6:10: error: cluster.nnodes = 0 is out of range (1..10000)\n");
}

TEST(Loader, MasterAddrRules) {
  const std::string head = "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n";
  EXPECT_EQ(Diags(Parse(head + "nodes = [\"a\", \"b\"]\nmaster_addr = \"10.1.1.1\"\n")),
            "7:15: warning: cluster.master_addr = \"10.1.1.1\" is not one of cluster.nodes\n"
            "  hint: it must be an address of node 0 (\"a\"), where the coordinator listens; "
            "ddprun cannot check that\n");
  EXPECT_EQ(Diags(Parse(head + "nodes = [\"a\", \"b\"]\nmaster_addr = \"b\"\n")),
            "7:15: error: cluster.master_addr = \"b\" is node 1, but node 0 (\"a\") hosts the "
            "coordinator\n"
            "  hint: list \"b\" first in cluster.nodes, or set master_addr to an address of "
            "\"a\"\n");
  EXPECT_EQ(Diags(Parse(head + "nnodes = 2\nmaster_addr = \"bad host!\"\n")),
            "7:15: error: cluster.master_addr = \"bad host!\" is neither an IP address nor a "
            "host name\n"
            "  hint: write an address like \"10.10.10.16\" or a host name like \"gpu-01\" (IPv6 "
            "without brackets)\n");
  auto v6 = Parse(head + "nnodes = 2\nmaster_addr = \"fd00::1\"\n");
  ASSERT_TRUE(v6.spec) << Diags(v6);
  EXPECT_EQ(v6.spec->cluster.master_addr, "fd00::1");
  auto same = Parse(head + "nodes = [\"a\", \"b\"]\nmaster_addr = \"a\"\n");
  EXPECT_EQ(Diags(same), "");
}

TEST(Loader, Ports) {
  const std::string head = "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nnnodes = 1\n";
  EXPECT_EQ(Diags(Parse(head + "master_port = 70000\n")),
            "7:15: error: cluster.master_port = 70000 is out of range (1..65535)\n");
  EXPECT_EQ(Diags(Parse(head + "master_port = \"50000\"\n")),
            "7:15: error: cluster.master_port must be an integer, not a string\n"
            "  hint: write the number without quotes: master_port = 50000\n");
  EXPECT_EQ(Diags(Parse(head + "master_port = 443\n")),
            "7:15: warning: cluster.master_port = 443 is a privileged port\n"
            "  hint: binding it needs root; ports 1024..65535 do not\n");
  EXPECT_EQ(Diags(Parse(head + "master_port = 50000\nstore_port = 50000\n")),
            "8:14: error: cluster.store_port = 50000 is the same as cluster.master_port\n"
            "  hint: the store needs a port of its own; remove store_port to relay the store "
            "through master_port\n");
  auto ok = Parse(head + "master_port = 50000\nstore_port = 50001\n");
  ASSERT_TRUE(ok.spec);
  EXPECT_EQ(ok.spec->cluster.store_port, std::optional<uint16_t>(50001));
}

TEST(Loader, NprocPerNodeMustMatchDevices) {
  auto r = Parse(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nnnodes = 2\n"
      "nproc_per_node = 4\n[trainer]\ndevices = 8\nnum_nodes = 2\n");
  EXPECT_EQ(Diags(r),
            "7:18: error: cluster.nproc_per_node = 4 does not match trainer.devices = 8\n"
            "  hint: set trainer.devices = 4 or cluster.nproc_per_node = 8\n");
}

TEST(Loader, DevicesAsListOfIds) {
  auto r = Parse(WithBase("").replace(WithBase("").find("devices = 2"), 11, "devices = [2, 3]"));
  ASSERT_TRUE(r.spec == std::nullopt);  // cpu takes a count, not ids
  EXPECT_EQ(Diags(r),
            "10:11: error: trainer.devices lists device ids, but accelerator = \"cpu\" takes a "
            "count\n"
            "  hint: write devices = 2\n");
  auto gpu = Parse(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nnnodes = 1\n"
      "[trainer]\naccelerator = \"gpu\"\ndevices = [2, 3]\nnum_nodes = 1\n");
  ASSERT_TRUE(gpu.spec) << Diags(gpu);
  EXPECT_EQ(gpu.spec->trainer.devices, 2);
  EXPECT_EQ(gpu.spec->trainer.device_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(gpu.spec->cluster.nproc_per_node, 2);
}

TEST(Loader, DevicesRejectsAutoAllDuplicatesAndZero) {
  const std::string head =
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
      "nnodes = 1\n[trainer]\nnum_nodes = 1\n";
  EXPECT_EQ(Diags(Parse(head + "devices = \"auto\"\n")),
            "9:11: error: trainer.devices = \"auto\" is not supported\n"
            "  hint: ddprun starts one process per device and must know how many: set an "
            "explicit count, e.g. devices = 8\n");
  EXPECT_EQ(Diags(Parse(head + "devices = -1\n")),
            "9:11: error: trainer.devices = -1 (all devices) is not supported\n"
            "  hint: ddprun starts one process per device and must know how many: set an "
            "explicit count, e.g. devices = 8\n");
  EXPECT_EQ(Diags(Parse(head + "devices = 0\n")),
            "9:11: error: trainer.devices = 0 is out of range (1..1024)\n");
  EXPECT_EQ(Diags(Parse(head + "devices = [0, 1, 0]\n")),
            "9:18: error: device id 0 is listed twice in trainer.devices\n"
            "  note 9:12: first listed here\n");
  EXPECT_EQ(Diags(Parse(head + "devices = \"0,1\"\n")),
            "9:11: error: trainer.devices = \"0,1\" is not a device count\n"
            "  hint: write a count (devices = 8) or a list of device ids (devices = [0, 1])\n");
}

TEST(Loader, NumNodesRules) {
  const std::string head = "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n";
  EXPECT_EQ(Diags(Parse(head + "nodes = [\"a\", \"b\"]\n[trainer]\nnum_nodes = 3\n")),
            "8:13: error: trainer.num_nodes = 3 does not match the 2 hosts of cluster.nodes\n"
            "  hint: set trainer.num_nodes = 2 or list 3 hosts in cluster.nodes\n");
  EXPECT_EQ(Diags(Parse(head + "nnodes = 2\n[trainer]\nnum_nodes = 3\n")),
            "8:13: error: trainer.num_nodes = 3 does not match cluster.nnodes = 2\n"
            "  hint: set trainer.num_nodes = 2 or cluster.nnodes = 3\n");
  EXPECT_EQ(Diags(Parse(head + "nnodes = 1\n[trainer]\nnum_nodes = 0\n")),
            "8:13: error: trainer.num_nodes must be a positive integer, not 0\n"
            "  hint: Lightning requires num_nodes >= 1\n");
  EXPECT_EQ(Diags(Parse(head + "nnodes = 1\n[trainer]\nnum_nodes = 1.5\n")),
            "8:13: error: trainer.num_nodes must be a positive integer, not 1.5\n"
            "  hint: Lightning requires num_nodes >= 1\n");
  EXPECT_EQ(Diags(Parse(head + "nnodes = 2\n[trainer]\ndevices = 1\n")),
            "7:1: warning: [trainer] does not set num_nodes; Lightning's Trainer() then uses 1 "
            "and rejects WORLD_SIZE = 2\n"
            "  hint: add num_nodes = 2 under [trainer]\n");
}

TEST(Loader, Strategies) {
  const std::string head =
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
      "nnodes = 1\n[trainer]\nnum_nodes = 1\n";
  for (const char* ok : {"ddp", "ddp_find_unused_parameters_true", "ddp_find_unused_parameters_false", "fsdp",
                         "deepspeed_stage_2", "auto"}) {
    EXPECT_EQ(Diags(Parse(head + "strategy = \"" + ok + "\"\n")), "") << ok;
  }
  EXPECT_EQ(Diags(Parse(head + "strategy = \"ddp_spawn\"\n")),
            "9:12: error: trainer.strategy = \"ddp_spawn\" starts its own worker processes\n"
            "  hint: ddprun starts one process per device; use strategy = \"ddp\"\n");
  EXPECT_EQ(Diags(Parse(head + "strategy = \"ddp_notebook_find_unused_parameters_true\"\n")),
            "9:12: error: trainer.strategy = \"ddp_notebook_find_unused_parameters_true\" starts "
            "its own worker processes\n"
            "  hint: ddprun starts one process per device; use strategy = "
            "\"ddp_find_unused_parameters_true\"\n");
  EXPECT_EQ(Diags(Parse(head + "strategy = \"ddp_fork\"\n")),
            "9:12: error: trainer.strategy = \"ddp_fork\" starts its own worker processes\n"
            "  hint: ddprun starts one process per device; use strategy = \"ddp\"\n");
  EXPECT_EQ(Diags(Parse(head + "strategy = \"dp\"\n")),
            "9:12: error: trainer.strategy = \"dp\" runs in a single process on one node\n"
            "  hint: use strategy = \"ddp\" for multi-node training\n");
  EXPECT_EQ(Diags(Parse(head + "strategy = \"dpp\"\n")),
            "9:12: warning: unknown strategy \"dpp\": ddprun cannot tell whether it works with "
            "an external launcher\n"
            "  hint: did you mean \"ddp\"?\n");
}

TEST(Loader, Accelerators) {
  const std::string head =
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
      "nnodes = 1\n[trainer]\nnum_nodes = 1\n";
  for (const char* ok : {"cpu", "gpu", "cuda", "auto"}) {
    EXPECT_EQ(Diags(Parse(head + "accelerator = \"" + ok + "\"\n")), "") << ok;
  }
  EXPECT_EQ(Diags(Parse(head + "accelerator = \"tpu\"\n")),
            "9:15: error: trainer.accelerator = \"tpu\" is not supported\n"
            "  hint: TPU jobs start their processes through XLA, not through a DDP launcher\n");
  EXPECT_EQ(Diags(Parse(head + "accelerator = \"mps\"\n")),
            "9:15: warning: trainer.accelerator = \"mps\" has one device per machine and no "
            "multi-node backend\n"
            "  hint: use \"cpu\" for a multi-node test on Macs\n");
  EXPECT_EQ(Diags(Parse(head + "accelerator = \"gpus\"\n")),
            "9:15: error: unknown accelerator \"gpus\"\n"
            "  hint: did you mean \"gpu\"?\n");
}

TEST(Loader, OtherTrainerKeysAreForwardedTyped) {
  auto r =
      Parse(WithBase("precision = \"bf16-mixed\"\nmax_epochs = 90\ndeterministic = true\n"
                     "gradient_clip_val = 0.5\n"));
  ASSERT_TRUE(r.spec) << Diags(r);
  const auto& s = r.spec->trainer.settings;
  ASSERT_EQ(s.size(), 7u);
  EXPECT_EQ(s[3].first, "precision");
  EXPECT_EQ(s[3].second, TrainerValue{std::string("bf16-mixed")});
  EXPECT_EQ(s[4].second, TrainerValue{int64_t{90}});
  EXPECT_EQ(s[5].second, TrainerValue{true});
  EXPECT_EQ(s[6].second, TrainerValue{0.5});
}

TEST(Loader, TrainerTablesArraysDatesAndUnknownArgs) {
  // Inline tables and mixed arrays are forwarded as Python dicts and lists.
  auto r = Parse(WithBase("max_time = { hours = 5, days = 1 }\nplugins = [1, \"a\", 0.5]\n"));
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(r.spec->trainer.settings[3].second,
            (TrainerValue{TrainerLiteral{"{'days': 1, 'hours': 5}", "{\"days\" = 1, \"hours\" = 5}"}}));
  EXPECT_EQ(r.spec->trainer.settings[4].second,
            (TrainerValue{TrainerLiteral{"[1, 'a', 0.5]", "[1, \"a\", 0.5f]"}}));
  auto nested = Parse(WithBase("plugins = [[1, 2], { k = [true, \"x\"] }, 1.0]\n"));
  ASSERT_TRUE(nested.spec) << Diags(nested);
  EXPECT_EQ(nested.spec->trainer.settings[3].second,
            (TrainerValue{TrainerLiteral{"[[1, 2], {'k': [True, 'x']}, 1.0]",
                                         "[[1, 2], {\"k\" = [true, \"x\"]}, 1f]"}}));
  EXPECT_EQ(Diags(Parse(WithBase("logger = { at = 1979-05-27 }\nmax_epoch = 3\n"
                                 "val_check_interval = [1.0, inf]\n"))),
            "12:17: error: trainer.logger.at must be a boolean, number, string, array or table, "
            "not a date\n"
            "  hint: [trainer] values reach the script as PL_TRAINER_* Python literals, which "
            "have no dates or times; write it as a string\n"
            "13:13: warning: trainer.max_epoch is not an argument of Lightning's Trainer; "
            "Lightning ignores PL_TRAINER_MAX_EPOCH\n"
            "  hint: did you mean `max_epochs`?\n"
            "14:28: error: trainer.val_check_interval[1] must be a finite number\n"
            "  hint: inf and nan have no Python literal, so Lightning would read them as "
            "strings\n");
}

TEST(Loader, Restart) {
  EXPECT_EQ(Diags(Parse(WithBase("[restart]\nmax_restarts = -1\n"))),
            "13:16: error: restart.max_restarts = -1 is out of range (0..10000)\n");
  auto r = Parse(WithBase("[restart]\nmax_restarts = 3\nbackoff = \"1m30s\"\n"));
  ASSERT_TRUE(r.spec);
  EXPECT_EQ(r.spec->restart.max_restarts, 3);
  EXPECT_EQ(r.spec->restart.backoff, Seconds(90));
}

TEST(Loader, Durations) {
  EXPECT_EQ(Diags(Parse(WithBase("[timeouts]\nheartbeat = 30\n"))),
            "13:13: error: timeouts.heartbeat must be a duration string, not an integer\n"
            "  hint: write \"30s\" (units: ms, s, m, h, d; e.g. \"250ms\", \"30s\", \"15m\")\n");
  EXPECT_EQ(Diags(Parse(WithBase("[timeouts]\nstop_grace = \"30 sec\"\n"))),
            "13:14: error: timeouts.stop_grace = \"30 sec\" is not a duration\n"
            "  hint: write a number and a unit, without spaces (units: ms, s, m, h, d; e.g. "
            "\"250ms\", \"30s\", \"15m\")\n");
}

TEST(Loader, TimeoutConsistency) {
  EXPECT_EQ(Diags(Parse(WithBase("[timeouts]\nheartbeat = \"0s\"\n"))),
            "13:13: error: timeouts.heartbeat must be longer than 0s\n"
            "  hint: e.g. heartbeat = \"2s\"\n");
  EXPECT_EQ(Diags(Parse(WithBase("[timeouts]\nrendezvous = \"1m\"\nheartbeat = \"20s\"\n"))),
            "14:13: error: timeouts.heartbeat = 20s is too long for timeouts.rendezvous = 1m: a "
            "node is declared lost after 3 missed beats (1m)\n"
            "  hint: make 3 x heartbeat shorter than rendezvous: e.g. heartbeat = \"6s\", or "
            "rendezvous = \"3m20s\"\n");
  // The hint must itself satisfy the rule (it suggested heartbeat = "2s" here).
  EXPECT_EQ(Diags(Parse(WithBase("[timeouts]\nrendezvous = \"6s\"\nheartbeat = \"2s\"\n"
                                 "stop_grace = \"1s\"\n[restart]\nbackoff = \"1s\"\n"))),
            "14:13: error: timeouts.heartbeat = 2s is too long for timeouts.rendezvous = 6s: a "
            "node is declared lost after 3 missed beats (6s)\n"
            "  hint: make 3 x heartbeat shorter than rendezvous: e.g. heartbeat = \"600ms\", or "
            "rendezvous = \"20s\"\n");
  // Only rendezvous written: the heartbeat is the default, named so, at the rendezvous line.
  EXPECT_EQ(Diags(Parse(WithBase("[timeouts]\nrendezvous = \"5s\"\nstop_grace = \"1s\"\n"
                                 "[restart]\nbackoff = \"1s\"\n"))),
            "13:14: error: timeouts.rendezvous = 5s is too short for the default "
            "timeouts.heartbeat = 2s (not set in this file): a node is declared lost after 3 "
            "missed beats (6s)\n"
            "  hint: make 3 x heartbeat shorter than rendezvous: e.g. heartbeat = \"500ms\", or "
            "rendezvous = \"20s\"\n");
  // A default the user never wrote is named as a default, at the setting they did write.
  EXPECT_EQ(Diags(Parse(WithBase("[timeouts]\nrendezvous = \"20s\"\n"))),
            "13:14: warning: the default timeouts.stop_grace = 30s is longer than "
            "timeouts.rendezvous = 20s\n"
            "  hint: other nodes may give up on the next round while this one still waits for "
            "its workers to stop; set timeouts.stop_grace shorter, or rendezvous longer\n");
  EXPECT_EQ(Diags(Parse(WithBase("[timeouts]\nrendezvous = \"1m\"\nstop_grace = \"2m\"\n"))),
            "14:14: warning: timeouts.stop_grace = 2m is longer than timeouts.rendezvous = 1m\n"
            "  hint: other nodes may give up on the next round while this one still waits for "
            "its workers to stop\n");
  EXPECT_EQ(Diags(Parse(WithBase("[restart]\nbackoff = \"20m\"\n"))),
            "13:11: warning: restart.backoff = 20m is not shorter than timeouts.rendezvous = "
            "15m\n"
            "  hint: nodes wait for the backoff before rejoining; keep it well under the "
            "rendezvous timeout\n");
}

// Hints must themselves be valid: no `nnodes = 2:4` (not TOML), no `timeouts.rendezvous` as
// a table name.
TEST(Loader, HintsThatWork) {
  const std::string head = "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n";
  EXPECT_EQ(Diags(Parse(head + "nnodes = \"2:4\"\n")),
            "6:10: error: cluster.nnodes must be an integer, not a string\n"
            "  hint: nnodes is a number, not torchrun's MIN:MAX range: write nnodes = 4 and "
            "min_nodes = 2 (cluster.min_nodes lets rounds run with fewer nodes when some are "
            "lost)\n");
  EXPECT_EQ(Diags(Parse(head + "nnodes = \"two\"\n")),
            "6:10: error: cluster.nnodes must be an integer, not a string\n");
  EXPECT_EQ(Diags(Parse(head + "nnodes = 1\n[rendezvous]\ntimeout = \"5m\"\n")),
            "8:1: error: unknown key `rendezvous.timeout`\n"
            "  hint: known keys in [rendezvous]: backend, endpoints, prefix, lease, ca_file, "
            "cert_file, key_file, user, probe; `rendezvous` is also a key of [timeouts]: "
            "`timeouts.rendezvous`\n");
  // A table named after a key that has no table of its own still says where the key goes.
  EXPECT_EQ(Diags(Parse(head + "nnodes = 1\n[heartbeat]\nevery = \"5s\"\n")),
            "7:2: error: unknown table [heartbeat]\n"
            "  hint: there is no [heartbeat] table; `heartbeat` is a key of [timeouts]: write "
            "`heartbeat = ...` under [timeouts]\n");
}

TEST(Loader, RestartBackoffDoublesUpToBackoffMax) {
  auto r =
      Parse(WithBase("[restart]\nmax_restarts = 9\nbackoff = \"10s\"\n"
                     "backoff_max = \"1m\"\n"));
  ASSERT_TRUE(r.spec) << Diags(r);
  std::vector<std::string> waits;
  for (int n = 1; n <= 6; ++n) waits.push_back(FormatDuration(r.spec->RestartBackoff(n)));
  EXPECT_EQ(waits, (std::vector<std::string>{"10s", "20s", "40s", "1m", "1m", "1m"}));
  EXPECT_EQ(r.spec->RestartBackoff(1'000'000), Seconds(60));
  auto constant = Parse(WithBase("[restart]\nbackoff = \"10s\"\n"));
  ASSERT_TRUE(constant.spec);
  EXPECT_EQ(constant.spec->RestartBackoff(5), Seconds(10));
  EXPECT_EQ(Diags(Parse(WithBase("[restart]\nbackoff = \"10s\"\nbackoff_max = \"5s\"\n"))),
            "14:15: error: restart.backoff_max = 5s is shorter than restart.backoff = 10s\n"
            "  hint: backoff is the first wait and backoff_max the longest; the wait doubles "
            "after each restart between the two\n");
}

TEST(Loader, Logs) {
  auto r = Parse(WithBase("[logs]\ndir = \"/var/log/ddp\"\nconsole = [3, 0]\n"));
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(r.spec->logs.dir, "/var/log/ddp");
  EXPECT_EQ(r.spec->logs.console.mode, ConsoleFilter::Mode::kRanks);
  EXPECT_EQ(r.spec->logs.console.ranks, (std::vector<int>{0, 3}));
  EXPECT_TRUE(r.spec->logs.console.Shows(3));
  EXPECT_FALSE(r.spec->logs.console.Shows(1));
  EXPECT_EQ(Diags(Parse(WithBase("[logs]\nconsole = [4]\n"))),
            "13:12: error: logs.console[0] = 4 is out of range (0..3)\n");
  EXPECT_EQ(Diags(Parse(WithBase("[logs]\nconsole = \"some\"\n"))),
            "13:11: error: logs.console = \"some\" is not a console filter\n"
            "  hint: write \"all\", \"none\" or a list of global ranks, e.g. [0]\n");
  auto none = Parse(WithBase("[logs]\nconsole = \"none\"\n"));
  ASSERT_TRUE(none.spec);
  EXPECT_FALSE(none.spec->logs.console.Shows(0));
}

TEST(Loader, MetricsAreOffUnlessListenIsSet) {
  auto off = Parse(testing::kBaseJob);
  ASSERT_TRUE(off.spec);
  EXPECT_FALSE(off.spec->metrics.Served());
  auto r = Parse(WithBase("[metrics]\nlisten = \"0.0.0.0:9400\"\n"));
  ASSERT_TRUE(r.spec) << Diags(r);
  EXPECT_EQ(Diags(r), "");
  EXPECT_EQ(r.spec->metrics.addr, "0.0.0.0");
  EXPECT_EQ(r.spec->metrics.port, 9400);
  EXPECT_EQ(r.spec->metrics.Listen(), "0.0.0.0:9400");
  EXPECT_EQ(r.spec->MetricsAddressOf(1), "0.0.0.0");
  EXPECT_EQ(r.spec->LocationOf("metrics.listen"), (SourceLoc{13, 10}));
  // "*": each node's own entry of cluster.nodes.
  auto own = Parse(WithBase("[metrics]\nlisten = \"*:9400\"\n"));
  ASSERT_TRUE(own.spec) << Diags(own);
  EXPECT_EQ(own.spec->MetricsAddressOf(0), "a");
  EXPECT_EQ(own.spec->MetricsAddressOf(1), "b");
  EXPECT_EQ(own.spec->metrics.Listen(), "*:9400");
  // A spare listens on its own entry of cluster.spares (its agent number follows the nodes).
  auto spare = Parse(
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\n"
      "nodes = [\"a\", \"b\"]\nspares = [\"c\"]\n[metrics]\nlisten = \"*:9400\"\n");
  ASSERT_TRUE(spare.spec) << Diags(spare);
  EXPECT_EQ(spare.spec->MetricsAddressOf(2), "c");
  auto v6 = Parse(WithBase("[metrics]\nlisten = \"[::]:9400\"\n"));
  ASSERT_TRUE(v6.spec) << Diags(v6);
  EXPECT_EQ(v6.spec->metrics.addr, "::");
  EXPECT_EQ(v6.spec->metrics.Listen(), "[::]:9400");
  // Loopback on every node: one URL for all of them, which agents sharing a host cannot all serve.
  auto loopback = Parse(WithBase("[metrics]\nlisten = \"127.0.0.1:9400\"\n"));
  EXPECT_EQ(Diags(loopback),
            "13:10: warning: metrics.listen = \"127.0.0.1:9400\": every node is listed at "
            "http://127.0.0.1:9400/metrics; agents that share a host cannot both listen there\n"
            "  hint: set metrics.ports = \"per-node\" (node k listens on port 9400 + k), or listen on "
            "\"*:9400\" or \"0.0.0.0:9400\" when each node has a host of its own\n");
  EXPECT_EQ(loopback.spec->metrics.linger, Seconds(15));
  auto per_node =
      Parse(WithBase("[metrics]\nlisten = \"127.0.0.1:9400\"\nports = \"per-node\"\nlinger = \"0s\"\n"));
  EXPECT_EQ(Diags(per_node), "");
  EXPECT_EQ(per_node.spec->MetricsPortOf(0), 9400);
  EXPECT_EQ(per_node.spec->MetricsPortOf(1), 9401);
  EXPECT_EQ(per_node.spec->metrics.linger, Duration::zero());
  EXPECT_EQ(Diags(Parse(WithBase("[metrics]\nlisten = \"127.0.0.1:65535\"\nports = \"per-node\"\n"))),
            "13:10: error: metrics.listen = \"127.0.0.1:65535\" with metrics.ports = \"per-node\": agent 1 "
            "would listen on port 65536, out of range\n");
  EXPECT_EQ(Diags(Parse(WithBase("[metrics]\nlisten = \"0.0.0.0:9400\"\nports = \"each\"\n"))),
            "14:9: error: metrics.ports = \"each\" is neither \"same\" nor \"per-node\"\n"
            "  hint: \"per-node\": node k listens on the port + k\n");
}

TEST(Loader, MetricsListenErrors) {
  auto diags = [](std::string_view listen) {
    return Diags(Parse(WithBase("[metrics]\nlisten = " + std::string(listen) + "\n")));
  };
  EXPECT_EQ(diags("9400"),
            "13:10: error: metrics.listen must be a string, not an integer\n"
            "  hint: quote it: listen = \"9400\"\n");
  EXPECT_EQ(diags("\"0.0.0.0\""),
            "13:10: error: metrics.listen = \"0.0.0.0\" is not ADDR:PORT\n"
            "  hint: write the address and the port, e.g. \"0.0.0.0:9400\" (every interface), "
            "\"127.0.0.1:9400\" (this host only) or \"*:9400\" (each node's address in cluster.nodes)\n");
  EXPECT_EQ(diags("\":::9400\""),
            "13:10: error: metrics.listen = \":::9400\" is not ADDR:PORT\n"
            "  hint: an IPv6 address goes in brackets: \"[::]:9400\"\n");
  EXPECT_EQ(diags("\"0.0.0.0:http\""),
            "13:10: error: metrics.listen = \"0.0.0.0:http\": the port \"http\" is not a number\n"
            "  hint: write the address and the port, e.g. \"0.0.0.0:9400\" (every interface), "
            "\"127.0.0.1:9400\" (this host only) or \"*:9400\" (each node's address in cluster.nodes)\n");
  EXPECT_EQ(diags("\"0.0.0.0:70000\""),
            "13:10: error: metrics.listen = \"0.0.0.0:70000\": port 70000 is out of range (1..65535)\n");
  EXPECT_EQ(diags("\"0.0.0.0:0\""),
            "13:10: error: metrics.listen = \"0.0.0.0:0\": port 0 is out of range (1..65535)\n");
  EXPECT_EQ(diags("\"gpu-01:9400\""),
            "13:10: error: metrics.listen = \"gpu-01:9400\": \"gpu-01\" is neither an IP address nor \"*\"\n"
            "  hint: every node reads this address: write \"0.0.0.0\" (every interface), \"127.0.0.1\" "
            "(this host only) or \"*\" (each node's own entry of cluster.nodes)\n");
  EXPECT_EQ(diags("\"0.0.0.0:29500\""),
            "13:10: error: metrics.listen = \"0.0.0.0:29500\": port 29500 is cluster.master_port, "
            "where node 0's coordinator listens\n"
            "  hint: metrics need a port of their own\n");
  EXPECT_EQ(diags("\"0.0.0.0:443\""),
            "13:10: warning: metrics.listen = \"0.0.0.0:443\": port 443 is a privileged port\n"
            "  hint: binding it needs root; ports 1024..65535 do not\n");
  EXPECT_EQ(diags("\"10.1.2.3:9400\""),
            "13:10: warning: metrics.listen = \"10.1.2.3:9400\": 10.1.2.3 is one host's address, but "
            "every node listens on it\n"
            "  hint: the other nodes cannot, and serve no metrics; write \"*:9400\" for each node's "
            "own address in cluster.nodes, or \"0.0.0.0:9400\"\n");
  EXPECT_EQ(diags("\"0.0.0.0:9400\"\nport = 1"),
            "14:1: error: unknown key `metrics.port`\n"
            "  hint: did you mean `ports`?\n");
  // "*" needs the nodes listed.
  EXPECT_EQ(Diags(Parse("version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nnnodes = 2\n"
                        "[metrics]\nlisten = \"*:9400\"\n")),
            "8:10: error: metrics.listen = \"*:9400\": \"*\" is each node's entry of cluster.nodes, and "
            "cluster.nodes is not listed\n"
            "  hint: list the nodes in cluster.nodes, or write \"0.0.0.0:9400\" to listen on every "
            "interface\n");
  EXPECT_EQ(Diags(Parse("version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n[cluster]\nnnodes = 2\n"
                        "store_port = 9400\n[metrics]\nlisten = \"0.0.0.0:9400\"\n")),
            "9:10: error: metrics.listen = \"0.0.0.0:9400\": port 9400 is cluster.store_port, where "
            "worker rank 0's store listens\n"
            "  hint: metrics need a port of their own\n");
}

TEST(Loader, JobEnv) {
  auto r =
      Parse(WithBase("[job.env]\nNCCL_DEBUG = \"INFO\"\nRANK = \"3\"\nPL_TRAINER_DEVICES = \"1\"\n"
                     "\"1BAD\" = \"x\"\nOMP = 4\n"));
  EXPECT_EQ(Diags(r),
            "14:1: error: job.env may not set RANK: ddprun sets it for each worker\n"
            "  hint: ddprun sets RANK per worker from its node rank and local rank\n"
            "15:1: error: job.env may not set PL_TRAINER_DEVICES: ddprun sets it for each worker\n"
            "  hint: ddprun sets PL_TRAINER_DEVICES from [trainer]; write `devices = ...` under "
            "[trainer]\n"
            "16:1: error: `1BAD` is not a valid environment variable name\n"
            "  hint: use letters, digits and '_', not starting with a digit\n"
            "17:7: error: job.env.OMP must be a string, not an integer\n"
            "  hint: quote it: OMP = \"4\"\n");
  auto ok = Parse(WithBase("[job.env]\nNCCL_DEBUG = \"INFO\"\n"));
  ASSERT_TRUE(ok.spec);
  EXPECT_EQ(ok.spec->job.env.at("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(Diags(Parse(WithBase("[job.env]\nMASTER_PORT = \"1\"\n"))),
            "13:1: error: job.env may not set MASTER_PORT: ddprun sets it for each worker\n"
            "  hint: ddprun sets MASTER_PORT from cluster.master_port (or cluster.store_port)\n");
}

TEST(Loader, TypeErrorsForTables) {
  EXPECT_EQ(Diags(Parse("version = 1\njob = 3\ncluster = { nnodes = 1 }\n")),
            "2:7: error: job must be a table, not an integer\n"
            "  hint: write it as a section: [job]\n");
}

TEST(Loader, AllErrorsAreCollected) {
  auto r = Parse(
      "version = 3\n[job]\nname = \"\"\ncommand = []\n[cluster]\nnnodes = -2\n"
      "master_port = 0\n[timeouts]\nheartbeat = 1\n");
  EXPECT_EQ(r.diagnostics.ErrorCount(), 6) << Diags(r);
}

}  // namespace
}  // namespace ddprun
