#pragma once
// How job.command starts: the program it runs (looking through /usr/bin/env), and when that
// is a Python interpreter, what the interpreter runs (a script, a module, inline code). Shared
// by job.code_check (which file to hash), job.library_check (which interpreter's libraries)
// and preflight (which interpreter to ask).

#include <map>
#include <string>
#include <vector>

namespace ddprun::cli {

struct CommandShape {
  /// The index in job.command of the program that runs (1 for "/usr/bin/env python3 ...";
  /// 0 otherwise; command.size() when env names none).
  size_t program = 0;
  /// The program is a Python interpreter: "python", "python3", "python3.11", any path ending
  /// in one ("/opt/venv/bin/python"), also when started through env.
  bool python = false;
  /// For Python: the script it runs ("" when none), or the module of `-m`, or `-c` code.
  std::string script;
  std::string module;
  bool inline_code = false;
};

CommandShape ShapeOf(const std::vector<std::string>& command);

/// Where `program` is: itself when it contains a '/' (relative to `workdir`), else the first
/// executable file of that name on `path` (a PATH value; relative entries against `workdir`).
/// "" when not found.
std::string FindProgram(const std::string& program, const std::string& path, const std::string& workdir);

/// A variable as the job's workers see it: job.env's value, else this process's ("" if unset).
std::string JobEnvValue(const std::map<std::string, std::string>& job_env, const std::string& name);

}  // namespace ddprun::cli
