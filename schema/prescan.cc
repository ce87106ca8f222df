#include "schema/prescan.h"

#include <string>

#include <fmt/format.h>

namespace ddprun {
namespace {

// Offset of the first byte that is not part of valid UTF-8, or npos.
size_t FirstInvalidUtf8(std::string_view text) {
  uint32_t cp = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t length = DecodeUtf8(text, i, cp);
    if (length == 0) return i;
    i += length;
  }
  return std::string_view::npos;
}

// Offset just past the string literal that opens at text[i] (a quote), or at the end of its
// line when it is unterminated (toml++ reports that).
size_t SkipString(std::string_view text, size_t i) {
  const char c = text[i];
  const bool triple = text.substr(i, 3) == std::string(3, c);
  const std::string_view close = triple ? text.substr(i, 3) : text.substr(i, 1);
  i += close.size();
  while (i < text.size()) {
    if (c == '"' && text[i] == '\\') {
      i += 2;
      continue;
    }
    if (!triple && text[i] == '\n') break;
    if (text.substr(i, close.size()) == close) return i + close.size();
    ++i;
  }
  return i;
}

// toml++ parses arrays and inline tables recursively; bound the depth before it sees the text.
// Strings and comments are skipped so brackets inside them do not count.
size_t FirstTooDeep(std::string_view text) {
  int depth = 0;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      i = SkipString(text, i);
      continue;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNesting) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    ++i;
  }
  return std::string_view::npos;
}

}  // namespace

SourceLoc LocAtOffset(std::string_view text, size_t offset) {
  SourceLoc loc{1, 1};
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++loc.line;
      loc.column = 1;
    } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      ++loc.column;
    }
  }
  return loc;
}

bool PreScan(std::string_view text, Diagnostics& diagnostics) {
  if (text.size() > kMaxFileBytes) {
    diagnostics.Error({}, "", fmt::format("the job file is larger than {} bytes", kMaxFileBytes),
                      "a job file is a short TOML text; is this the right file?");
    return false;
  }
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    diagnostics.Error(LocAtOffset(text, nul), "", "the job file contains a NUL byte; it must be UTF-8 text",
                      "is this the right file? a job file is TOML text");
    return false;
  }
  if (size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    diagnostics.Error(LocAtOffset(text, bad), "",
                      fmt::format("the job file is not valid UTF-8 (byte 0x{:02x} at offset {})",
                                  static_cast<unsigned char>(text[bad]), bad),
                      "save the file as UTF-8");
    return false;
  }
  if (size_t deep = FirstTooDeep(text); deep != std::string_view::npos) {
    diagnostics.Error(LocAtOffset(text, deep), "",
                      fmt::format("arrays and inline tables are nested more than {} deep", kMaxNesting),
                      "a job file needs at most two levels");
    return false;
  }
  return true;
}

}  // namespace ddprun
