// Real agents of one job with different code or libraries: job.code_check hashes the script the
// interpreter runs, job.library_check compares installed versions, and refusals name the kind.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

std::string HostName() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// `sha256sum FILE`'s digest, as the job file's canonical form quotes it.
std::string Sha256Of(const std::string& path) {
  FILE* pipe = ::popen(("sha256sum '" + path + "'").c_str(), "r");
  char digest[65] = {};
  if (pipe) {
    if (std::fread(digest, 1, 64, pipe) != 64) digest[0] = '\0';
    ::pclose(pipe);
  }
  return digest;
}

// The python3 this test's PATH finds, as an absolute path (what a venv job names).
std::string AbsolutePython() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/python3";
    if (!dir.empty() && dir[0] == '/' && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Two nodes of one job, each in its own folder (as on two machines) with its own train.py;
// the two scripts differ. `command` is the TOML array.
struct TwoFolders {
  std::string job0, job1, script0, script1;
};
TwoFolders TwoNodesWithTheirOwnTrainPy(const ScratchDir& dir, const std::string& command,
                                       const std::string& mode) {
  TestJob spec;
  spec.command = command;
  spec.devices = 1;
  spec.code_check = mode;
  spec.rendezvous = "10s";
  spec.master_port = FreePort();
  const std::string text = spec.Toml();
  return {dir.Write("n0/job.toml", text), dir.Write("n1/job.toml", text),
          dir.Write("n0/train.py", "print('v1')\n"), dir.Write("n1/train.py", "print('v2')\n")};
}

constexpr std::string_view kCodeHint =
    "\nhint: deploy the same code to every node (ddprun check prints the script's sha256 and the "
    "git commit it finds), or set job.code_check = \"warn\" to let such a node run";

// The issue's case: an interpreter named by its path (a venv's, /usr/bin's) or through
// /usr/bin/env. The script is compared, not the interpreter, and the refusal names it.
TEST(NodeIdentity, CodeCheckComparesTheScriptAnInterpreterRuns) {
  const std::string python = AbsolutePython();
  if (python.empty()) GTEST_SKIP() << "no python3 on PATH";
  for (const std::string& command : {"[" + TomlString(python) + ", \"train.py\"]",
                                     std::string(R"(["/usr/bin/env", "python3", "-u", "train.py"])")}) {
    SCOPED_TRACE(command);
    ScratchDir dir;
    const TwoFolders job = TwoNodesWithTheirOwnTrainPy(dir, command, "refuse");
    AgentProcess node0({job.job0, "--node-rank", "0"}, dir.path() + "/a0.txt");
    AgentProcess node1({job.job1, "--node-rank", "1"}, dir.path() + "/a1.txt");
    const auto code1 = node1.Wait(30s);
    ASSERT_TRUE(code1.has_value()) << node1.Output();
    EXPECT_EQ(*code1, 3) << node1.Output();
    EXPECT_THAT(node1.Output(), HasSubstr("the coordinator refused this node: node 1 (host " + HostName() +
                                          ") runs different code than node 0 (job.code_check = \"refuse\"):\n"
                                          "  code.script_sha256 of \"train.py\": node 1 has \"" +
                                          Sha256Of(job.script1) + "\", node 0 has \"" +
                                          Sha256Of(job.script0) + "\"" + std::string(kCodeHint)))
        << node1.Output();
    EXPECT_THAT(node1.Output(), HasSubstr("ddprun: code: train.py sha256 " +
                                          Sha256Of(job.script1).substr(0, 12) + " (the script "))
        << node1.Output();
  }
}

// A bare `python3`: the refusal says "different code", never "a different job file".
TEST(NodeIdentity, BarePythonRefusalIsAboutCodeNotTheJobFile) {
  ScratchDir dir;
  const TwoFolders job = TwoNodesWithTheirOwnTrainPy(dir, R"(["python3", "train.py"])", "refuse");
  AgentProcess node0({job.job0, "--node-rank", "0"}, dir.path() + "/a0.txt");
  AgentProcess node1({job.job1, "--node-rank", "1"}, dir.path() + "/a1.txt");
  const auto code1 = node1.Wait(30s);
  ASSERT_TRUE(code1.has_value()) << node1.Output();
  EXPECT_EQ(*code1, 3) << node1.Output();
  EXPECT_THAT(node1.Output(), HasSubstr(") runs different code than node 0 (job.code_check = \"refuse\"):\n"
                                        "  code.script_sha256 of \"train.py\": node 1 has \""));
  EXPECT_THAT(node1.Output(), Not(HasSubstr("job file"))) << node1.Output();
}

// "warn": the node joins, the job runs, node 0 names the script and both nodes.
TEST(NodeIdentity, CodeCheckWarnNamesTheScriptAndRuns) {
  ScratchDir dir;
  const TwoFolders job =
      TwoNodesWithTheirOwnTrainPy(dir, R"(["/usr/bin/env", "python3", "train.py"])", "warn");
  AgentProcess node0({job.job0, "--node-rank", "0"}, dir.path() + "/a0.txt");
  AgentProcess node1({job.job1, "--node-rank", "1"}, dir.path() + "/a1.txt");
  const auto code0 = node0.Wait(30s);
  const auto code1 = node1.Wait(30s);
  ASSERT_TRUE(code0.has_value() && code1.has_value()) << node0.Output() << node1.Output();
  EXPECT_EQ(*code0, 0) << node0.Output();
  EXPECT_EQ(*code1, 0) << node1.Output();
  EXPECT_THAT(node0.Output(),
              HasSubstr("node 1 (host " + HostName() +
                        ") runs different code than node 0 (job.code_check = \"warn\" "
                        "lets it join):\n  code.script_sha256 of \"train.py\": node 1 has \"" +
                        Sha256Of(job.script1) + "\", node 0 has \"" + Sha256Of(job.script0) + "\""))
      << node0.Output();
}

// Arguments after `--` that differ are named as such, not as another job file.
TEST(NodeIdentity, ScriptArgumentDifferencesAreNamedAsSuch) {
  ScratchDir dir;
  TestJob spec;
  spec.command = R"(["true"])";
  spec.devices = 1;
  spec.rendezvous = "10s";
  spec.master_port = FreePort();
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess node0({job, "--node-rank", "0", "--", "--lr", "0.1"}, dir.path() + "/n0.txt");
  AgentProcess node1({job, "--node-rank", "1", "--", "--lr", "0.2"}, dir.path() + "/n1.txt");
  const auto code1 = node1.Wait(30s);
  ASSERT_TRUE(code1.has_value()) << node1.Output();
  EXPECT_EQ(*code1, 3) << node1.Output();
  EXPECT_THAT(
      node1.Output(),
      HasSubstr("node 1 (host " + HostName() +
                ") was started with other arguments after `--` than node 0:\n"
                "  arguments after `--`: node 1 has [\"--lr\", \"0.2\"], node 0 has [\"--lr\", \"0.1\"]\n"
                "hint: start ddprun with the same arguments after `--` on every node"))
      << node1.Output();
}

// A folder that looks like an installed site-packages: torch (with its version.py),
// lightning, pytorch_lightning and NCCL's wheel, at the versions given.
std::string FakeSite(const ScratchDir& dir, const std::string& name, const std::string& torch,
                     const std::string& cuda) {
  auto metadata = [](const std::string& package, const std::string& version) {
    return "Metadata-Version: 2.1\nName: " + package + "\nVersion: " + version + "\nSummary: x\n";
  };
  dir.Write(name + "/torch-" + torch + ".dist-info/METADATA", metadata("torch", torch));
  dir.Write(name + "/torch/version.py",
            "__version__ = '" + torch + "'\ncuda: Optional[str] = '" + cuda + "'\n");
  dir.Write(name + "/lightning-2.2.5.dist-info/METADATA", metadata("lightning", "2.2.5"));
  dir.Write(name + "/pytorch_lightning-2.2.5.dist-info/METADATA", metadata("pytorch-lightning", "2.2.5"));
  dir.Write(name + "/nvidia_nccl_cu12-2.20.5.dist-info/METADATA", metadata("nvidia-nccl-cu12", "2.20.5"));
  return dir.path() + "/" + name;
}

std::pair<std::string, std::string> TwoNodesWithLibraryCheck(const ScratchDir& dir, const std::string& mode) {
  TestJob spec;
  spec.command = R"(["python3", "-c", "pass"])";
  spec.devices = 1;
  spec.library_check = mode;
  spec.rendezvous = "10s";
  spec.master_port = FreePort();
  const std::string job = dir.Write("job.toml", spec.Toml());
  return {job, job};
}

// Node 1's Python finds another torch (and a torch built for another CUDA) first on its path:
// refused, each version named with both nodes.
TEST(NodeIdentity, LibraryCheckRefusesOtherTorchAndCuda) {
  ScratchDir dir;
  const std::string site0 = FakeSite(dir, "site0", "2.3.1", "12.1");
  const std::string site1 = FakeSite(dir, "site1", "2.4.0", "12.4");
  const auto [job, same] = TwoNodesWithLibraryCheck(dir, "refuse");
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/a0.txt", {{"PYTHONPATH", site0}});
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/a1.txt", {{"PYTHONPATH", site1}});
  const auto code1 = node1.Wait(30s);
  ASSERT_TRUE(code1.has_value()) << node1.Output();
  EXPECT_EQ(*code1, 3) << node1.Output();
  EXPECT_THAT(node1.Output(),
              HasSubstr("node 1 (host " + HostName() +
                        ") has other library versions than node 0 (job.library_check = \"refuse\"):\n"
                        "  libraries.cuda: node 1 has \"12.4\", node 0 has \"12.1\"\n"
                        "  libraries.torch: node 1 has \"2.4.0\", node 0 has \"2.3.1\"\n"
                        "hint: install the same versions on every node (ddprun check lists what it "
                        "finds here), or set job.library_check = \"warn\" to let such a node run"))
      << node1.Output();
  EXPECT_THAT(node1.Output(), HasSubstr(", torch 2.4.0, lightning 2.2.5, pytorch_lightning 2.2.5, "
                                        "nccl 2.20.5, cuda 12.4\n"))
      << node1.Output();
}

// Issue 40: Lightning from a source tree on each node (a git checkout on PYTHONPATH, no
// metadata), 2.2.5 on node 0 and 2.2.6 on node 1: both logged `lightning -` and the job ran
// mixed under "refuse". The version Python would import is read from the tree, and node 1 is
// refused.
TEST(NodeIdentity, LibraryCheckRefusesAnotherLightningFromASourceTree) {
  ScratchDir dir;
  for (const auto& [name, version] :
       {std::pair<std::string, std::string>{"tree0", "2.2.5"}, {"tree1", "2.2.6"}}) {
    dir.Write(name + "/lightning/__init__.py", "__version__ = None\n");
    dir.Write(name + "/lightning/version.info", version + "\n");
  }
  const auto [job, same] = TwoNodesWithLibraryCheck(dir, "refuse");
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/a0.txt",
                     {{"PYTHONPATH", dir.path() + "/tree0"}});
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/a1.txt",
                     {{"PYTHONPATH", dir.path() + "/tree1"}});
  const auto code1 = node1.Wait(30s);
  ASSERT_TRUE(code1.has_value()) << node1.Output();
  EXPECT_EQ(*code1, 3) << node1.Output();
  EXPECT_THAT(node1.Output(),
              HasSubstr("  libraries.lightning: node 1 has \"2.2.6\", node 0 has \"2.2.5\"\n"))
      << node1.Output();
}

