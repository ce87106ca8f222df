#include "schema/diagnostics.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace ddprun {
size_t DecodeUtf8(std::string_view text, size_t i, uint32_t& cp) {
  const auto b = static_cast<unsigned char>(text[i]);
  size_t extra = 0;
  if (b < 0x80) {
    cp = b;
    return 1;
  } else if ((b & 0xE0) == 0xC0) {
    extra = 1;
    cp = b & 0x1Fu;
  } else if ((b & 0xF0) == 0xE0) {
    extra = 2;
    cp = b & 0x0Fu;
  } else if ((b & 0xF8) == 0xF0) {
    extra = 3;
    cp = b & 0x07u;
  } else {
    return 0;  // a continuation or invalid lead byte
  }
  if (i + extra >= text.size()) return 0;
  for (size_t k = 1; k <= extra; ++k) {
    const auto c = static_cast<unsigned char>(text[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3Fu);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return extra + 1;
}

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
  std::string_view out =
      text.substr(start, end == std::string_view::npos ? text.size() - start : end - start);
  if (!out.empty() && out.back() == '\r') out.remove_suffix(1);
  return out;
}

// One code point of a quoted line as the terminal will show it: itself when printable,
// else an escape (clang's spelling: <U+001B> for a control or invisible character, <FF> for a
// byte that is not UTF-8), so a binary or hostile file cannot drive the terminal.
struct Cell {
  std::string text;
  size_t width = 1;  // columns it takes (escapes are ASCII; other code points count 1)
  bool tab = false;
};

// Whether code point `cp` may reach the terminal as is: not a C0/C1 control, DEL, or one of
// the bidirectional overrides that make text read differently than it parses.
bool Printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0)) return false;
  if ((cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)) return false;
  if (cp == 0x200e || cp == 0x200f || cp == 0x061c || cp == 0xfeff) return false;
  return true;
}

// Splits `text` into cells, one per code point or invalid byte. Tabs stay tabs so the caret
// lands right whatever the tab width.
std::vector<Cell> Cells(std::string_view text) {
  std::vector<Cell> cells;
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    uint32_t cp = b;
    size_t length = 1;
    if (b >= 0x80) {
      length = DecodeUtf8(text, i, cp);
      if (length == 0) {
        std::string escape = fmt::format("<{:02X}>", b);
        const size_t width = escape.size();
        cells.push_back({std::move(escape), width, false});
        ++i;
        continue;
      }
    }
    if (cp == '\t') {
      cells.push_back({"\t", 1, true});
    } else if (!Printable(cp)) {
      std::string escape = fmt::format("<U+{:04X}>", cp);
      const size_t width = escape.size();
      cells.push_back({std::move(escape), width, false});
    } else {
      cells.push_back({std::string(text.substr(i, length)), 1, false});
    }
    i += length;
  }
  return cells;
}

// The widest source line quoted whole; longer ones are cut to a window around the caret.
constexpr size_t kMaxQuotedWidth = 100;
constexpr std::string_view kEllipsis = "...";

// The quoted line and the caret line's padding for 1-based `column` (counted in code points,
// as toml++ counts them): escaped, and cut to about kMaxQuotedWidth columns around the caret
// when longer, with "..." where text was left out (as clang does).
std::pair<std::string, std::string> QuoteLine(std::string_view line, uint32_t column) {
  const std::vector<Cell> cells = Cells(line);
  const size_t caret = column == 0 ? 0 : column - 1;
  size_t total = 0;
  for (const Cell& cell : cells) total += cell.width;
  size_t begin = 0;
  size_t end = cells.size();
  if (total > kMaxQuotedWidth) {
    // Grow a window from the caret, one cell to the right then one to the left, until full.
    const size_t budget = kMaxQuotedWidth - 2 * kEllipsis.size();
    begin = std::min(caret, cells.size());
    end = begin;
    size_t used = 0;
    bool grew = true;
    while (grew) {
      grew = false;
      if (end < cells.size() && used + cells[end].width <= budget) {
        used += cells[end++].width;
        grew = true;
      }
      if (begin > 0 && used + cells[begin - 1].width <= budget) {
        used += cells[--begin].width;
        grew = true;
      }
    }
  }
  std::string quoted;
  std::string pad;
  if (begin > 0) {
    quoted += kEllipsis;
    pad.append(kEllipsis.size(), ' ');
  }
  for (size_t i = begin; i < end; ++i) {
    quoted += cells[i].text;
    if (i < caret) pad += cells[i].tab ? std::string("\t") : std::string(cells[i].width, ' ');
  }
  if (end < cells.size()) quoted += kEllipsis;
  // A column past the end of the line (an error at end of file) still gets its caret.
  if (caret > cells.size()) pad.append(std::min<size_t>(caret - cells.size(), 4096), ' ');
  return {quoted, pad};
}

}  // namespace

