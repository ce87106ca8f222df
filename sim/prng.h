#pragma once
// The simulator's own PRNG: xoshiro256** seeded through splitmix64. std:: distributions are
// avoided on purpose: their output differs between standard libraries, and one seed must
// reproduce a run everywhere (STYLE.md rule 4).

#include <cmath>
#include <cstdint>

#include "schema/duration.h"

namespace ddprun::sim {

/// splitmix64: used to expand seeds and to derive independent streams.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Prng {
 public:
  /// Seeds the four words from `seed` via splitmix64; `stream` selects an independent sequence
  /// (network, workers, faults...), so adding draws to one never shifts another.
  explicit Prng(uint64_t seed, uint64_t stream = 0) {
    uint64_t state = seed ^ (stream * 0xd1342543de82ef95ULL);
    for (uint64_t& word : s_) word = SplitMix64(state);
  }

  /// The next 64 random bits.
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  /// Uniform in [0, n); n > 0. The modulo bias is below 2^-40 for the ranges we use.
  uint64_t Below(uint64_t n) { return Next() % n; }

  /// Uniform in [0, 1).
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  /// True with probability `p`.
  bool Chance(double p) { return p > 0 && Unit() < p; }

  /// Uniform in [lo, hi]; lo when hi <= lo.
  Duration Between(Duration lo, Duration hi) {
    if (hi <= lo) return lo;
    const auto span = static_cast<uint64_t>((hi - lo).count()) + 1;
    return lo + Duration(static_cast<int64_t>(Below(span)));
  }

  /// Exponentially distributed with mean `mean` (inter-arrival times of a Poisson process).
  Duration Exponential(Duration mean) {
    const double u = Unit();
    const double x = -std::log1p(-u) * static_cast<double>(mean.count());
    return Duration(static_cast<int64_t>(x));
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace ddprun::sim
