#include <doctest/doctest.h>

#include <algorithm>

#include "cohort/aggregation/registries.h"
#include "cohort/aggregation/robust.h"
#include "cohort/core/error.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::run_round;
using cohort::aggregation::testing::TestRng;

TEST_CASE("bulyan refuses m < 4f + 3") {
  Bulyan agg(1);
  CHECK(agg.min_updates() == 7);
  std::vector<float> out;
  CHECK_FALSE(run_round(agg, {{0}, {1}, {2}, {3}, {4}, {5}}, out));
  CHECK(run_round(agg, {{0}, {1}, {2}, {3}, {4}, {5}, {6}}, out));
}

TEST_CASE("bulyan by hand: 0..5 and an outlier at 100, f = 1") {
  // Repeated Krum picks 2, 3, 1, 4, 0 (theta = 5, the outlier never); the beta = 3 values
  // closest to their median 2 are 2, 3, 1: mean 2.
  Bulyan agg(1);
  std::vector<float> out;
  REQUIRE(run_round(agg, {{0}, {1}, {2}, {3}, {4}, {5}, {100}}, out));
  CHECK(agg.selected() == std::vector<cohort::ClientId>{2, 3, 1, 4, 0});
  CHECK(out[0] == 2.0f);
}

TEST_CASE("bulyan keeps every coordinate within the honest range with f far inputs") {
  TestRng rng(5);
  const std::size_t f = 2, m = 4 * f + 3, d = 16;
  std::vector<std::vector<float>> u;
  for (std::size_t c = 0; c < m; ++c) {
    u.emplace_back(d);
    for (auto& v : u.back()) v = c < m - f ? rng.between(-1, 1) : 1e8f;
  }
  auto agg = cohort::builtin_registries().aggregators.create(
      "bulyan", cohort::ConfigSection("aggregator", {{"f", std::int64_t{2}}}));
  std::vector<float> out;
  REQUIRE(run_round(*agg, u, out));
  for (std::size_t j = 0; j < d; ++j) {
    CHECK(out[j] >= -1.0f);
    CHECK(out[j] <= 1.0f);
  }
}
