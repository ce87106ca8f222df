#pragma once
// Words for how a worker ended, shared by the coordinator's summaries and the agents' logs.

#include <string>
#include <string_view>
#include <vector>

namespace ddprun::core {

/// One thing a failure is known by. Typed everywhere in the code; spelled as text only where
/// people and files see it: the event log's "kinds", the summary's "kind:" line, the metrics,
/// and restart.never_on's rules ("ValueError", "oom", "nccl", "lost-peer", "signal:SIGSEGV",
/// "exit:1", "hang", "lost-node", "stall").
struct FailureKind {
  enum class Type { kException, kOom, kNccl, kLostPeer, kSignal, kExit, kHang, kLostNode, kStall };
  Type type = Type::kExit;
  std::string exception;  // kException: its type, "torch.cuda.OutOfMemoryError"
  int number = 0;         // kSignal: the signal (-1 a name no table here knows); kExit: the code

  static FailureKind Of(Type type) { return FailureKind{type, {}, 0}; }
  static FailureKind Exception(std::string name) { return FailureKind{Type::kException, std::move(name), 0}; }
  static FailureKind Signal(int signal) { return FailureKind{Type::kSignal, {}, signal}; }
  static FailureKind Exit(int code) { return FailureKind{Type::kExit, {}, code}; }
  /// Its one spelling.
  std::string Text() const;
  /// The inverse of Text, for what a file or a rule says: "signal:11" is Signal(11), a word
  /// that is none of the others an exception name.
  static FailureKind Parse(std::string_view text);
  bool operator==(const FailureKind&) const = default;
};
/// Each kind's Text, in order, and back (an event log's "kinds").
std::vector<std::string> KindTexts(const std::vector<FailureKind>& kinds);
std::vector<FailureKind> ParseKinds(const std::vector<std::string>& texts);
/// Whether one of `kinds` is of `type`.
bool HasKind(const std::vector<FailureKind>& kinds, FailureKind::Type type);

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

/// Whether `text` holds what NCCL and PyTorch's NCCL process group print when a collective
/// fails (advice that merely names NCCL is not an NCCL error).
bool MentionsNccl(const std::string& text);

/// The Python exception type that ended a worker ("ValueError", "torch.cuda.OutOfMemoryError"),
/// from its error file, else from the last lines of its stderr; "" when neither shows one.
std::string ExceptionType(const std::string& error_file, const std::string& stderr_tail);

/// What a worker's failure is known by, the most specific first: its Python exception type,
/// "oom" (CUDA or host memory), "nccl", "lost-peer", then "signal:SIGSEGV" or "exit:1". The
/// coordinator adds "hang", "lost-node" and "stall" for failures that are not a process exit.
std::vector<FailureKind> FailureKinds(int exit_code, int signal, const std::string& error_file,
                                      const std::string& stderr_tail);

/// Whether `rule`, an entry of restart.never_on, names one of `kinds`: an exception type
/// (a bare name also matches a qualified one: "OutOfMemoryError" matches
/// "torch.cuda.OutOfMemoryError"), "exit:N", "signal:NAME" or "signal:N", or a kind word.
bool RuleMatches(std::string_view rule, const std::vector<FailureKind>& kinds);

/// Prefixes every line of `text` with `indent`, drops trailing blank lines.
std::string Indent(const std::string& text, const std::string& indent);

}  // namespace ddprun::core
