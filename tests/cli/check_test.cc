// The real `ddprun` binary: check on every example, a broken file, --json, schema, usage errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace {

struct Output {
  int exit_code = -1;
  std::string out;  // stdout, or stdout+stderr when asked
};

Output RunDdprun(const std::string& args, bool merge_stderr = false) {
  const std::string command =
      std::string(DDPRUN_BINARY) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  Output result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// stdout and stderr apart, for commands whose two streams have different readers.
struct SplitOutput {
  int exit_code = -1;
  std::string out;
  std::string err;
};

SplitOutput RunDdprunSplit(const std::string& args) {
  // One file per process and call: CTest runs the tests of this file in parallel processes.
  static int calls = 0;
  const auto err_path =
      std::filesystem::temp_directory_path() /
      ("ddprun-cli-test-stderr-" + std::to_string(::getpid()) + "-" + std::to_string(++calls) + ".txt");
  const Output o = RunDdprun(args + " 2>" + err_path.string() + " #", /*merge_stderr=*/false);
  std::stringstream err;
  {
    std::ifstream in(err_path);
    err << in.rdbuf();
  }
  std::filesystem::remove(err_path);
  return {o.exit_code, o.out, err.str()};
}

std::string SourcePath(const std::string& relative) {
  return std::string(DDPRUN_SOURCE_DIR) + "/" + relative;
}

std::string TempFile(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("ddprun-cli-test-" + name);
  std::ofstream(path) << text;
  return path.string();
}

TEST(Cli, CheckEveryExample) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(SourcePath("examples"))) {
    if (entry.path().extension() != ".toml") continue;
    ++checked;
    const Output o = RunDdprun("check " + entry.path().string(), /*merge_stderr=*/true);
    EXPECT_EQ(o.exit_code, 0) << entry.path() << "\n" << o.out;
    EXPECT_NE(o.out.find("torchrun: "), std::string::npos) << o.out;
    if (entry.path().filename() == "llama3-54d.toml") {
      // A simulation of Meta's 54-day run: its training script is not in this repository, and
      // check says so, as it would for a user's typo.
      EXPECT_NE(o.out.find("warning: job.command[1] = \"train_llama.py\" does not exist here"),
                std::string::npos)
          << o.out;
      EXPECT_NE(o.out.find("0 errors, 1 warning"), std::string::npos) << o.out;
      continue;
    }
    EXPECT_EQ(o.out.find("warning"), std::string::npos) << o.out;
  }
  EXPECT_GE(checked, 3);
}

// Issue 40: `python3 wrok.py` passed check without a word, and a missing job.workdir hid a
// missing absolute program. The script is looked for in job.workdir (with the closest .py file
// there as the hint); an absolute program is looked for whether or not the folder exists.
TEST(Cli, CheckWarnsAboutAScriptOrProgramThatIsNotThere) {
  const auto dir = std::filesystem::temp_directory_path() / "ddprun-cli-test-script";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "src");
  std::ofstream(dir / "src" / "work.py") << "print(1)\n";
  const std::string head = "version = 1\n[cluster]\nnnodes = 1\n[job]\nname = \"t\"\n";
  std::ofstream(dir / "typo.toml")
      << head << "workdir = \"src\"\ncommand = [\"python3\", \"wrok.py\", \"--lr\", \"0.1\"]\n";
  const Output typo = RunDdprun("check " + (dir / "typo.toml").string(), /*merge_stderr=*/true);
  EXPECT_EQ(typo.exit_code, 0) << typo.out;
  EXPECT_NE(typo.out.find("typo.toml:7:23: warning: job.command[1] = \"wrok.py\" does not exist here (" +
                          (dir / "src" / "wrok.py").string() + ")"),
            std::string::npos)
      << typo.out;
  EXPECT_NE(
      typo.out.find("hint: did you mean \"work.py\"? Python runs the script from job.workdir on every node"),
      std::string::npos)
      << typo.out;
  std::ofstream(dir / "there.toml") << head << "workdir = \"src\"\ncommand = [\"python3\", \"work.py\"]\n";
  const Output there = RunDdprun("check " + (dir / "there.toml").string(), /*merge_stderr=*/true);
  EXPECT_EQ(there.out.find("warning"), std::string::npos) << there.out;
  std::ofstream(dir / "both.toml")
      << head << "workdir = \"gone\"\ncommand = [\"/opt/nowhere/bin/python3\", \"t.py\"]\n";
  const Output both = RunDdprun("check " + (dir / "both.toml").string(), /*merge_stderr=*/true);
  EXPECT_NE(both.out.find("warning: job.workdir = \"gone\" is not a folder here"), std::string::npos)
      << both.out;
  EXPECT_NE(both.out.find("warning: job.command[0] = \"/opt/nowhere/bin/python3\" does not exist here"),
            std::string::npos)
      << both.out;
  EXPECT_NE(both.out.find("0 errors, 2 warnings"), std::string::npos) << both.out;
}

