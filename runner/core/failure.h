#pragma once
// Words for how a worker ended, shared by the coordinator's summaries and the agents' logs.

#include <string>

namespace ddprun::core {

/// "SIGKILL" for 9, "signal 42" for unknown numbers.
std::string SignalName(int signal);

/// "exited with code 1" or "was killed by signal 9 (SIGKILL)".
std::string DescribeExit(int exit_code, int signal);

/// Whether a rank's error reads as the consequence of another rank going away rather than a
/// failure of its own: its collective library lost a peer (gloo's "Connection closed by peer",
/// NCCL's "remote process exited", a reset or broken connection, an aborted communicator).
/// Looks at the error file and at the last lines of stderr, where the error itself is. The
/// root cause of a round prefers a failure that does not read so.
bool LooksLikeALostPeer(const std::string& error_file, const std::string& stderr_tail);

/// Whether a rank's error is the stop itself: the SIGTERM (or SIGINT) that ddprun or the user
/// sent, turned into an exception by the program (Lightning's SignalException, Python's
/// KeyboardInterrupt). Such an error file is written after the stop began: never a root cause.
bool LooksLikeTheStop(const std::string& error_file, const std::string& stderr_tail);

/// Prefixes every line of `text` with `indent`, drops trailing blank lines.
std::string Indent(const std::string& text, const std::string& indent);

}  // namespace ddprun::core