// "warn": the node joins and the job runs; node 0 names what differs.
TEST(NodeIdentity, LibraryCheckWarnLetsItRunAndSaysWhat) {
  ScratchDir dir;
  const std::string site0 = FakeSite(dir, "site0", "2.3.1", "12.1");
  const std::string site1 = FakeSite(dir, "site1", "2.4.0", "12.1");
  const auto [job, same] = TwoNodesWithLibraryCheck(dir, "warn");
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/a0.txt", {{"PYTHONPATH", site0}});
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/a1.txt", {{"PYTHONPATH", site1}});
  const auto code0 = node0.Wait(30s);
  const auto code1 = node1.Wait(30s);
  ASSERT_TRUE(code0.has_value() && code1.has_value()) << node0.Output() << node1.Output();
  EXPECT_EQ(*code0, 0) << node0.Output();
  EXPECT_EQ(*code1, 0) << node1.Output();
  EXPECT_THAT(node0.Output(), HasSubstr("node 1 (host " + HostName() +
                                        ") has other library versions than node 0 (job.library_check = "
                                        "\"warn\" lets it join):\n"
                                        "  libraries.torch: node 1 has \"2.4.0\", node 0 has \"2.3.1\""))
      << node0.Output();
}

// One node, one worker: counts in the summary are singular, and the warning about a missing
// secret is the one the README quotes.
TEST(NodeIdentity, OneNodeSummaryIsSingularAndTheSecretWarningIsTheReadmes) {
  ScratchDir dir;
  TestJob spec;
  spec.name = "one";
  spec.command = R"(["true"])";
  spec.nnodes = 1;
  spec.devices = 1;
  spec.rendezvous = "10s";
  spec.master_port = FreePort();
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess agent({job}, dir.path() + "/out.txt", {{"DDPRUN_SECRET", ""}, {"DDPRUN_SECRET_FILE", ""}});
  const auto code = agent.Wait(30s);
  ASSERT_TRUE(code.has_value()) << agent.Output();
  EXPECT_EQ(*code, 0) << agent.Output();
  EXPECT_THAT(agent.Output(), HasSubstr("job \"one\" succeeded: the 1 rank on 1 node exited 0 in round 0"))
      << agent.Output();
  EXPECT_THAT(agent.Output(), HasSubstr("round 0: starting 1 worker\n")) << agent.Output();
  EXPECT_THAT(agent.Output(), Not(HasSubstr(" 1 nodes"))) << agent.Output();
  const std::string warning =
      "no shared secret (DDPRUN_SECRET or DDPRUN_SECRET_FILE): any host that can reach the master "
      "port can join this job";
  EXPECT_THAT(agent.Output(), HasSubstr(warning)) << agent.Output();
  std::ifstream readme(std::string(DDPRUN_SOURCE_DIR) + "/README.md");
  std::stringstream text;
  text << readme.rdbuf();
  // Lines wrap and indent anywhere in Markdown: compare with runs of white space as one space.
  std::string flat;
  for (char c : text.str()) {
    const bool space = c == ' ' || c == '\n';
    if (!space || (!flat.empty() && flat.back() != ' ')) flat += space ? ' ' : c;
  }
  EXPECT_THAT(flat, HasSubstr(warning)) << "README.md should quote the warning ddprun prints";
}

}  // namespace
}  // namespace ddprun::e2e
