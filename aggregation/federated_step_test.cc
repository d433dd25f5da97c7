// FederatedStep: a named rule and a named server optimizer, one call per round.
#include "cohort/aggregation/federated_step.h"

#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::aggregation {
namespace {

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST_CASE(
    "FederatedStep: fedavg + sgd is the weighted mean added to the model, round after round") {
  FederatedStep step(3, {});  // fedavg, sgd at lr 1
  std::vector<float> params{1, 1, 1};
  const std::vector<float> a{1, 0, 2}, b{3, 0, -2};
  const std::vector<WeightedUpdate> updates{{a, 1.0}, {b, 3.0}};
  const auto delta = step.apply(params, updates);
  CHECK(delta[0] == doctest::Approx(2.5));  // (1 * 1 + 3 * 3) / 4
  CHECK(delta[2] == doctest::Approx(-1.0));
  CHECK(params[0] == doctest::Approx(3.5));
  step.apply(params, updates);
  CHECK(params[0] == doctest::Approx(6.0));
  CHECK(step.rounds() == 2);
}

TEST_CASE("FederatedStep: a robust rule and a stateful optimizer; refusals say why") {
  FederatedStep median(2, {.rule = "median", .optimizer = "fedadam"});
  std::vector<float> params{0, 0};
  const std::vector<float> u1{1, 1}, u2{2, 2}, u3{100, -100};
  const std::vector<WeightedUpdate> three{{u1}, {u2}, {u3}};
  const auto delta = median.apply(params, three);
  CHECK(delta[0] == doctest::Approx(2.0));  // the outlier does not move the median
  CHECK(params[0] > 0);                     // Adam moved the model along the median
  const float after_one = params[0];
  median.apply(params, three);
  CHECK(params[0] > after_one);  // its moments persist across calls

  const std::vector<float> nan{1, std::numeric_limits<float>::quiet_NaN()}, short_update{1};
  const std::vector<float> before(params);
  CHECK(error_of([&] { median.apply(params, {}); }) ==
        "aggregation rule 'median': no update to aggregate");
  CHECK(error_of([&] {
          median.apply(params, std::vector<WeightedUpdate>{{u1}, {nan}});
        }) == "aggregation rule 'median': update 1 has a non-finite value at 1");
  CHECK(error_of([&] {
          median.apply(params, std::vector<WeightedUpdate>{{u1}, {short_update}});
        }) == "aggregation rule 'median': update 1 has 1 values, the model 2");
  CHECK(error_of([&] {
          median.apply(params, std::vector<WeightedUpdate>{{u1, 0.0}});
        }).find("weight 0") != std::string::npos);
  CHECK(params == before);  // nothing applied by a refused call

  FederatedStep krum(
      2, {.rule = "krum", .rule_options = ConfigSection("aggregator", {{"f", std::int64_t{1}}})});
  CHECK(krum.min_updates() == 5);
  CHECK(error_of([&] { krum.apply(params, three); }) ==
        "aggregation rule 'krum': 3 update(s), it needs at least 5");
  CHECK_THROWS_AS(FederatedStep(2, {.rule = "no_such_rule"}), ConfigError);
}

}  // namespace
}  // namespace cohort::aggregation
