#include "cohort/kernels/primitives.h"

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "check.h"
#include "parallel.h"

namespace cohort::kernels {
namespace {

using FloatMap = Eigen::Map<Eigen::VectorXf>;
using ConstFloatMap = Eigen::Map<const Eigen::VectorXf>;
using DoubleMap = Eigen::Map<Eigen::VectorXd>;
using ConstDoubleMap = Eigen::Map<const Eigen::VectorXd>;

ConstFloatMap map(std::span<const float> x) {
  return {x.data(), static_cast<Eigen::Index>(x.size())};
}
FloatMap map(std::span<float> x) { return {x.data(), static_cast<Eigen::Index>(x.size())}; }

// 2048 doubles = 16 KiB of accumulator: stays in L1 while every input streams through it.
constexpr std::size_t kBlock = 2048;
// Below this many coordinates a second thread costs more than it saves.
constexpr std::size_t kParallelGrain = 1 << 15;

}  // namespace

void axpy(float alpha, std::span<const float> x, std::span<float> y) {
  detail::check_size("axpy", x.size(), y.size());
  map(y) += alpha * map(x);
}

void scale(float alpha, std::span<float> x) { map(x) *= alpha; }

bool copy_finite(std::span<const float> src, std::span<float> dst) {
  detail::check_size("copy_finite", dst.size(), src.size());
  // A float is non-finite exactly when its exponent bits are all ones. OR-reducing "exponent ==
  // all ones" with no early exit lets the compiler vectorise the copy and the test together.
  constexpr std::uint32_t kExponent = 0x7f800000u;
  std::uint32_t bad = 0;
  const float* s = src.data();
  float* d = dst.data();
  for (std::size_t i = 0; i < src.size(); ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, s + i, sizeof bits);
    bad |= static_cast<std::uint32_t>((bits & kExponent) == kExponent);
    d[i] = s[i];
  }
  return bad == 0;
}

bool all_finite(std::span<const float> x) {
  constexpr std::uint32_t kExponent = 0x7f800000u;
  std::uint32_t bad = 0;
  const float* s = x.data();
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, s + i, sizeof bits);
    bad |= static_cast<std::uint32_t>((bits & kExponent) == kExponent);
  }
  return bad == 0;
}

double dot(std::span<const float> x, std::span<const float> y) {
  detail::check_size("dot", x.size(), y.size());
  return map(x).cast<double>().dot(map(y).cast<double>());
}

double l2_norm(std::span<const float> x) { return map(x).cast<double>().norm(); }

void weighted_sum(std::span<const std::span<const float>> inputs, std::span<const double> weights,
                  std::span<float> out, ThreadPool* pool) {
  if (inputs.empty()) throw KernelError("weighted_sum: no inputs");
  detail::check_size("weighted_sum weights", weights.size(), inputs.size());
  for (const auto& in : inputs) detail::check_size("weighted_sum input", in.size(), out.size());
  const std::size_t d = out.size();
  detail::parallel_ranges(pool, d, kParallelGrain, [&](std::size_t begin, std::size_t end) {
    std::array<double, kBlock> acc_storage;
    for (std::size_t b = begin; b < end; b += kBlock) {
      const std::size_t len = std::min(kBlock, end - b);
      DoubleMap acc(acc_storage.data(), static_cast<Eigen::Index>(len));
      acc.setZero();
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        acc += weights[k] * map(inputs[k].subspan(b, len)).cast<double>();
      }
      map(out.subspan(b, len)) = acc.cast<float>();
    }
  });
}

void accumulate(double weight, std::span<const float> x, std::span<double> acc) {
  detail::check_size("accumulate", x.size(), acc.size());
  DoubleMap(acc.data(), static_cast<Eigen::Index>(acc.size())) += weight * map(x).cast<double>();
}

void store(std::span<const double> acc, double scale_by, std::span<float> out) {
  detail::check_size("store", acc.size(), out.size());
  map(out) =
      (scale_by * ConstDoubleMap(acc.data(), static_cast<Eigen::Index>(acc.size()))).cast<float>();
}

}  // namespace cohort::kernels
