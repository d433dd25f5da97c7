#include "cohort/aggregation/fedopt.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "cohort/aggregation/registries.h"
#include "cohort/core/error.h"

using namespace cohort::aggregation;
using cohort::ConfigSection;

namespace {

std::unique_ptr<ServerOptimizer> make(const char* name,
                                      std::map<std::string, cohort::Value, std::less<>> opts = {}) {
  static const auto reg = cohort::builtin_registries();
  return reg.server_optimizers.create(name, ConfigSection("server_optimizer", std::move(opts)));
}

float state_value(ServerOptimizer& opt, const char* name) {
  for (auto& [n, span] : opt.state()) {
    if (n == name) return span[0];
  }
  FAIL("no state " << name);
  return 0;
}

}  // namespace

TEST_CASE("fedadam and fedyogi first step moves each coordinate by lr * sign(delta) (1.3)") {
  // m = 0.1 D, v = 0.01 D^2 (Yogi: sign(0 - D^2) = -1 gives the same), so m / sqrt(v) = sign(D).
  const std::vector<float> delta{0.5f, -2.0f, 1e-3f, 3.0f, -2e-4f};
  for (const char* name : {"fedadam", "fedyogi"}) {
    for (bool bc : {false, true}) {
      if (bc && std::string(name) != "fedadam") continue;
      std::map<std::string, cohort::Value, std::less<>> o{{"lr", 0.5}, {"tau", 1e-12}};
      if (bc) o["bias_correction"] = true;
      auto opt = make(name, o);
      opt->reset(delta.size());
      std::vector<float> x(delta.size(), 1.0f);
      opt->apply_delta(x, delta);
      for (std::size_t i = 0; i < x.size(); ++i) {
        INFO(name << " bias_correction=" << bc << " coordinate " << i);
        const double expected = 1.0 + 0.5 * (delta[i] > 0 ? 1 : -1);
        CHECK(x[i] == doctest::Approx(expected).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("fedadagrad, fedyogi, fedadam: two steps match hand-computed values (defaults)") {
  SUBCASE("fedadagrad: lr 0.02, beta1 0, tau 1e-3") {
    auto opt = make("fedadagrad");
    opt->reset(1);
    std::vector<float> x{0};
    opt->apply_delta(x, std::vector<float>{2});  // v = 4: 0.02 * 2 / (2 + 1e-3)
    CHECK(x[0] == doctest::Approx(0.0199900049975).epsilon(1e-6));
    opt->apply_delta(x, std::vector<float>{-1});  // m = -1, v = 5: - 0.02 / (sqrt(5) + 1e-3)
    CHECK(x[0] == doctest::Approx(0.0110497312994).epsilon(1e-6));
    CHECK(state_value(*opt, "v") == doctest::Approx(5.0));
  }
  SUBCASE("fedyogi: lr 0.03; v drops by (1 - beta2) D^2 when v > D^2") {
    auto opt = make("fedyogi");
    opt->reset(1);
    std::vector<float> x{0};
    opt->apply_delta(x, std::vector<float>{2});  // m = 0.2, v = 0.04: 0.03 * 0.2 / (0.2 + 1e-3)
    CHECK(x[0] == doctest::Approx(0.0298507462687).epsilon(1e-6));
    CHECK(state_value(*opt, "v") == doctest::Approx(0.04).epsilon(1e-6));
    opt->apply_delta(x, std::vector<float>{0.1f});  // v = 0.04 - 0.01 * 0.01; m = 0.19
    CHECK(state_value(*opt, "v") == doctest::Approx(0.0399).epsilon(1e-6));
    CHECK(state_value(*opt, "m") == doctest::Approx(0.19).epsilon(1e-6));
    CHECK(x[0] == doctest::Approx(0.0582442926798).epsilon(1e-6));
  }
  SUBCASE("fedadam: lr 0.03, without and with bias correction") {
    auto opt = make("fedadam");
    opt->reset(1);
    std::vector<float> x{0};
    opt->apply_delta(x, std::vector<float>{2});   // 0.03 * 0.2 / (0.2 + 1e-3)
    opt->apply_delta(x, std::vector<float>{-1});  // m = 0.08, v = 0.0496
    CHECK(x[0] == doctest::Approx(0.0405788935869).epsilon(1e-6));
    CHECK(state_value(*opt, "step") == 2.0f);
    auto bc = make("fedadam", {{"bias_correction", true}});
    bc->reset(1);
    std::vector<float> y{0};
    bc->apply_delta(y, std::vector<float>{2});   // step factor sqrt(0.01) / 0.1 = 1
    bc->apply_delta(y, std::vector<float>{-1});  // step factor sqrt(1 - 0.99^2) / (1 - 0.9^2)
    CHECK(y[0] == doctest::Approx(0.0378159642564).epsilon(1e-6));
  }
}

TEST_CASE("fedadagrad's accumulator never decreases; apply_gradient is apply_delta(-g)") {
  auto a = make("fedadagrad"), b = make("fedadagrad");
  a->reset(3);
  b->reset(3);
  std::vector<float> xa{1, 2, 3}, xb{1, 2, 3};
  float last_v = 0;
  for (int t = 0; t < 20; ++t) {
    const std::vector<float> g{static_cast<float>(std::sin(t)), 0.25f * (t % 3), -1.0f / (t + 1)};
    std::vector<float> minus_g(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) minus_g[i] = -g[i];
    a->apply_gradient(xa, g);
    b->apply_delta(xb, minus_g);
    const float v = state_value(*a, "v");
    CHECK(v >= last_v);
    last_v = v;
  }
  for (std::size_t i = 0; i < xa.size(); ++i) CHECK(xa[i] == xb[i]);
}

TEST_CASE("fedopt options are validated; unknown keys are named") {
  CHECK_THROWS_WITH_AS(make("fedadam", {{"momentum", 0.9}}), doctest::Contains("momentum"),
                       cohort::ConfigError);
  CHECK_THROWS_WITH_AS(make("fedyogi", {{"bias_correction", true}}),
                       doctest::Contains("bias_correction"), cohort::ConfigError);
  CHECK_THROWS_WITH_AS(make("fedadagrad", {{"beta2", 0.9}}), doctest::Contains("beta2"),
                       cohort::ConfigError);
  CHECK_THROWS_AS(make("fedadam", {{"beta1", 1.0}}), cohort::ConfigError);
  CHECK_THROWS_AS(make("fedyogi", {{"lr", 0.0}}), cohort::ConfigError);
  CHECK_THROWS_AS(make("fedadam", {{"tau", 0.0}}), cohort::ConfigError);  // 0/0 on zero deltas
  CHECK_NOTHROW(make("fedadam", {{"tau", 0.0}, {"initial_v", 1e-6}}));
  auto opt = make("fedadam");
  opt->reset(2);
  std::vector<float> x{1, 1};
  opt->apply_delta(x, std::vector<float>{0, 0});  // zero delta: no move, no NaN
  CHECK(x[0] == 1.0f);
  CHECK(x[1] == 1.0f);
}

TEST_CASE("piecewise stepping (elementwise rules) equals one apply_gradient, bit for bit") {
  const std::size_t n = 1000;
  for (const char* name : {"sgd", "fedavgm", "fedadagrad", "fedyogi", "fedadam"}) {
    CAPTURE(name);
    std::map<std::string, cohort::Value, std::less<>> opts{{"lr", 0.05}};
    if (std::string(name) == "fedadam") opts["bias_correction"] = true;
    auto whole = make(name, opts);
    auto pieces = make(name, opts);
    REQUIRE(whole->elementwise());
    REQUIRE(pieces->elementwise());
    whole->reset(n);
    pieces->reset(n);
    std::vector<float> xa(n), xb(n), g(n);
    for (std::size_t i = 0; i < n; ++i) xa[i] = xb[i] = std::sin(static_cast<float>(i));
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = 0; i < n; ++i) g[i] = std::cos(static_cast<float>(i * (step + 2)));
      whole->apply_gradient(xa, g);
      pieces->begin_gradient_step();
      // Uneven pieces, out of order: the shard may apply them on any thread, in any order.
      const std::size_t cuts[] = {0, 7, 300, 301, 999, n};
      for (int k = 4; k >= 0; --k) {
        const std::size_t b = cuts[k], e = cuts[k + 1];
        pieces->apply_gradient_range(b, std::span<float>(xb).subspan(b, e - b),
                                     std::span<const float>(g).subspan(b, e - b));
      }
    }
    CHECK(xa == xb);
    auto sa = whole->state();
    auto sb = pieces->state();
    REQUIRE(sa.size() == sb.size());
    for (std::size_t k = 0; k < sa.size(); ++k) {
      CHECK(std::vector<float>(sa[k].second.begin(), sa[k].second.end()) ==
            std::vector<float>(sb[k].second.begin(), sb[k].second.end()));
    }
  }
}

TEST_CASE("a rule that is not elementwise refuses piecewise stepping with a clear error") {
  struct Whole final : ServerOptimizer {
    void reset(std::size_t) override {}
    void apply_delta(std::span<float>, std::span<const float>) override {}
    void apply_gradient(std::span<float>, std::span<const float>) override {}
    std::vector<std::pair<std::string, std::span<float>>> state() override { return {}; }
  } w;
  CHECK_FALSE(w.elementwise());
  std::vector<float> x(4), g(4);
  CHECK_THROWS_WITH_AS(w.apply_gradient_range(0, x, g), doctest::Contains("elementwise"), cohort::Error);
}

TEST_CASE("default_server_lr: a rate for deltas and one for gradients per built-in name") {
  static const auto reg = cohort::builtin_registries();
  const std::string names = reg.server_optimizers.names();
  CHECK(names == "fedadagrad, fedadam, fedavgm, fedyogi, sgd");  // a new built-in needs rates
  for (const char* name : {"sgd", "fedavgm", "fedadagrad", "fedyogi", "fedadam"}) {
    CAPTURE(name);
    const auto delta = default_server_lr(name, ServerInput::kDelta);
    const auto gradient = default_server_lr(name, ServerInput::kGradient);
    REQUIRE(delta.has_value());
    REQUIRE(gradient.has_value());
    CHECK(*gradient < *delta);  // a gradient step is one batch's, a delta a round of local work
    // The factory's default is the delta rate: its steps equal those with lr set to it.
    auto implicit = make(name);
    auto explicit_lr = make(name, {{"lr", *delta}});
    implicit->reset(2);
    explicit_lr->reset(2);
    std::vector<float> xa{0.5f, -1}, xb{0.5f, -1};
    for (const auto& d : {std::vector<float>{0.02f, -0.3f}, std::vector<float>{-0.01f, 0.1f}}) {
      implicit->apply_delta(xa, d);
      explicit_lr->apply_delta(xb, d);
    }
    CHECK(xa == xb);
    CHECK(xa != std::vector<float>{0.5f, -1});
  }
  CHECK(*default_server_lr("sgd", ServerInput::kDelta) == 1.0);  // plain FedAvg
  CHECK(*default_server_lr("fedadam", ServerInput::kDelta) == 0.03);
  CHECK(*default_server_lr("fedadagrad", ServerInput::kDelta) == 0.02);
  CHECK_FALSE(default_server_lr("my_plugin", ServerInput::kDelta).has_value());
  CHECK_FALSE(default_server_lr("my_plugin", ServerInput::kGradient).has_value());
}