namespace {

// Optimal string alignment distance: like Levenshtein, plus a swap of two neighbours as one
// edit, since "nmae" for "name" is the commonest typo.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::optional<std::string_view> ClosestName(std::string_view word,
                                            std::span<const std::string_view> candidates) {
  if (word.size() > 64) return std::nullopt;
  const size_t limit = word.size() <= 4 ? 1 : (word.size() <= 8 ? 2 : 3);
  std::optional<std::string_view> best;
  size_t best_distance = limit + 1;
  for (std::string_view c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

std::string EscapeForTerminal(std::string_view text) {
  std::string out;
  for (const Cell& cell : Cells(text)) out += cell.tab ? "\t" : cell.text;
  return out;
}

std::string EscapeLinesForTerminal(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    out += EscapeForTerminal(text.substr(begin, end - begin));
    if (end == text.size()) break;
    out += '\n';
    begin = end + 1;
  }
  return out;
}

namespace {

std::string Paint(std::string_view text, std::string_view color, bool enabled) {
  if (!enabled) return std::string(text);
  return fmt::format("{}{}{}", color, text, kReset);
}

// One located message: header, quoted source line and caret.
void RenderOne(std::string& out, std::string_view source_name, std::string_view source_text, SourceLoc loc,
               std::string_view label, std::string_view label_color, std::string_view message, bool color,
               bool hide_line) {
  std::string where = loc.line == 0 ? fmt::format("{}:", source_name)
                                    : fmt::format("{}:{}:{}:", source_name, loc.line, loc.column);
  out += fmt::format("{} {} {}\n", Paint(EscapeForTerminal(where), kBold, color),
                     Paint(fmt::format("{}:", label), label_color, color),
                     Paint(EscapeForTerminal(message), kBold, color));
  if (loc.line == 0) return;
  if (hide_line) {
    out += fmt::format("{:>5} | (line not shown: it holds a secret)\n", loc.line);
    return;
  }
  const auto [quoted, pad] = QuoteLine(SourceLine(source_text, loc.line), loc.column);
  out += fmt::format("{:>5} | {}\n", loc.line, quoted);
  out += fmt::format("{:>5} | {}{}\n", "", pad, Paint("^", kGreen, color));
}

std::string Plural(int n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

}  // namespace

void Diagnostics::Error(SourceLoc loc, std::string key_path, std::string message, std::string hint) {
  items.push_back({Severity::kError, loc, std::move(key_path), std::move(message), std::move(hint), {}, {}});
}

void Diagnostics::Warning(SourceLoc loc, std::string key_path, std::string message, std::string hint) {
  items.push_back(
      {Severity::kWarning, loc, std::move(key_path), std::move(message), std::move(hint), {}, {}});
}

void Diagnostics::AddNote(SourceLoc loc, std::string note) {
  if (items.empty()) return;
  items.back().note = std::move(note);
  items.back().note_loc = loc;
}

void Diagnostics::HideLine() {
  if (!items.empty()) items.back().hide_line = true;
}

bool Diagnostics::HasErrors() const { return ErrorCount() > 0; }

int Diagnostics::ErrorCount() const {
  return static_cast<int>(std::count_if(items.begin(), items.end(),
                                        [](const Diagnostic& d) { return d.severity == Severity::kError; }));
}

int Diagnostics::WarningCount() const { return static_cast<int>(items.size()) - ErrorCount(); }

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
    RenderOne(out, source_name, source_text, d.loc, error ? "error" : "warning", error ? kRed : kMagenta,
              d.message, color, d.hide_line);
    if (!d.hint.empty()) {
      out += fmt::format("   {} {}\n", Paint("hint:", kCyan, color), EscapeForTerminal(d.hint));
    }
    if (!d.note.empty()) {
      RenderOne(out, source_name, source_text, d.note_loc, "note", kCyan, d.note, color, d.hide_line);
    }
  }
  if (!out.empty()) out += DiagnosticsSummary(diagnostics) + "\n";
  return out;
}

std::string ShownName(std::string_view name) {
  if (name.size() <= kShownNameMax) return std::string(name);
  size_t cut = 40;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("{}... ({} bytes)", name.substr(0, cut), name.size());
}

}  // namespace ddprun
