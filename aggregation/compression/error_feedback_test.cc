#include "cohort/aggregation/error_feedback.h"

#include <doctest/doctest.h>

#include <cmath>

#include "cohort/aggregation/registries.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::TestRng;

// (7.1)-(7.4): sum_t sent_t + e_T = sum_t x_t. In float, each step rounds p = x + e and
// e' = p - sent once each (round to nearest: error <= 2^-24 of the result), so per coordinate
// |sum sent + e_T - sum x| <= sum_t 2^-24 (|p_t| + |e_{t+1}|): the bound the test computes.
TEST_CASE("error feedback conserves mass: sent + residual = input, over many steps") {
  const auto reg = cohort::builtin_registries();
  const char* names[] = {"topk", "randomk", "sign", "powersgd", "qsgd", "int8"};
  for (const char* name : names) {
    INFO(name);
    auto c = reg.compressors.create(
        name, cohort::ConfigSection("compressor", {{"error_feedback", true}}));
    auto* ef = dynamic_cast<ErrorFeedback*>(c.get());
    REQUIRE(ef != nullptr);
    const std::size_t d = 500;
    auto state = c->make_state(d);
    const auto& e = dynamic_cast<ErrorFeedback::State&>(*state).residual();
    TestRng rng(12);
    std::vector<double> sum_x(d, 0), sum_sent(d, 0), bound(d, 0);
    std::vector<float> x(d), sent(d), e_before(d);
    std::vector<std::byte> bytes;
    for (int t = 0; t < 30; ++t) {
      for (auto& v : x) v = static_cast<float>(rng.normal() * (1 + t % 3));
      std::copy(e.begin(), e.end(), e_before.begin());
      c->encode(x, state.get(), compression_seed(1, t, 0), bytes);
      c->decode(bytes, sent);
      for (std::size_t j = 0; j < d; ++j) {
        sum_x[j] += x[j];
        sum_sent[j] += sent[j];
        const double p = static_cast<double>(x[j]) + e_before[j];
        bound[j] += 0x1.0p-24 * (std::fabs(p) * (1 + 0x1.0p-23) + std::fabs(e[j]));
      }
      if (t == 0 && std::string(name) == "topk") {
        // First step, e_0 = 0: top-k sends some coordinates exactly and keeps the rest exactly.
        for (std::size_t j = 0; j < d; ++j) CHECK(sent[j] + e[j] == x[j]);
      }
    }
    for (std::size_t j = 0; j < d; ++j) {
      CHECK(std::fabs(sum_sent[j] + e[j] - sum_x[j]) <= bound[j] + 1e-9);
    }
  }
}

TEST_CASE("error feedback forwards the inner encoding; topk's residual feeds the next step") {
  ErrorFeedback ef(cohort::builtin_registries().compressors.create(
      "topk",
      cohort::ConfigSection("compressor", {{"k", std::int64_t{1}}, {"error_feedback", false}})));
  CHECK(ef.encoding() == "topk");
  CHECK_FALSE(ef.is_unbiased());
  auto state = ef.make_state(3);
  std::vector<std::byte> bytes;
  std::vector<float> sent(3);
  ef.encode(std::vector<float>{3, 2, 1}, state.get(), 0, bytes);
  ef.decode(bytes, sent);
  CHECK(sent == std::vector<float>{3, 0, 0});
  ef.encode(std::vector<float>{0, 1, 0}, state.get(), 0, bytes);  // p = (0, 3, 1)
  ef.decode(bytes, sent);
  CHECK(sent == std::vector<float>{0, 3, 0});
  const auto& e = dynamic_cast<ErrorFeedback::State&>(*state).residual();
  CHECK(std::vector<float>(e.begin(), e.end()) == std::vector<float>{0, 0, 1});
}
