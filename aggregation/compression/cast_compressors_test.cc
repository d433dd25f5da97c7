#include <doctest/doctest.h>

#include <cmath>

#include "cohort/aggregation/registries.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::TestRng;

namespace {

std::unique_ptr<Compressor> make(const char* name,
                                 std::map<std::string, cohort::Value, std::less<>> o = {}) {
  static const auto reg = cohort::builtin_registries();
  return reg.compressors.create(name, cohort::ConfigSection("compressor", std::move(o)));
}

std::vector<float> round_trip(const Compressor& c, const std::vector<float>& x,
                              std::size_t* bytes_out = nullptr, std::uint64_t seed = 0) {
  std::vector<std::byte> bytes;
  c.encode(x, nullptr, seed, bytes);
  if (bytes_out) *bytes_out = bytes.size();
  std::vector<float> out(x.size());
  c.decode(bytes, out);
  return out;
}

}  // namespace

TEST_CASE("none: exact, 8 + 4d bytes") {
  const std::vector<float> x{1.5f, -0.0f, 3e-38f, 1e30f};
  std::size_t n = 0;
  const auto y = round_trip(*make("none"), x, &n);
  CHECK(n == 8 + 4 * 4);
  CHECK(y == x);
  CHECK(std::signbit(y[1]));
}

TEST_CASE("fp16: 2 bytes per element, round to nearest even, overflow to inf (7.6)") {
  TestRng rng(2);
  std::vector<float> x(10000);
  for (auto& v : x) v = static_cast<float>(rng.normal() * 100);
  std::size_t n = 0;
  const auto y = round_trip(*make("fp16"), x, &n);
  CHECK(n == 8 + 2 * x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) >= 6.103515625e-05f) {  // normal range: relative error <= 2^-11
      CHECK(std::fabs(y[i] - x[i]) <= std::fabs(x[i]) * 0x1.0p-11f);
    }
  }
  const auto edge = round_trip(*make("fp16"), {65519.0f, 65520.0f, -0.0f, 5.9604645e-08f});
  CHECK(edge[0] == 65504.0f);
  CHECK(std::isinf(edge[1]));
  CHECK((edge[2] == 0.0f && std::signbit(edge[2])));
  CHECK(edge[3] == 5.9604645e-08f);  // smallest subnormal kept
}

TEST_CASE("bf16: the docs/ALGORITHMS.md 7.6 vectors") {
  std::size_t n = 0;
  const auto y =
      round_trip(*make("bf16"), {1.0f + 0x1.0p-8f, 1.0f + 3 * 0x1.0p-8f, 0.0f, -0.0f}, &n);
  CHECK(n == 8 + 2 * 4);
  CHECK(y[0] == 1.0f);
  CHECK(y[1] == 1.015625f);
  CHECK((y[2] == 0.0f && !std::signbit(y[2])));
  CHECK((y[3] == 0.0f && std::signbit(y[3])));
}

TEST_CASE("int8: error <= s/2 per entry, one scale per chunk, zero chunks send zeros") {
  TestRng rng(4);
  std::vector<float> x(1000);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // a zero chunk
  std::size_t n = 0;
  const auto y = round_trip(*make("int8", {{"chunk", std::int64_t{256}}}), x, &n);
  CHECK(n == 12 + 4 * 4 + 1000);  // header, chunk size, 4 scales, 1 byte per element
  for (std::size_t c = 0; c < 4; ++c) {
    float top = 0;
    for (std::size_t j = c * 256; j < std::min<std::size_t>(1000, (c + 1) * 256); ++j) {
      top = std::max(top, std::fabs(x[j]));
    }
    const float s = top / 127;
    for (std::size_t j = c * 256; j < std::min<std::size_t>(1000, (c + 1) * 256); ++j) {
      CHECK(std::fabs(y[j] - x[j]) <= s / 2 * (1 + 1e-5f));
    }
  }
  for (std::size_t j = 256; j < 512; ++j) CHECK(y[j] == 0.0f);
  std::size_t whole = 0;
  round_trip(*make("int8"), x, &whole);
  CHECK(whole == 12 + 4 + 1000);
}

TEST_CASE("int8 with stochastic rounding is unbiased") {
  // One draw of coordinate j takes s*floor(x/s) or s*(floor(x/s)+1): a range of s. Hoeffding over
  // N draws: P(|mean - x_j| >= t) <= 2 exp(-2 N t^2 / s^2); with t = 0.0725 s, N = 2000 and 64
  // coordinates the test fails with probability < 64 * 2 * exp(-21.02) < 1e-7.
  TestRng rng(8);
  std::vector<float> x(64);
  for (auto& v : x) v = rng.between(-1, 1);
  x[0] = 1.0f;  // the scale is exactly 1/127
  auto c = make("int8", {{"stochastic", true}});
  CHECK(c->is_unbiased());
  const int n = 2000;
  std::vector<double> mean(x.size(), 0.0);
  for (int t = 0; t < n; ++t) {
    const auto y = round_trip(*c, x, nullptr, compression_seed(5, t, 0));
    for (std::size_t j = 0; j < x.size(); ++j) mean[j] += y[j] / n;
  }
  const double s = 1.0 / 127;
  for (std::size_t j = 0; j < x.size(); ++j) CHECK(std::fabs(mean[j] - x[j]) <= 0.0725 * s);
}
