#include "schema/join_mismatch.h"

#include <vector>

#include <fmt/format.h>

#include "schema/canonical.h"

namespace ddprun {
namespace {

// What a canonical key belongs to, in the order the message names them.
enum class Kind { kJobFile, kCode, kScriptArgs, kLibraries };
constexpr Kind kKinds[] = {Kind::kJobFile, Kind::kCode, Kind::kScriptArgs, Kind::kLibraries};

// The key as the user knows it: advisory lines lose their prefix.
std::string UserKey(const std::string& key) {
  return key.starts_with(kAdvisoryPrefix) ? key.substr(kAdvisoryPrefix.size()) : key;
}

Kind KindOf(const std::string& user_key) {
  if (user_key.starts_with("code.")) return Kind::kCode;
  if (user_key.starts_with("libraries.")) return Kind::kLibraries;
  if (user_key == "job.script_args") return Kind::kScriptArgs;
  return Kind::kJobFile;
}

// The value of `key` (with or without the advisory prefix) in a canonical form, "" if absent.
std::string ValueOf(const std::string& canonical, const std::string& key) {
  for (const std::string& spelling : {key, std::string(kAdvisoryPrefix) + key}) {
    const std::string needle = spelling + " = ";
    size_t at = 0;
    if (!canonical.starts_with(needle)) {
      at = canonical.find("\n" + needle);
      if (at == std::string::npos) continue;
      ++at;
    }
    const size_t begin = at + needle.size();
    const size_t end = canonical.find('\n', begin);
    return canonical.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  }
  return "";
}

struct Lines {
  std::string text;  // "\n  key: node N has X, node 0 has Y" per field
  bool has[4] = {false, false, false, false};
  bool Has(Kind kind) const { return has[static_cast<int>(kind)]; }
};

Lines DifferenceLines(const std::string& ours, const std::string& theirs, std::string_view who,
                      std::string_view us) {
  Lines lines;
  for (const auto& d : DiffCanonical(ours, theirs)) {
    const std::string key = UserKey(d.key);
    const Kind kind = KindOf(key);
    lines.has[static_cast<int>(kind)] = true;
    std::string label = key;
    std::string mine = d.ours;
    std::string other = d.theirs;
    if (key == "code.script_sha256") {
      // Which file the digests are of: node 0's script (the line for code.script says if the
      // nodes found different ones).
      const std::string script = ValueOf(ours, "code.script");
      if (!script.empty() && script != "\"\"") label = fmt::format("{} of {}", key, script);
    } else if (kind == Kind::kScriptArgs) {
      label = "arguments after `--`";
      if (mine == "(not set)") mine = "none";
      if (other == "(not set)") other = "none";
    }
    lines.text += fmt::format("\n  {}: {} has {}, {} has {}", label, who, other, us, mine);
  }
  return lines;
}

std::string Headline(Kind kind, std::string_view us) {
  switch (kind) {
    case Kind::kJobFile:
      return fmt::format("runs a different job file than {}", us);
    case Kind::kCode:
      return fmt::format("runs different code than {} (job.code_check = \"refuse\")", us);
    case Kind::kScriptArgs:
      return fmt::format("was started with other arguments after `--` than {}", us);
    case Kind::kLibraries:
      return fmt::format("has other library versions than {} (job.library_check = \"refuse\")", us);
  }
  return "";
}

// The part named in a message that lists several: "... differs from node 0 in its code and ..."
const char* Part(Kind kind) {
  switch (kind) {
    case Kind::kJobFile:
      return "its job file";
    case Kind::kCode:
      return "its code";
    case Kind::kScriptArgs:
      return "its arguments after `--`";
    case Kind::kLibraries:
      return "its library versions";
  }
  return "";
}

const char* Why(Kind kind) {
  switch (kind) {
    case Kind::kJobFile:
      return "it runs a different job file";
    case Kind::kCode:
      return "it runs different code";
    case Kind::kScriptArgs:
      return "it was started with other arguments after `--`";
    case Kind::kLibraries:
      return "it has other library versions";
  }
  return "";
}

const char* Hint(Kind kind) {
  switch (kind) {
    case Kind::kJobFile:
      return "use the same job file on every node (ddprun check prints its fingerprint)";
    case Kind::kCode:
      return "deploy the same code to every node (ddprun check prints the script's sha256 and the "
             "git commit it finds), or set job.code_check = \"warn\" to let such a node run";
    case Kind::kScriptArgs:
      return "start ddprun with the same arguments after `--` on every node";
    case Kind::kLibraries:
      return "install the same versions on every node (ddprun check lists what it finds here), "
             "or set job.library_check = \"warn\" to let such a node run";
  }
  return "";
}

std::string JoinParts(const std::vector<std::string>& parts, const char* last_separator) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) text += i + 1 == parts.size() ? last_separator : ", ";
    text += parts[i];
  }
  return text;
}

}  // namespace

JoinRefusal DescribeRefusedJoin(const std::string& ours, const std::string& theirs, std::string_view who,
                                const std::string& host, std::string_view us) {
  Lines lines = DifferenceLines(ours, theirs, who, us);
  std::vector<Kind> kinds;
  for (Kind kind : kKinds) {
    if (lines.Has(kind)) kinds.push_back(kind);
  }
  if (kinds.empty()) {
    kinds.push_back(Kind::kJobFile);
    lines.text = "\n  (the canonical forms agree; the fingerprints do not)";
  }
  JoinRefusal refusal;
  if (kinds.size() == 1) {
    refusal.message = fmt::format("{} (host {}) {}:{}\nhint: {}", who, host, Headline(kinds[0], us),
                                  lines.text, Hint(kinds[0]));
    refusal.why = Why(kinds[0]);
    return refusal;
  }
  std::vector<std::string> parts;
  std::string hints;
  for (Kind kind : kinds) {
    parts.push_back(Part(kind));
    hints += fmt::format("\nhint: {}", Hint(kind));
  }
  const std::string named = JoinParts(parts, " and ");
  refusal.message =
      fmt::format("{} (host {}) differs from {} in {}:{}{}", who, host, us, named, lines.text, hints);
  refusal.why = "it differs in " + named;
  return refusal;
}

std::string DescribeAdvisoryDifference(const std::string& ours, const std::string& theirs,
                                       std::string_view who, const std::string& host, std::string_view us) {
  const Lines lines = DifferenceLines(ours, theirs, who, us);
  if (lines.text.empty()) return "";
  std::vector<std::string> what;
  std::vector<std::string> checks;
  if (lines.Has(Kind::kCode)) {
    what.push_back("runs different code");
    checks.push_back("job.code_check = \"warn\"");
  }
  if (lines.Has(Kind::kLibraries)) {
    what.push_back("has other library versions");
    checks.push_back("job.library_check = \"warn\"");
  }
  if (what.empty()) {
    return fmt::format("{} (host {}) differs from {}:{}", who, host, us, lines.text);
  }
  return fmt::format("{} (host {}) {} than {}{}:{}", who, host, JoinParts(what, " and "), us,
                     checks.empty() ? std::string()
                                    : fmt::format(" ({} {} it join)", JoinParts(checks, " and "),
                                                  checks.size() == 1 ? "lets" : "let"),
                     lines.text);
}

}  // namespace ddprun
