// [restart]: the job-wide restart budget and the wait before each restart.
#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "base/parse_int.h"

#include "schema/sections.h"

namespace ddprun {
namespace {

constexpr std::array<std::string_view, 6> kKindWords = {"oom",       "nccl",      "hang",
                                                        "lost-node", "lost-peer", "stall"};

bool IsIdentifier(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool letter = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// An exception type (dotted identifiers), exit:N, signal:NAME or signal:N, or a kind word.
std::optional<std::string> RuleProblem(std::string_view rule) {
  if (std::find(kKindWords.begin(), kKindWords.end(), rule) != kKindWords.end()) return std::nullopt;
  if (rule.rfind("exit:", 0) == 0) {
    const std::string_view code = rule.substr(5);
    if (code.empty() || code[0] < '0' || code[0] > '9' || !ParseNonNegative(code, 255)) {
      return "an exit code is 0..255, e.g. \"exit:2\"";
    }
    return std::nullopt;
  }
  if (rule.rfind("signal:", 0) == 0) {
    const std::string_view sig = rule.substr(7);
    if (!sig.empty() && sig[0] >= '0' && sig[0] <= '9') {
      const auto number = ParseNonNegative(sig, 64);
      if (!number || *number < 1) return "a signal number is 1..64, e.g. \"signal:11\"";
      return std::nullopt;
    }
    if (sig.rfind("SIG", 0) == 0 && sig.size() > 3 && IsIdentifier(sig)) return std::nullopt;
    return "write a signal as \"signal:SIGSEGV\" or \"signal:11\"";
  }
  size_t begin = 0;
  while (true) {
    const size_t dot = rule.find('.', begin);
    if (!IsIdentifier(rule.substr(begin, dot == std::string_view::npos ? dot : dot - begin))) {
      return "write a Python exception type (\"SyntaxError\"), \"exit:N\", \"signal:SIGSEGV\", "
             "or one of \"oom\", \"nccl\", \"hang\", \"lost-node\", \"lost-peer\", \"stall\"";
    }
    if (dot == std::string_view::npos) return std::nullopt;
    begin = dot + 1;
  }
}

void ReadNeverOn(const toml::table& table, TomlReader& reader, std::vector<std::string>& never_on) {
  const toml::node* node = reader.Node(&table, "never_on", "restart.never_on");
  if (!node) return;
  const toml::array* items = node->as_array();
  if (!items) {
    reader.diags().Error(LocOf(*node), "restart.never_on", "restart.never_on must be an array of strings",
                         "e.g. never_on = [\"SyntaxError\", \"ModuleNotFoundError\", \"exit:2\"]");
    return;
  }
  for (const toml::node& item : *items) {
    const auto text = item.value_exact<std::string>();
    if (!text) {
      reader.diags().Error(LocOf(item), "restart.never_on", "restart.never_on items must be strings",
                           "e.g. \"SyntaxError\" or \"exit:2\"");
      continue;
    }
    if (auto problem = RuleProblem(*text)) {
      reader.diags().Error(LocOf(item), "restart.never_on",
                           fmt::format("restart.never_on: \"{}\" names no kind of failure", *text), *problem);
      continue;
    }
    if (std::find(never_on.begin(), never_on.end(), *text) != never_on.end()) {
      reader.diags().Error(LocOf(item), "restart.never_on",
                           fmt::format("restart.never_on lists \"{}\" twice", *text));
      continue;
    }
    never_on.push_back(*text);
  }
}

}  // namespace

void LoadRestart(const toml::table& root, TomlReader& reader, JobSpec::Restart& restart) {
  const toml::table* table = reader.Table(root, "restart", "restart");
  if (!table) return;
  reader.CheckKeys(*table, SectionNamed("restart"), "restart");
  if (const toml::node* node = reader.Node(table, "max_restarts", "restart.max_restarts")) {
    if (auto n = reader.Integer(*node, "restart.max_restarts", *Key("restart.max_restarts").range)) {
      restart.max_restarts = static_cast<int>(*n);
    }
  }
  reader.ReadDuration(table, "backoff", "restart", restart.backoff);
  ReadNeverOn(*table, reader, restart.never_on);
  const toml::node* node = reader.Node(table, "backoff_max", "restart.backoff_max");
  if (!node) return;
  auto longest = reader.DurationValue(*node, "restart.backoff_max");
  if (!longest) return;
  if (*longest < restart.backoff) {
    reader.diags().Error(LocOf(*node), "restart.backoff_max",
                         fmt::format("restart.backoff_max = {} is shorter than restart.backoff "
                                     "= {}",
                                     FormatDuration(*longest), FormatDuration(restart.backoff)),
                         "backoff is the first wait and backoff_max the longest; the wait "
                         "doubles after each restart between the two");
    return;
  }
  restart.backoff_max = *longest;
}

}  // namespace ddprun
