#pragma once
// Where the agent finds the `ddprun` Python module it puts on every worker's PYTHONPATH: staged
// beside the binary at build time and installed the same way, <exe dir>/../share/ddprun/python.

#include <optional>
#include <string>

namespace ddprun::io {

/// The folder that holds the `ddprun` Python package for the running binary (resolved through
/// /proc/self/exe): DdprunPythonDirFor(that path). nullopt when it cannot be resolved.
std::optional<std::string> DdprunPythonDir();

/// `<folder of exe_path>/../share/ddprun/python` as a canonical absolute path when
/// `ddprun/__init__.py` exists below it; nullopt otherwise. `exe_path` is absolute; the
/// executable itself need not exist.
std::optional<std::string> DdprunPythonDirFor(const std::string& exe_path);

/// The warm-start template (job.preload), staged and installed beside the module as
/// <exe dir>/../share/ddprun/warm/template.py, outside the workers' PYTHONPATH: canonical and
/// absolute, or nullopt when it is not there.
std::optional<std::string> DdprunWarmTemplate();
std::optional<std::string> DdprunWarmTemplateFor(const std::string& exe_path);

}  // namespace ddprun::io
