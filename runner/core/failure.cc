#include "runner/core/failure.h"

#include <algorithm>
#include <csignal>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <utility>

namespace ddprun::core {

std::string SignalName(int signal) {
  switch (signal) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "signal " + std::to_string(signal);
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
                   "remote process exited or there was a network error", "NCCL communicator was aborted",
                   "DistNetworkError", "ncclRemoteError"});
}

bool LooksLikeTheStop(const std::string& error_file, const std::string& stderr_tail) {
  return Mentions(
      error_file, stderr_tail,
      {"SignalException", "got signal: 15", "got signal: 2", "Received SIGTERM", "KeyboardInterrupt"});
}

bool MentionsNccl(const std::string& text) {
  for (const char* marker :
       {"NCCL WARN", "NCCL error", "NCCL Error", "ProcessGroupNCCL", "NCCL communicator", "ncclInternalError",
        "ncclSystemError", "ncclUnhandledCudaError", "ncclRemoteError", "ncclInvalidUsage"}) {
    if (text.find(marker) != std::string::npos) return true;
  }
  return false;
}

namespace {

bool IsIdentifierStart(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool IsIdentifierChar(char c) { return IsIdentifierStart(c) || (c >= '0' && c <= '9'); }

// "ValueError: bad", "torch.cuda.OutOfMemoryError: CUDA out of memory", "KeyboardInterrupt":
// the type, when the line (not indented) starts with one; "" otherwise.
std::string TypeOfExceptionLine(std::string_view line) {
  size_t i = 0;
  size_t last_start = 0;
  while (true) {
    if (i >= line.size() || !IsIdentifierStart(line[i])) return "";
    last_start = i;
    while (i < line.size() && IsIdentifierChar(line[i])) ++i;
    if (i < line.size() && line[i] == '.') {
      ++i;
      continue;
    }
    break;
  }
  if (i < line.size() && line[i] != ':') return "";
  const std::string_view name = line.substr(last_start, i - last_start);
  for (std::string_view suffix : {"Error", "Exception", "Interrupt", "Exit", "Failure", "Timeout"}) {
    if (name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      return std::string(line.substr(0, i));
    }
  }
  return name == "StopIteration" ? std::string(line.substr(0, i)) : "";
}

// The last exception line of `text`, looking at its last `lines` lines.
std::string LastExceptionType(std::string_view text, int lines) {
  size_t end = text.size();
  for (int n = 0; n < lines && end > 0; ++n) {
    while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == '\r')) --end;
    const size_t begin = text.rfind('\n', end == 0 ? 0 : end - 1);
    const size_t from = begin == std::string_view::npos ? 0 : begin + 1;
    if (std::string type = TypeOfExceptionLine(text.substr(from, end - from)); !type.empty()) return type;
    if (begin == std::string_view::npos) break;
    end = begin;
  }
  return "";
}

}  // namespace

std::string ExceptionType(const std::string& error_file, const std::string& stderr_tail) {
  // The error file is the message, or a traceback that ends with the exception's line.
  if (std::string type = LastExceptionType(error_file, 64); !type.empty()) return type;
  return LastExceptionType(stderr_tail, 8);
}

std::vector<FailureKind> FailureKinds(int exit_code, int signal, const std::string& error_file,
                                      const std::string& stderr_tail) {
  std::vector<FailureKind> kinds;
  if (std::string type = ExceptionType(error_file, stderr_tail); !type.empty()) {
    kinds.push_back(FailureKind::Exception(std::move(type)));
  }
  const std::string_view tail = LastLines(stderr_tail, 8);
  for (const char* marker :
       {"CUDA out of memory", "OutOfMemoryError", "MemoryError", "Cannot allocate memory"}) {
    if (error_file.find(marker) != std::string::npos || tail.find(marker) != std::string_view::npos) {
      kinds.push_back(FailureKind::Of(FailureKind::Type::kOom));
      break;
    }
  }
  if (MentionsNccl(error_file) || MentionsNccl(stderr_tail))
    kinds.push_back(FailureKind::Of(FailureKind::Type::kNccl));
  if (LooksLikeALostPeer(error_file, stderr_tail))
    kinds.push_back(FailureKind::Of(FailureKind::Type::kLostPeer));
  kinds.push_back(signal > 0 ? FailureKind::Signal(signal) : FailureKind::Exit(exit_code));
  return kinds;
}

