#include "cohort/aggregation/norm_clip.h"

#include <doctest/doctest.h>

#include <cmath>

#include "cohort/aggregation/registries.h"
#include "cohort/core/error.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::run_round;
using cohort::aggregation::testing::TestRng;

namespace {
double norm(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}
}  // namespace

TEST_CASE("norm clip: each update scaled to norm <= M, then the weighted mean") {
  NormClip agg(1.0);
  std::vector<float> out;
  // (3, 4) has norm 5 -> (0.6, 0.8); (0, 0.5) is inside. Weights 1 and 3.
  REQUIRE(run_round(agg, {{3, 4}, {0, 0.5f}}, out, {1, 3}));
  CHECK(out[0] == doctest::Approx(0.6 / 4));
  CHECK(out[1] == doctest::Approx((0.8 + 3 * 0.5) / 4));
}

TEST_CASE("norm clip (noise off): the aggregate's norm is at most M up to float rounding") {
  TestRng rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::vector<float>> u(7, std::vector<float>(100));
    for (auto& x : u) {
      const double scale = std::pow(10.0, rng.between(-2, 3));
      for (auto& v : x) v = static_cast<float>(scale * rng.normal());
    }
    NormClip agg(0.5);
    std::vector<float> out;
    REQUIRE(run_round(agg, u, out, {1, 2, 3, 4, 5, 6, 7}));
    CHECK(norm(out) <= 0.5 * (1 + 1e-6));
  }
}

TEST_CASE("norm clip streams: interleaved chunks give the same bits as whole updates") {
  const std::vector<float> a{3, 4, 0, 12}, b{0.1f, 0.2f, 0.3f, 0.4f};
  NormClip whole(2.0), chunked(2.0);
  std::vector<float> ref;
  REQUIRE(run_round(whole, {a, b}, ref, {2, 1}));
  chunked.begin_round(1, 4);
  REQUIRE(chunked.accept({0, 0, std::span(a).first(1), 2}) == Verdict::kAccepted);
  REQUIRE(chunked.accept({1, 0, std::span(b).first(3), 1}) == Verdict::kAccepted);
  REQUIRE(chunked.accept({0, 1, std::span(a).subspan(1, 2), 2}) == Verdict::kAccepted);
  REQUIRE(chunked.accept({1, 3, std::span(b).subspan(3), 1}) == Verdict::kAccepted);
  REQUIRE(chunked.accept({0, 3, std::span(a).subspan(3), 2}) == Verdict::kAccepted);
  chunked.end_update(1, true);
  chunked.end_update(0, true);
  // An update abandoned half-way adds nothing.
  const std::vector<float> c{100, 100};
  REQUIRE(chunked.accept({2, 0, c, 5}) == Verdict::kAccepted);
  chunked.end_update(2, false);
  CHECK(chunked.completed_updates() == 2);
  std::vector<float> out(4);
  REQUIRE(chunked.finish_round(out));
  CHECK(out == ref);
}

TEST_CASE("norm clip: noise is seeded; options are validated") {
  const auto reg = cohort::builtin_registries();
  auto make = [&](std::map<std::string, cohort::Value, std::less<>> o) {
    return reg.aggregators.create("norm_clip", cohort::ConfigSection("aggregator", std::move(o)));
  };
  CHECK_THROWS_WITH_AS(make({}), doctest::Contains("bound"), cohort::ConfigError);
  CHECK_THROWS_AS(make({{"bound", -1.0}}), cohort::ConfigError);
  CHECK_THROWS_WITH_AS(make({{"bound", 1.0}, {"sigma", 1.0}}), doctest::Contains("sigma"),
                       cohort::ConfigError);
  auto a = make({{"bound", 1.0}, {"noise_stddev", 0.1}, {"seed", std::int64_t{3}}});
  auto b = make({{"bound", 1.0}, {"noise_stddev", 0.1}, {"seed", std::int64_t{3}}});
  CHECK(a->is_streaming());
  std::vector<float> oa, ob;
  REQUIRE(run_round(*a, {{0, 0, 0}}, oa));
  REQUIRE(run_round(*b, {{0, 0, 0}}, ob));
  CHECK(oa == ob);
  CHECK(oa != std::vector<float>{0, 0, 0});
}
