#include "tests/tidy/tidy.h"

#include <cctype>
#include <regex>

namespace ddprun::testing {
namespace {

struct Rule {
  const char* what;
  const char* pattern;  // ECMAScript regex, matched against code with comments and strings blanked
};

// Each pattern names the call or type, not a substring of ours (`Now()`, `SimTimer`, `Open`
// are our ports and stay allowed).
constexpr Rule kCodeRules[] = {
    {"a clock",
     R"(_clock\s*::\s*now\b|\bgettimeofday\b|\bclock_gettime\b|(^|[^\w.>])time\s*\(|\bclock\s*\(\s*\))"},
    {"a thread", R"(\bstd\s*::\s*(thread|jthread|async)\b|\bpthread_\w+)"},
    {"a random generator outside sim/prng.h",
     R"((^|[^\w.>])s?rand\s*\(|\brandom_device\b|\buniform_\w+_distribution\b|\bmt19937)"},
    {"the environment", R"(\b(secure_)?getenv\b|\bsetenv\b|\benviron\b)"},
    {"a socket", R"((^|[^\w.>])(socket|bind|listen|accept|connect)\s*\()"},
    {"process spawning",
     R"((^|[^\w.>])(v?fork|execv|execve|execvp|execl|execlp|execle|popen|system)\s*\(|\bposix_spawn)"},
    {"file I/O", R"(\bf(re)?open\s*\(|\b(o|i)?fstream\b|(^|[^\w.>])open\s*\(|\bopenat\s*\()"},
};

constexpr Rule kIncludeRules[] = {
    {"Asio", R"(#\s*include\s*[<"](asio|boost/asio)[./])"},
    {"Boost.Process", R"(#\s*include\s*[<"]boost/process)"},
    {"a thread", R"(#\s*include\s*<(thread|future)>)"},
    {"a random generator outside sim/prng.h", R"(#\s*include\s*<random>)"},
    {"file I/O", R"(#\s*include\s*<(fstream|fcntl\.h)>)"},
    {"a socket", R"(#\s*include\s*<(sys/socket\.h|netinet/|arpa/inet\.h|netdb\.h))"},
    {"process spawning", R"(#\s*include\s*<(unistd\.h|spawn\.h|sys/wait\.h)>)"},
};

// The text with comments and the contents of string and character literals replaced by
// spaces, line structure kept.
std::string Blank(std::string_view source) {
  std::string out(source);
  enum class State { kCode, kLine, kBlock, kString, kChar, kRaw } state = State::kCode;
  std::string raw_end;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = source[i];
    const char next = i + 1 < source.size() ? source[i + 1] : '\0';
    switch (state) {
      case State::kCode:
        if (c == '/' && next == '/') {
          state = State::kLine;
          out[i] = ' ';
        } else if (c == '/' && next == '*') {
          state = State::kBlock;
          out[i] = ' ';
        } else if (c == 'R' && next == '"' &&
                   (i == 0 || !std::isalnum(static_cast<unsigned char>(source[i - 1])))) {
          const size_t open = source.find('(', i + 2);
          if (open == std::string_view::npos) break;
          raw_end = ")" + std::string(source.substr(i + 2, open - i - 2)) + "\"";
          state = State::kRaw;
          i = open;
        } else if (c == '"') {
          state = State::kString;
        } else if (c == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(source[i - 1])))) {
          state = State::kChar;  // not a digit separator such as 1'000
        }
        break;
      case State::kLine:
        if (c == '\n')
          state = State::kCode;
        else
          out[i] = ' ';
        break;
      case State::kBlock:
        if (c == '*' && next == '/') {
          out[i] = out[i + 1] = ' ';
          ++i;
          state = State::kCode;
        } else if (c != '\n') {
          out[i] = ' ';
        }
        break;
      case State::kString:
      case State::kChar:
        if (c == '\\') {
          out[i] = ' ';
          if (i + 1 < out.size() && next != '\n') out[++i] = ' ';
        } else if ((state == State::kString && c == '"') || (state == State::kChar && c == '\'')) {
          state = State::kCode;
        } else if (c != '\n') {
          out[i] = ' ';
        }
        break;
      case State::kRaw:
        if (source.substr(i, raw_end.size()) == raw_end) {
          i += raw_end.size() - 1;
          state = State::kCode;
        } else if (c != '\n') {
          out[i] = ' ';
        }
        break;
    }
  }
  return out;
}

std::string Trim(std::string_view line) {
  const size_t begin = line.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return "";
  const size_t end = line.find_last_not_of(" \t\r");
  return std::string(line.substr(begin, end - begin + 1));
}

}  // namespace

std::vector<TidyFinding> ScanForBannedUses(std::string_view source) {
  static const auto compile = [](const auto& rules) {
    std::vector<std::pair<std::string, std::regex>> out;
    for (const Rule& rule : rules) out.emplace_back(rule.what, std::regex(rule.pattern));
    return out;
  };
  static const auto code_rules = compile(kCodeRules);
  static const auto include_rules = compile(kIncludeRules);
  const std::string blanked = Blank(source);
  std::vector<TidyFinding> findings;
  size_t start = 0;
  for (int number = 1; start <= source.size(); ++number) {
    size_t end = source.find('\n', start);
    if (end == std::string_view::npos) end = source.size();
    const std::string_view raw = source.substr(start, end - start);
    const std::string code = blanked.substr(start, end - start);
    const bool include = Trim(raw).starts_with("#") && Trim(raw).find("include") != std::string::npos;
    for (const auto& [what, re] : include ? include_rules : code_rules) {
      if (std::regex_search(include ? std::string(raw) : code, re)) {
        findings.push_back(TidyFinding{number, what, Trim(raw)});
        break;
      }
    }
    start = end + 1;
  }
  return findings;
}

}  // namespace ddprun::testing
