// Seeded pseudo-random numbers: the one module every folder draws from when a result must be
// reproducible from a seed and the same on every platform.
//
// std::mt19937_64 is portable but std::uniform_int_distribution, std::shuffle and the
// std::*_distribution classes are not: libstdc++ and libc++ produce different streams from the
// same engine, so a client built with another standard library would pick other random-k indices
// than the server that decodes them. Every derived quantity is therefore defined here:
//   - mix64(): SplitMix64's output function (Steele, Lea and Flood, 2014; passes BigCrush);
//     constexpr, so CUDA device code may call it too (kernels/random.h builds its counter-based
//     streams on it);
//   - derive_seed(): a seed for an independent stream from a base seed and up to two labels;
//   - below(n): Lemire's multiply-shift with rejection (unbiased, "Fast Random Integer
//     Generation in an Interval", 2019);
//   - uniform(): the top 53 bits of next() times 2^-53, in [0, 1).
// Two generators, because seeded runs, tests and the wire protocol (random-k indices, PowerSGD's
// initial Q) are pinned to their streams; neither is cryptographic (secure aggregation uses
// AES-CTR):
//   - SplitMixRng: SplitMix64 (8 bytes of state), inline; normal() is Box-Muller with both outputs
//     used. What aggregation/ draws from: client selection, random-k, DP noise, topologies.
//   - Rng: xoshiro256** (Blackman and Vigna, 2018) seeded by SplitMix64; normal() is Marsaglia's
//     polar method (the spare value is discarded, so a call consumes whole pairs and the stream
//     does not depend on call history); also shuffles, gamma and Dirichlet draws. What client/
//     draws from: partitions, per-epoch shuffles, synthetic data, simulated clocks.
// Integer results are bit-identical everywhere; results that pass through std::log/std::sqrt are
// identical wherever those are correctly rounded (glibc, musl) and may differ in the last ulp
// elsewhere.
//
// Not thread-safe: one generator per thread or per task. Both are cheap to copy.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace cohort {

// SplitMix64's increment, 2^64 / golden ratio.
inline constexpr std::uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;

// SplitMix64's output function: a bijection of the 64-bit words with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One step of the SplitMix64 stream whose state is `state`: advances it and returns the output.
constexpr std::uint64_t splitmix64(std::uint64_t& state) {
  state += kGoldenGamma;
  return mix64(state);
}

// A seed for an independent stream, from a base seed and up to two labels (purpose, round, client).
constexpr std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0) {
  return mix64(mix64(mix64(seed ^ 0x6a09e667f3bcc909ULL) + a * kGoldenGamma) + b);
}

// Uniform in [0, 1) from the top 53 bits of `bits`.
constexpr double unit_double(std::uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

namespace random_detail {

__extension__ using Uint128 = unsigned __int128;  // GCC and Clang; __extension__ quiets -Wpedantic

// Uniform in [0, n) from next(), unbiased (Lemire's multiply-and-reject). REQUIRES n > 0.
template <typename Engine>
std::uint64_t below(Engine& engine, std::uint64_t n) {
  Uint128 m = static_cast<Uint128>(engine.next()) * n;
  auto low = static_cast<std::uint64_t>(m);
  if (low < n) {
    const std::uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<Uint128>(engine.next()) * n;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

}  // namespace random_detail

// SplitMix64, seeded through mix64 so that nearby seeds start far apart.
class SplitMixRng {
 public:
  explicit SplitMixRng(std::uint64_t seed) : state_(mix64(seed ^ 0xbb67ae8584caa73bULL)) {}

  std::uint64_t next() { return splitmix64(state_); }
  // Uniform in [0, n). REQUIRES n > 0.
  std::uint64_t below(std::uint64_t n) { return random_detail::below(*this, n); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return unit_double(next()); }
  // Uniform in (0, 1]: safe to take the log of.
  double uniform_open0() { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }
  // Standard normal (Box-Muller; the second output is kept for the next call).
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

// xoshiro256**, its state seeded by four SplitMix64 steps from the seed (32 bytes of state).
class Rng {
 public:
  explicit Rng(std::uint64_t seed);

  // A new generator whose stream is independent of this one's: seeded from (seed, stream).
  // Used to give each client, epoch or class its own stream without coupling their lengths.
  static Rng for_stream(std::uint64_t seed, std::uint64_t stream);

  std::uint64_t next();
  // Uniform in [0, 1).
  double uniform() { return unit_double(next()); }
  // Uniform integer in [0, n). REQUIRES: n > 0 (checked).
  std::uint64_t below(std::uint64_t n);
  // Standard normal.
  double normal();
  // log of a Gamma(shape, 1) variate (Marsaglia and Tsang, 2000), with the shape < 1 boost
  // log G(a + 1) + log(U) / a kept in log space so that tiny shapes (Dirichlet alpha = 0.01) never
  // underflow to zero. REQUIRES: shape > 0.
  double log_gamma_variate(double shape);

  // Fisher-Yates from the back, swapping i with below(i + 1).
  template <typename T>
  void shuffle(std::span<T> values) {
    for (std::size_t i = values.size(); i > 1; --i) {
      const auto j = static_cast<std::size_t>(below(i));
      std::swap(values[i - 1], values[j]);
    }
  }

  // A draw from Dirichlet(alpha * 1_n) restricted to the entries where `eligible` is true
  // (others get 0), computed in log space: the same as drawing all n, zeroing the ineligible
  // ones and renormalising. All n gamma variates are drawn either way, so the stream does not
  // depend on `eligible`. REQUIRES: alpha > 0, eligible empty (all eligible) or of size n with at
  // least one true entry.
  std::vector<double> dirichlet(std::size_t n, double alpha,
                                const std::vector<bool>& eligible = {});

 private:
  std::uint64_t s_[4];
};

}  // namespace cohort
