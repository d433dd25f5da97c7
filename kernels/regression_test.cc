#include "cohort/kernels/regression.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/loss.h"

namespace cohort::kernels {
namespace {

// y = A x + c + noise for x ~ U(-1, 1)^4 and T = 2 outputs; row-major.
struct LinearProblem {
  std::vector<float> x, y;
  std::size_t n = 0;
};

LinearProblem linear_problem(std::size_t n, float noise, std::uint32_t seed) {
  const float a[2][4] = {{1.5f, -2.0f, 0.5f, 1.0f}, {-0.5f, 0.25f, 2.0f, -1.0f}};
  const float c[2] = {0.3f, -0.7f};
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::normal_distribution<float> e(0.0f, noise);
  LinearProblem p;
  p.n = n;
  for (std::size_t i = 0; i < n; ++i) {
    float xi[4];
    for (float& v : xi) v = u(gen);
    p.x.insert(p.x.end(), xi, xi + 4);
    for (int t = 0; t < 2; ++t) {
      float v = c[t];
      for (int k = 0; k < 4; ++k) v += a[t][k] * xi[k];
      p.y.push_back(v + e(gen));
    }
  }
  return p;
}

NetworkSpec small_mlp() {
  NetworkSpec spec(Shape{4, 1, 1});
  spec.linear(4, 8).tanh().linear(8, 2);
  return spec;
}

TEST_CASE("regression_gradients trains a tiny linear regression: the test MSE falls to the noise") {
  const auto device = make_device("cpu");
  NetworkSpec spec(Shape{4, 1, 1});
  spec.linear(4, 2);
  auto net = device->make_network(spec);
  net->init(1);
  OptimizerOptions sgd;
  sgd.learning_rate = 0.1f;
  net->set_optimizer(sgd);
  const auto train = linear_problem(256, 0.05f, 7), test = linear_problem(128, 0.05f, 8);
  const double before = evaluate_regression(*net, test.x, test.y, test.n).mse();
  RegressionBuffers buffers;
  float first = 0, last = 0;
  for (int epoch = 0; epoch < 60; ++epoch) {
    for (std::size_t begin = 0; begin < train.n; begin += 32) {
      const float loss = regression_gradients(
          *net, std::span<const float>(train.x).subspan(begin * 4, 32 * 4),
          std::span<const float>(train.y).subspan(begin * 2, 32 * 2), 32, &buffers);
      if (epoch == 0 && begin == 0) first = loss;
      last = loss;
      net->step();
    }
  }
  const RegressionEvaluation after = evaluate_regression(*net, test.x, test.y, test.n);
  MESSAGE("MSE before " << before << ", after " << after.mse() << " (noise variance 0.0025)");
  CHECK(after.count == test.n);
  CHECK(after.outputs == 2);
  CHECK(last < first / 20);
  CHECK(after.mse() < before / 50);
  CHECK(after.mse() < 0.01);  // noise variance 0.0025
}

TEST_CASE("regression_gradients matches finite differences of the batch's mean squared error") {
  const auto device = make_device("cpu");
  auto net = device->make_network(small_mlp());
  net->init(3);
  const auto p = linear_problem(5, 0.1f, 11);
  const float loss = regression_gradients(*net, p.x, p.y, p.n);
  CHECK(loss == doctest::Approx(evaluate_regression(*net, p.x, p.y, p.n).mse()).epsilon(1e-5));
  const std::vector<float> grad(net->gradients().begin(), net->gradients().end());
  const float h = 1e-2f;
  for (std::size_t i = 0; i < grad.size(); i += 3) {
    const float saved = net->parameters()[i];
    net->parameters()[i] = saved + h;
    const double up = evaluate_regression(*net, p.x, p.y, p.n).mse();
    net->parameters()[i] = saved - h;
    const double down = evaluate_regression(*net, p.x, p.y, p.n).mse();
    net->parameters()[i] = saved;
    INFO("parameter " << i);
    CHECK(std::abs((up - down) / (2 * h) - grad[i]) <= 2e-3 + 1e-2 * std::abs(grad[i]));
  }
}

TEST_CASE("micro-batched regression gradients equal the whole batch's") {
  const auto device = make_device("cpu");
  auto whole = device->make_network(small_mlp());
  auto split = device->make_network(small_mlp());
  whole->init(5);
  split->init(5);
  split->set_micro_batch(3);  // 10 samples as 3 + 3 + 3 + 1
  const auto p = linear_problem(10, 0.1f, 13);
  const float a = regression_gradients(*whole, p.x, p.y, p.n);
  RegressionBuffers buffers;
  const float b = regression_gradients(*split, p.x, p.y, p.n, &buffers);
  CHECK(b == doctest::Approx(a).epsilon(1e-5));
  const auto ga = whole->gradients(), gb = split->gradients();
  REQUIRE(ga.size() == gb.size());
  double worst = 0;
  for (std::size_t i = 0; i < ga.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(ga[i] - gb[i])));
  }
  CHECK(worst < 1e-5);
  // Evaluation runs micro-batches too, to the same result.
  CHECK(evaluate_regression(*split, p.x, p.y, p.n).mse() ==
        doctest::Approx(evaluate_regression(*whole, p.x, p.y, p.n).mse()).epsilon(1e-6));
}

TEST_CASE("regression functions refuse inputs and targets that do not fit") {
  const auto device = make_device("cpu");
  auto net = device->make_network(small_mlp());
  net->init(1);
  const auto p = linear_problem(4, 0.1f, 1);
  const std::vector<float> one_target(4);  // T = 1, but the network has 2 outputs
  CHECK_THROWS_AS((void)regression_gradients(*net, p.x, one_target, 4), KernelError);
  CHECK_THROWS_AS((void)evaluate_regression(*net, p.x, one_target, 4), KernelError);
  CHECK_THROWS_AS((void)regression_gradients(*net, p.x, p.y, 3), KernelError);
  CHECK(regression_gradients(*net, {}, {}, 0) == 0.0f);
  CHECK(evaluate_regression(*net, {}, {}, 0).mse() == 0.0);
}

}  // namespace
}  // namespace cohort::kernels
