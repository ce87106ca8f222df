#pragma once
// The real Console: the agent's and coordinator's lines on stderr, as
// "[ddprun 12:00:01.250 n1] warning: ...", with the time of day, coloured only on a terminal,
// and every line of other nodes' and workers' text escaped; the job's summary between two
// rules. Everything goes through the non-blocking ConsoleWriter, so a terminal that stops
// reading never stops the loop.

#include <functional>
#include <string>
#include <string_view>

#include "runner/host/ports.h"

namespace ddprun::io {

class ConsoleWriter;

class TerminalConsole final : public host::Console {
 public:
  /// Colour as `check` has it: only on a terminal, and never with NO_COLOR set (no-color.org).
  TerminalConsole(ConsoleWriter& writer, int node_rank, bool verbose);
  void Log(core::LogLevel level, std::string_view source, std::string_view text) override;
  void Summary(std::string_view text) override;
  /// This node's own facts (its log folder, logs it could not write), printed after the job's
  /// summary.
  void SetSummaryFooter(std::function<std::string()> footer) { footer_ = std::move(footer); }
  /// Prints only the footer, as a line, not the job's summary (every node but node 0 under
  /// `ddprun up`).
  void OmitJobSummary() { job_summary_ = false; }

 private:
  void Print(const std::string& text);
  ConsoleWriter& writer_;
  int node_rank_;
  bool verbose_;
  bool color_;
  bool job_summary_ = true;
  std::function<std::string()> footer_;
};

/// The job's log folder as the user can open it: relative to the current directory when it
/// lies below it ("logs/resnet50/"), else absolute.
std::string LogsHint(const std::string& run_folder);

}  // namespace ddprun::io
