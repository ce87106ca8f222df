// Helpers shared by the schema tests.
#include "tests/schema/test_util.h"

#include <fmt/format.h>

namespace ddprun::testing {

LoadResult Parse(std::string_view text) { return ParseJobText(text, "job.toml"); }

std::string Diags(const LoadResult& result) {
  std::string out;
  for (const Diagnostic& d : SortedDiagnostics(result.diagnostics)) {
    out += fmt::format("{}:{}: {}: {}\n", d.loc.line, d.loc.column,
                       d.severity == Severity::kError ? "error" : "warning", d.message);
    if (!d.hint.empty()) out += fmt::format("  hint: {}\n", d.hint);
    if (!d.note.empty()) {
      out += fmt::format("  note {}:{}: {}\n", d.note_loc.line, d.note_loc.column, d.note);
    }
  }
  return out;
}

std::string WithBase(std::string_view extra) { return std::string(kBaseJob) + std::string(extra); }

}  // namespace ddprun::testing
