#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "cohort/aggregation/registries.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::TestRng;

namespace {

std::unique_ptr<Compressor> make(const char* name,
                                 std::map<std::string, cohort::Value, std::less<>> o) {
  static const auto reg = cohort::builtin_registries();
  o["error_feedback"] = false;  // the bare compressor
  return reg.compressors.create(name, cohort::ConfigSection("compressor", std::move(o)));
}

std::vector<float> encode_decode(const Compressor& c, const std::vector<float>& x,
                                 std::uint64_t seed, std::size_t* size = nullptr) {
  std::vector<std::byte> bytes;
  c.encode(x, nullptr, seed, bytes);
  if (size) *size = bytes.size();
  std::vector<float> y(x.size());
  c.decode(bytes, y);
  return y;
}

std::vector<float> gaussian(std::size_t d, std::uint64_t seed) {
  TestRng rng(seed);
  std::vector<float> x(d);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  return x;
}

}  // namespace

TEST_CASE("topk keeps exactly the k largest magnitudes; contractive with delta = k/d") {
  const auto x = gaussian(10000, 1);
  std::size_t size = 0;
  const auto y = encode_decode(*make("topk", {{"k", std::int64_t{100}}}), x, 0, &size);
  CHECK(size == 12 + 4 * 100 + 4 * 100);  // k indices + k values
  std::vector<float> mags;
  for (float v : x) mags.push_back(std::fabs(v));
  std::nth_element(mags.begin(), mags.begin() + 9900, mags.end());
  const float threshold = mags[9900];
  std::size_t kept = 0;
  double err = 0, total = 0;
  for (std::size_t j = 0; j < x.size(); ++j) {
    if (y[j] != 0) {
      ++kept;
      CHECK(y[j] == x[j]);
      CHECK(std::fabs(x[j]) >= threshold);
    } else {
      CHECK(std::fabs(x[j]) <= threshold);
    }
    err += static_cast<double>(y[j] - x[j]) * (y[j] - x[j]);
    total += static_cast<double>(x[j]) * x[j];
  }
  CHECK(kept == 100);
  CHECK(err <= (1 - 100.0 / 10000) * total);
}

TEST_CASE("topk sends a bitmap instead of indices when k > d/32") {
  const auto x = gaussian(1000, 2);
  std::size_t size = 0;
  const auto y = encode_decode(*make("topk", {{"k_fraction", 0.1}}), x, 0, &size);
  CHECK(size == 12 + 125 + 4 * 100);  // d bits + k values (4 k index bytes would be 400)
  CHECK(std::count_if(y.begin(), y.end(), [](float v) { return v != 0; }) == 100);
}

TEST_CASE("randomk sends a seed, not indices; each index is equally likely") {
  // Inclusion frequency of each of d = 100 coordinates over N = 20000 seeds, k = 10: Hoeffding
  // P(|freq - 0.1| >= 0.022) <= 2 exp(-2 N 0.022^2) = 8e-9 per coordinate, < 1e-6 for all 100.
  auto c = make("randomk", {{"k", std::int64_t{10}}});
  CHECK_FALSE(c->is_unbiased());
  std::vector<float> ones(100, 1.0f);
  std::vector<int> hits(100, 0);
  std::size_t size = 0;
  for (int t = 0; t < 20000; ++t) {
    const auto y = encode_decode(*c, ones, compression_seed(3, t, 0), &size);
    int nonzero = 0;
    for (std::size_t j = 0; j < 100; ++j) {
      if (y[j] != 0) {
        ++hits[j];
        ++nonzero;
        CHECK(y[j] == 1.0f);
      }
    }
    REQUIRE(nonzero == 10);
  }
  CHECK(size == 20 + 4 * 10);
  for (int h : hits) CHECK(std::fabs(h / 20000.0 - 0.1) <= 0.022);
}

TEST_CASE("scaled randomk: E||C(x) - x||^2 = (d/k - 1) ||x||^2, and it is unbiased") {
  auto c = make("randomk", {{"k", std::int64_t{10}}, {"scaled", true}});
  CHECK(c->is_unbiased());
  // Equal magnitudes: every draw has ||C(x) - x||^2 = k (d/k - 1)^2 + (d - k) = (d/k - 1) d.
  std::vector<float> ones(100, 1.0f);
  const auto y = encode_decode(*c, ones, 77);
  double err = 0;
  for (float v : y) err += (v - 1.0) * (v - 1.0);
  CHECK(err == doctest::Approx((100.0 / 10 - 1) * 100));
  // Unbiased: one draw of coordinate j spans (d/k)|x_j|; Hoeffding with N = 20000 and
  // t = 3.6 (d/k)|x_j| / sqrt(N): 2 exp(-25.9) per coordinate, < 1e-9 over 100 coordinates.
  const auto x = gaussian(100, 4);
  std::vector<double> mean(100, 0.0);
  const int n = 20000;
  for (int t = 0; t < n; ++t) {
    const auto z = encode_decode(*c, x, compression_seed(4, t, 0));
    for (std::size_t j = 0; j < 100; ++j) mean[j] += z[j] / static_cast<double>(n);
  }
  for (std::size_t j = 0; j < 100; ++j) {
    CHECK(std::fabs(mean[j] - x[j]) <= 3.6 * 10 * std::fabs(x[j]) / std::sqrt(n));
  }
}
