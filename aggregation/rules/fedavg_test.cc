#include "cohort/aggregation/fedavg.h"

#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "cohort/aggregation/registries.h"
#include "cohort/core/error.h"

using namespace cohort::aggregation;

TEST_CASE("fedavg weights each update by its sample count, streaming chunk by chunk") {
  FedAvg agg;
  agg.begin_round(1, 4);
  const std::vector<float> a{1, 1, 1, 1}, b{4, 4, 4, 4};
  // Client 1 in two chunks, interleaved with client 2's whole update.
  REQUIRE(agg.accept({1, 0, std::span(a).first(2), 1}) == Verdict::kAccepted);
  REQUIRE(agg.accept({2, 0, b, 2}) == Verdict::kAccepted);
  REQUIRE(agg.accept({1, 2, std::span(a).subspan(2), 1}) == Verdict::kAccepted);
  agg.end_update(1, true);
  agg.end_update(2, true);
  CHECK(agg.completed_updates() == 2);
  std::vector<float> out(4);
  REQUIRE(agg.finish_round(out));
  for (float v : out) CHECK(v == doctest::Approx(3.0));
}

TEST_CASE("fedavg rejects bad chunks as values, and averages abandoned prefixes exactly") {
  FedAvg agg;
  agg.begin_round(1, 4);
  const std::vector<float> a{2, 2, 2, 2}, nan{std::numeric_limits<float>::quiet_NaN(), 0};
  const std::vector<float> big{1, 2, 3, 4, 5};
  CHECK(agg.accept({9, 0, big, 1}) == Verdict::kRejected);                // too long
  CHECK(agg.accept({1, 2, std::span(a).first(2), 1}) == Verdict::kRejected);  // gap
  REQUIRE(agg.accept({1, 0, std::span(a).first(2), 1}) == Verdict::kAccepted);
  CHECK(agg.accept({1, 2, nan, 1}) == Verdict::kRejected);                  // non-finite
  agg.end_update(1, false);
  CHECK(agg.accept({1, 2, std::span(a).first(2), 1}) == Verdict::kRejected);  // after its end
  const std::vector<float> c{6, 6, 6, 6};
  REQUIRE(agg.accept({2, 0, c, 1}) == Verdict::kAccepted);
  agg.end_update(2, true);
  CHECK(agg.completed_updates() == 1);
  std::vector<float> out(4);
  REQUIRE(agg.finish_round(out));
  CHECK(out[0] == doctest::Approx(4.0));  // (2 + 6) / 2
  CHECK(out[1] == doctest::Approx(4.0));
  CHECK(out[2] == doctest::Approx(6.0));  // only client 2 reached here
  CHECK(out[3] == doctest::Approx(6.0));
}

TEST_CASE("fedavg with no updates reports false; the registry knows it") {
  FedAvg agg;
  agg.begin_round(3, 2);
  std::vector<float> out(2, 7.0f);
  CHECK_FALSE(agg.finish_round(out));
  CHECK(out[0] == 7.0f);
  auto reg = cohort::builtin_registries();
  CHECK(reg.aggregators.create("fedavg", {})->is_streaming());
  CHECK_THROWS_WITH_AS(reg.aggregators.create("nope", {}), doctest::Contains("fedavg"),
                       cohort::ConfigError);
}

TEST_CASE("server sgd and fedavgm move the model as docs/ALGORITHMS.md 1.2 says") {
  auto reg = cohort::builtin_registries();
  auto sgd = reg.server_optimizers.create("sgd", {});
  std::vector<float> x{1, 2};
  const std::vector<float> d{0.5f, -1};
  sgd->reset(2);
  sgd->apply_delta(x, d);
  CHECK(x[0] == doctest::Approx(1.5));
  CHECK(x[1] == doctest::Approx(1.0));
  cohort::ConfigSection opts("server_optimizer", {{"lr", 1.0}, {"beta", 0.5}});
  auto m = reg.server_optimizers.create("fedavgm", opts);
  m->reset(2);
  std::vector<float> y{0, 0};
  m->apply_delta(y, d);  // v = d, y = d
  m->apply_delta(y, d);  // v = 0.5 d + d = 1.5 d, y = 2.5 d
  CHECK(y[0] == doctest::Approx(1.25));
  CHECK(y[1] == doctest::Approx(-2.5));
}

TEST_CASE("fedavg: a non-finite value late in a long chunk keeps the finite blocks before it") {
  // accept() checks and sums 4096-value blocks in turn: the client's prefix ends at the block
  // with the NaN, and the average counts it exactly on the coordinates it reached.
  constexpr std::size_t n = 10000;
  FedAvg agg;
  agg.begin_round(1, n);
  std::vector<float> a(n, 2.0f), c(n, 6.0f);
  a[5000] = std::numeric_limits<float>::infinity();
  CHECK(agg.accept({1, 0, a, 1}) == Verdict::kRejected);
  agg.end_update(1, false);
  REQUIRE(agg.accept({2, 0, c, 1}) == Verdict::kAccepted);
  agg.end_update(2, true);
  std::vector<float> out(n);
  REQUIRE(agg.finish_round(out));
  for (std::size_t i = 0; i < n; ++i) {
    INFO("coordinate " << i);
    CHECK(out[i] == doctest::Approx(i < 4096 ? 4.0 : 6.0));
  }
}
