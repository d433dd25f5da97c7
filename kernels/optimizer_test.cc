// Optimizer steps against values computed by hand from the PyTorch update rules (optimizer.h).
#include "cohort/kernels/optimizer.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::kernels {
namespace {

TEST_CASE("plain sgd: p -= lr * g") {
  Optimizer opt({.learning_rate = 0.1f}, 2);
  std::vector<float> p{1.0f, -2.0f};
  const std::vector<float> g{0.5f, -1.0f};
  opt.step(p, g);
  CHECK(p[0] == doctest::Approx(0.95));
  CHECK(p[1] == doctest::Approx(-1.9));
  CHECK(opt.state().empty());
}

TEST_CASE("sgd with momentum: v = mu v + g, p -= lr v") {
  Optimizer opt({.learning_rate = 0.1f, .momentum = 0.9f}, 1);
  std::vector<float> p{1.0f};
  const std::vector<float> g{0.5f};
  opt.step(p, g);  // v = 0.5, p = 1 - 0.05 = 0.95
  CHECK(p[0] == doctest::Approx(0.95));
  opt.step(p, g);  // v = 0.45 + 0.5 = 0.95, p = 0.95 - 0.095 = 0.855
  CHECK(opt.state()[0] == doctest::Approx(0.95));
  CHECK(p[0] == doctest::Approx(0.855));
}

TEST_CASE("sgd with nesterov: p -= lr (g + mu v)") {
  Optimizer opt({.learning_rate = 0.1f, .momentum = 0.9f, .nesterov = true}, 1);
  std::vector<float> p{1.0f};
  const std::vector<float> g{0.5f};
  opt.step(p, g);  // v = 0.5, d = 0.5 + 0.45 = 0.95, p = 0.905
  CHECK(p[0] == doctest::Approx(0.905));
  opt.step(p, g);  // v = 0.95, d = 0.5 + 0.855 = 1.355, p = 0.905 - 0.1355 = 0.7695
  CHECK(p[0] == doctest::Approx(0.7695));
}

TEST_CASE("sgd weight decay adds wd * p to the gradient, also inside momentum") {
  Optimizer plain({.learning_rate = 0.1f, .weight_decay = 0.01f}, 1);
  std::vector<float> p{2.0f};
  plain.step(p, std::vector<float>{0.5f});  // g = 0.52, p = 2 - 0.052 = 1.948
  CHECK(p[0] == doctest::Approx(1.948));

  Optimizer mom({.learning_rate = 0.1f, .momentum = 0.5f, .weight_decay = 0.1f}, 1);
  std::vector<float> q{1.0f};
  mom.step(q, std::vector<float>{1.0f});  // g = 1.1, v = 1.1, q = 0.89
  CHECK(q[0] == doctest::Approx(0.89));
  mom.step(q, std::vector<float>{1.0f});  // g = 1.089, v = 0.55 + 1.089 = 1.639, q = 0.7261
  CHECK(q[0] == doctest::Approx(0.7261));
}

TEST_CASE("adam: two steps by hand") {
  // lr 0.1, b1 0.9, b2 0.999, eps 1e-8, g = 0.5 twice, p0 = 1.
  // t=1: m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25, p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.9
  // t=2: m = 0.095, v = 0.00049975, m^ = 0.095 / 0.19 = 0.5, v^ = 0.00049975 / 0.001999 = 0.25,
  //      p = 0.9 - 0.1 = 0.8
  Optimizer opt({.kind = OptimizerKind::kAdam, .learning_rate = 0.1f}, 1);
  std::vector<float> p{1.0f};
  opt.step(p, std::vector<float>{0.5f});
  CHECK(p[0] == doctest::Approx(0.9).epsilon(1e-6));
  CHECK(opt.state()[0] == doctest::Approx(0.05));
  CHECK(opt.state()[1] == doctest::Approx(0.00025));
  opt.step(p, std::vector<float>{0.5f});
  CHECK(p[0] == doctest::Approx(0.8).epsilon(1e-6));
  // A different gradient: t=3, g = -1: m = 0.0855 - 0.1 = -0.0145, v = 0.000499250 + 0.001
  // = 0.00149925025; m^ = -0.0145 / 0.271 = -0.0535055, v^ = 0.00149925025 / 0.002997001
  // = 0.500250, p = 0.8 + 0.1 * 0.0535055 / 0.707284 = 0.8075649
  opt.step(p, std::vector<float>{-1.0f});
  CHECK(p[0] == doctest::Approx(0.8075649).epsilon(1e-5));
}

TEST_CASE("adam couples weight decay into the gradient; adamw decouples it") {
  // Adam, wd 0.5, p = 2, g = 0: effective g = 1, first step moves by lr * 1 / (1 + eps) = 0.1.
  Optimizer adam({.kind = OptimizerKind::kAdam, .learning_rate = 0.1f, .weight_decay = 0.5f}, 1);
  std::vector<float> p{2.0f};
  adam.step(p, std::vector<float>{0.0f});
  CHECK(p[0] == doctest::Approx(1.9).epsilon(1e-6));
  // AdamW, same: p *= 1 - 0.1 * 0.5 = 0.95 -> 1.9, and g = 0 gives no Adam move (m = 0).
  Optimizer adamw({.kind = OptimizerKind::kAdamW, .learning_rate = 0.1f, .weight_decay = 0.5f}, 1);
  std::vector<float> q{2.0f};
  adamw.step(q, std::vector<float>{0.0f});
  CHECK(q[0] == doctest::Approx(1.9).epsilon(1e-6));
  // AdamW with g = 0.5: q = 1.9 * 0.95 - 0.1 * 0.5 / (0.5 + eps) ... step 2 of a fresh one:
  Optimizer fresh({.kind = OptimizerKind::kAdamW, .learning_rate = 0.1f, .weight_decay = 0.5f}, 1);
  std::vector<float> r{2.0f};
  fresh.step(r, std::vector<float>{0.5f});  // 2 * 0.95 - 0.1 = 1.8
  CHECK(r[0] == doctest::Approx(1.8).epsilon(1e-6));
}

TEST_CASE("reset clears state and steps; set_learning_rate keeps state") {
  Optimizer opt({.learning_rate = 0.1f, .momentum = 0.9f}, 1);
  std::vector<float> p{1.0f};
  opt.step(p, std::vector<float>{1.0f});
  opt.set_learning_rate(0.2f);
  CHECK(opt.steps() == 1);
  CHECK(opt.state()[0] == 1.0f);
  opt.reset();
  CHECK(opt.steps() == 0);
  CHECK(opt.state()[0] == 0.0f);
}

TEST_CASE("optimizer options are validated") {
  CHECK_THROWS_AS(Optimizer({.learning_rate = -1.0f}, 1), ConfigError);
  CHECK_THROWS_AS(Optimizer({.nesterov = true}, 1), ConfigError);
  CHECK_THROWS_AS(Optimizer({.kind = OptimizerKind::kAdam, .beta2 = 1.0f}, 1), ConfigError);
  CHECK_THROWS_AS(Optimizer({.kind = OptimizerKind::kAdam, .epsilon = 0.0f}, 1), ConfigError);
  CHECK(parse_optimizer_kind("adamw") == OptimizerKind::kAdamW);
  CHECK_THROWS_AS(parse_optimizer_kind("rmsprop"), ConfigError);
  Optimizer opt({}, 2);
  std::vector<float> p(3), g(3);
  CHECK_THROWS_AS(opt.step(p, g), KernelError);
}

TEST_CASE("element-wise steps on split ranges equal one whole step") {
  const OptimizerOptions o{.kind = OptimizerKind::kAdam, .learning_rate = 0.01f, .weight_decay = 0.1f};
  std::vector<float> p1{1, 2, 3, 4, 5}, p2 = p1, m1(5), v1(5), m2(5), v2(5);
  const std::vector<float> g{0.1f, -0.2f, 0.3f, -0.4f, 0.5f};
  adam_step(o, 1, p1, g, m1, v1);
  const std::span<float> sp(p2), sm(m2), sv(v2);
  const std::span<const float> sg(g);
  adam_step(o, 1, sp.first(2), sg.first(2), sm.first(2), sv.first(2));
  adam_step(o, 1, sp.last(3), sg.last(3), sm.last(3), sv.last(3));
  CHECK(p1 == p2);
}

}  // namespace
}  // namespace cohort::kernels
