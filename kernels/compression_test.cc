#include "cohort/kernels/compression.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::kernels {
namespace {

TEST_CASE("top_k picks the largest magnitudes, indices ascending, ties to the lower index") {
  const std::vector<float> x{0.5f, -3.0f, 2.0f, 0.0f, -2.0f, 1.0f, 3.0f};
  std::vector<std::uint32_t> idx(3);
  std::vector<float> val(3);
  top_k(x, 3, idx, val);  // |x| = 3 (1), 3 (6), 2 (2) and 2 (4): the tie at 2 goes to index 2
  CHECK(idx == std::vector<std::uint32_t>{1, 2, 6});
  CHECK(val == std::vector<float>{-3.0f, 2.0f, 3.0f});

  std::vector<std::uint32_t> all(x.size());
  std::vector<float> all_val(x.size());
  top_k(x, x.size(), all, all_val);
  CHECK(all_val == x);
  top_k(x, 0, std::span<std::uint32_t>{}, std::span<float>{});
  CHECK_THROWS_AS(top_k(x, 8, all, all_val), KernelError);
}

TEST_CASE("top_k agrees with a full sort on random data") {
  std::mt19937 gen(5);
  std::normal_distribution<float> dist;
  std::vector<float> x(10000);
  for (auto& v : x) v = dist(gen);
  const std::size_t k = 137;
  std::vector<std::uint32_t> idx(k);
  std::vector<float> val(k);
  top_k(x, k, idx, val);
  std::vector<float> mags(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) mags[i] = std::fabs(x[i]);
  std::sort(mags.begin(), mags.end(), std::greater<>());
  const float kth = mags[k - 1];
  for (std::size_t i = 0; i < k; ++i) {
    CHECK(std::fabs(val[i]) >= kth);
    CHECK(x[idx[i]] == val[i]);
    if (i > 0) CHECK(idx[i] > idx[i - 1]);
  }
}

TEST_CASE("qsgd levels stay in [-s, s], zero input gives zero, and apply = dequantize(quantize)") {
  const std::vector<float> x{0.3f, -1.2f, 0.0f, 2.5f, -0.01f, 0.7f, 1.0f};
  for (const QsgdNorm norm : {QsgdNorm::kL2, QsgdNorm::kMaxAbs}) {
    const QsgdOptions o{.levels = 4, .bucket_size = 3, .norm = norm};
    std::vector<float> scales(qsgd_bucket_count(x.size(), o));
    CHECK(scales.size() == 3);
    std::vector<std::int16_t> levels(x.size());
    qsgd_quantize(x, o, 42, scales, levels);
    for (std::size_t j = 0; j < x.size(); ++j) {
      CHECK(std::abs(levels[j]) <= 4);
      if (x[j] != 0.0f && levels[j] != 0) CHECK(std::signbit(x[j]) == (levels[j] < 0));
    }
    std::vector<float> decoded(x.size()), applied(x.size());
    qsgd_dequantize(scales, levels, o, decoded);
    qsgd_apply(x, o, 42, applied);
    CHECK(decoded == applied);
  }
  const std::vector<float> zero(5, 0.0f);
  std::vector<float> out(5, 1.0f);
  qsgd_apply(zero, {.levels = 1}, 1, out);
  CHECK(out == zero);
  CHECK_THROWS_AS(qsgd_apply(zero, {.levels = 0}, 1, out), KernelError);
}

TEST_CASE("qsgd is unbiased (Monte Carlo with Hoeffding and 5-sigma bounds)") {
  // docs/ALGORITHMS.md 7.2: N = 1e4 draws with distinct seeds, d = 1000. One draw of coordinate j spans
  // an interval of width ||v|| / s, so by Hoeffding each coordinate's sample mean lies within
  // 3.3 ||v|| / (s sqrt N) of v_j except with probability 2 exp(-2 * 3.3^2) ~ 7e-10; over 1000
  // coordinates and 3 level counts the test fails spuriously with probability < 3e-6.
  // The mean squared error must lie within 5 sigma of the exact variance
  // (||v||^2 / s^2) sum_j p_j (1 - p_j), sigma = (||v||^2 / s^2) sqrt(sum_j p_j(1-p_j)(1-2p_j)^2 / N).
  const std::size_t d = 1000, draws = 10000;
  std::mt19937 gen(11);
  std::normal_distribution<float> dist;
  std::vector<float> v(d);
  for (auto& x : v) x = dist(gen);
  double norm2 = 0;
  for (float x : v) norm2 += double(x) * x;
  const double norm = std::sqrt(norm2);
  for (const std::uint32_t s : {1u, 4u, 15u}) {
    CAPTURE(s);
    const QsgdOptions o{.levels = s};
    std::vector<double> mean(d, 0.0);
    double mse = 0.0;
    std::vector<float> q(d);
    for (std::size_t t = 0; t < draws; ++t) {
      qsgd_apply(v, o, /*seed=*/t * 7919 + s, q);
      for (std::size_t j = 0; j < d; ++j) {
        mean[j] += q[j];
        mse += (double(q[j]) - v[j]) * (double(q[j]) - v[j]);
      }
    }
    const double bound = 3.3 * norm / (s * std::sqrt(double(draws)));
    std::size_t outside = 0;
    for (std::size_t j = 0; j < d; ++j) {
      if (std::abs(mean[j] / draws - v[j]) > bound) ++outside;
    }
    CHECK(outside == 0);
    double var_sum = 0, sigma_sum = 0;
    for (std::size_t j = 0; j < d; ++j) {
      const double r = s * std::fabs(double(v[j])) / norm;
      const double p = r - std::floor(r);
      var_sum += p * (1 - p);
      sigma_sum += p * (1 - p) * (1 - 2 * p) * (1 - 2 * p);
    }
    const double unit = norm2 / (double(s) * s);
    const double exact = unit * var_sum;
    const double sigma = unit * std::sqrt(sigma_sum / draws);
    CHECK(std::abs(mse / draws - exact) <= 5 * sigma + 1e-6 * exact);
    // Lemma 3.1 (ii): the exact variance never exceeds min(d/s^2, sqrt(d)/s) ||v||^2.
    CHECK(exact <= std::min(double(d) / (s * s), std::sqrt(double(d)) / s) * norm2);
  }
}

TEST_CASE("fp16 round to nearest even on known values") {
  CHECK(float_to_fp16(1.0f) == 0x3C00);
  CHECK(float_to_fp16(-2.0f) == 0xC000);
  CHECK(float_to_fp16(65504.0f) == 0x7BFF);
  CHECK(float_to_fp16(65519.0f) == 0x7BFF);       // below the midpoint to 65536
  CHECK(float_to_fp16(65520.0f) == 0x7C00);       // the midpoint rounds to even: inf
  CHECK(float_to_fp16(std::ldexp(1.0f, -24)) == 0x0001);             // smallest subnormal
  CHECK(float_to_fp16(std::ldexp(1.0f, -25)) == 0x0000);             // tie -> even (0)
  CHECK(float_to_fp16(std::ldexp(3.0f, -25)) == 0x0002);             // tie -> even (2)
  CHECK(float_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);      // tie -> even
  CHECK(float_to_fp16(1.0f + std::ldexp(3.0f, -11)) == 0x3C02);      // tie -> even (up)
  CHECK(float_to_fp16(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(float_to_fp16(-0.0f) == 0x8000);
  CHECK((float_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7FFF) > 0x7C00);
  CHECK(fp16_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(fp16_to_float(0x7BFF) == 65504.0f);
  CHECK(fp16_to_float(0x3555) == doctest::Approx(0.333251953125));
  CHECK(fp16_to_float(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(std::signbit(fp16_to_float(0x8000)));
  CHECK(std::isnan(fp16_to_float(0x7E00)));
}

TEST_CASE("bf16 round to nearest even on known values") {
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);   // tie -> even: 1.0
  CHECK(bf16_to_float(float_to_bf16(1.0f + std::ldexp(3.0f, -8))) == 1.015625f);
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xFF80);
  CHECK(float_to_bf16(0.0f) == 0x0000);
  CHECK(float_to_bf16(-0.0f) == 0x8000);
  CHECK(float_to_bf16(std::numeric_limits<float>::quiet_NaN()) == 0x7FC0);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds up to inf
  CHECK(bf16_to_float(0x4049) == 3.140625f);
}

TEST_CASE("span casts agree with the scalar casts and round-trip representable values") {
  std::mt19937 gen(13);
  std::vector<float> x;
  for (int i = 0; i < 4099; ++i) {
    float v;
    do {
      v = std::bit_cast<float>(static_cast<std::uint32_t>(gen()));
    } while (std::isnan(v));
    x.push_back(v);
  }
  std::vector<std::uint16_t> half(x.size()), bf(x.size());
  to_fp16(x, half);
  to_bf16(x, bf);
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(half[i] == float_to_fp16(x[i]));
    REQUIRE(bf[i] == float_to_bf16(x[i]));
  }
  std::vector<float> back(x.size());
  from_fp16(half, back);
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(std::bit_cast<std::uint32_t>(back[i]) == std::bit_cast<std::uint32_t>(fp16_to_float(half[i])));
  }
  // Every finite fp16 value round-trips exactly through float.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    REQUIRE(float_to_fp16(fp16_to_float(static_cast<std::uint16_t>(h))) == h);
  }
  from_bf16(bf, back);
  to_bf16(back, half);
  CHECK(half == bf);
}

}  // namespace
}  // namespace cohort::kernels
