#pragma once
// Durations of the job file ("250ms", "30s", "15m", "2h", "1h30m") and their canonical spelling.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

/// Every duration in ddprun, real or virtual. int64 nanoseconds reach 292 years.
using Duration = std::chrono::nanoseconds;

constexpr Duration Millis(int64_t n) { return std::chrono::milliseconds(n); }
constexpr Duration Seconds(int64_t n) { return std::chrono::seconds(n); }
constexpr Duration Minutes(int64_t n) { return std::chrono::minutes(n); }
constexpr Duration Hours(int64_t n) { return std::chrono::hours(n); }

/// Parses "250ms", "30s", "15m", "2h", "1d", "1h30m", "1.5s", "0s". Units: ns, us, ms, s, m, h, d.
/// Returns nullopt for anything else (empty, no unit, negative, overflow past 100 years).
std::optional<Duration> ParseDuration(std::string_view text);

/// The canonical spelling: the largest units first, no zero parts ("1h30m", "250ms", "0s").
/// ParseDuration(FormatDuration(d)) == d for every d >= 0.
std::string FormatDuration(Duration d);

/// A short human form for progress lines and summaries: "41s", "2m05s", "3h12m", "1.5s", "250ms".
std::string HumanDuration(Duration d);

}  // namespace ddprun
