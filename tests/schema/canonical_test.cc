// Canonical form, fingerprint and field-level difference of job specs.
#include <gtest/gtest.h>

#include "schema/canonical.h"
#include "schema/join_mismatch.h"
#include "schema/loader.h"
#include "tests/schema/test_util.h"

namespace ddprun {
namespace {

JobSpec Load(std::string_view text) {
  auto r = testing::Parse(text);
  EXPECT_TRUE(r.spec) << testing::Diags(r);
  return r.spec.value_or(JobSpec{});
}

constexpr std::string_view kJob = R"(version = 1
[job]
name = "resnet"
command = ["python", "train.py"]
[cluster]
nodes = ["a", "b"]
master_port = 50000
[trainer]
devices = 8
num_nodes = 2
[timeouts]
rendezvous = "60s"
)";

// The same job: keys reordered, comments, spacing, "1m" for "60s", defaults written out.
constexpr std::string_view kSameJob = R"(# the same job
version = 1
[cluster]
master_port   = 50000
nodes = [ "a",
          "b" ]           # two nodes
master_addr = "a"
nproc_per_node = 8
[trainer]
num_nodes = 2
devices = 8
[job]
command = ["python", "train.py"]
name = "resnet"
[timeouts]
rendezvous = "1m"
heartbeat = "2000ms"
[simulate]
seed = 99
[logs]
console = [0]
)";

TEST(Canonical, FormIsSortedAndSpelledOneWay) {
  EXPECT_EQ(CanonicalForm(Load(kJob)),
            "cluster.master_addr = \"a\"\n"
            "cluster.master_port = 50000\n"
            "cluster.nnodes = 2\n"
            "cluster.nodes = [\"a\", \"b\"]\n"
            "cluster.nproc_per_node = 8\n"
            "job.command = [\"python\", \"train.py\"]\n"
            "job.name = \"resnet\"\n"
            "job.workdir = \".\"\n"
            "logs.dir = \"logs\"\n"
            "restart.backoff = 10s\n"
            "restart.max_restarts = 0\n"
            "timeouts.heartbeat = 2s\n"
            "timeouts.rendezvous = 1m\n"
            "timeouts.stop_grace = 30s\n"
            "trainer.devices = 8\n"
            "trainer.num_nodes = 2\n"
            "version = 1\n");
}

TEST(Canonical, SameJobSameFingerprint) {
  const JobSpec a = Load(kJob);
  const JobSpec b = Load(kSameJob);
  EXPECT_EQ(CanonicalForm(a), CanonicalForm(b));
  EXPECT_EQ(Fingerprint(a), Fingerprint(b));
  EXPECT_EQ(Fingerprint(a).size(), 64u);
  EXPECT_EQ(Fingerprint(a), FingerprintOfCanonical(CanonicalForm(a)));
  EXPECT_TRUE(DiffCanonical(CanonicalForm(a), CanonicalForm(b)).empty());
}

TEST(Canonical, KnownSha256) {
  EXPECT_EQ(FingerprintOfCanonical("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Canonical, EveryChangeThatMattersDiffers) {
  const std::string base(kJob);
  const JobSpec a = Load(base);
  auto changed = [&](std::string_view from, std::string_view to) {
    std::string text = base;
    text.replace(text.find(from), from.size(), to);
    return Load(text);
  };
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"name = \"resnet\"", "name = \"resnet2\""},
      {"\"train.py\"]", "\"train.py\", \"--lr\", \"1\"]"},
      {"nodes = [\"a\", \"b\"]", "nodes = [\"b\", \"a\"]"},
      {"master_port = 50000", "master_port = 50001"},
      {"devices = 8", "devices = [0, 1, 2, 3, 4, 5, 6, 7]\naccelerator = \"gpu\""},
      {"rendezvous = \"60s\"", "rendezvous = \"61s\""},
      {"[timeouts]", "[restart]\nmax_restarts = 1\n[timeouts]"},
      {"[timeouts]", "[job.env]\nA = \"1\"\n[timeouts]"},
      {"[timeouts]", "[metrics]\nlisten = \"0.0.0.0:9400\"\n[timeouts]"},
  };
  for (const auto& [from, to] : edits) {
    const JobSpec b = changed(from, to);
    EXPECT_NE(Fingerprint(a), Fingerprint(b)) << to;
    EXPECT_FALSE(DiffCanonical(CanonicalForm(a), CanonicalForm(b)).empty()) << to;
  }
}

TEST(Canonical, MetricsListenOnlyWhenSetInTheFilesSpelling) {
  EXPECT_EQ(CanonicalForm(Load(kJob)).find("metrics"), std::string::npos);
  const std::string v6 = CanonicalForm(Load(std::string(kJob) + "[metrics]\nlisten = \"[::]:9400\"\n"));
  EXPECT_NE(v6.find("\nmetrics.listen = \"[::]:9400\"\n"), std::string::npos) << v6;
}

