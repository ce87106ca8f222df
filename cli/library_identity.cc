#include "cli/library_identity.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "cli/job_python.h"
#include "schema/plan.h"

namespace ddprun::cli {
namespace {

// The interpreter's answer: its version, sys.executable, then sys.path, one per line.
constexpr std::string_view kProbe =
    "import sys\n"
    "print('%d.%d.%d' % sys.version_info[:3])\n"
    "print(sys.executable)\n"
    "for p in sys.path: print(p)\n";
constexpr size_t kMaxProbeOutput = 64 * 1024;
// A metadata file's header is at its start; its Version: line is among the first few.
constexpr int kMaxMetadataLines = 64;

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// `interpreter -c kProbe` in `workdir` with job.env, or nullopt when it fails or takes longer
// than kInterpreterTimeoutSeconds.
std::optional<std::vector<std::string>> AskInterpreter(const JobSpec& spec, const std::string& interpreter,
                                                       const std::string& workdir) {
  std::string command = "cd " + ShellQuote(workdir) + " && env";
  for (const auto& [name, value] : spec.job.env) command += " " + ShellQuote(name + "=" + value);
  command += fmt::format(" timeout {} {} -c {} 2>/dev/null", kInterpreterTimeoutSeconds,
                         ShellQuote(interpreter), ShellQuote(kProbe));
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    if (out.size() < kMaxProbeOutput) out.append(buffer, std::min(n, kMaxProbeOutput - out.size()));
  }
  const int status = ::pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  std::vector<std::string> lines = SplitLines(out);
  if (lines.size() < 2) return std::nullopt;
  return lines;
}

// "torch", "Lightning", "pytorch-lightning", "nvidia.nccl" -> "torch", "lightning",
// "pytorch_lightning", "nvidia_nccl" (the normalisation of package names, PEP 503 style).
std::string NormalName(std::string name) {
  for (char& c : name) {
    if (c == '-' || c == '.') c = '_';
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return name;
}

// The Version: of a METADATA / PKG-INFO file, "" when it has none near its start.
std::string VersionIn(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  for (int i = 0; i < kMaxMetadataLines && std::getline(in, line); ++i) {
    if (line.starts_with("Version:")) {
      const size_t begin = line.find_first_not_of(' ', 8);
      return begin == std::string::npos ? "" : line.substr(begin, 128);
    }
  }
  return "";
}

// The CUDA version a torch was built with, from torch/version.py ("cuda = '12.1'" or
// "cuda: Optional[str] = '12.1'"); "" for None or when unreadable.
std::string TorchCuda(const std::filesystem::path& site) {
  std::ifstream in(site / "torch" / "version.py");
  std::string line;
  for (int i = 0; i < kMaxMetadataLines && std::getline(in, line); ++i) {
    if (!line.starts_with("cuda")) continue;
    const size_t quote = line.find_first_of("'\"", line.find('='));
    if (line.find('=') == std::string::npos || quote == std::string::npos) return "";
    const size_t end = line.find(line[quote], quote + 1);
    return end == std::string::npos ? "" : line.substr(quote + 1, std::min<size_t>(end - quote - 1, 64));
  }
  return "";
}

// Fills the versions not yet found from one sys.path folder's *.dist-info / *.egg-info.
void ReadSite(const std::filesystem::path& site, JobSpec::Libraries& libraries) {
  std::error_code ec;
  if (!std::filesystem::is_directory(site, ec)) return;
  for (std::filesystem::directory_iterator it(site, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    const bool dist_info = entry.ends_with(".dist-info");
    if (!dist_info && !entry.ends_with(".egg-info")) continue;
    const std::string name = NormalName(entry.substr(0, entry.find('-')));
    std::string* field = name == "torch"                 ? &libraries.torch
                         : name == "lightning"           ? &libraries.lightning
                         : name == "pytorch_lightning"   ? &libraries.pytorch_lightning
                         : name.starts_with("nvidia_nccl") ? &libraries.nccl
                                                           : nullptr;
    if (field == nullptr || !field->empty()) continue;
    // An .egg-info may be the metadata file itself (old setuptools) or a folder holding it.
    const std::filesystem::path file = dist_info ? it->path() / "METADATA"
                                       : std::filesystem::is_directory(it->path(), ec) ? it->path() / "PKG-INFO"
                                                                                       : it->path();
    *field = VersionIn(file);
    if (field->empty()) {
      // The folder's name carries the version too ("torch-2.3.1.dist-info").
      const size_t dash = entry.find('-');
      const size_t suffix = entry.rfind('.');
      if (dash != std::string::npos && suffix > dash) *field = entry.substr(dash + 1, suffix - dash - 1);
    }
    if (field == &libraries.torch) libraries.cuda = TorchCuda(site);
  }
}

}  // namespace

JobSpec::Libraries FindLibraries(const JobSpec& spec, const std::string& workdir) {
  JobSpec::Libraries libraries;
  const CommandShape shape = ShapeOf(spec.job.command);
  std::string program = "python3";
  if (shape.python) {
    program = spec.job.command[shape.program];
  } else {
    const std::string runs =
        shape.program < spec.job.command.size() ? spec.job.command[shape.program] : "env";
    libraries.note = fmt::format("job.command runs {}, not Python: these are the python3 on PATH's", runs);
  }
  const std::string found = FindProgram(program, JobEnvValue(spec.job.env, "PATH"), workdir);
  if (found.empty()) {
    libraries.note = fmt::format("{} is not found{}", program,
                                 program.find('/') == std::string::npos ? " on PATH" : "");
    return libraries;
  }
  const auto answer = AskInterpreter(spec, found, workdir);
  if (!answer) {
    libraries.interpreter = found;
    libraries.note = fmt::format("{} -c did not answer within {}s", found, kInterpreterTimeoutSeconds);
    return libraries;
  }
  libraries.python = (*answer)[0];
  libraries.interpreter = (*answer)[1].empty() ? found : (*answer)[1];
  for (size_t i = 2; i < answer->size(); ++i) {
    const std::string& entry = (*answer)[i];
    // "" is the current folder (the workdir): -c puts it first, as a script puts its own.
    const std::filesystem::path site(entry);
    ReadSite(site.is_absolute() ? site : std::filesystem::path(workdir) / site, libraries);
  }
  return libraries;
}

}  // namespace ddprun::cli
