// The real `ddprun` binary pointing at the right place: check's code and library lines, torchrun
// lines that work from any folder, a missing program, torchrun habits, long keys, exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Output {
  int exit_code = -1;
  std::string text;  // stdout and stderr
};

// `command` through the shell with DDPRUN_BINARY as $D, stdout and stderr together.
Output Shell(const std::string& command) {
  const std::string line = "D=" + std::string(DDPRUN_BINARY) + "; " + command + " 2>&1";
  Output result;
  FILE* pipe = ::popen(line.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.text.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// A fresh folder for one test, removed afterwards.
class Folder {
 public:
  Folder() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ddprun-pointers-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) ? pattern : "";
  }
  ~Folder() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::filesystem::path file = std::filesystem::path(path_) / name;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
    return file.string();
  }

 private:
  std::string path_;
};

// A job file with these [job] lines (name first) and [cluster] lines; two nodes on a
// non-loopback master by default, so that check has nothing else to say.
std::string Job(const std::string& job_lines,
                const std::string& cluster = "nnodes = 2\nmaster_addr = \"10.0.0.1\"\n") {
  return "version = 1\n[job]\nname = \"p\"\n" + job_lines + "[cluster]\n" + cluster;
}

std::string Sha256Prefix(const std::string& path) {
  const Output o = Shell("sha256sum '" + path + "'");
  return o.text.substr(0, 12);
}

// code_check with an interpreter named by path, through env, with options, and python -m: the
// plan names the file hashed and says what it is.
TEST(Pointers, CheckNamesTheScriptNotTheInterpreter) {
  Folder dir;
  const std::string train = dir.Write("train.py", "print('hi')\n");
  const std::string module = dir.Write("src/pkg/train.py", "print('module')\n");
  const std::string main = dir.Write("tool/__main__.py", "print('main')\n");
  const std::string tail = ", workdir not in a git repository\n";
  const std::pair<std::string, std::string> cases[] = {
      {"command = [\"/opt/venv/bin/python3.11\", \"train.py\"]",
       "train.py sha256 " + Sha256Prefix(train) + " (the script /opt/venv/bin/python3.11 runs)" + tail},
      {"command = [\"/usr/bin/env\", \"python3\", \"-u\", \"train.py\", \"--lr\", \"1\"]",
       "train.py sha256 " + Sha256Prefix(train) + " (the script python3 runs)" + tail},
      {"command = [\"python3\", \"-X\", \"dev\", \"-m\", \"pkg.train\"]\nenv = { PYTHONPATH = \"src\" }",
       "src/pkg/train.py sha256 " + Sha256Prefix(module) + " (module pkg.train as python3 -m finds it)" +
           tail},
      {"command = [\"python\", \"-m\", \"tool\"]",
       "tool/__main__.py sha256 " + Sha256Prefix(main) + " (module tool as python -m finds it)" + tail},
      {"command = [\"python3\", \"-m\", \"nope.train\"]",
       "nothing to hash (module nope.train is neither under job.workdir nor on the job's PYTHONPATH "
       "(an installed package?); not compared)" +
           tail},
      {"command = [\"python3\", \"-c\", \"print(1)\"]",
       "nothing to hash (python3 -c runs code written in job.command itself, which every node's "
       "job file already agrees on; no file to compare)" +
           tail},
  };
  for (const auto& [command, expected] : cases) {
    const std::string job = dir.Write("job.toml", Job(command + "\ncode_check = \"refuse\"\n"));
    const Output o = Shell("cd / && $D check " + job);
    EXPECT_EQ(o.exit_code, 0) << o.text;
    EXPECT_THAT(o.text, HasSubstr("\ncode (nodes that differ are refused): " + expected)) << command;
  }
}

