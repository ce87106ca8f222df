#include "schema/python_command.h"

#include <fmt/format.h>

namespace ddprun {
namespace {

// Options without a value that change nothing about how the script is found: the template
// starts with them too, so sys.flags are the worker's.
constexpr std::string_view kPlainFlags = "bBdEIOPqRsSuv";

}  // namespace

bool IsPythonInterpreter(const std::string& program) {
  const size_t slash = program.rfind('/');
  const std::string_view name = std::string_view(program).substr(slash == std::string::npos ? 0 : slash + 1);
  if (!name.starts_with("python")) return false;
  std::string_view version = name.substr(6);
  if (version.empty()) return true;
  // "3" or "3.11"
  bool dot = false;
  for (size_t i = 0; i < version.size(); ++i) {
    const char c = version[i];
    if (c == '.' && i > 0 && !dot && i + 1 < version.size()) {
      dot = true;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  return true;
}

Result<PythonCommand> ParsePythonCommand(const std::vector<std::string>& command) {
  if (command.empty() || !IsPythonInterpreter(command[0])) {
    return Fail(
        fmt::format("job.command does not run a Python interpreter ({} is not python, "
                    "python3 or python3.N)",
                    command.empty() ? std::string("nothing") : "\"" + command[0] + "\""));
  }
  PythonCommand parsed;
  parsed.interpreter = command[0];
  size_t i = 1;
  for (; i < command.size(); ++i) {
    const std::string& arg = command[i];
    if (arg.size() < 2 || arg[0] != '-') break;  // the script ("-" alone is stdin, refused below)
    if (arg == "-m" || arg.starts_with("-m")) {
      parsed.module = true;
      if (arg.size() > 2) {
        parsed.target = arg.substr(2);
      } else if (i + 1 < command.size()) {
        parsed.target = command[++i];
      } else {
        return Fail("job.command ends with -m and no module");
      }
      break;
    }
    if (arg == "-W" || arg == "-X") {
      if (i + 1 >= command.size()) return Fail(fmt::format("job.command ends with {} and no value", arg));
      parsed.options.push_back(arg);
      parsed.options.push_back(command[++i]);
      continue;
    }
    if (arg.starts_with("-W") || arg.starts_with("-X")) {
      parsed.options.push_back(arg);
      continue;
    }
    if (arg.starts_with("--")) {
      return Fail(fmt::format("the interpreter option {} is not one warm starts know", arg));
    }
    for (size_t k = 1; k < arg.size(); ++k) {
      if (arg[k] == 'c') return Fail("job.command runs a string (-c), not a script or module");
      if (kPlainFlags.find(arg[k]) == std::string_view::npos) {
        return Fail(fmt::format("the interpreter option -{} is not one warm starts know", arg[k]));
      }
    }
    parsed.options.push_back(arg);
  }
  if (!parsed.module) {
    if (i >= command.size())
      return Fail("job.command names no script or module (an interactive interpreter)");
    if (command[i] == "-") return Fail("job.command reads its program from stdin (-)");
    parsed.target = command[i];
  }
  parsed.args.assign(command.begin() + static_cast<std::ptrdiff_t>(i) + 1, command.end());
  return parsed;
}

std::string WorkerStartText(const std::vector<std::string>& command,
                            const std::vector<std::string>& preload) {
  if (preload.empty()) return "worker start: cold (each worker starts job.command; job.preload is not set)";
  const auto parsed = ParsePythonCommand(command);
  if (!parsed) {
    return fmt::format("worker start: cold, although job.preload is set: {}", parsed.error());
  }
  return fmt::format(
      "worker start: warm: each agent starts a template `{}` that imports {} while "
      "the nodes join, and forks every worker from it to run {}{} as __main__ "
      "(cold instead, said once, when the template is not safe to fork: more than "
      "one thread, CUDA initialised, open files)",
      parsed->interpreter, fmt::join(preload, ", "), parsed->module ? "-m " : "", parsed->target);
}

}  // namespace ddprun