TEST(Cli, BrokenFileExits2WithRenderedDiagnostic) {
  const std::string path = TempFile("broken.toml",
                                    "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n"
                                    "[cluster]\nnnodes = 2\nnproc_per_node = 4\n[trainer]\n"
                                    "devices = 8\nnum_nodes = 2\n");
  const Output o = RunDdprun("check " + path, true);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.out, path +
                       ":7:18: error: cluster.nproc_per_node = 4 does not match "
                       "trainer.devices = 8\n"
                       "    7 | nproc_per_node = 4\n"
                       "      |                  ^\n"
                       "   hint: set trainer.devices = 4 or cluster.nproc_per_node = 8\n"
                       "1 error, 0 warnings\n");
}

TEST(Cli, CheckJson) {
  const Output ok = RunDdprun("check --json " + SourcePath("examples/laptop.toml"));
  EXPECT_EQ(ok.exit_code, 0);
  auto j = nlohmann::json::parse(ok.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << ok.out;
  EXPECT_EQ(j["valid"], true);
  EXPECT_EQ(j["plan"]["world_size"], 4);
  EXPECT_EQ(j["plan"]["nodes"].size(), 2u);

  const std::string path = TempFile("bad.toml", "version = 2\n");
  const Output bad = RunDdprun("check --json " + path);
  EXPECT_EQ(bad.exit_code, 2);
  auto k = nlohmann::json::parse(bad.out, nullptr, false);
  ASSERT_FALSE(k.is_discarded()) << bad.out;
  EXPECT_EQ(k["valid"], false);
  EXPECT_TRUE(k["plan"].is_null());
  EXPECT_EQ(k["diagnostics"][0]["line"], 0);  // missing [job] has no position
  EXPECT_EQ(k["diagnostics"].size(), 3u);
}

TEST(Cli, CheckNodeRank) {
  const std::string job = SourcePath("examples/laptop.toml");
  const Output one = RunDdprun("check --node-rank 1 " + job);
  EXPECT_EQ(one.exit_code, 0);
  EXPECT_NE(one.out.find("node 1 (node1):"), std::string::npos) << one.out;
  EXPECT_EQ(one.out.find("node 0 (node0):"), std::string::npos) << one.out;
  const Output out_of_range = RunDdprun("check --node-rank 2 " + job, true);
  EXPECT_EQ(out_of_range.exit_code, 2);
  EXPECT_NE(out_of_range.out.find("--node-rank 2 is out of range"), std::string::npos);
}

TEST(Cli, SchemaIsValidJsonAndMatchesTheCommittedFile) {
  const Output o = RunDdprun("schema");
  EXPECT_EQ(o.exit_code, 0);
  auto j = nlohmann::json::parse(o.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["$schema"], "https://json-schema.org/draft/2020-12/schema");
  std::ifstream committed(SourcePath("docs/job-file.schema.json"));
  std::stringstream text;
  text << committed.rdbuf();
  EXPECT_EQ(text.str(), o.out) << "regenerate: ddprun schema > docs/job-file.schema.json";
}

TEST(Cli, UsageErrorsExit2) {
  EXPECT_EQ(RunDdprun("").exit_code, 2);
  EXPECT_EQ(RunDdprun("check").exit_code, 2);
  EXPECT_EQ(RunDdprun("check --bogus x.toml").exit_code, 2);
  EXPECT_EQ(RunDdprun("check --node-rank -1 x.toml").exit_code, 2);
  EXPECT_EQ(RunDdprun("check /nonexistent.toml").exit_code, 2);
}

TEST(Cli, VersionAndHelp) {
  const Output v = RunDdprun("--version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_EQ(v.out.rfind("ddprun ", 0), 0u);
  // The version, then the commit and how it was built (cmake/commit.cmake, cmake/version.h.in).
  EXPECT_THAT(v.out, ::testing::ContainsRegex(
                         "^ddprun [0-9]+\\.[0-9]+\\.[0-9]+\ncommit ([0-9a-f]{12}(\\+changes)?|unknown)\n"
                         "build (portable: glibc 2.31 or newer|dynamic: this system's libraries), "
                         "GNU [0-9.]+, [A-Za-z]+\n$"))
      << v.out;
  for (const char* sub : {"run", "simulate", "check", "preflight", "schema"}) {
    const Output h = RunDdprun(std::string(sub) + " --help");
    EXPECT_EQ(h.exit_code, 0) << sub;
    EXPECT_NE(h.out.find("Examples:"), std::string::npos) << sub;
  }
  EXPECT_NE(RunDdprun("--help").out.find("ddprun --simulate job.toml"), std::string::npos);
}

TEST(Cli, ShortFormsDispatch) {
  // `ddprun job.toml` is `ddprun run job.toml`; `ddprun --simulate job.toml` is
  // `ddprun simulate job.toml`: same output, same exit code, whatever those commands do.
  const std::string job = "/nonexistent/ddprun-short-form.toml";
  const Output run_short = RunDdprun(job, true);
  const Output run_long = RunDdprun("run " + job, true);
  EXPECT_EQ(run_short.exit_code, run_long.exit_code);
  EXPECT_EQ(run_short.out, run_long.out);
  const Output sim_short = RunDdprun("--simulate " + job + " --seed 3", true);
  const Output sim_long = RunDdprun("simulate " + job + " --seed 3", true);
  EXPECT_EQ(sim_short.exit_code, sim_long.exit_code);
  EXPECT_EQ(sim_short.out, sim_long.out);
}

// Under the store relay rank 0's MASTER_PORT is a port picked each round: the plan says so
// instead of showing master_port, in the text and in --json.
TEST(Cli, CheckShowsRankZerosPrivateMasterPort) {
  const std::string job = SourcePath("examples/laptop.toml");
  const Output json = RunDdprun("check --json " + job);
  ASSERT_EQ(json.exit_code, 0);
  auto j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.out;
  const auto& ranks = j["plan"]["nodes"][0]["ranks"];
  EXPECT_EQ(ranks[0]["env"]["MASTER_PORT"], "<private port, picked each round>");
  EXPECT_EQ(ranks[1]["env"]["MASTER_PORT"], "29500");
  EXPECT_EQ(j["plan"]["nodes"][1]["ranks"][0]["env"]["MASTER_PORT"], "29500");

  const Output text = RunDdprun("check --node-rank 0 " + job);
  EXPECT_NE(text.out.find("    RANK LOCAL_RANK MASTER_PORT                       ROLE_RANK "
                          "TORCHELASTIC_ERROR_FILE\n"
                          "    0    0          <private port, picked each round> 0         "
                          "logs/laptop/<run>/attempt-0/rank-0.error.json\n"
                          "    1    1          29500                             1         "
                          "logs/laptop/<run>/attempt-0/rank-1.error.json\n"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("code that derives ports from MASTER_PORT needs cluster.store_port"),
            std::string::npos)
      << text.out;
}

constexpr std::string_view kSecretJob = R"(version = 1
[job]
name = "j"
command = ["python3", "train.py"]
[job.env]
WANDB_API_KEY = "k-123456"
HF_TOKEN = "t-123456"
db_password = "p-123456"
MY_SECRET_THING = "s-123456"
NCCL_DEBUG = "WARN"
[cluster]
nnodes = 2
master_port = 29500
)";

// Values of secret-looking job.env names never reach any output of check.
TEST(Cli, CheckHidesSecretLookingValues) {
  const std::string path = TempFile("secret.toml", std::string(kSecretJob));
  const Output text = RunDdprun("check " + path, /*merge_stderr=*/true);
  const Output json = RunDdprun("check --json " + path, /*merge_stderr=*/true);
  for (const Output* o : {&text, &json}) {
    EXPECT_EQ(o->exit_code, 0) << o->out;
    EXPECT_EQ(o->out.find("-123456"), std::string::npos) << o->out;
    EXPECT_NE(o->out.find("WARN"), std::string::npos) << o->out;
  }
  EXPECT_NE(text.out.find("    WANDB_API_KEY=<hidden>\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(" && HF_TOKEN='<hidden>' MY_SECRET_THING='<hidden>' "
                          "NCCL_DEBUG=WARN WANDB_API_KEY='<hidden>' db_password='<hidden>' "
                          "torchrun "),
            std::string::npos)
      << text.out;
  auto j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.out;
  EXPECT_EQ(j["plan"]["nodes"][1]["ranks"][0]["env"]["HF_TOKEN"], "<hidden>");
}

TEST(Cli, JobEnvMayNotSetTheSharedSecret) {
  const std::string path = TempFile("secret-in-env.toml",
                                    "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n"
                                    "env = { DDPRUN_SECRET = \"hunter2\" }\n"
                                    "[cluster]\nnnodes = 1\n");
  const Output o = RunDdprun("check " + path, true);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.out, path +
                       ":5:9: error: job.env may not set DDPRUN_SECRET: the shared secret "
                       "must not be in the job file\n"
                       "    5 | (line not shown: it holds a secret)\n"
                       "   hint: set DDPRUN_SECRET_FILE (a file only you can read) in the "
                       "environment of ddprun on every node; see Security in "
                       "docs/running.md\n"
                       "1 error, 0 warnings\n");
}

std::string EphemeralWarning(const std::string& path, int port, int first, int last, bool default_fits) {
  return path + ":7:15: warning: cluster.master_port = " + std::to_string(port) +
         " is inside this machine's ephemeral port range (" + std::to_string(first) + "-" +
         std::to_string(last) + ")\n" + "    7 | master_port = " + std::to_string(port) +
         "\n      |               ^\n   hint: an outgoing connection may be given this port, "
         "and node 0 then cannot listen on it; use a port outside the range" +
         (default_fits ? " (e.g. 29500, as torchrun)" : "") +
         ", or reserve it with `sysctl net.ipv4.ip_local_reserved_ports=" + std::to_string(port) +
         "`\n0 errors, 1 warning\n";
}

// The range this machine's kernel uses (Linux's default where /proc cannot be read).
std::pair<int, int> EphemeralRange() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 32768, last = 60999;
  if (!(in >> first >> last)) return {32768, 60999};
  return {first, last};
}

