#include "cli/job_python.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace ddprun::cli {
namespace {

// "python", "python3", "python3.11": what CPython installs under a name of its own.
bool IsPythonName(const std::string& program) {
  const std::string base = program.substr(program.find_last_of('/') + 1);
  if (!base.starts_with("python")) return false;
  return base.find_first_not_of("0123456789.", 6) == std::string::npos;
}

// The program env runs: after its options and NAME=value assignments. env's options that
// take a value (-u NAME, -C DIR, -S STRING) are skipped with it.
size_t ProgramAfterEnv(const std::vector<std::string>& command) {
  size_t i = 1;
  while (i < command.size()) {
    const std::string& arg = command[i];
    if (arg == "--") return i + 1;
    if (arg == "-u" || arg == "-C" || arg == "-S" || arg == "--unset" || arg == "--chdir" ||
        arg == "--split-string") {
      i += 2;
    } else if (arg.starts_with("-") || arg.find('=') != std::string::npos) {
      ++i;
    } else {
      return i;
    }
  }
  return command.size();
}

}  // namespace

CommandShape ShapeOf(const std::vector<std::string>& command) {
  CommandShape shape;
  if (command.empty()) return shape;
  const std::string& first = command[0];
  if (first.substr(first.find_last_of('/') + 1) == "env") shape.program = ProgramAfterEnv(command);
  if (shape.program >= command.size()) return shape;
  shape.python = IsPythonName(command[shape.program]);
  if (!shape.python) return shape;
  // Python's own options come before the script; -c and -m end them, and -W, -X and
  // --check-hash-based-pycs take a value (attached, "-Wignore", or the next argument).
  for (size_t i = shape.program + 1; i < command.size(); ++i) {
    const std::string& arg = command[i];
    if (arg == "--check-hash-based-pycs") {
      ++i;
      continue;
    }
    if (arg == "-" || !arg.starts_with("-")) {
      if (arg != "-") shape.script = arg;
      return shape;
    }
    if (arg.starts_with("--")) continue;
    for (size_t c = 1; c < arg.size(); ++c) {
      const char option = arg[c];
      if (option != 'c' && option != 'm' && option != 'W' && option != 'X') continue;
      std::string value = arg.substr(c + 1);
      if (value.empty() && i + 1 < command.size()) value = command[++i];
      if (option == 'c') {
        shape.inline_code = true;
        return shape;
      }
      if (option == 'm') {
        shape.module = value;
        return shape;
      }
      break;  // -W / -X: the rest of the argument was its value
    }
  }
  return shape;
}

std::string FindProgram(const std::string& program, const std::string& path, const std::string& workdir) {
  if (program.empty()) return "";
  std::error_code ec;
  if (program.find('/') != std::string::npos) {
    const std::filesystem::path file =
        program.starts_with("/") ? std::filesystem::path(program) : std::filesystem::path(workdir) / program;
    return std::filesystem::exists(file, ec) ? file.lexically_normal().string() : "";
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    // An empty entry is the current folder.
    const std::string dir = end > start ? path.substr(start, end - start) : std::string(".");
    const std::filesystem::path base =
        dir.starts_with("/") ? std::filesystem::path(dir) : std::filesystem::path(workdir) / dir;
    const std::filesystem::path file = base / program;
    if (std::filesystem::is_regular_file(file, ec) && ::access(file.c_str(), X_OK) == 0) {
      return file.lexically_normal().string();
    }
    start = end + 1;
  }
  return "";
}

std::string JobEnvValue(const std::map<std::string, std::string>& job_env, const std::string& name) {
  if (auto it = job_env.find(name); it != job_env.end()) return it->second;
  const char* value = std::getenv(name.c_str());
  return value ? value : "";
}

}  // namespace ddprun::cli