// Issue 36.4: an interpreter that ignores SIGTERM and leaves a child in a session of its own
// holding its stdout held `check` for 40 s on 56e208f (docs: "at most 5 s"). Its group is
// killed at the bound and the pipe is not waited for past it.
TEST(Pointers, AnInterpreterThatHangsHoldsCheckForItsBoundOnly) {
  Folder dir;
  const std::string python =
      dir.Write("bin/python3", "#!/bin/sh\ntrap '' TERM\nsetsid sleep 20 &\nsleep 40\n");
  ::chmod(python.c_str(), 0755);
  const std::string job =
      dir.Write("job.toml", Job("command = [\"" + python + "\", \"train.py\"]\nlibrary_check = \"warn\"\n"));
  const auto started = std::chrono::steady_clock::now();
  const Output o = Shell("$D check " + job);
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(o.exit_code, 0) << o.text;
  EXPECT_THAT(o.text, HasSubstr("did not answer within 5s")) << o.text;
  EXPECT_LT(took, std::chrono::seconds(9)) << o.text;
}

// Issue 40: Lightning imported from a source tree (a git checkout on PYTHONPATH) was "-", and a
// stale dist-info later on the path was read instead of the code Python imports. The version is
// read where Python would import the package from; a tree with no version is compared by a hash
// of its files, and says so.
TEST(Pointers, CheckReadsTheLibraryPythonWouldImport) {
  Folder dir;
  dir.Write("tree/lightning/__init__.py", "from lightning.__version__ import version as __version__\n");
  dir.Write("tree/lightning/version.info", "2.2.5\n");
  dir.Write("site/lightning-2.2.6.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: lightning\nVersion: 2.2.6\n");
  dir.Write("bare/pytorch_lightning/__init__.py", "import os\n");
  const std::string job =
      dir.Write("job.toml", Job("command = [\"python3\", \"train.py\"]\nlibrary_check = \"refuse\"\n"));
  const std::string path =
      "PYTHONPATH=" + dir.path() + "/tree:" + dir.path() + "/site:" + dir.path() + "/bare";
  const Output o = Shell(path + " $D check " + job);
  EXPECT_EQ(o.exit_code, 0) << o.text;
  EXPECT_THAT(o.text, HasSubstr(", lightning 2.2.5, ")) << o.text;
  const std::regex hashed(", pytorch_lightning (sha256:[0-9a-f]{16}), ");
  std::smatch first;
  ASSERT_TRUE(std::regex_search(o.text, first, hashed)) << o.text;
  // Other code in the unversioned tree: another hash. The same code: the same hash.
  EXPECT_EQ(std::regex_search(Shell(path + " $D check " + job).text, hashed), true);
  std::smatch same;
  const Output again = Shell(path + " $D check " + job);
  ASSERT_TRUE(std::regex_search(again.text, same, hashed)) << again.text;
  EXPECT_EQ(same[1], first[1]);
  dir.Write("bare/pytorch_lightning/__init__.py", "import sys\n");
  std::smatch other;
  const Output changed = Shell(path + " $D check " + job);
  ASSERT_TRUE(std::regex_search(changed.text, other, hashed)) << changed.text;
  EXPECT_NE(other[1], first[1]);
  // With the tree gone from the path, the metadata is what Python finds (nothing else names it).
  const Output metadata_only = Shell("PYTHONPATH=" + dir.path() + "/site $D check " + job);
  EXPECT_THAT(metadata_only.text, HasSubstr(", lightning 2.2.6, ")) << metadata_only.text;
}

