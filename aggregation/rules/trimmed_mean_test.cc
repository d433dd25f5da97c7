#include <doctest/doctest.h>

#include "cohort/aggregation/registries.h"
#include "cohort/aggregation/robust.h"
#include "cohort/core/error.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::run_round;
using cohort::aggregation::testing::TestRng;

TEST_CASE("trimmed mean: beta = 0 is the plain mean") {
  TrimmedMean agg(0.0);
  std::vector<float> out;
  REQUIRE(run_round(agg, {{1, 4}, {2, 8}, {6, 0}}, out));
  CHECK(out[0] == doctest::Approx(3.0));
  CHECK(out[1] == doctest::Approx(4.0));
}

TEST_CASE("trimmed mean: odd m with b = (m - 1) / 2 is the median") {
  TestRng rng(7);
  std::vector<std::vector<float>> u(5, std::vector<float>(32));
  for (auto& x : u) {
    for (auto& v : x) v = rng.between(-5, 5);
  }
  TrimmedMean trimmed(0.4);  // b = floor(0.4 * 5) = 2
  CoordinateMedian median;
  std::vector<float> a, b;
  REQUIRE(run_round(trimmed, u, a));
  REQUIRE(run_round(median, u, b));
  for (std::size_t j = 0; j < a.size(); ++j) CHECK(a[j] == doctest::Approx(b[j]));
}

TEST_CASE("trimmed mean: drops floor(beta m) at each end; refuses b < f") {
  TrimmedMean agg(0.2);  // m = 10: b = 2
  std::vector<std::vector<float>> u;
  for (float v : {-1e6f, -500.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 700.0f, 1e7f})
    u.push_back({v});
  std::vector<float> out;
  REQUIRE(run_round(agg, u, out));
  CHECK(out[0] == doctest::Approx(3.5));  // mean of 1..6

  TrimmedMean strict(0.2, 1);  // b = floor(0.2 m) >= 1 needs m >= 5
  CHECK(strict.min_updates() == 5);
  CHECK_FALSE(run_round(strict, {{1}, {2}, {3}, {4}}, out));
  CHECK(run_round(strict, {{1}, {2}, {3}, {4}, {100}}, out));
  CHECK(out[0] == doctest::Approx(3.0));
}

TEST_CASE("trimmed mean: options are validated") {
  const auto reg = cohort::builtin_registries();
  auto make = [&](std::map<std::string, cohort::Value, std::less<>> o) {
    return reg.aggregators.create("trimmed_mean",
                                  cohort::ConfigSection("aggregator", std::move(o)));
  };
  CHECK_THROWS_AS(make({{"beta", 0.5}}), cohort::ConfigError);
  CHECK_THROWS_AS(make({{"beta", -0.1}}), cohort::ConfigError);
  CHECK_THROWS_AS(make({{"beta", 0.0}, {"f", std::int64_t{1}}}), cohort::ConfigError);
  CHECK_THROWS_WITH_AS(make({{"trim", 0.1}}), doctest::Contains("trim"), cohort::ConfigError);
  CHECK(make({{"beta", 0.1}, {"f", std::int64_t{1}}})->min_updates() == 10);
}
