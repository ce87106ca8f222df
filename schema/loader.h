#pragma once
// TOML text -> JobSpec, with every rule of DESIGN.md section 2 checked and all problems collected.

#include <optional>
#include <string>
#include <string_view>

#include "schema/diagnostics.h"
#include "schema/job_spec.h"

namespace ddprun {

struct LoadResult {
  std::optional<JobSpec> spec;   // set when there is no error (warnings allowed)
  Diagnostics diagnostics;
  std::string source_text;       // what was read, for rendering the diagnostics
};

/// Parses and validates job file text. Never throws, never crashes, bounded in time and memory
/// for any input (binary, truncated, deeply nested, huge numbers).
LoadResult ParseJobText(std::string_view text, std::string_view source_name);

/// Reads `path` (at most 1 MiB) and parses it; a missing or unreadable file is a diagnostic.
LoadResult LoadJobFile(const std::string& path);

}  // namespace ddprun
