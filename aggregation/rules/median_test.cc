#include <doctest/doctest.h>

#include <algorithm>

#include "cohort/aggregation/registries.h"
#include "cohort/aggregation/robust.h"
#include "cohort/core/error.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::run_round;
using cohort::aggregation::testing::TestRng;

TEST_CASE("median: f < m/2 inputs at +-1e9 leave every coordinate within the honest min/max") {
  TestRng rng(1);
  const std::size_t d = 64, honest = 4, f = 3;  // m = 7
  std::vector<std::vector<float>> u;
  for (std::size_t c = 0; c < honest; ++c) {
    u.emplace_back(d);
    for (auto& v : u.back()) v = rng.between(-1, 1);
  }
  for (std::size_t c = 0; c < f; ++c) u.emplace_back(d, c % 2 == 0 ? 1e9f : -1e9f);
  CoordinateMedian agg;
  std::vector<float> out;
  REQUIRE(run_round(agg, u, out));
  for (std::size_t j = 0; j < d; ++j) {
    float lo = u[0][j], hi = u[0][j];
    for (std::size_t c = 1; c < honest; ++c) {
      lo = std::min(lo, u[c][j]);
      hi = std::max(hi, u[c][j]);
    }
    CHECK(out[j] >= lo);
    CHECK(out[j] <= hi);
  }
}

TEST_CASE("median: even m averages the two middle values; weights are ignored; order is too") {
  CoordinateMedian agg;
  std::vector<float> out;
  REQUIRE(run_round(agg, {{1, -1}, {10, -10}, {2, -2}, {3, -3}}, out, {100, 1, 1, 1}));
  CHECK(out[0] == 2.5f);
  CHECK(out[1] == -2.5f);
  // The same updates arriving in another order (client ids fixed) give the same bits.
  CoordinateMedian other;
  other.begin_round(1, 2);
  const std::vector<std::vector<float>> u{{1, -1}, {10, -10}, {2, -2}, {3, -3}};
  for (int c : {3, 1, 0, 2}) {
    REQUIRE(other.accept({static_cast<cohort::ClientId>(c), 0, u[c], 1}) == Verdict::kAccepted);
    other.end_update(static_cast<cohort::ClientId>(c), true);
  }
  std::vector<float> out2(2);
  REQUIRE(other.finish_round(out2));
  CHECK(out2 == out);
}

TEST_CASE("median: an abandoned update does not count; the registry builds it") {
  auto agg = cohort::builtin_registries().aggregators.create("median", {});
  CHECK_FALSE(agg->is_streaming());
  agg->begin_round(1, 1);
  const std::vector<float> a{1}, b{2}, c{100};
  REQUIRE(agg->accept({1, 0, a, 1}) == Verdict::kAccepted);
  REQUIRE(agg->accept({2, 0, b, 1}) == Verdict::kAccepted);
  REQUIRE(agg->accept({3, 0, c, 1}) == Verdict::kAccepted);
  agg->end_update(1, true);
  agg->end_update(2, true);
  agg->end_update(3, false);
  CHECK(agg->completed_updates() == 2);
  std::vector<float> out(1);
  REQUIRE(agg->finish_round(out));
  CHECK(out[0] == 1.5f);
  CHECK_THROWS_AS(cohort::builtin_registries().aggregators.create(
                      "median", cohort::ConfigSection("aggregator", {{"beta", 0.1}})),
                  cohort::ConfigError);
}
