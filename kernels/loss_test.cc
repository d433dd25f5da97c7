#include "cohort/kernels/loss.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::kernels {
namespace {

TEST_CASE("softmax cross-entropy of equal logits is log(classes)") {
  const std::vector<float> logits(2 * 4, 0.5f);
  const std::vector<std::int32_t> labels{0, 3};
  CHECK(softmax_cross_entropy(logits, labels, 4) == doctest::Approx(std::log(4.0)));
}

TEST_CASE("softmax cross-entropy is stable for huge logits") {
  const std::vector<float> logits{1000.0f, 0.0f, -1000.0f, 1e30f, 1e30f, -1e30f};
  const std::vector<std::int32_t> labels{0, 2};
  std::vector<float> grad(6);
  // Row 0: loss ~ 0; row 1: loss = log 2 + 2e30 -> finite huge, no NaN.
  const float loss = softmax_cross_entropy(std::span<const float>(logits).first(3),
                                           std::span<const std::int32_t>(labels).first(1), 3,
                                           std::span<float>(grad).first(3));
  CHECK(loss == doctest::Approx(0.0).scale(1.0));
  CHECK(std::isfinite(softmax_cross_entropy(logits, labels, 3, grad)));
  for (float g : grad) CHECK(std::isfinite(g));
}

TEST_CASE("softmax cross-entropy gradient matches finite differences") {
  // Mean over a batch of 3, 5 classes. Loss is smooth; h = 1e-3 in float logits gives a
  // central-difference error ~ h^2 * |f'''| + 6e-8 / h, below 1e-4; tolerance 1e-3 + 1e-2 rel.
  std::vector<float> logits{0.3f, -1.2f, 2.0f, 0.0f, 0.7f, 1.5f,  1.4f, -0.3f,
                            0.2f, -2.0f, 0.1f, 0.1f, 0.9f, -0.8f, 3.0f};
  const std::vector<std::int32_t> labels{2, 0, 4};
  std::vector<float> grad(logits.size());
  softmax_cross_entropy(logits, labels, 5, grad);
  const float h = 1e-3f;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float saved = logits[i];
    logits[i] = saved + h;
    const double up = softmax_cross_entropy(logits, labels, 5);
    logits[i] = saved - h;
    const double down = softmax_cross_entropy(logits, labels, 5);
    logits[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    INFO("logit " << i);
    CHECK(std::abs(numeric - grad[i]) <= 1e-3 + 1e-2 * std::abs(grad[i]));
  }
  // Each row of the gradient sums to zero.
  for (std::size_t r = 0; r < 3; ++r) {
    double sum = 0;
    for (std::size_t c = 0; c < 5; ++c) sum += grad[r * 5 + c];
    CHECK(sum == doctest::Approx(0.0).scale(1.0));
  }
}

TEST_CASE("softmax cross-entropy rejects bad labels and sizes") {
  const std::vector<float> logits(6, 0.0f);
  const std::vector<std::int32_t> bad{0, 3}, ok{0, 1};
  CHECK_THROWS_AS(softmax_cross_entropy(logits, bad, 3), KernelError);
  CHECK_THROWS_AS(softmax_cross_entropy(logits, std::vector<std::int32_t>{-1, 0}, 3), KernelError);
  CHECK_THROWS_AS(softmax_cross_entropy(logits, ok, 4), KernelError);
  std::vector<float> small(5);
  CHECK_THROWS_AS(softmax_cross_entropy(logits, ok, 3, small), KernelError);
}

TEST_CASE("mean squared error is PyTorch's MSELoss: the mean over batch x outputs") {
  // Two samples of three outputs: squared errors 1, 0, 4 and 9, 0.25, 0 -> 14.25 / 6.
  const std::vector<float> outputs{1.0f, 2.0f, 3.0f, -1.0f, 0.5f, 0.0f};
  const std::vector<float> targets{0.0f, 2.0f, 5.0f, 2.0f, 0.0f, 0.0f};
  CHECK(mean_squared_error(outputs, targets) == doctest::Approx(14.25 / 6));
  CHECK(mean_squared_error(std::span<const float>(), std::span<const float>()) == 0.0f);
  std::vector<float> small(5);
  CHECK_THROWS_AS(mean_squared_error(outputs, small), KernelError);
  CHECK_THROWS_AS(mean_squared_error(outputs, targets, small), KernelError);
}

TEST_CASE("mean squared error gradient matches finite differences") {
  // A batch of 3 with T = 2. The loss is quadratic, so the central difference is exact up to
  // float rounding of the loss (~1e-7 relative): h = 1e-2 keeps that below 1e-4.
  std::vector<float> outputs{0.3f, -1.2f, 2.0f, 0.0f, 0.7f, 1.5f};
  const std::vector<float> targets{1.0f, -1.0f, 0.5f, 0.25f, -2.0f, 1.5f};
  std::vector<float> grad(outputs.size());
  mean_squared_error(outputs, targets, grad);
  const float h = 1e-2f;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const float saved = outputs[i];
    outputs[i] = saved + h;
    const double up = mean_squared_error(outputs, targets);
    outputs[i] = saved - h;
    const double down = mean_squared_error(outputs, targets);
    outputs[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    INFO("output " << i);
    CHECK(std::abs(numeric - grad[i]) <= 1e-4 + 1e-3 * std::abs(grad[i]));
    CHECK(grad[i] == doctest::Approx(2.0 * (outputs[i] - targets[i]) / 6.0));
  }
  // dloss may alias the outputs.
  std::vector<float> inplace = outputs;
  const float loss = mean_squared_error(inplace, targets, inplace);
  CHECK(loss == doctest::Approx(mean_squared_error(outputs, targets)));
  for (std::size_t i = 0; i < grad.size(); ++i) CHECK(inplace[i] == doctest::Approx(grad[i]));
}

TEST_CASE("count_correct takes the first maximum") {
  const std::vector<float> logits{0.1f, 0.9f, 0.0f, 0.5f, 0.5f, 0.2f};
  CHECK(count_correct(logits, std::vector<std::int32_t>{1, 0}, 3) == 2);
  CHECK(count_correct(logits, std::vector<std::int32_t>{2, 1}, 3) == 0);
}

}  // namespace
}  // namespace cohort::kernels
