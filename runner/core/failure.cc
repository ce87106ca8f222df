#include "runner/core/failure.h"

#include <csignal>

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

}  // namespace ddprun::core