namespace {

using KindType = FailureKind::Type;

// The words of the kinds that carry nothing but their type.
constexpr std::pair<KindType, std::string_view> kKindWords[] = {
    {KindType::kOom, "oom"},   {KindType::kNccl, "nccl"},          {KindType::kLostPeer, "lost-peer"},
    {KindType::kHang, "hang"}, {KindType::kLostNode, "lost-node"}, {KindType::kStall, "stall"}};

// A decimal number of at most nine digits, else nullopt.
std::optional<int> SmallNumber(std::string_view text, bool allow_sign) {
  const bool negative = allow_sign && text.starts_with('-');
  if (negative) text.remove_prefix(1);
  if (text.empty() || text.size() > 9) return std::nullopt;
  int number = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    number = number * 10 + (c - '0');
  }
  return negative ? -number : number;
}

}  // namespace

std::string FailureKind::Text() const {
  switch (type) {
    case Type::kException:
      return exception;
    case Type::kSignal:
      return "signal:" + (number < 0 ? exception : SignalName(number));
    case Type::kExit:
      return "exit:" + std::to_string(number);
    default:
      break;
  }
  for (const auto& [kind, word] : kKindWords) {
    if (kind == type) return std::string(word);
  }
  return "unknown";
}

FailureKind FailureKind::Parse(std::string_view text) {
  for (const auto& [kind, word] : kKindWords) {
    if (text == word) return Of(kind);
  }
  if (text.starts_with("exit:")) {
    if (const auto code = SmallNumber(text.substr(5), true)) return Exit(*code);
  }
  if (text.starts_with("signal:")) {
    const std::string_view name = text.substr(7);
    if (const auto number = SmallNumber(name, false)) return Signal(*number);
    for (int signal = 1; signal < 65; ++signal) {
      if (SignalName(signal) == name) return Signal(signal);
    }
    FailureKind unknown = Signal(-1);  // a name SignalName never gives: matches nothing here
    unknown.exception = std::string(name);
    return unknown;
  }
  return Exception(std::string(text));
}

std::vector<std::string> KindTexts(const std::vector<FailureKind>& kinds) {
  std::vector<std::string> texts;
  texts.reserve(kinds.size());
  for (const FailureKind& kind : kinds) texts.push_back(kind.Text());
  return texts;
}

std::vector<FailureKind> ParseKinds(const std::vector<std::string>& texts) {
  std::vector<FailureKind> kinds;
  kinds.reserve(texts.size());
  for (const std::string& text : texts) kinds.push_back(FailureKind::Parse(text));
  return kinds;
}

bool HasKind(const std::vector<FailureKind>& kinds, FailureKind::Type type) {
  return std::any_of(kinds.begin(), kinds.end(), [&](const FailureKind& kind) { return kind.type == type; });
}

bool RuleMatches(std::string_view rule, const std::vector<FailureKind>& kinds) {
  const FailureKind wanted = FailureKind::Parse(rule);
  for (const FailureKind& kind : kinds) {
    if (kind.type != wanted.type) continue;
    if (kind.type == KindType::kSignal && kind.number < 0) continue;  // an unknown name: nothing
    if (kind.type != KindType::kException) {
      if (kind.number == wanted.number) return true;
      continue;
    }
    // A bare exception name matches its qualified form.
    const std::string& name = kind.exception;
    const std::string& bare = wanted.exception;
    if (name == bare || (name.size() > bare.size() && name[name.size() - bare.size() - 1] == '.' &&
                         name.compare(name.size() - bare.size(), bare.size(), bare) == 0)) {
      return true;
    }
  }
  return false;
}

}  // namespace ddprun::core