TEST(Cli, CheckWarnsAboutAMasterPortInTheEphemeralRange) {
  const auto [first, last] = EphemeralRange();
  const int port = last;  // inside the range, and (unless reserved) free to be taken
  std::ifstream reserved_file("/proc/sys/net/ipv4/ip_local_reserved_ports");
  std::string reserved;
  std::getline(reserved_file, reserved);
  if (!reserved.empty()) GTEST_SKIP() << "ports are reserved here: " << reserved;
  const std::string path = TempFile("ephemeral.toml",
                                    "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n"
                                    "[cluster]\nnnodes = 1\nmaster_port = " +
                                        std::to_string(port) + "\n");
  const SplitOutput o = RunDdprunSplit("check " + path);
  EXPECT_EQ(o.exit_code, 0);
  const bool default_fits = 29500 < first || 29500 > last;
  EXPECT_EQ(o.err, EphemeralWarning(path, port, first, last, default_fits));
}

// --json: one JSON document on stdout and nothing on stderr, for a valid file with a warning
// and for an invalid one.
TEST(Cli, CheckJsonPrintsOnlyJson) {
  const std::string warn = TempFile("json-warn.toml",
                                    "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n"
                                    "[cluster]\nnnodes = 1\nmaster_port = 80\n");
  const std::string bad = TempFile("json-bad.toml", "version = 1\n[job]\nnmae = 1\n");
  for (const std::string& path : {warn, bad}) {
    const SplitOutput o = RunDdprunSplit("check --json " + path);
    EXPECT_EQ(o.err, "") << path;
    auto j = nlohmann::json::parse(o.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << o.out;
    EXPECT_FALSE(j["diagnostics"].empty()) << o.out;
  }
}

TEST(Cli, DidYouMeanForFlagsAndCommands) {
  const std::string job = SourcePath("examples/laptop.toml");
  const SplitOutput flag = RunDdprunSplit(job + " --nodes-rank 1");
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.err.find("hint: `--nodes-rank` is not an option of `ddprun run`; did you mean "
                          "`--node-rank`?\n"),
            std::string::npos)
      << flag.err;
  const SplitOutput check_flag = RunDdprunSplit("check " + job + " --jsn");
  EXPECT_NE(check_flag.err.find("did you mean `--json`?"), std::string::npos) << check_flag.err;
  const SplitOutput command = RunDdprunSplit("chekc " + job);
  EXPECT_EQ(command.exit_code, 2);
  EXPECT_EQ(command.err,
            "ddprun: error: `chekc` is neither a command nor a job file; did you "
            "mean `ddprun check`?\n");
}

