#pragma once
// The tidy check (tests/tidy/tidy_test.cc): the layers that must stay deterministic and free of
// I/O (runner/core, runner/host, sim) may not use a clock, a thread, the C or std random
// generators, the environment, sockets, process spawning or file I/O, nor include Asio or
// Boost.Process. CMake only checks what a target links; the public include path lets any
// header in, so this scans the source text.

#include <string>
#include <string_view>
#include <vector>

namespace ddprun::testing {

struct TidyFinding {
  int line = 0;
  std::string rule;  // what is banned, e.g. "a clock"
  std::string text;  // the offending line, trimmed
};

/// The banned uses in one file's text. Comments and string literals are ignored, except that
/// `#include` lines are checked as written.
std::vector<TidyFinding> ScanForBannedUses(std::string_view source);

}  // namespace ddprun::testing
