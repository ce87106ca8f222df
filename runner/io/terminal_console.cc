#include "runner/io/terminal_console.h"

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>

#include <unistd.h>

#include <fmt/format.h>

#include "runner/io/console_writer.h"
#include "schema/diagnostics.h"

namespace ddprun::io {

namespace {

/// "12:00:01.250": the local time of day, to the millisecond.
std::string TimeOfDay() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  return fmt::format("{:02}:{:02}:{:02}.{:03}", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

}  // namespace

TerminalConsole::TerminalConsole(ConsoleWriter& writer, int node_rank, bool verbose)
    : writer_(writer),
      node_rank_(node_rank),
      verbose_(verbose),
      color_(::isatty(STDERR_FILENO) == 1 && std::getenv("NO_COLOR") == nullptr) {}

void TerminalConsole::Log(core::LogLevel level, std::string_view source, std::string_view text) {
  if (level == core::LogLevel::kDebug && !verbose_) return;
  const char* tag = level == core::LogLevel::kError  ? "error: "
                    : level == core::LogLevel::kWarn ? "warning: "
                                                     : "";
  // The coordinator speaks for the job; the agent for this node.
  const std::string who = source == "coordinator" ? "coordinator" : fmt::format("n{}", node_rank_);
  const bool paint = color_ && *tag != '\0';
  Print(fmt::format("[ddprun {} {}] {}{}{}{}\n", TimeOfDay(), who,
                    !paint                            ? ""
                    : level == core::LogLevel::kError ? "\x1b[1;31m"
                                                      : "\x1b[1;35m",
                    tag, paint ? "\x1b[0m" : "", EscapeLinesForTerminal(text)));
}

void TerminalConsole::Summary(std::string_view text) {
  const std::string rule(72, '=');
  // This node's own facts (its log folder, logs it could not write) follow the job's words.
  std::string footer = footer_ ? footer_() : "";
  if (!footer.empty() && footer.back() == '\n') footer.pop_back();
  if (!job_summary_) {
    if (!footer.empty()) Log(core::LogLevel::kInfo, "agent", footer);
    return;
  }
  // The summary carries text from other nodes and from workers (tracebacks, a peer's
  // reason): escaped, like every line this console prints.
  Print(fmt::format("{}\n{}\n{}{}{}\n", rule, EscapeLinesForTerminal(text), EscapeLinesForTerminal(footer),
                    footer.empty() ? "" : "\n", rule));
}

void TerminalConsole::Print(const std::string& text) { writer_.Write(ConsoleWriter::Stream::kErr, text); }

std::string LogsHint(const std::string& run_folder) {
  const std::filesystem::path folder = run_folder;
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  if (!ec) {
    const auto relative = folder.lexically_relative(cwd);
    if (!relative.empty() && *relative.begin() != "..") return relative.string() + "/";
  }
  return folder.string() + "/";
}

}  // namespace ddprun::io
