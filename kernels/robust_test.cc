#include "cohort/kernels/robust.h"

#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/core/thread_pool.h"

namespace cohort::kernels {
namespace {

using Inputs = std::vector<std::span<const float>>;

TEST_CASE("coordinate median of an odd and an even number of inputs") {
  const std::vector<float> a{1, 10, -3}, b{5, 20, -1}, c{3, 0, -2}, d{100, 30, 7};
  std::vector<float> out(3);
  coordinate_median(Inputs{a, b, c}, out);
  CHECK(out == std::vector<float>{3, 10, -2});
  coordinate_median(Inputs{a, b, c, d}, out);  // mean of the two middle values
  CHECK(out == std::vector<float>{4, 15, -1.5f});
  coordinate_median(Inputs{a}, out);
  CHECK(out == a);
}

TEST_CASE("median ignores a minority of huge Byzantine values") {
  const std::vector<float> h1{0.1f, -0.2f}, h2{0.2f, -0.1f}, h3{0.3f, 0.0f}, bad1{1e9f, -1e9f},
      bad2{-1e9f, 1e9f};
  std::vector<float> out(2);
  coordinate_median(Inputs{h1, bad1, h2, bad2, h3}, out);
  CHECK(out[0] >= 0.1f);
  CHECK(out[0] <= 0.3f);
  CHECK(out[1] >= -0.2f);
  CHECK(out[1] <= 0.0f);
}

TEST_CASE("trimmed mean drops trim values per side") {
  const std::vector<float> a{1, -100}, b{2, 4}, c{3, 5}, d{4, 6}, e{100, 1000};
  std::vector<float> out(2);
  trimmed_mean(Inputs{a, b, c, d, e}, 1, out);  // {2,3,4} and {4,5,6}
  CHECK(out == std::vector<float>{3, 5});
  trimmed_mean(Inputs{a, b, c, d, e}, 0, out);  // plain mean
  CHECK(out[0] == doctest::Approx(22.0));
  CHECK(out[1] == doctest::Approx(183.0));
  trimmed_mean(Inputs{a, b, c, d, e}, 2, out);  // b = (m - 1) / 2: the median
  std::vector<float> median(2);
  coordinate_median(Inputs{a, b, c, d, e}, median);
  CHECK(out == median);
  CHECK_THROWS_AS(trimmed_mean(Inputs{a, b, c, d}, 2, out), KernelError);
  CHECK_THROWS_AS(trimmed_mean(Inputs{}, 0, out), KernelError);
  const std::vector<float> short_input{1};
  CHECK_THROWS_AS(coordinate_median(Inputs{a, short_input}, out), KernelError);
}

TEST_CASE("robust statistics on a thread pool equal the serial result") {
  const std::size_t d = 50001, m = 7;
  std::mt19937 gen(3);
  std::normal_distribution<float> dist;
  std::vector<std::vector<float>> data(m, std::vector<float>(d));
  for (auto& v : data)
    for (auto& x : v) x = dist(gen);
  const Inputs inputs(data.begin(), data.end());
  ThreadPool pool(2);
  std::vector<float> s(d), t(d);
  coordinate_median(inputs, s);
  coordinate_median(inputs, t, &pool);
  CHECK(s == t);
  trimmed_mean(inputs, 2, s);
  trimmed_mean(inputs, 2, t, &pool);
  CHECK(s == t);
}

}  // namespace
}  // namespace cohort::kernels
