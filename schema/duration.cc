#include "schema/duration.h"

#include <array>
#include <cmath>

#include <fmt/format.h>

namespace ddprun {
namespace {

struct Unit {
  std::string_view name;
  int64_t nanos;
};

// Longest names first so "ms" is not read as "m" followed by garbage.
constexpr std::array<Unit, 7> kUnits = {{
    {"ns", 1},
    {"us", 1'000},
    {"ms", 1'000'000},
    {"s", 1'000'000'000},
    {"m", 60'000'000'000},
    {"h", 3'600'000'000'000},
    {"d", 86'400'000'000'000},
}};

constexpr int64_t kMaxNanos = 100LL * 365 * 86'400'000'000'000;

std::optional<int64_t> UnitNanos(std::string_view text, size_t& pos) {
  for (const auto& two : {"ns", "us", "ms"}) {
    if (text.substr(pos, 2) == two) {
      pos += 2;
      for (const Unit& u : kUnits) {
        if (u.name == two) return u.nanos;
      }
    }
  }
  if (pos < text.size()) {
    for (const Unit& u : kUnits) {
      if (u.name.size() == 1 && text[pos] == u.name[0]) {
        ++pos;
        return u.nanos;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<Duration> ParseDuration(std::string_view text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  size_t pos = 0;
  double total = 0;
  while (pos < text.size()) {
    size_t start = pos;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') ++pos;
    if (pos < text.size() && text[pos] == '.') {
      ++pos;
      while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') ++pos;
    }
    std::string_view number = text.substr(start, pos - start);
    if (number.empty() || number == "." || number.front() == '.' || number.back() == '.') {
      return std::nullopt;
    }
    auto unit = UnitNanos(text, pos);
    if (!unit) return std::nullopt;
    double value = std::stod(std::string(number));
    total += value * static_cast<double>(*unit);
    if (total > static_cast<double>(kMaxNanos)) return std::nullopt;
  }
  return Duration(static_cast<int64_t>(std::llround(total)));
}

std::string FormatDuration(Duration d) {
  int64_t n = d.count();
  if (n == 0) return "0s";
  std::string out;
  if (n < 0) {
    out = "-";
    n = -n;
  }
  for (auto it = kUnits.rbegin(); it != kUnits.rend(); ++it) {
    if (n >= it->nanos) {
      out += fmt::format("{}{}", n / it->nanos, it->name);
      n %= it->nanos;
    }
  }
  return out;
}

std::string HumanDuration(Duration d) {
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  if (ms < 0) return "-" + HumanDuration(-d);
  if (ms < 1000) return fmt::format("{}ms", ms);
  if (ms < 10'000) return fmt::format("{:.1f}s", static_cast<double>(ms) / 1000.0);
  const int64_t s = ms / 1000;
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02}h", s / 86400, (s % 86400) / 3600);
}

}  // namespace ddprun
