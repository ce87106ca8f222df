#pragma once
// Compiler-style diagnostics for the job file: `job.toml:12:3: error: ...`, the source line,
// a caret under the value and an optional hint.

#include <string>
#include <string_view>
#include <vector>

#include "schema/job_spec.h"

namespace ddprun {

enum class Severity { kError, kWarning };

struct Diagnostic {
  Severity severity = Severity::kError;
  SourceLoc loc;           // {0,0}: not tied to a place in the file
  std::string key_path;    // "cluster.nproc_per_node"; "" for whole-file problems
  std::string message;     // one sentence, no trailing period
  std::string hint;        // "" or e.g. "did you mean `nproc_per_node`?"
  bool operator==(const Diagnostic&) const = default;
};

struct Diagnostics {
  std::vector<Diagnostic> items;

  void Error(SourceLoc loc, std::string key_path, std::string message, std::string hint = {});
  void Warning(SourceLoc loc, std::string key_path, std::string message, std::string hint = {});
  bool HasErrors() const;
  int ErrorCount() const;
  int WarningCount() const;
};

/// Renders every diagnostic the way compilers do, sorted by position, then a count line
/// ("2 errors, 1 warning"). `source_text` supplies the quoted line and caret.
std::string RenderDiagnostics(const Diagnostics& diagnostics, std::string_view source_name,
                              std::string_view source_text, bool color);

}  // namespace ddprun