// `ddprun init` writes a file that `check` accepts without a warning, and never overwrites one.
TEST(Cli, InitWritesAValidStarterJobFile) {
  const auto dir = std::filesystem::temp_directory_path() / "ddprun-cli-test-init";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // The script of a command written as a path must exist, or check warns (a binary not built),
  // and so must the Python script (a typo).
  std::ofstream(dir / "run.sh") << "#!/bin/sh\n";
  std::ofstream(dir / "train.py") << "print(1)\n";
  const std::string listed = (dir / "listed.toml").string();
  const std::string counted = (dir / "counted.toml").string();
  const std::string cpu = (dir / "cpu.toml").string();
  for (const auto& [path, flags] : std::vector<std::pair<std::string, std::string>>{
           {listed, "--nodes gpu-01,gpu-02 --gpus 8 --script train.py"},
           {counted, "--nnodes 4 --gpus 2 --name big --script ./run.sh"},
           {cpu, "--gpus 0"}}) {
    const SplitOutput init = RunDdprunSplit("init -o " + path + " " + flags);
    EXPECT_EQ(init.exit_code, 0) << init.err;
    EXPECT_EQ(init.out, "wrote " + path + "; next: ddprun check " + path + "\n");
    const Output check = RunDdprun("check " + path, /*merge_stderr=*/true);
    EXPECT_EQ(check.exit_code, 0) << check.out;
    EXPECT_EQ(check.out.find("warning"), std::string::npos) << check.out;
  }
  EXPECT_NE(RunDdprun("check " + listed).out.find("job train: 2 nodes x 8 processes"), std::string::npos);
  EXPECT_NE(RunDdprun("check " + counted).out.find("job big: 4 nodes x 2 processes"), std::string::npos);
  EXPECT_NE(RunDdprun("check " + cpu).out.find("job train: 1 node x 1 process"), std::string::npos);
  const SplitOutput again = RunDdprunSplit("init -o " + listed);
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_EQ(again.err, "ddprun init: cannot write " + listed + ": File exists (--force overwrites it)\n");
  EXPECT_EQ(RunDdprunSplit("init --force -o " + listed).exit_code, 0);
  std::filesystem::remove_all(dir);
}

