#include "cohort/kernels/primitives.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/core/thread_pool.h"

namespace cohort::kernels {
namespace {

TEST_CASE("copy_finite copies everything and flags NaN, +Inf and -Inf anywhere") {
  std::vector<float> src(1037);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) - 500.5f;
  src[7] = 3.4e38f;  // large but finite
  src[8] = std::numeric_limits<float>::denorm_min();
  std::vector<float> dst(src.size());
  CHECK(copy_finite(src, dst));
  CHECK(all_finite(src));
  CHECK(dst == src);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {std::size_t{0}, std::size_t{513}, src.size() - 1}) {
      auto s = src;
      s[at] = bad;
      std::fill(dst.begin(), dst.end(), 0.0f);
      CHECK_FALSE(copy_finite(s, dst));
      CHECK_FALSE(all_finite(s));
      CHECK(dst[at + (at == 0 ? 1 : -1)] == s[at + (at == 0 ? 1 : -1)]);
    }
  }
  std::vector<float> shorter(3);
  CHECK_THROWS_AS((void)copy_finite(src, shorter), KernelError);
}

TEST_CASE("axpy, scale, dot and l2_norm on known values") {
  std::vector<float> y{1, 2, 3};
  axpy(2.0f, std::vector<float>{1, -1, 0.5f}, y);
  CHECK(y == std::vector<float>{3, 0, 4});
  scale(0.5f, y);
  CHECK(y == std::vector<float>{1.5f, 0, 2});
  CHECK(dot(std::vector<float>{1, 2, 3}, std::vector<float>{4, 5, 6}) == 32.0);
  CHECK(l2_norm(std::vector<float>{3, 4}) == 5.0);
  CHECK(l2_norm(std::vector<float>{}) == 0.0);
  CHECK_THROWS_AS(axpy(1.0f, std::vector<float>{1}, y), KernelError);
}

TEST_CASE("weighted_sum accumulates in double: 1e8 + 1 - 1e8 is exactly 1") {
  // In float, 1e8 + 1 rounds back to 1e8 (ulp 8), so a float accumulator would give 0.
  const std::vector<float> a{1e8f, 0.5f}, b{1.0f, 0.25f}, c{-1e8f, 0.25f};
  const std::vector<std::span<const float>> inputs{a, b, c};
  std::vector<float> out(2);
  weighted_sum(inputs, std::vector<double>{1.0, 1.0, 1.0}, out);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 1.0f);
  weighted_sum(inputs, std::vector<double>{0.5, 2.0, 0.5}, out);
  CHECK(out[0] == 2.0f);
  CHECK(out[1] == 0.875f);
}

TEST_CASE("weighted_sum is exact for sample-weighted averages of small integers") {
  // FedAvg shape: weights n_k / sum n = 1/6, 2/6, 3/6 of integer-valued vectors.
  const std::vector<float> a{6, 12, -6}, b{0, 6, 6}, c{2, 0, 4};
  std::vector<float> out(3);
  weighted_sum(std::vector<std::span<const float>>{a, b, c},
               std::vector<double>{1.0 / 6, 2.0 / 6, 3.0 / 6}, out);
  CHECK(out == std::vector<float>{2, 4, 3});
}

TEST_CASE("weighted_sum on a thread pool equals the serial result bit for bit") {
  const std::size_t d = 200003, m = 5;
  std::mt19937 gen(7);
  std::normal_distribution<float> dist;
  std::vector<std::vector<float>> data(m, std::vector<float>(d));
  for (auto& v : data)
    for (auto& x : v) x = dist(gen);
  const std::vector<std::span<const float>> inputs(data.begin(), data.end());
  const std::vector<double> w{0.1, 0.2, 0.3, 0.25, 0.15};
  std::vector<float> serial(d), threaded(d);
  weighted_sum(inputs, w, serial);
  ThreadPool pool(2);
  weighted_sum(inputs, w, threaded, &pool);
  CHECK(serial == threaded);
  CHECK_THROWS_AS(weighted_sum(inputs, std::vector<double>{1.0}, serial), KernelError);
  CHECK_THROWS_AS(weighted_sum({}, {}, serial), KernelError);
}

TEST_CASE("accumulate and store stream a weighted average") {
  std::vector<double> acc(2, 0.0);
  accumulate(1.0, std::vector<float>{1e8f, 1.0f}, acc);
  accumulate(1.0, std::vector<float>{1.0f, 2.0f}, acc);
  accumulate(1.0, std::vector<float>{-1e8f, 3.0f}, acc);
  std::vector<float> out(2);
  store(acc, 1.0 / 3.0, out);
  CHECK(out[0] == doctest::Approx(1.0 / 3.0));
  CHECK(out[1] == 2.0f);
}

}  // namespace
}  // namespace cohort::kernels
