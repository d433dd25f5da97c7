#include <doctest/doctest.h>

#include <cmath>

#include "cohort/aggregation/registries.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::TestRng;

TEST_CASE("scaled sign: ||C(p)||_1 = ||p||_1, d bits + one float, sign(0) = +1 (7.3)") {
  const auto reg = cohort::builtin_registries();
  auto c = reg.compressors.create("sign",
                                  cohort::ConfigSection("compressor", {{"error_feedback", false}}));
  TestRng rng(6);
  std::vector<float> p(10000);
  for (auto& v : p) v = static_cast<float>(rng.normal());
  p[0] = 0.0f;
  p[1] = -0.0f;
  std::vector<std::byte> bytes;
  c->encode(p, nullptr, 0, bytes);
  CHECK(bytes.size() == 12 + 1250);
  std::vector<float> y(p.size());
  c->decode(bytes, y);
  double l1p = 0, l1y = 0, l2p = 0, err = 0;
  for (std::size_t j = 0; j < p.size(); ++j) {
    l1p += std::fabs(p[j]);
    l1y += std::fabs(y[j]);
    l2p += static_cast<double>(p[j]) * p[j];
    err += static_cast<double>(y[j] - p[j]) * (y[j] - p[j]);
    if (p[j] != 0) CHECK(std::signbit(y[j]) == std::signbit(p[j]));
  }
  CHECK(y[0] > 0);
  CHECK(y[1] > 0);
  CHECK(l1y == doctest::Approx(l1p).epsilon(1e-6));
  // ||C(p) - p||^2 = (1 - delta) ||p||^2 with delta = ||p||_1^2 / (d ||p||^2).
  const double delta = l1p * l1p / (p.size() * l2p);
  CHECK(err == doctest::Approx((1 - delta) * l2p).epsilon(1e-5));
}