// Issue 40: `init --script train.sh` wrote command = ["train.sh"], which is looked up on PATH (exit
// 127, then restarts); `init --slurm` wrote a stop_grace equal to SLURM's default KillWait.
TEST(Cli, InitWritesCommandsThatRunFromWorkdirAndAStopGraceBelowKillWait) {
  const auto dir = std::filesystem::temp_directory_path() / "ddprun-cli-test-init-script";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto written = [&](const std::string& name, const std::string& flags) {
    const std::string path = (dir / name).string();
    EXPECT_EQ(RunDdprunSplit("init -o " + path + " " + flags).exit_code, 0);
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_NE(written("sh.toml", "--script train.sh").find("command = [\"bash\", \"train.sh\"]"),
            std::string::npos);
  EXPECT_NE(written("bin.toml", "--script mytool").find("command = [\"./mytool\"]"), std::string::npos);
  const std::string slurm = written("slurm.toml", "--slurm --nnodes 2");
  EXPECT_NE(slurm.find("stop_grace = \"20s\""), std::string::npos) << slurm;
  EXPECT_NE(written("plain.toml", "").find("stop_grace = \"30s\""), std::string::npos);
  std::filesystem::remove_all(dir);
}

// Issue 40: outside a SLURM allocation `check` showed the default 127.0.0.1 as node 0's address,
// in the coordinator line, MASTER_ADDR and the torchrun command; nothing is known of it there.
TEST(Cli, CheckOutsideASlurmAllocationShowsNoMadeUpCoordinator) {
  const std::string path = TempFile("slurm.toml",
                                    "version = 1\n[job]\nname = \"s\"\ncommand = [\"python3\", \"t.py\"]\n"
                                    "[cluster]\nhosts_from = \"slurm\"\nnnodes = 2\nmaster_port = 29500\n"
                                    "[trainer]\naccelerator = \"cpu\"\ndevices = 1\nnum_nodes = 2\n");
  const Output o = RunDdprun("check " + path, /*merge_stderr=*/true);
  EXPECT_EQ(o.exit_code, 0) << o.out;
  EXPECT_NE(o.out.find("coordinator on node 0 at <node 0's host in the allocation>:29500"), std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("    MASTER_ADDR=<node 0's host in the allocation>\n"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("127.0.0.1"), std::string::npos) << o.out;
}

TEST(Cli, CheckAppendsArgumentsAfterDashes) {
  const std::string job = SourcePath("examples/laptop.toml");
  const Output o = RunDdprun("check --node-rank 1 " + job + " -- --lr 0.1 'a b'");
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_NE(o.out.find("  ddprun:   ddprun " + job + " --node-rank 1 -- --lr 0.1 'a b'\n"), std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("ddp_train.py --steps 20 --lr 0.1 'a b'\n"), std::string::npos) << o.out;
  EXPECT_EQ(RunDdprun("schema -- x").exit_code, 2);
}

// Above a few dozen nodes the text plan is a summary; --full and --json give everything.
TEST(Cli, CheckSummarisesALargeJob) {
  std::string nodes;
  for (int i = 1; i <= 64; ++i)
    nodes += (i > 1 ? ", " : "") + std::string("\"gpu-") + std::to_string(1000 + i) + "\"";
  const std::string path = TempFile("large.toml",
                                    "version = 1\n[job]\nname = \"big\"\ncommand = [\"python3\", \"t.py\"]\n"
                                    "[cluster]\nnodes = [" +
                                        nodes +
                                        "]\n[trainer]\naccelerator = \"gpu\"\n"
                                        "devices = 8\nnum_nodes = 64\n");
  const Output summary = RunDdprun("check " + path);
  EXPECT_EQ(summary.exit_code, 0);
  const auto lines = [](const std::string& text) { return std::count(text.begin(), text.end(), '\n'); };
  EXPECT_LT(lines(summary.out), 90) << summary.out;
  for (const char* expected :
       {"64 nodes: a summary; the whole plan with --full, one node with --node-rank N, for tools "
        "--json\n",
        "      0  gpu-1001  0..7\n", "    ...  (58 more)\n", "     63  gpu-1064  504..511\n",
        "differs per node: GROUP_RANK, NODE_RANK\n",
        "differs per worker: LOCAL_RANK, MASTER_PORT, RANK, ROLE_RANK, TORCHELASTIC_ERROR_FILE\n",
        "\nnode 63 (gpu-1064):\n", "torchrun --nnodes=64 --nproc_per_node=8 --node_rank=63"}) {
    EXPECT_NE(summary.out.find(expected), std::string::npos) << expected << "\n" << summary.out;
  }
  const Output full = RunDdprun("check --full " + path);
  EXPECT_GT(lines(full.out), 64 * 8 * 2) << full.out.substr(0, 2000);
  EXPECT_NE(full.out.find("\nnode 37 (gpu-1038):\n"), std::string::npos);
  const Output json = RunDdprun("check --json " + path);
  auto j = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["plan"]["nodes"].size(), 64u);
}

// A binary job file: nothing raw reaches the terminal.
TEST(Cli, BinaryJobFileIsEscaped) {
  const std::string path = TempFile("binary.toml", std::string("version = 1\n\x1b[2J\x1b]0;pwned\x07"
                                                               "\0\xff\xfe\n",
                                                               30));
  const Output o = RunDdprun("check " + path, true);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.out, path +
                       ":2:15: error: the job file contains a NUL byte; it must be UTF-8 "
                       "text\n"
                       "    2 | <U+001B>[2J<U+001B>]0;pwned<U+0007><U+0000><FF><FE>\n"
                       "      | " +
                       std::string(35, ' ') +
                       "^\n"
                       "   hint: is this the right file? a job file is TOML text\n"
                       "1 error, 0 warnings\n");
}

