#pragma once
// The checks a job file's text must pass before toml++ parses it: size, NUL bytes, UTF-8 and
// nesting depth, so that the parser is never handed input that could make it slow or deep.

#include <cstddef>
#include <string_view>

#include "schema/diagnostics.h"

namespace ddprun {

/// The largest job file ddprun reads.
inline constexpr size_t kMaxFileBytes = 1 << 20;
/// The deepest nesting of arrays and inline tables.
inline constexpr int kMaxNesting = 32;

/// Reports the first problem with `text` and returns false; true when toml++ may parse it.
bool PreScan(std::string_view text, Diagnostics& diagnostics);

/// 1-based line and column (in code points, as toml++ counts them) of byte `offset`.
SourceLoc LocAtOffset(std::string_view text, size_t offset);

}  // namespace ddprun
