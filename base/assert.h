#pragma once
// DDPRUN_ASSERT: an assertion for programmer errors that stays on in every build type
// (STYLE.md rule 7). <cassert>'s assert() vanishes under NDEBUG, which Release and
// RelWithDebInfo define, so a broken state transition would run on silently in exactly the
// builds users run. Operating errors (a peer, the network, the user's file) are values, never
// assertions.

#include <cstdio>
#include <cstdlib>

namespace ddprun::core::detail {

/// Prints "file:line: assertion failed: condition" to stderr and aborts (a core dump for the
/// post-mortem). Not inline in the macro so each use costs one compare and a cold call.
[[noreturn]] inline void AssertFailed(const char* file, int line, const char* condition) {
  std::fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, condition);
  std::fflush(stderr);
  std::abort();
}

}  // namespace ddprun::core::detail

/// Aborts with file:line and the condition's text when `condition` is false, in every build.
#define DDPRUN_ASSERT(condition)                                            \
  do {                                                                      \
    if (!(condition)) [[unlikely]] {                                        \
      ::ddprun::core::detail::AssertFailed(__FILE__, __LINE__, #condition); \
    }                                                                       \
  } while (false)