TEST(Cli, CheckWarnsAboutAMissingWorkdir) {
  const std::string path = TempFile("workdir.toml",
                                    "version = 1\n[job]\nname = \"j\"\ncommand = [\"x\"]\n"
                                    "workdir = \"no-such-folder\"\n[cluster]\nnnodes = 1\n");
  const SplitOutput o = RunDdprunSplit("check " + path);
  EXPECT_EQ(o.exit_code, 0);
  const std::string full = (std::filesystem::path(path).parent_path() / "no-such-folder").string();
  EXPECT_EQ(o.err, path + ":5:11: warning: job.workdir = \"no-such-folder\" is not a folder here (" + full +
                       ")\n"
                       "    5 | workdir = \"no-such-folder\"\n"
                       "      |           ^\n"
                       "   hint: the workers start in it on every node; create it, or make sure "
                       "it exists on the nodes\n"
                       "0 errors, 1 warning\n");
}

}  // namespace

namespace {

// check says whether hung ranks are detected, and how; a bad value is a compiler-style error.
TEST(Cli, CheckSaysHowHungRanksAreDetected) {
  const std::string base =
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"python3\", \"t.py\"]\n"
      "[cluster]\nnnodes = 2\n[timeouts]\n";
  const Output off = RunDdprun("check " + TempFile("progress-off.toml", base));
  ASSERT_EQ(off.exit_code, 0) << off.out;
  EXPECT_NE(off.out.find("hung ranks: NOT detected: without timeouts.progress a round whose ranks "
                         "all hang (a deadlock, a collective that never returns) runs until someone "
                         "stops the job, since no other timeout ends it; set timeouts.progress and "
                         "call ddprun.progress() in the training loop (docs/job-file.md, "
                         "[timeouts])\n"),
            std::string::npos)
      << off.out;
  const Output fixed = RunDdprun("check " + TempFile("progress-fixed.toml", base + "progress = \"5m\"\n"));
  EXPECT_NE(fixed.out.find("hung ranks: a rank without a progress beacon for 5m (10m to the first) "
                           "is hung; workers must call ddprun.progress()\n"),
            std::string::npos)
      << fixed.out;
  const Output automatic =
      RunDdprun("check " + TempFile("progress-auto.toml", base + "progress = \"auto\"\n"));
  EXPECT_NE(automatic.out.find("hung ranks: timeouts.progress = \"auto\" (5 x the longest interval "
                               "between beacons, at least 10s; 10m to the first beacon)"),
            std::string::npos)
      << automatic.out;
  const Output bad =
      RunDdprun("check " + TempFile("progress-bad.toml", base + "progress = \"soon\"\n"), true);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("error: timeouts.progress = \"soon\" is neither \"auto\" nor a duration"),
            std::string::npos)
      << bad.out;
  const Output short_one =
      RunDdprun("check " + TempFile("progress-short.toml", base + "progress = \"3s\"\n"), true);
  EXPECT_EQ(short_one.exit_code, 2);
  EXPECT_NE(short_one.out.find("timeouts.progress = 3s is shorter than 2 x timeouts.heartbeat = 4s"),
            std::string::npos)
      << short_one.out;
}

}  // namespace

