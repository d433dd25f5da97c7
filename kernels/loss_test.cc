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
  std::vector<float> logits{0.3f, -1.2f, 2.0f, 0.0f, 0.7f,  1.5f, 1.4f, -0.3f,
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

TEST_CASE("count_correct takes the first maximum") {
  const std::vector<float> logits{0.1f, 0.9f, 0.0f, 0.5f, 0.5f, 0.2f};
  CHECK(count_correct(logits, std::vector<std::int32_t>{1, 0}, 3) == 2);
  CHECK(count_correct(logits, std::vector<std::int32_t>{2, 1}, 3) == 0);
}

}  // namespace
}  // namespace cohort::kernels
