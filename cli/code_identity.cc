#include "cli/code_identity.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "cli/job_python.h"
#include "schema/canonical.h"
#include "schema/plan.h"

namespace ddprun::cli {
namespace {

// A script larger than this is not hashed (its digest stays empty): a job's entry point is
// source code or a binary of at most a few hundred MB, and hashing must not delay the join.
constexpr std::uintmax_t kMaxScriptBytes = 512ull << 20;
// What is read of a git command's output: a commit id, or enough of `status` to see it is not
// empty.
constexpr size_t kMaxGitOutput = 4096;

// The output of `git -C workdir args` (stderr dropped), or nullopt when git fails or is absent.
std::optional<std::string> Git(const std::string& workdir, const std::string& args) {
  const std::string command = "git -C " + ShellQuote(workdir) + " " + args + " 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string out;
  char buffer[512];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    if (out.size() < kMaxGitOutput) out.append(buffer, std::min(n, kMaxGitOutput - out.size()));
  }
  const int status = ::pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return out;
}

// The file an argument names, relative to the workdir unless absolute; empty when it is not a
// regular file.
std::filesystem::path FileOf(const std::string& workdir, const std::string& arg) {
  if (arg.empty() || arg.starts_with("-")) return {};
  const std::filesystem::path path = std::filesystem::path(arg).is_absolute()
                                         ? std::filesystem::path(arg)
                                         : std::filesystem::path(workdir) / arg;
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) ? path : std::filesystem::path();
}

// The file `python -m module` runs, looked for as Python would in the folders the job gives
// it: the workdir (python -m puts the current folder first on sys.path), then PYTHONPATH.
// A package runs its __main__.py. Returns the file as found ("pkg/train.py",
// "/opt/src/pkg/__main__.py"), or "" (an installed package, or not there).
std::string ModuleFile(const std::string& module, const JobSpec& spec, const std::string& workdir) {
  std::string relative = module;
  for (char& c : relative) {
    if (c == '.') c = '/';
  }
  std::vector<std::string> roots = {""};
  const std::string pythonpath = JobEnvValue(spec.job.env, "PYTHONPATH");
  size_t start = 0;
  while (!pythonpath.empty() && start <= pythonpath.size()) {
    size_t end = pythonpath.find(':', start);
    if (end == std::string::npos) end = pythonpath.size();
    if (end > start) roots.push_back(pythonpath.substr(start, end - start) + "/");
    start = end + 1;
  }
  for (const std::string& root : roots) {
    for (const std::string& candidate : {root + relative + ".py", root + relative + "/__main__.py"}) {
      if (!FileOf(workdir, candidate).empty())
        return std::filesystem::path(candidate).lexically_normal().string();
    }
  }
  return "";
}

// The SHA-256 of a file of at most kMaxScriptBytes; "" when larger or unreadable.
std::string FileSha256(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxScriptBytes) return "";
  std::ifstream in(path, std::ios::binary);
  std::string content(static_cast<size_t>(size), '\0');
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  if (in.gcount() != static_cast<std::streamsize>(content.size())) return "";
  return Sha256Hex(content);
}

// Which argument of job.command is the job's code, and what to call it.
void FindScript(const JobSpec& spec, const std::string& workdir, JobSpec::Code& code) {
  const auto& command = spec.job.command;
  const CommandShape shape = ShapeOf(command);
  if (shape.program >= command.size()) {
    code.what = "job.command runs env without a program";
    return;
  }
  const std::string& program = command[shape.program];
  if (shape.python) {
    // The interpreter is not the job's code (job.library_check compares its version): the
    // script it runs, or the module's file, is.
    if (shape.inline_code) {
      code.what = fmt::format(
          "{} -c runs code written in job.command itself, which every node's "
          "job file already agrees on; no file to compare",
          program);
    } else if (!shape.module.empty()) {
      code.script = ModuleFile(shape.module, spec, workdir);
      code.what = code.script.empty() ? fmt::format(
                                            "module {} is neither under job.workdir nor on the job's "
                                            "PYTHONPATH (an installed package?); not compared",
                                            shape.module)
                                      : fmt::format("module {} as {} -m finds it", shape.module, program);
    } else if (shape.script.empty()) {
      code.what = fmt::format("{} is given no script in job.command", program);
    } else if (FileOf(workdir, shape.script).empty()) {
      code.what = fmt::format("{}, the script {} runs, is not a file in job.workdir", shape.script, program);
    } else {
      code.script = shape.script;
      code.what = fmt::format("the script {} runs", program);
    }
    return;
  }
  // The program itself when written as a path ("./train.sh", "bin/train"): a bare name such
  // as "bash" is found on PATH and is not the job's code; then the first argument that names
  // a file ("bash train.sh").
  if (program.find('/') != std::string::npos && !FileOf(workdir, program).empty()) {
    code.script = program;
    code.what = "the program job.command runs";
    return;
  }
  for (size_t i = shape.program + 1; i < command.size(); ++i) {
    if (FileOf(workdir, command[i]).empty()) continue;
    code.script = command[i];
    code.what = fmt::format("the first file {} is given", program);
    return;
  }
  code.what = "no file named in job.command";
}

}  // namespace

JobSpec::Code FindCode(const JobSpec& spec, const std::string& workdir) {
  JobSpec::Code code;
  FindScript(spec, workdir, code);
  if (!code.script.empty()) code.script_sha256 = FileSha256(FileOf(workdir, code.script));
  if (auto head = Git(workdir, "rev-parse --verify --quiet HEAD")) {
    while (!head->empty() && (head->back() == '\n' || head->back() == '\r')) head->pop_back();
    code.git_commit = *head;
    if (auto status = Git(workdir, "status --porcelain --untracked-files=no")) {
      code.git_dirty = !status->empty();
    }
  }
  return code;
}

std::string DescribeCode(const JobSpec::Code& code) { return "code: " + DescribeCodeFields(code); }

}  // namespace ddprun::cli