namespace {

TEST(Cli, CheckRefusesNeverOnEntriesThatNameNoFailure) {
  const std::string base =
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"python3\", \"t.py\"]\n"
      "[cluster]\nnnodes = 2\n[restart]\nmax_restarts = 3\n";
  const Output good = RunDdprun(
      "check " + TempFile("never-good.toml",
                          base + "never_on = [\"SyntaxError\", \"torch.cuda.OutOfMemoryError\", "
                                 "\"exit:2\", \"signal:SIGSEGV\", \"signal:11\", \"oom\", \"hang\"]\n"),
      true);
  EXPECT_EQ(good.exit_code, 0) << good.out;
  const Output bad =
      RunDdprun("check " + TempFile("never-bad.toml",
                                    base + "never_on = [\"exit:300\", \"Syntax Error\", \"signal:0\", "
                                           "\"SyntaxError\", \"SyntaxError\"]\n"),
                true);
  EXPECT_EQ(bad.exit_code, 2);
  for (const char* expected : {
           "error: restart.never_on: \"exit:300\" names no kind of failure",
           "hint: an exit code is 0..255, e.g. \"exit:2\"",
           "error: restart.never_on: \"Syntax Error\" names no kind of failure",
           "hint: a signal number is 1..64",
           "error: restart.never_on lists \"SyntaxError\" twice",
       }) {
    EXPECT_NE(bad.out.find(expected), std::string::npos) << expected << "\n" << bad.out;
  }
}

}  // namespace

