// Counter-based random numbers shared by the CPU and CUDA kernels: the value for element j is a
// pure function of (key, j), so results do not depend on threads, launch shapes or the device.
// SplitMix64 (cohort/core/random.h: its mix64, constexpr and so callable from device code under
// --expt-relaxed-constexpr): passes BigCrush; one multiply-xorshift chain per draw.
#pragma once

#include <cstdint>

#include "cohort/core/random.h"

#if defined(__CUDACC__)
#define COHORT_HOST_DEVICE __host__ __device__
#else
#define COHORT_HOST_DEVICE
#endif

namespace cohort::kernels::detail {

// The j-th output of the SplitMix64 stream whose state starts at key.
COHORT_HOST_DEVICE inline std::uint64_t counter_bits(std::uint64_t key, std::uint64_t j) {
  return mix64(key + (j + 1) * kGoldenGamma);
}

// Uniform in [0, 1) with 24 random bits: exactly representable as float on every device.
COHORT_HOST_DEVICE inline float counter_uniform(std::uint64_t key, std::uint64_t j) {
  return static_cast<float>(counter_bits(key, j) >> 40) * (1.0f / 16777216.0f);
}

// Derives independent stream keys from a user seed and a purpose / step number: derive_seed()'s
// shape (core/random.h) with a constant of its own, so kernel streams never coincide with others.
COHORT_HOST_DEVICE inline std::uint64_t derive_key(std::uint64_t seed, std::uint64_t a,
                                                   std::uint64_t b = 0) {
  return mix64(mix64(mix64(seed ^ 0x5851f42d4c957f2dULL) + a * kGoldenGamma) + b);
}

// Key purposes, so that init, dropout and quantisation streams never coincide.
inline constexpr std::uint64_t kInitStream = 1;
inline constexpr std::uint64_t kDropoutStream = 2;
inline constexpr std::uint64_t kQsgdStream = 3;

// The dropout key of the k-th training forward (k from 0) of layer `layer`.
COHORT_HOST_DEVICE inline std::uint64_t dropout_key(std::uint64_t seed, std::uint64_t k,
                                                    std::uint64_t layer) {
  return derive_key(seed, kDropoutStream, (k << 16) ^ layer);
}

}  // namespace cohort::kernels::detail
