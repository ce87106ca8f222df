#include "runner/core/failure.h"

#include <csignal>
#include <initializer_list>
#include <string_view>

namespace ddprun::core {

std::string SignalName(int signal) {
  switch (signal) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGPIPE: return "SIGPIPE";
    case SIGTERM: return "SIGTERM";
    default: return "signal " + std::to_string(signal);
  }
}

std::string DescribeExit(int exit_code, int signal) {
  if (signal > 0) {
    return "was killed by signal " + std::to_string(signal) + " (" + SignalName(signal) + ")";
  }
  return "exited with code " + std::to_string(exit_code);
}

std::string Indent(const std::string& text, const std::string& indent) {
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out += indent;
    out.append(text, start, end - start);
    out += '\n';
    start = end + 1;
  }
  while (out.size() >= indent.size() + 1 &&
         out.compare(out.size() - indent.size() - 1, indent.size() + 1, indent + "\n") == 0) {
    out.resize(out.size() - indent.size() - 1);
  }
  return out;
}

namespace {

// The last few lines of stderr, where the error itself is; earlier lines may quote anything.
std::string_view LastLines(const std::string& text, int count) {
  size_t from = text.size();
  for (int lines = 0; lines < count && from > 0; ++lines) {
    from = text.rfind('\n', from - 1);
    if (from == std::string::npos) return text;
  }
  return std::string_view(text).substr(from);
}

bool Mentions(const std::string& error_file, const std::string& stderr_tail,
              std::initializer_list<const char*> markers) {
  const std::string_view tail = LastLines(stderr_tail, 4);
  for (const char* marker : markers) {
    if (error_file.find(marker) != std::string::npos || tail.find(marker) != std::string_view::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool LooksLikeALostPeer(const std::string& error_file, const std::string& stderr_tail) {
  return Mentions(error_file, stderr_tail,
                  {"Connection closed by peer", "Connection reset by peer", "Broken pipe",
                   "remote process exited or there was a network error",
                   "NCCL communicator was aborted", "DistNetworkError", "ncclRemoteError"});
}

bool LooksLikeTheStop(const std::string& error_file, const std::string& stderr_tail) {
  return Mentions(error_file, stderr_tail,
                  {"SignalException", "got signal: 15", "got signal: 2", "Received SIGTERM",
                   "KeyboardInterrupt"});
}

}  // namespace ddprun::core