// library_check: check lists what this node's Python would use, read from package metadata
// (a dist-info and, as Debian's python3-torch installs it, an egg-info).
TEST(Pointers, CheckListsTheLibraries) {
  Folder dir;
  dir.Write("site/torch-1.13.0a0+gitunknown.egg-info/PKG-INFO",
            "Metadata-Version: 2.1\nName: torch\nVersion: 1.13.0a0+gitunknown\n");
  dir.Write("site/torch/version.py", "__version__ = '1.13.0a0'\ndebug = False\ncuda = None\n");
  dir.Write("site/lightning-2.2.5.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: lightning\nVersion: 2.2.5\n");
  const std::string job =
      dir.Write("job.toml", Job("command = [\"python3\", \"train.py\"]\nlibrary_check = \"warn\"\n"));
  const Output o = Shell("PYTHONPATH=" + dir.path() + "/site $D check " + job);
  EXPECT_EQ(o.exit_code, 0) << o.text;
  EXPECT_THAT(o.text, HasSubstr("\nlibraries (nodes that differ are warned about): python 3."));
  // pytorch_lightning and NCCL come from the machine's own site-packages (or are "-").
  EXPECT_THAT(o.text, HasSubstr("), torch 1.13.0a0+gitunknown, lightning 2.2.5, pytorch_lightning "))
      << o.text;
  EXPECT_THAT(o.text, HasSubstr(", cuda -\n")) << o.text;
  // The job's interpreter runs with -S: the job's sitecustomize.py does not run for `check`.
  dir.Write("site/sitecustomize.py", "open('" + dir.path() + "/sitecustomize-ran', 'w').close()\n");
  const Output again = Shell("PYTHONPATH=" + dir.path() + "/site $D check " + job);
  EXPECT_EQ(again.exit_code, 0) << again.text;
  EXPECT_THAT(again.text, HasSubstr(", lightning 2.2.5, ")) << again.text;
  EXPECT_THAT(again.text,
              HasSubstr(" -S -c '<print version and sys.path>' once, in workdir with job.env, at most 5 s"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/sitecustomize-ran"));
  // A program that is not Python: the python3 on PATH is read, and the line says so.
  const std::string shell_job =
      dir.Write("sh.toml", Job("command = [\"sh\", \"train.sh\"]\nlibrary_check = \"refuse\"\n"));
  EXPECT_THAT(Shell("$D check " + shell_job).text,
              HasSubstr("(job.command runs sh, not Python: these are the python3 on PATH's)\n"));
  const std::string bad = dir.Write("bad.toml", Job("command = [\"x\"]\nlibrary_check = \"yes\"\n"));
  const Output invalid = Shell("$D check " + bad);
  EXPECT_EQ(invalid.exit_code, 2);
  EXPECT_THAT(invalid.text,
              HasSubstr(bad + ":5:17: error: job.library_check = \"yes\" is not \"off\", \"warn\" or "
                              "\"refuse\"\n    5 | library_check = \"yes\"\n      |                 ^\n"
                              "   hint: \"refuse\" refuses a node whose Python, torch, "
                              "Lightning, NCCL or CUDA version differs from node 0's; \"warn\" lets "
                              "it join and says what differs\n"))
      << invalid.text;
}

// The torchrun lines `cd` to the absolute workers' folder, so they work from anywhere.
TEST(Pointers, TorchrunLinesWorkFromAnotherFolder) {
  Folder dir;
  const std::string job = dir.Write("job.toml", Job("command = [\"python3\", \"train.py\"]\n"));
  const Output o = Shell("cd / && $D check " + job);
  EXPECT_EQ(o.exit_code, 0) << o.text;
  EXPECT_THAT(o.text, HasSubstr("  torchrun: cd " + dir.path() + " && torchrun --nnodes=2 ")) << o.text;
  const std::string sub =
      dir.Write("sub.toml", Job("command = [\"python3\", \"train.py\"]\nworkdir = \"code/../run\"\n"));
  std::filesystem::create_directories(dir.path() + "/run");
  EXPECT_THAT(Shell("cd / && $D check " + sub).text,
              HasSubstr("  torchrun: cd " + dir.path() + "/run && torchrun "));
}

// A program written as a path that is not there (a binary not built yet): a warning with its
// place, and check still passes.
TEST(Pointers, CheckWarnsWhenTheProgramPathDoesNotExist) {
  Folder dir;
  const std::string job =
      dir.Write("job.toml", Job("command = [\"build/cpp_ddp_train\", \"--steps\", \"2\"]\n"));
  const Output o = Shell("$D check " + job);
  EXPECT_EQ(o.exit_code, 0) << o.text;
  EXPECT_THAT(o.text, HasSubstr(job +
                                ":4:12: warning: job.command[0] = \"build/cpp_ddp_train\" does "
                                "not exist here (" +
                                dir.path() + "/build/cpp_ddp_train)\n"))
      << o.text;
  EXPECT_THAT(o.text, HasSubstr("\n   hint: the workers run it on every node; build or install it first "
                                "(relative paths are relative to job.workdir), or fix the path\n"));
  dir.Write("build/cpp_ddp_train", "#!/bin/sh\n");
  EXPECT_THAT(Shell("$D check " + job).text, Not(HasSubstr("warning")));
  // Through env too; a bare name is left to each node's PATH.
  const std::string env_job = dir.Write("env.toml", Job("command = [\"/usr/bin/env\", \"./missing.sh\"]\n"));
  EXPECT_THAT(Shell("$D check " + env_job).text,
              HasSubstr("warning: job.command[1] = \"./missing.sh\" does not exist"));
  const std::string bare = dir.Write("bare.toml", Job("command = [\"no-such-program-here\"]\n"));
  EXPECT_THAT(Shell("$D check " + bare).text, Not(HasSubstr("warning")));
}

// torchrun's elastic range and a rendezvous shorter than the default heartbeat allows: each
// error names where to look.
TEST(Pointers, NnodesRangeAndDefaultHeartbeat) {
  Folder dir;
  const std::string range = dir.Write("range.toml", Job("command = [\"x\"]\n", "nnodes = \"2:4\"\n"));
  const Output r = Shell("$D check " + range);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.text,
              HasSubstr(range + ":6:10: error: cluster.nnodes must be an integer, not a string\n"
                                "    6 | nnodes = \"2:4\"\n      |          ^\n"
                                "   hint: nnodes is a number, not torchrun's MIN:MAX range: write nnodes = 4 "
                                "and min_nodes = 2 (cluster.min_nodes lets rounds run with fewer nodes "
                                "when some are lost)\n"))
      << r.text;
  const std::string beat =
      dir.Write("beat.toml", Job("command = [\"x\"]\n",
                                 "nnodes = 2\n[timeouts]\nrendezvous = \"5s\"\nstop_grace = \"1s\"\n"
                                 "[restart]\nbackoff = \"1s\"\n"));
  const Output b = Shell("$D check " + beat);
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_THAT(b.text,
              HasSubstr(beat + ":8:14: error: timeouts.rendezvous = 5s is too short for the default "
                               "timeouts.heartbeat = 2s (not set in this file): a node is declared lost "
                               "after 3 missed beats (6s)\n"))
      << b.text;
}

// Typed as for torchrun or python: a pointer to `ddprun init --script`, nothing from TOML or
// the option parser.
TEST(Pointers, TorchrunHabitsGetAPointerToInit) {
  Folder dir;
  dir.Write("train.py", "print(1)\n");
  const Output script = Shell("cd " + dir.path() + " && $D train.py");
  EXPECT_EQ(script.exit_code, 2);
  EXPECT_EQ(script.text,
            "ddprun: error: `train.py` is a Python script; ddprun runs a job file (TOML) that names the "
            "script, the nodes and the workers per node\n"
            "hint: `ddprun init --script train.py` writes job.toml for it (add --nodes host-a,host-b for "
            "several machines), then run `ddprun job.toml` on every node\n");
  const Output torchrun = Shell("cd " + dir.path() + " && $D --nproc_per_node=2 train.py --lr 0.1");
  EXPECT_EQ(torchrun.exit_code, 2);
  EXPECT_EQ(torchrun.text,
            "ddprun: error: `train.py` is a Python script; ddprun runs a job file (TOML) that names the "
            "script, the nodes and the workers per node\n"
            "hint: `ddprun init --script train.py --gpus 2` writes job.toml for it (--gpus is torchrun's "
            "--nproc_per_node; add --nodes host-a,host-b for several machines), then run `ddprun "
            "job.toml -- --lr 0.1` on every node\n");
  const Output options = Shell("$D --nnodes 2 --nproc-per-node 8");
  EXPECT_EQ(options.exit_code, 2);
  EXPECT_EQ(options.text,
            "ddprun: error: `--nnodes` is a torchrun option; ddprun takes a job file (TOML) instead of "
            "options\n"
            "hint: `ddprun init --script train.py --nnodes 2 --gpus 8` writes job.toml for it (--gpus is "
            "torchrun's --nproc_per_node; add --nodes host-a,host-b for several machines), then run "
            "`ddprun job.toml` on every node\n");
  // The suggested command works.
  const Output init =
      Shell("cd " + dir.path() + " && $D init --script train.py --gpus 2 && $D check job.toml");
  EXPECT_EQ(init.exit_code, 0) << init.text;
}

// Issue 40: the hint dropped --master_addr, --master_port and the script's arguments. They are in
// the init command it prints (the master as node 0), and that command writes a job that checks
// with the same nodes, port and processes.
TEST(Pointers, TheTorchrunHintKeepsTheMasterThePortAndTheArguments) {
  Folder dir;
  dir.Write("train.py", "print(1)\n");
  const Output o = Shell("cd " + dir.path() +
                         " && $D --nproc_per_node=4 --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 "
                         "--master_port=29400 train.py --epochs 3 --name 'my run'");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(
      o.text,
      "ddprun: error: `train.py` is a Python script; ddprun runs a job file (TOML) that names the "
      "script, the nodes and the workers per node\n"
      "hint: `ddprun init --script train.py --nodes 10.0.0.1,HOST1 --gpus 4 --master-port 29400` writes "
      "job.toml for it (--gpus is torchrun's --nproc_per_node; node 0 is torchrun's --master_addr; put "
      "the other machine's name for HOST1), then run `ddprun job.toml -- --epochs 3 --name 'my run'` on "
      "every node\n");
  const std::string init = o.text.substr(o.text.find("`ddprun init") + 8,
                                         o.text.find("` writes") - o.text.find("`ddprun init") - 8);
  const Output written = Shell("cd " + dir.path() + " && $D " + init + " && $D check job.toml --node-rank 1");
  EXPECT_EQ(written.exit_code, 0) << written.text;
  EXPECT_THAT(written.text, HasSubstr("job train: 2 nodes x 4 processes = world size 8")) << written.text;
  EXPECT_THAT(written.text, HasSubstr("MASTER_ADDR=10.0.0.1\n")) << written.text;
  EXPECT_THAT(written.text, HasSubstr("MASTER_PORT=29400\n")) << written.text;
  // Many nodes: no list of 300 placeholders.
  const Output many = Shell("cd " + dir.path() + " && $D --nnodes=300 --master_addr=10.0.0.1 train.py");
  EXPECT_THAT(many.text,
              HasSubstr("`ddprun init --script train.py --nnodes 300` writes job.toml for it (list the "
                        "machines with --nodes, 10.0.0.1 (torchrun's --master_addr) first)"))
      << many.text;
}

// A 10,000-character key is named by its start and length, not echoed whole.
TEST(Pointers, UnknownKeyMessagesAreBounded) {
  Folder dir;
  const std::string key(10000, 'k');
  const std::string job = dir.Write("long.toml", Job("command = [\"x\"]\n" + key + " = 1\n"));
  const Output o = Shell("$D check " + job);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_THAT(o.text, HasSubstr("error: unknown key `job." + std::string(40, 'k') + "... (10000 bytes)`"))
      << o.text.substr(0, 2000);
  // The message stays short; the file's own line is shown as the renderer shows any line.
  std::string longest;
  std::stringstream lines(o.text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("error:") != std::string::npos && line.size() > longest.size()) longest = line;
  }
  EXPECT_LT(longest.size(), 400u) << longest.substr(0, 500);
}

// The exit codes in `--help` are the README's.
TEST(Pointers, HelpAndReadmeAgreeOnExitCodes) {
  const Output help = Shell("$D --help");
  EXPECT_EQ(help.exit_code, 0);
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/README.md");
  std::stringstream readme;
  readme << in.rdbuf();
  auto codes = [](const std::string& text, const std::string& start) {
    std::set<int> found;
    const size_t at = text.find(start);
    if (at == std::string::npos) return found;
    const std::string paragraph = text.substr(at, text.find("\n\n", at) - at);
    const std::regex number("\\b[0-9]{1,3}\\b");
    for (auto it = std::sregex_iterator(paragraph.begin(), paragraph.end(), number);
         it != std::sregex_iterator(); ++it) {
      found.insert(std::stoi(it->str()));
    }
    return found;
  };
  const std::set<int> from_help = codes(help.text, "Exit codes:");
  const std::set<int> from_readme = codes(readme.str(), "Exit codes:");
  EXPECT_EQ(from_help, (std::set<int>{0, 1, 2, 3, 70, 129, 130, 143})) << help.text;
  EXPECT_EQ(from_readme, from_help);
}

}  // namespace
