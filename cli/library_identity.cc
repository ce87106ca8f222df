#include "cli/library_identity.h"

#include <csignal>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli/job_python.h"
#include "runner/core/auth.h"
#include "runner/io/remote_processes.h"
#include "schema/plan.h"

namespace ddprun::cli {
namespace {

// The interpreter's answer: its version, sys.executable, then the sys.path it would have, one
// per line. It runs with -S: the site module's main() does not run, so neither does the job's
// sitecustomize.py or usercustomize.py, nor an `import` line of a .pth file; the path entries
// they would add (the site folders, then each folder's .pth path lines, in Python's order) are
// added here by reading, as site.py itself would read them.
constexpr std::string_view kProbe =
    "import os, site, sys\n"
    "print('%d.%d.%d' % sys.version_info[:3])\n"
    "print(sys.executable)\n"
    "paths = list(sys.path)\n"
    "dirs = []\n"
    "try:\n"
    "    if site.check_enableusersite(): dirs.append(site.getusersitepackages())\n"
    "except Exception: pass\n"
    "try: dirs += site.getsitepackages()\n"
    "except Exception: pass\n"
    "for d in dirs:\n"
    "    if not os.path.isdir(d) or d in paths: continue\n"
    "    paths.append(d)\n"
    "    try: names = sorted(n for n in os.listdir(d) if n.endswith('.pth'))\n"
    "    except OSError: names = []\n"
    "    for n in names:\n"
    "        try: lines = open(os.path.join(d, n), encoding='utf-8', errors='replace').read().splitlines()\n"
    "        except OSError: continue\n"
    "        for line in lines:\n"
    "            if not line.strip() or line.startswith(('#', 'import ', 'import\\t')): continue\n"
    "            p = os.path.join(d, line.rstrip())\n"
    "            if os.path.exists(p) and p not in paths: paths.append(p)\n"
    "for p in paths: print(p)\n";
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

// `interpreter -S -c kProbe` in `workdir` with job.env, or nullopt when it fails or takes longer
// than kInterpreterTimeoutSeconds. It runs in its own process group, killed whole at the bound,
// and its output is not waited for past it (a background child holding the pipe open, an
// interpreter that ignores SIGTERM: both were seen to hold `check` for 40 s).
std::optional<std::vector<std::string>> AskInterpreter(const JobSpec& spec, const std::string& interpreter,
                                                       const std::string& workdir) {
  io::RemoteChild probe;
  probe.argv = {"/bin/sh", "-c", "cd \"$1\" || exit 126; shift; exec env \"$@\"", "sh", workdir};
  for (const auto& [name, value] : spec.job.env) probe.argv.push_back(name + "=" + value);
  probe.argv.insert(probe.argv.end(), {interpreter, "-S", "-c", std::string(kProbe)});
  io::RunLimits limits;
  limits.deadline = std::chrono::seconds(kInterpreterTimeoutSeconds);
  const io::RunOutcome outcome = io::RunRemoteChildren({probe}, limits);
  if (outcome.interrupted_by) {
    // Ctrl-C during the lookup is the user's: end as it would have without it.
    ::signal(outcome.interrupted_by, SIG_DFL);
    ::raise(outcome.interrupted_by);
  }
  const io::ChildOutcome& child = outcome.children[0];
  if (child.exit_status != 0) return std::nullopt;
  std::vector<std::string> lines = SplitLines(child.out.substr(0, kMaxProbeOutput));
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

// The version a *.dist-info / *.egg-info entry of a folder gives, "" when unreadable.
std::string MetadataVersion(const std::filesystem::directory_entry& info) {
  const std::string entry = info.path().filename().string();
  const bool dist_info = entry.ends_with(".dist-info");
  std::error_code ec;
  // An .egg-info may be the metadata file itself (old setuptools) or a folder holding it.
  const std::filesystem::path file = dist_info ? info.path() / "METADATA"
                                     : std::filesystem::is_directory(info.path(), ec)
                                         ? info.path() / "PKG-INFO"
                                         : info.path();
  std::string version = VersionIn(file);
  if (version.empty()) {
    // The folder's name carries the version too ("torch-2.3.1.dist-info").
    const size_t dash = entry.find('-');
    const size_t suffix = entry.rfind('.');
    if (dash != std::string::npos && suffix > dash) version = entry.substr(dash + 1, suffix - dash - 1);
  }
  return version;
}

// The distributions whose versions are compared.
bool Compared(const std::string& name) {
  return name == "torch" || name == "lightning" || name == "pytorch_lightning" ||
         name.starts_with("nvidia_nccl");
}

// The versions one sys.path folder's metadata gives for the compared distributions, by
// normalised name; the metadata of the others (hundreds in a site-packages) is not opened.
std::map<std::string, std::string> MetadataIn(const std::filesystem::path& site) {
  std::map<std::string, std::string> found;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(site, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    if (!entry.ends_with(".dist-info") && !entry.ends_with(".egg-info")) continue;
    const std::string name = NormalName(entry.substr(0, entry.find('-')));
    if (Compared(name) && !found.contains(name)) found[name] = MetadataVersion(*it);
  }
  return found;
}

// `__version__ = "x"` (or `version = "x"`) near the start of a Python file; "" when none.
std::string VersionAssigned(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  for (int i = 0; i < 4 * kMaxMetadataLines && std::getline(in, line); ++i) {
    if (!line.starts_with("__version__") && !line.starts_with("version =") && !line.starts_with("version:"))
      continue;
    const size_t quote = line.find_first_of("'\"", line.find_first_of("=:"));
    if (quote == std::string::npos) continue;
    const size_t end = line.find(line[quote], quote + 1);
    if (end != std::string::npos && end > quote + 1)
      return line.substr(quote + 1, std::min<size_t>(end - quote - 1, 128));
  }
  return "";
}

// A package without a version anywhere (a source tree): what is there, as a hash of its file
// names and contents, so that two nodes with other code still differ. Bounded: a tree too big to
// read says so instead.
std::string ContentHash(const std::filesystem::path& package) {
  constexpr size_t kMaxFiles = 20'000;
  constexpr uintmax_t kMaxBytes = 256ull << 20;
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator
           it(package, std::filesystem::directory_options::none, ec),
       end;
       !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec) && it->path().extension() != ".pyc") files.push_back(it->path());
    if (files.size() > kMaxFiles) return "unhashed (more than 20000 files)";
  }
  std::sort(files.begin(), files.end());
  std::string digest_input;
  uintmax_t bytes = 0;
  for (const std::filesystem::path& file : files) {
    bytes += std::filesystem::file_size(file, ec);
    if (bytes > kMaxBytes) return "unhashed (more than 256 MiB)";
    std::ifstream in(file, std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    digest_input +=
        std::filesystem::relative(file, package, ec).string() + '\0' + core::Sha256Hex(content) + '\n';
  }
  return "sha256:" + core::Sha256Hex(digest_input).substr(0, 16);
}

// Where Python would import `module` from: the index of the first sys.path folder with a
// regular package (`module/__init__.py`) or a module file (`module.py`), as the path finder looks.
std::optional<size_t> Origin(const std::vector<std::filesystem::path>& path, const std::string& module) {
  std::error_code ec;
  for (size_t i = 0; i < path.size(); ++i) {
    if (std::filesystem::is_regular_file(path[i] / module / "__init__.py", ec) ||
        std::filesystem::is_regular_file(path[i] / (module + ".py"), ec)) {
      return i;
    }
  }
  return std::nullopt;
}

// The version of `module` as imported from `folder` (whose metadata is `metadata`): the metadata
// beside it, else the version its own files state (Lightning's version.info, a __version__), else
// a hash of its files.
std::string VersionAt(const std::filesystem::path& folder, const std::map<std::string, std::string>& metadata,
                      const std::string& module) {
  if (const auto it = metadata.find(module); it != metadata.end() && !it->second.empty()) return it->second;
  const std::filesystem::path package = folder / module;
  std::error_code ec;
  if (!std::filesystem::is_directory(package, ec)) return VersionAssigned(folder / (module + ".py"));
  // Lightning's __version__.py reads version.info beside the package folder in a checkout
  // (src/version.info), else inside it (a wheel).
  auto first_line = [](const std::filesystem::path& file) {
    std::ifstream in(file);
    std::string line;
    if (in && std::getline(in, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (line.size() <= 64) return line;
    }
    return std::string();
  };
  std::ifstream reader(package / "__version__.py");
  const std::string reads((std::istreambuf_iterator<char>(reader)), std::istreambuf_iterator<char>());
  if (reads.find("version.info") != std::string::npos) {
    if (std::string version = first_line(folder / "version.info"); !version.empty()) return version;
  }
  if (std::string version = first_line(package / "version.info"); !version.empty()) return version;
  for (const char* file : {"__about__.py", "__version__.py", "version.py", "__init__.py"}) {
    if (std::string version = VersionAssigned(package / file); !version.empty()) return version;
  }
  return ContentHash(package);
}

// Fills torch, lightning and pytorch_lightning from where Python would import each (issue 40:
// a source tree on PYTHONPATH was "-", and a stale dist-info later on the path was read instead
// of the code imported), NCCL's wheel from the first metadata that names it. A package found
// only as metadata (an editable install whose code an import hook finds) keeps that version.
void ReadLibraries(const std::vector<std::filesystem::path>& path, JobSpec::Libraries& libraries) {
  // Each folder's metadata, read once; and the first metadata of each name along the path.
  std::vector<std::map<std::string, std::string>> metadata;
  std::map<std::string, std::pair<std::string, size_t>> listed;
  for (size_t i = 0; i < path.size(); ++i) {
    metadata.push_back(MetadataIn(path[i]));
    for (const auto& [name, version] : metadata.back()) listed.try_emplace(name, version, i);
  }
  for (const auto& [module, field] : {std::pair<std::string, std::string*>{"torch", &libraries.torch},
                                      {"lightning", &libraries.lightning},
                                      {"pytorch_lightning", &libraries.pytorch_lightning}}) {
    std::optional<size_t> folder = Origin(path, module);
    if (folder) {
      *field = VersionAt(path[*folder], metadata[*folder], module);
    } else if (const auto it = listed.find(module); it != listed.end()) {
      *field = it->second.first;
      folder = it->second.second;
    }
    if (module == "torch" && folder) libraries.cuda = TorchCuda(path[*folder]);
  }
  for (const auto& [name, found] : listed) {
    if (name.starts_with("nvidia_nccl")) {
      libraries.nccl = found.first;
      break;
    }
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
    libraries.note =
        fmt::format("{} is not found{}", program, program.find('/') == std::string::npos ? " on PATH" : "");
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
  std::vector<std::filesystem::path> path;
  for (size_t i = 2; i < answer->size(); ++i) {
    // "" is the current folder (the workdir): -c puts it first, as a script puts its own.
    const std::filesystem::path site((*answer)[i]);
    path.push_back(site.is_absolute() ? site : std::filesystem::path(workdir) / site);
  }
  ReadLibraries(path, libraries);
  return libraries;
}

}  // namespace ddprun::cli
