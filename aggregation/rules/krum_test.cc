#include <doctest/doctest.h>

#include <algorithm>

#include "cohort/aggregation/registries.h"
#include "cohort/aggregation/robust.h"
#include "cohort/core/error.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::run_round;
using cohort::aggregation::testing::TestRng;

namespace {

// m - f honest inputs near 0 (clients 0..m-f-1), then f far away.
std::vector<std::vector<float>> honest_and_far(std::size_t m, std::size_t f, std::size_t d) {
  TestRng rng(m * 100 + f);
  std::vector<std::vector<float>> u;
  for (std::size_t c = 0; c < m; ++c) {
    u.emplace_back(d);
    for (auto& v : u.back()) v = c < m - f ? rng.between(-0.1, 0.1) : rng.between(1e5, 1e6);
  }
  return u;
}

}  // namespace

TEST_CASE("krum scores by hand: points 0, 1, 3, 10 with f = 0 (two nearest neighbours)") {
  const std::vector<float> p0{0}, p1{1}, p3{3}, p10{10};
  const std::vector<std::span<const float>> u{p0, p1, p3, p10};
  const auto s = krum_scores(u, 0);
  CHECK(s == std::vector<double>{1 + 9, 1 + 4, 4 + 9, 49 + 81});
}

TEST_CASE("krum: honest inputs near 0 plus f far away select an honest input") {
  for (std::size_t f : {1, 2, 3}) {
    const std::size_t m = 2 * f + 3;
    const auto u = honest_and_far(m, f, 20);
    Krum agg(f);
    std::vector<float> out;
    REQUIRE(run_round(agg, u, out));
    REQUIRE(agg.selected().size() == 1);
    const auto chosen = agg.selected()[0];
    CHECK(chosen < m - f);
    CHECK(out == u[chosen]);
  }
}

TEST_CASE("krum refuses m <= 2f + 2") {
  Krum agg(2);
  CHECK(agg.min_updates() == 7);
  std::vector<float> out;
  CHECK_FALSE(run_round(agg, honest_and_far(6, 2, 4), out));
  CHECK(run_round(agg, honest_and_far(7, 2, 4), out));
}

TEST_CASE("multi-krum averages the m lowest-score inputs uniformly") {
  const auto u = honest_and_far(9, 2, 8);
  Krum agg(2, 3);
  std::vector<float> out;
  REQUIRE(run_round(agg, u, out, {1, 50, 1, 1, 1, 1, 1, 1, 1}));  // weights do not matter
  REQUIRE(agg.selected().size() == 3);
  std::vector<double> mean(8, 0.0);
  for (auto c : agg.selected()) {
    CHECK(c < 7u);
    for (std::size_t j = 0; j < 8; ++j) mean[j] += u[c][j] / 3.0;
  }
  for (std::size_t j = 0; j < 8; ++j) CHECK(out[j] == doctest::Approx(mean[j]).epsilon(1e-6));

  auto def = cohort::builtin_registries().aggregators.create(
      "multi_krum", cohort::ConfigSection("aggregator", {{"f", std::int64_t{2}}}));
  auto* multi = dynamic_cast<Krum*>(def.get());
  REQUIRE(multi != nullptr);
  REQUIRE(run_round(*multi, u, out));
  CHECK(multi->selected().size() == 7);  // m = 0: n - f
  for (auto c : multi->selected()) CHECK(c < 7u);
}