TEST(Canonical, DiffNamesFieldsAndSides) {
  const JobSpec a = Load(kJob);
  std::string other(kJob);
  other.replace(other.find("devices = 8"), 11, "devices = 4");
  other += "[job.env]\nNCCL_DEBUG = \"INFO\"\n";
  const JobSpec b = Load(other);
  const auto diff = DiffCanonical(CanonicalForm(a), CanonicalForm(b));
  ASSERT_EQ(diff.size(), 3u);
  EXPECT_EQ(diff[0], (FieldDifference{"cluster.nproc_per_node", "8", "4"}));
  EXPECT_EQ(diff[1], (FieldDifference{"job.env.NCCL_DEBUG", "(not set)", "\"INFO\""}));
  EXPECT_EQ(diff[2], (FieldDifference{"trainer.devices", "8", "4"}));
  const auto back = DiffCanonical(CanonicalForm(b), CanonicalForm(a));
  EXPECT_EQ(back[1], (FieldDifference{"job.env.NCCL_DEBUG", "\"INFO\"", "(not set)"}));
}

TEST(Canonical, StringsAreQuotedSoSpacesAndNewlinesCannotCollide) {
  JobSpec a;
  a.job.command = {"a b"};
  JobSpec b;
  b.job.command = {"a", "b"};
  EXPECT_NE(CanonicalForm(a), CanonicalForm(b));
  JobSpec c;
  c.job.name = "x\ny = 1";
  EXPECT_EQ(CanonicalForm(c).find("\ny = 1"), std::string::npos);
}

// Secret-looking job.env values never appear in a printed difference; that they differ does.
TEST(Canonical, DiffHidesSecretLookingValues) {
  JobSpec a = Load(kJob);
  JobSpec b = a;
  a.job.env["WANDB_API_KEY"] = "k1";
  b.job.env["WANDB_API_KEY"] = "k2";
  a.job.env["HF_TOKEN"] = "same";
  b.job.env["HF_TOKEN"] = "same";
  EXPECT_EQ(DiffCanonical(CanonicalForm(a), CanonicalForm(b)),
            (std::vector<FieldDifference>{{"job.env.WANDB_API_KEY", "<hidden>", "<hidden>"}}));
}

// job.code_check = "refuse" puts the code into the fingerprint; off (the default) leaves the
// canonical form of existing files unchanged.
TEST(Canonical, CodeFieldsOnlyWithCodeCheck) {
  JobSpec off = Load(kJob);
  off.job.code.script_sha256 = "aa";
  EXPECT_EQ(CanonicalForm(off), CanonicalForm(Load(kJob)));
  JobSpec a = off;
  a.job.code_check = JobSpec::CodeCheck::kRefuse;
  JobSpec b = a;
  b.job.code.script_sha256 = "bb";
  b.job.code.git_dirty = true;
  EXPECT_EQ(DiffCanonical(CanonicalForm(a), CanonicalForm(b)),
            (std::vector<FieldDifference>{{"code.git_dirty", "false", "true"},
                                          {"code.script_sha256", "\"aa\"", "\"bb\""}}));
}

// job.code_check = "warn": the code fields are advisory, compared (DiffCanonical names them)
// but not part of the fingerprint, so nodes whose code differs still join.
TEST(Canonical, WarnKeepsTheCodeOutOfTheFingerprint) {
  JobSpec a = Load(kJob);
  a.job.code_check = JobSpec::CodeCheck::kWarn;
  a.job.code.script_sha256 = "aa";
  JobSpec b = a;
  b.job.code.script_sha256 = "bb";
  EXPECT_NE(CanonicalForm(a), CanonicalForm(b));
  EXPECT_EQ(Fingerprint(a), Fingerprint(b));
  EXPECT_EQ(DiffCanonical(CanonicalForm(a), CanonicalForm(b)),
            (std::vector<FieldDifference>{{"advisory.code.script_sha256", "\"aa\"", "\"bb\""}}));
  // The mode itself is part of the job: a node with "refuse" and one with "warn" disagree.
  JobSpec refuse = a;
  refuse.job.code_check = JobSpec::CodeCheck::kRefuse;
  EXPECT_NE(Fingerprint(a), Fingerprint(refuse));
}

// job.library_check works as code_check: off leaves existing fingerprints alone, refuse makes
// the versions part of the fingerprint, warn keeps them advisory.
TEST(Canonical, LibraryFieldsOnlyWithLibraryCheck) {
  JobSpec off = Load(kJob);
  off.job.libraries.torch = "2.3.1";
  EXPECT_EQ(CanonicalForm(off), CanonicalForm(Load(kJob)));
  JobSpec warn = off;
  warn.job.library_check = JobSpec::CodeCheck::kWarn;
  JobSpec other = warn;
  other.job.libraries.torch = "2.4.0";
  EXPECT_EQ(Fingerprint(warn), Fingerprint(other));
  EXPECT_EQ(DiffCanonical(CanonicalForm(warn), CanonicalForm(other)),
            (std::vector<FieldDifference>{{"advisory.libraries.torch", "\"2.3.1\"", "\"2.4.0\""}}));
  warn.job.library_check = other.job.library_check = JobSpec::CodeCheck::kRefuse;
  EXPECT_NE(Fingerprint(warn), Fingerprint(other));
}

