#include "cli/code_identity.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

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
  const std::filesystem::path path =
      std::filesystem::path(arg).is_absolute() ? std::filesystem::path(arg)
                                               : std::filesystem::path(workdir) / arg;
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) ? path : std::filesystem::path();
}

}  // namespace

JobSpec::Code FindCode(const JobSpec& spec, const std::string& workdir) {
  JobSpec::Code code;
  const auto& command = spec.job.command;
  // The program itself only when written as a path ("./train.sh", "bin/train"): a bare
  // "python3" is found on PATH and is not the job's code.
  for (size_t i = 0; i < command.size() && code.script.empty(); ++i) {
    if (i == 0 && command[0].find('/') == std::string::npos) continue;
    if (i > 0 && command[i - 1] == "-m") break;  // `python -m package`: no single file
    const std::filesystem::path path = FileOf(workdir, command[i]);
    if (path.empty()) continue;
    code.script = command[i];
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec || size > kMaxScriptBytes) break;
    std::ifstream in(path, std::ios::binary);
    std::string content(static_cast<size_t>(size), '\0');
    in.read(content.data(), static_cast<std::streamsize>(content.size()));
    if (in.gcount() == static_cast<std::streamsize>(content.size())) {
      code.script_sha256 = Sha256Hex(content);
    }
  }
  if (auto head = Git(workdir, "rev-parse --verify --quiet HEAD")) {
    while (!head->empty() && (head->back() == '\n' || head->back() == '\r')) head->pop_back();
    code.git_commit = *head;
    if (auto status = Git(workdir, "status --porcelain --untracked-files=no")) {
      code.git_dirty = !status->empty();
    }
  }
  return code;
}

std::string DescribeCode(const JobSpec::Code& code) {
  std::string text = "code: ";
  text += code.script.empty() ? "no script file found in job.command"
                              : fmt::format("{} sha256 {}", code.script,
                                            code.script_sha256.empty()
                                                ? std::string("(not read)")
                                                : code.script_sha256.substr(0, 12));
  text += code.git_commit.empty()
              ? ", workdir not in a git repository"
              : fmt::format(", git {}{}", code.git_commit.substr(0, 12),
                            code.git_dirty ? " (dirty)" : "");
  return text;
}

}  // namespace ddprun::cli
