#pragma once
// A size in bytes as messages give a bound: "512 bytes", "64 KiB", "1 MiB", "1.5 GiB".

#include <cstdint>
#include <iterator>
#include <string>

#include <fmt/format.h>

namespace ddprun {

/// `bytes` in the largest binary unit that keeps the number at least 1, with one decimal
/// when it is not whole.
inline std::string ByteSize(uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  if (value == static_cast<double>(static_cast<uint64_t>(value)))
    return fmt::format("{} {}", value, kUnits[unit]);
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

}  // namespace ddprun
