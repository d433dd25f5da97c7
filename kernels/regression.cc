#include "cohort/kernels/regression.h"

#include <algorithm>
#include <string>
#include <utility>

#include "check.h"
#include "cohort/kernels/loss.h"

namespace cohort::kernels {
namespace {

void check_shapes(const char* what, const Network& network, std::span<const float> input,
                  std::span<const float> targets, std::size_t batch) {
  detail::check_size((std::string(what) + " input").c_str(), input.size(),
                     batch * network.spec().input_shape().size());
  detail::check_size((std::string(what) + " targets").c_str(), targets.size(),
                     batch * network.output_size());
}

// Forward, loss and backward of rows [begin, begin + b): the gradient of their own mean loss.
float micro_step(Network& network, std::span<const float> input, std::span<const float> targets,
                 std::size_t begin, std::size_t b, std::vector<float>& dloss) {
  const std::size_t d = network.spec().input_shape().size();
  const std::size_t t = network.output_size();
  const auto outputs = network.forward(input.subspan(begin * d, b * d), b, /*training=*/true);
  dloss.resize(b * t);
  const float loss = mean_squared_error(outputs, targets.subspan(begin * t, b * t), dloss);
  network.backward(dloss);
  return loss;
}

}  // namespace

float regression_gradients(Network& network, std::span<const float> input,
                           std::span<const float> targets, std::size_t batch,
                           RegressionBuffers* buffers) {
  check_shapes("regression_gradients", network, input, targets, batch);
  if (batch == 0) return 0.0f;
  // The network's own micro-batch loop, accumulating in place, where it has one (CPU).
  if (const auto loss = network.compute_gradients_mse(input, targets, batch)) return *loss;
  RegressionBuffers local;
  RegressionBuffers& scratch = buffers != nullptr ? *buffers : local;
  const std::size_t m = network.micro_batch();
  if (m == 0 || m >= batch) return micro_step(network, input, targets, 0, batch, scratch.dloss);
  // d(mean over the batch)/dw = sum over micro-batches of (b / batch) x d(mean over b)/dw.
  auto& sum = scratch.gradient_sum;
  sum.assign(network.parameter_count(), 0.0f);
  double loss = 0.0;
  for (std::size_t begin = 0; begin < batch; begin += m) {
    const std::size_t b = std::min(m, batch - begin);
    const double weight = static_cast<double>(b) / static_cast<double>(batch);
    loss += weight * micro_step(network, input, targets, begin, b, scratch.dloss);
    const auto w = static_cast<float>(weight);
    const auto grads = std::as_const(network).gradients();
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += w * grads[i];
  }
  std::ranges::copy(sum, network.gradients().begin());
  return static_cast<float>(loss);
}

double RegressionEvaluation::mse() const {
  const std::size_t n = count * outputs;
  return n > 0 ? squared_error_sum / static_cast<double>(n) : 0.0;
}

RegressionEvaluation evaluate_regression(Network& network, std::span<const float> input,
                                         std::span<const float> targets, std::size_t batch) {
  check_shapes("evaluate_regression", network, input, targets, batch);
  const std::size_t d = network.spec().input_shape().size();
  const std::size_t t = network.output_size();
  const std::size_t m = network.micro_batch() > 0 ? network.micro_batch() : batch;
  RegressionEvaluation out;
  out.outputs = t;
  for (std::size_t begin = 0; begin < batch; begin += m) {
    const std::size_t b = std::min(m, batch - begin);
    const auto outputs = network.forward(input.subspan(begin * d, b * d), b, /*training=*/false);
    const float* target = targets.data() + begin * t;
    for (std::size_t i = 0; i < b * t; ++i) {
      const double diff = static_cast<double>(outputs[i]) - static_cast<double>(target[i]);
      out.squared_error_sum += diff * diff;
    }
    out.count += b;
  }
  return out;
}

}  // namespace cohort::kernels
