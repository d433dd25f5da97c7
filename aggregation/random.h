// Seeded pseudo-random numbers for aggregation/ (private header).
//
// Everything randomised in this folder (client selection, random-k indices, PowerSGD's initial Q,
// DP noise) draws from this generator so that a run is reproducible from its seeds and the same
// on every platform: std::uniform_int_distribution and std::normal_distribution are
// implementation-defined, so a client built with another standard library would pick other
// random-k indices than the server that decodes them. SplitMix64 (Steele et al., 2014): passes
// BigCrush; not cryptographic (secure aggregation uses AES-CTR instead).
#pragma once

#include <cmath>
#include <cstdint>

namespace cohort::aggregation::detail {

__extension__ using Uint128 = unsigned __int128;  // GCC/Clang; __extension__ quiets -Wpedantic

inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A seed for an independent stream, from a base seed and up to two labels (purpose, round, client).
inline std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0) {
  return mix64(mix64(mix64(seed ^ 0x6a09e667f3bcc909ULL) + a * 0x9e3779b97f4a7c15ULL) + b);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(mix64(seed ^ 0xbb67ae8584caa73bULL)) {}

  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }
  // Uniform in [0, n), unbiased (Lemire's multiply-and-reject). REQUIRES n > 0.
  std::uint64_t below(std::uint64_t n) {
    Uint128 m = static_cast<Uint128>(next()) * n;
    auto low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<Uint128>(next()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1]: safe to take the log of.
  double uniform_open0() { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }
  // Standard normal (Box-Muller, both outputs used).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform_open0()));
    const double phi = 6.283185307179586476925286766559 * uniform();
    spare_ = r * std::sin(phi);
    has_spare_ = true;
    return r * std::cos(phi);
  }

 private:
  std::uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace cohort::aggregation::detail
