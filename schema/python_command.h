#pragma once
// job.command read as a Python command line: the interpreter, its options, and the script or
// module it runs. Warm starts (job.preload) need it: the template is that interpreter with
// those options, and each worker forked from it runs that script or module as `__main__`.

#include <string>
#include <vector>

#include "base/result.h"

namespace ddprun {

struct PythonCommand {
  std::string interpreter;           // command[0]
  std::vector<std::string> options;  // interpreter options before the script or -m, as written
  bool module = false;               // `-m module` rather than a script
  std::string target;                // the script path (as written) or the module name
  std::vector<std::string> args;     // what follows the script or module
};

/// Whether `program` (command[0]) names a Python interpreter: its file name is python,
/// python3 or python3.N.
bool IsPythonInterpreter(const std::string& program);

/// Reads `command` as `python [options] script.py args...` or `python [options] -m mod args...`.
/// Fails with a sentence saying why workers must start cold: not a Python interpreter, `-c`,
/// stdin, an interactive or unknown option.
Result<PythonCommand> ParsePythonCommand(const std::vector<std::string>& command);

/// The line `ddprun check` prints about worker starts: "warm (preloaded: torch, lightning) ..."
/// or "cold ..." with the reason.
std::string WorkerStartText(const std::vector<std::string>& command, const std::vector<std::string>& preload);

}  // namespace ddprun