// The arguments after `--` are a line of their own, only when given.
TEST(Canonical, ScriptArgumentsApartFromTheCommand) {
  JobSpec a = Load(kJob);
  const std::string without = CanonicalForm(a);
  AppendScriptArgs(a, {"--lr", "0.1"});
  EXPECT_EQ(DiffCanonical(without, CanonicalForm(a)),
            (std::vector<FieldDifference>{{"job.script_args", "(not set)", "[\"--lr\", \"0.1\"]"}}));
}

// With "warn" the node joins and the coordinator names it; under etcd the coordinator is named
// as itself, not as node 0 (issue 37: a refused node 0 read "... than node 0").
TEST(JoinMismatch, AnAdvisoryDifferenceNamesWhoComparedIt) {
  JobSpec ours = Load(kJob);
  ours.job.code_check = JobSpec::CodeCheck::kWarn;
  ours.job.code.script = "train.py";
  ours.job.code.script_sha256 = "aa";
  JobSpec theirs = ours;
  theirs.job.code.script_sha256 = "bb";
  EXPECT_EQ(DescribeAdvisoryDifference(CanonicalForm(ours), CanonicalForm(theirs), "node 1", "gpu-02"),
            "node 1 (host gpu-02) runs different code than node 0 (job.code_check = \"warn\" lets it join):\n"
            "  code.script_sha256 of \"train.py\": node 1 has \"bb\", node 0 has \"aa\"");
  EXPECT_EQ(
      DescribeAdvisoryDifference(CanonicalForm(ours), CanonicalForm(theirs), "node 0", "gpu-01",
                                 "the coordinator (host gpu-03)"),
      "node 0 (host gpu-01) runs different code than the coordinator (host gpu-03) (job.code_check = "
      "\"warn\" lets it join):\n"
      "  code.script_sha256 of \"train.py\": node 0 has \"bb\", the coordinator (host gpu-03) has \"aa\"");
}

// A refusal names each kind of difference with its own hint, and only "job file" for the file.
TEST(JoinMismatch, NamesCodeArgumentsAndLibrariesAsWhatTheyAre) {
  JobSpec ours = Load(kJob);
  ours.job.code_check = JobSpec::CodeCheck::kRefuse;
  ours.job.library_check = JobSpec::CodeCheck::kRefuse;
  ours.job.code.script = "train.py";
  ours.job.code.script_sha256 = "aa";
  ours.job.libraries.torch = "2.3.1";
  JobSpec theirs = ours;
  theirs.job.code.script_sha256 = "bb";
  EXPECT_EQ(DescribeRefusedJoin(CanonicalForm(ours), CanonicalForm(theirs), "node 1", "gpu-02").message,
            "node 1 (host gpu-02) runs different code than node 0 (job.code_check = \"refuse\"):\n"
            "  code.script_sha256 of \"train.py\": node 1 has \"bb\", node 0 has \"aa\"\n"
            "hint: deploy the same code to every node (ddprun check prints the script's sha256 and "
            "the git commit it finds), or set job.code_check = \"warn\" to let such a node run");
  theirs.job.libraries.torch = "2.4.0";
  AppendScriptArgs(theirs, {"--lr", "0.2"});
  theirs.cluster.master_port = 50001;
  const JoinRefusal all = DescribeRefusedJoin(CanonicalForm(ours), CanonicalForm(theirs), "node 1", "gpu-02");
  EXPECT_EQ(all.message,
            "node 1 (host gpu-02) differs from node 0 in its job file, its code, its arguments after "
            "`--` and its library versions:\n"
            "  cluster.master_port: node 1 has 50001, node 0 has 50000\n"
            "  code.script_sha256 of \"train.py\": node 1 has \"bb\", node 0 has \"aa\"\n"
            "  arguments after `--`: node 1 has [\"--lr\", \"0.2\"], node 0 has none\n"
            "  libraries.torch: node 1 has \"2.4.0\", node 0 has \"2.3.1\"\n"
            "hint: use the same job file on every node (ddprun check prints its fingerprint)\n"
            "hint: deploy the same code to every node (ddprun check prints the script's sha256 and "
            "the git commit it finds), or set job.code_check = \"warn\" to let such a node run\n"
            "hint: start ddprun with the same arguments after `--` on every node\n"
            "hint: install the same versions on every node (ddprun check lists what it finds here), "
            "or set job.library_check = \"warn\" to let such a node run");
  EXPECT_EQ(all.why,
            "it differs in its job file, its code, its arguments after `--` and its library versions");
}

}  // namespace
}  // namespace ddprun
