#include "cohort/kernels/loss.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "check.h"
#include "cohort/core/error.h"

namespace cohort::kernels {
namespace {

void check_shapes(std::span<const float> logits, std::span<const std::int32_t> labels,
                  std::size_t classes) {
  if (classes == 0) throw KernelError("softmax_cross_entropy: zero classes");
  detail::check_size("softmax_cross_entropy logits", logits.size(), labels.size() * classes);
  for (const std::int32_t label : labels) {
    if (label < 0 || static_cast<std::size_t>(label) >= classes) {
      throw KernelError("label " + std::to_string(label) + " outside [0, " +
                        std::to_string(classes) + ")");
    }
  }
}

}  // namespace

float softmax_cross_entropy(std::span<const float> logits, std::span<const std::int32_t> labels,
                            std::size_t classes, std::span<float> dlogits) {
  check_shapes(logits, labels, classes);
  const bool want_grad = !dlogits.empty();
  if (want_grad) detail::check_size("softmax_cross_entropy dlogits", dlogits.size(), logits.size());
  const std::size_t batch = labels.size();
  if (batch == 0) return 0.0f;
  const double inv_batch = 1.0 / static_cast<double>(batch);
  double total = 0.0;
  for (std::size_t i = 0; i < batch; ++i) {
    const float* row = logits.data() + i * classes;
    const float top = *std::max_element(row, row + classes);
    double sum = 0.0;
    for (std::size_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c] - top));
    const double log_sum = std::log(sum);
    const auto label = static_cast<std::size_t>(labels[i]);
    total += log_sum - static_cast<double>(row[label] - top);
    if (want_grad) {
      float* grad = dlogits.data() + i * classes;
      const double inv_sum = 1.0 / sum;
      for (std::size_t c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(row[c] - top)) * inv_sum;
        grad[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) * inv_batch);
      }
    }
  }
  return static_cast<float>(total * inv_batch);
}

std::size_t count_correct(std::span<const float> logits, std::span<const std::int32_t> labels,
                          std::size_t classes) {
  check_shapes(logits, labels, classes);
  std::size_t correct = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const float* row = logits.data() + i * classes;
    const auto best = static_cast<std::size_t>(std::max_element(row, row + classes) - row);
    if (best == static_cast<std::size_t>(labels[i])) ++correct;
  }
  return correct;
}

float mean_squared_error(std::span<const float> outputs, std::span<const float> targets,
                         std::span<float> dloss) {
  detail::check_size("mean_squared_error targets", targets.size(), outputs.size());
  const bool want_grad = !dloss.empty();
  if (want_grad) detail::check_size("mean_squared_error dloss", dloss.size(), outputs.size());
  const std::size_t n = outputs.size();
  if (n == 0) return 0.0f;
  const double scale = 2.0 / static_cast<double>(n);
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double diff = static_cast<double>(outputs[i]) - static_cast<double>(targets[i]);
    total += diff * diff;
    if (want_grad) dloss[i] = static_cast<float>(scale * diff);  // after reading outputs[i]
  }
  return static_cast<float>(total / static_cast<double>(n));
}

}  // namespace cohort::kernels
