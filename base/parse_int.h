#pragma once
// Decimal integers from the environment and from /proc names, checked whole: no sign, no
// trailing text, a bound.

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

/// `text` as an integer in [0, max]; nullopt when empty, not wholly a decimal number, or out
/// of range. Leading blanks and a '+' are accepted, as strtol accepts them.
inline std::optional<long> ParseNonNegative(std::string_view text, long max) {
  if (text.empty()) return std::nullopt;
  const std::string copy(text);  // strtol needs the terminating NUL
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(copy.c_str(), &end, 10);
  if (errno != 0 || end == copy.c_str() || *end != '\0' || value < 0 || value > max) {
    return std::nullopt;
  }
  return value;
}

}  // namespace ddprun