namespace {

// check says where each node serves its metrics; a bad listen value is a compiler-style error
// and a port the kernel may hand out is a warning, as for master_port.
TEST(Cli, CheckSaysWhereMetricsAreServed) {
  const std::string base =
      "version = 1\n[job]\nname = \"j\"\ncommand = [\"python3\", \"t.py\"]\n"
      "[cluster]\nnodes = [\"gpu-01\", \"gpu-02\", \"gpu-03\"]\n[metrics]\n";
  const Output off = RunDdprun("check " + TempFile("metrics-off.toml",
                                                   "version = 1\n[job]\nname = \"j\"\n"
                                                   "command = [\"x\"]\n[cluster]\nnnodes = 1\n"));
  EXPECT_EQ(off.out.find("\nmetrics:"), std::string::npos) << off.out;
  const Output own = RunDdprun("check " + TempFile("metrics-own.toml", base + "listen = \"*:9400\"\n"));
  ASSERT_EQ(own.exit_code, 0) << own.out;
  EXPECT_NE(own.out.find("metrics: each node serves GET /metrics on port 9400 of its address in "
                         "cluster.nodes for itself, node 0 also for the job: "
                         "http://gpu-01:9400/metrics, http://gpu-02:9400/metrics, ...\n"),
            std::string::npos)
      << own.out;
  const Output any = RunDdprun("check " + TempFile("metrics-any.toml", base + "listen = \"0.0.0.0:9400\"\n"));
  EXPECT_NE(any.out.find("metrics: each node serves GET /metrics on 0.0.0.0:9400 for itself, node 0 "
                         "also for the job: http://gpu-01:9400/metrics, http://gpu-02:9400/metrics, ...\n"),
            std::string::npos)
      << any.out;
  const Output json =
      RunDdprun("check --json " + TempFile("metrics-json.toml", base + "listen = \"127.0.0.1:9400\"\n"));
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["plan"]["metrics_listen"], "127.0.0.1:9400");
  EXPECT_EQ(j["plan"]["nodes"][1]["metrics_url"], "http://127.0.0.1:9400/metrics");
  // Agents that share a host: a port per node, and check lists each URL.
  const Output per_node =
      RunDdprun("check --json " + TempFile("metrics-per-node.toml",
                                           base + "listen = \"127.0.0.1:9400\"\nports = \"per-node\"\n"));
  const auto p = nlohmann::json::parse(per_node.out);
  EXPECT_EQ(p["plan"]["nodes"][0]["metrics_url"], "http://127.0.0.1:9400/metrics");
  EXPECT_EQ(p["plan"]["nodes"][2]["metrics_url"], "http://127.0.0.1:9402/metrics");

  const std::string bad_path = TempFile("metrics-bad.toml", base + "listen = \"gpu-01:9400\"\n");
  const SplitOutput bad = RunDdprunSplit("check " + bad_path);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err, bad_path +
                         ":8:10: error: metrics.listen = \"gpu-01:9400\": \"gpu-01\" is neither an "
                         "IP address nor \"*\"\n"
                         "    8 | listen = \"gpu-01:9400\"\n"
                         "      |          ^\n"
                         "   hint: every node reads this address: write \"0.0.0.0\" (every "
                         "interface), \"127.0.0.1\" (this host only) or \"*\" (each node's own "
                         "entry of cluster.nodes)\n"
                         "1 error, 0 warnings\n");

  const auto [first, last] = EphemeralRange();
  std::ifstream reserved_file("/proc/sys/net/ipv4/ip_local_reserved_ports");
  std::string reserved;
  std::getline(reserved_file, reserved);
  if (!reserved.empty()) GTEST_SKIP() << "ports are reserved here: " << reserved;
  const std::string ephemeral_path =
      TempFile("metrics-ephemeral.toml", base + "listen = \"*:" + std::to_string(last) + "\"\n");
  const SplitOutput ephemeral = RunDdprunSplit("check " + ephemeral_path);
  EXPECT_EQ(ephemeral.exit_code, 0);
  EXPECT_NE(ephemeral.err.find(":8:10: warning: metrics.listen = \"*:" + std::to_string(last) + "\": port " +
                               std::to_string(last) + " is inside this machine's ephemeral port range (" +
                               std::to_string(first) + "-" + std::to_string(last) + ")\n"),
            std::string::npos)
      << ephemeral.err;
}

}  // namespace
