#pragma once
// A folder of event logs (docs/report.md) as `ddprun report` and `ddprun --simulate --replay`
// read it: every events-node<k>.jsonl below it, parsed, and the run the user picked.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "report/event_log.h"
#include "report/rebuild.h"

namespace ddprun::cli {

/// Every event file below `dir` (or `dir` itself, a file), read a piece at a time as files in
/// shared folders are (runner/io/safe_file.h) and parsed, its records within a bound on memory;
/// the error names the file and line.
Result<std::vector<report::EventFile>> LoadEventFiles(const std::string& dir);

/// The index of the run `run` (1-based, oldest first; nullopt: the newest) of `runs`. With
/// several runs, lists them on stderr; out of range: says so and returns nullopt.
std::optional<size_t> ChooseRun(const std::vector<report::Run>& runs, std::optional<int> run,
                                const std::string& dir, std::string_view tool, std::string_view what);

}  // namespace ddprun::cli
