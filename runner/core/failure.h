#pragma once
// Words for how a worker ended, shared by the coordinator's summaries and the agents' logs.

#include <string>

namespace ddprun::core {

/// "SIGKILL" for 9, "signal 42" for unknown numbers.
std::string SignalName(int signal);

/// "exited with code 1" or "was killed by signal 9 (SIGKILL)".
std::string DescribeExit(int exit_code, int signal);

/// Prefixes every line of `text` with `indent`, drops trailing blank lines.
std::string Indent(const std::string& text, const std::string& indent);

}  // namespace ddprun::core
