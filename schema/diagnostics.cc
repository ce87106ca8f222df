#include "schema/diagnostics.h"

#include <algorithm>

#include <fmt/format.h>

namespace ddprun {
namespace {

constexpr std::string_view kBold = "\x1b[1m";
constexpr std::string_view kRed = "\x1b[1;31m";
constexpr std::string_view kMagenta = "\x1b[1;35m";
constexpr std::string_view kCyan = "\x1b[1;36m";
constexpr std::string_view kGreen = "\x1b[1;32m";
constexpr std::string_view kReset = "\x1b[0m";

// The text of 1-based line `line`, without its line break; "" past the end.
std::string_view SourceLine(std::string_view text, uint32_t line) {
  size_t start = 0;
  for (uint32_t i = 1; i < line; ++i) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) return {};
    start = nl + 1;
  }
  size_t end = text.find('\n', start);
  std::string_view out = text.substr(start, end == std::string_view::npos ? text.size() - start
                                                                          : end - start);
  if (!out.empty() && out.back() == '\r') out.remove_suffix(1);
  return out;
}

// Blanks that line the caret up under column `column` (1-based, counted in code points, as
// toml++ counts them). Tabs stay tabs so the caret lands right whatever the tab width.
std::string CaretPadding(std::string_view line, uint32_t column) {
  std::string pad;
  uint32_t col = 1;
  for (size_t i = 0; i < line.size() && col < column; ++i) {
    const auto byte = static_cast<unsigned char>(line[i]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte: same code point
    pad += line[i] == '\t' ? '\t' : ' ';
    ++col;
  }
  // A column past the end of the line (an error at end of file) still gets its caret.
  for (; col < column && col < 4096; ++col) pad += ' ';
  return pad;
}

std::string Paint(std::string_view text, std::string_view color, bool enabled) {
  if (!enabled) return std::string(text);
  return fmt::format("{}{}{}", color, text, kReset);
}

// One located message: header, quoted source line and caret.
void RenderOne(std::string& out, std::string_view source_name, std::string_view source_text,
               SourceLoc loc, std::string_view label, std::string_view label_color,
               std::string_view message, bool color) {
  std::string where = loc.line == 0
                          ? fmt::format("{}:", source_name)
                          : fmt::format("{}:{}:{}:", source_name, loc.line, loc.column);
  out += fmt::format("{} {} {}\n", Paint(where, kBold, color),
                     Paint(fmt::format("{}:", label), label_color, color),
                     Paint(message, kBold, color));
  if (loc.line == 0) return;
  std::string_view line = SourceLine(source_text, loc.line);
  out += fmt::format("{:>5} | {}\n", loc.line, line);
  out += fmt::format("{:>5} | {}{}\n", "", CaretPadding(line, loc.column),
                     Paint("^", kGreen, color));
}

std::string Plural(int n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

}  // namespace

void Diagnostics::Error(SourceLoc loc, std::string key_path, std::string message,
                        std::string hint) {
  items.push_back({Severity::kError, loc, std::move(key_path), std::move(message),
                   std::move(hint), {}, {}});
}

void Diagnostics::Warning(SourceLoc loc, std::string key_path, std::string message,
                          std::string hint) {
  items.push_back({Severity::kWarning, loc, std::move(key_path), std::move(message),
                   std::move(hint), {}, {}});
}

void Diagnostics::AddNote(SourceLoc loc, std::string note) {
  if (items.empty()) return;
  items.back().note = std::move(note);
  items.back().note_loc = loc;
}

bool Diagnostics::HasErrors() const { return ErrorCount() > 0; }

int Diagnostics::ErrorCount() const {
  return static_cast<int>(std::count_if(items.begin(), items.end(), [](const Diagnostic& d) {
    return d.severity == Severity::kError;
  }));
}

int Diagnostics::WarningCount() const {
  return static_cast<int>(items.size()) - ErrorCount();
}

std::vector<Diagnostic> SortedDiagnostics(const Diagnostics& diagnostics) {
  std::vector<Diagnostic> sorted = diagnostics.items;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return std::pair(a.loc.line, a.loc.column) < std::pair(b.loc.line, b.loc.column);
  });
  return sorted;
}

std::string DiagnosticsSummary(const Diagnostics& diagnostics) {
  if (diagnostics.items.empty()) return {};
  return fmt::format("{}, {}", Plural(diagnostics.ErrorCount(), "error"),
                     Plural(diagnostics.WarningCount(), "warning"));
}

std::string RenderDiagnostics(const Diagnostics& diagnostics, std::string_view source_name,
                              std::string_view source_text, bool color) {
  std::string out;
  for (const Diagnostic& d : SortedDiagnostics(diagnostics)) {
    const bool error = d.severity == Severity::kError;
    RenderOne(out, source_name, source_text, d.loc, error ? "error" : "warning",
              error ? kRed : kMagenta, d.message, color);
    if (!d.hint.empty()) out += fmt::format("   {} {}\n", Paint("hint:", kCyan, color), d.hint);
    if (!d.note.empty()) {
      RenderOne(out, source_name, source_text, d.note_loc, "note", kCyan, d.note, color);
    }
  }
  if (!out.empty()) out += DiagnosticsSummary(diagnostics) + "\n";
  return out;
}

}  // namespace ddprun
