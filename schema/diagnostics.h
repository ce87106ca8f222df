#pragma once
// Compiler-style diagnostics for the job file: `job.toml:12:3: error: ...`, the source line,
// a caret under the value and an optional hint.

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "schema/job_spec.h"

namespace ddprun {

/// Decodes the UTF-8 code point that starts at text[i] into `cp`; returns its length in bytes,
/// or 0 when text[i] starts no valid UTF-8 (a stray continuation, a truncated sequence, an
/// overlong form, a surrogate, a value past U+10FFFF).
size_t DecodeUtf8(std::string_view text, size_t i, uint32_t& cp);

enum class Severity { kError, kWarning };

struct Diagnostic {
  Severity severity = Severity::kError;
  SourceLoc loc;           // {0,0}: not tied to a place in the file
  std::string key_path;    // "cluster.nproc_per_node"; "" for whole-file problems
  std::string message;     // one sentence, no trailing period
  std::string hint;        // "" or e.g. "did you mean `nproc_per_node`?"
  std::string note;        // "" or a pointer to a related place, e.g. "first written here"
  SourceLoc note_loc;      // where `note` points
  bool hide_line = false;  // the source line holds a secret: print the position only
  bool operator==(const Diagnostic&) const = default;
};

struct Diagnostics {
  std::vector<Diagnostic> items;

  void Error(SourceLoc loc, std::string key_path, std::string message, std::string hint = {});
  void Warning(SourceLoc loc, std::string key_path, std::string message, std::string hint = {});
  /// Attaches a note to the diagnostic added last (e.g. where a duplicate was first written).
  void AddNote(SourceLoc loc, std::string note);
  /// Keeps the diagnostic added last from quoting its source line (it holds a secret).
  void HideLine();
  bool HasErrors() const;
  int ErrorCount() const;
  int WarningCount() const;
};

/// Renders every diagnostic the way compilers do, sorted by position, then a count line
/// ("2 errors, 1 warning"). `source_text` supplies the quoted line and caret.
std::string RenderDiagnostics(const Diagnostics& diagnostics, std::string_view source_name,
                              std::string_view source_text, bool color);

/// `text` with every byte sequence a terminal should not interpret escaped: controls and
/// invisible code points as <U+001B>, bytes that are not UTF-8 as <FF>; tabs are kept.
std::string EscapeForTerminal(std::string_view text);

/// EscapeForTerminal line by line, keeping the line breaks: for multi-line text that comes
/// from outside ddprun (a peer's message, a worker's traceback, a stack, a name) on its way to
/// a terminal, so that nothing it holds can move the cursor, retitle the window or hide text.
std::string EscapeLinesForTerminal(std::string_view text);

/// The candidate closest to `word` when close enough to be a typo of it (optimal string
/// alignment distance: 1 edit for words up to 4 characters, 2 up to 8, else 3), else nullopt.
/// For "did you mean" hints on keys, flags and commands.
std::optional<std::string_view> ClosestName(std::string_view word,
                                            std::span<const std::string_view> candidates);

/// A name from the user's file (a key, a [trainer] argument, a variable) as a message shows
/// it: whole up to kShownNameMax bytes, else its first 40 and how long it is
/// ("aaaa... (10000 bytes)"), never cut inside a UTF-8 character.
inline constexpr size_t kShownNameMax = 64;
std::string ShownName(std::string_view name);

/// "2 errors, 1 warning"; "" when there are none.
std::string DiagnosticsSummary(const Diagnostics& diagnostics);

/// The diagnostics in the order RenderDiagnostics prints them: whole-file ones first, then by
/// line and column; stable for equal positions.
std::vector<Diagnostic> SortedDiagnostics(const Diagnostics& diagnostics);

}  // namespace ddprun
