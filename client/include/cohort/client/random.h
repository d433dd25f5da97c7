// A small portable random number generator for everything in client/ that must be reproducible
// from a seed: partitions, per-epoch shuffles, synthetic data.
//
// std::mt19937_64 is portable but std::uniform_int_distribution, std::shuffle and the
// std::*_distribution classes are not: libstdc++ and libc++ produce different streams from the
// same engine. So every derived quantity here is defined in this file:
//   - engine: xoshiro256** (Blackman and Vigna, 2018), state seeded by SplitMix64(seed);
//   - uniform(): the top 53 bits of next() times 2^-53, in [0, 1);
//   - below(n): Lemire's multiply-shift with rejection (unbiased, "Fast Random Integer
//     Generation in an Interval", 2019);
//   - shuffle(): Fisher-Yates from the back, swapping i with below(i + 1);
//   - normal(): Marsaglia's polar method (the spare value is discarded, so a call consumes
//     whole pairs and the stream does not depend on call history);
//   - log_gamma_variate(a): log of a Gamma(a, 1) draw by Marsaglia and Tsang (2000), with the
//     a < 1 boost log G(a + 1) + log(U) / a kept in log space so that tiny shapes (Dirichlet
//     alpha = 0.01) never underflow to zero.
// Integer results are bit-identical everywhere; results that pass through std::log/std::sqrt
// are identical wherever those are correctly rounded (glibc, musl) and may differ in the last
// ulp elsewhere.
//
// Not thread-safe: one Rng per thread or per task. Cheap to copy (32 bytes of state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace cohort::client {

class Rng {
 public:
  explicit Rng(std::uint64_t seed);

  // A new generator whose stream is independent of this one's: seeded from (seed, stream).
  // Used to give each client, epoch or class its own stream without coupling their lengths.
  static Rng for_stream(std::uint64_t seed, std::uint64_t stream);

  std::uint64_t next();
  // Uniform in [0, 1).
  double uniform();
  // Uniform integer in [0, n). REQUIRES: n > 0.
  std::uint64_t below(std::uint64_t n);
  // Standard normal.
  double normal();
  // log of a Gamma(shape, 1) variate. REQUIRES: shape > 0.
  double log_gamma_variate(double shape);

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

}  // namespace cohort::client
