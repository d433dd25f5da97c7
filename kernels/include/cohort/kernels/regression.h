// Regression (train.loss = mse) on the public Network API: a training step's gradient and an
// evaluation, with the mean squared error of loss.h as the loss.
//
// Network::train_step, compute_gradients and evaluate are fused with softmax cross-entropy over
// integer labels. regression_gradients() leaves the gradient of the batch's mean squared error
// in gradients() for the caller's step() (after an edit, if it makes one: FedProx's term).
// Where the network has its own MSE path (Network::compute_gradients_mse: the CPU), that runs:
// the same micro-batch loop as compute_gradients, gradients accumulated in place, dropout masks
// as a whole step's, no memory beyond what a memory plan measured. Elsewhere (CUDA) it runs
// forward(training = true), the host mean squared error and backward(dloss); with a micro-batch
// m set (Network::micro_batch() > 0: a memory plan) the batch runs as ceil(batch / m)
// micro-batches whose gradients (of their own mean loss) are added with weight b / batch into a
// host sum copied back into gradients() at the end: equal to the whole batch's up to float
// rounding, but with one more gradient-sized buffer, and each forward draws its own dropout
// masks. Batch normalisation normalises per micro-batch either way.
//
// On CUDA every step moves the outputs (and, micro-batched, the gradients) across the bus:
// correct, not the fast path.
//
// Free functions: they hold no state beyond the caller's RegressionBuffers and are as
// thread-safe as the Network they drive (one thread per network). They throw KernelError when
// the input or the targets do not match the batch and the network's shapes, and what the
// network throws.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "cohort/kernels/network.h"

namespace cohort::kernels {

// Scratch reused across steps, so that a steady training loop allocates nothing.
struct RegressionBuffers {
  std::vector<float> dloss;         // d(loss)/d(outputs) of one (micro-)batch
  std::vector<float> gradient_sum;  // micro-batched: the weighted sum of the gradients
};

// The gradient of the batch's mean squared error (mean over batch x T elements, T =
// network.output_size(), as PyTorch's MSELoss) in network.gradients(); returns that loss.
// input: batch x network.spec().input_shape().size() floats; targets: batch x T floats,
// row-major. batch 0 returns 0 and changes nothing. `buffers` may be null (then each call
// allocates its scratch).
float regression_gradients(Network& network, std::span<const float> input,
                           std::span<const float> targets, std::size_t batch,
                           RegressionBuffers* buffers = nullptr);

// The result of evaluate_regression(): summed, not averaged, so that batches add up.
struct RegressionEvaluation {
  double squared_error_sum = 0.0;  // over every output of every sample
  std::size_t count = 0;           // samples
  std::size_t outputs = 0;         // T: outputs per sample

  // The mean squared error, squared_error_sum / (count x outputs); 0 when empty.
  [[nodiscard]] double mse() const;
};

// forward(training = false) over the batch, at most micro_batch() samples at a time (the whole
// batch when it is 0), and the squared error against targets; touches no gradient or optimizer
// state. Shapes as for regression_gradients().
RegressionEvaluation evaluate_regression(Network& network, std::span<const float> input,
                                         std::span<const float> targets, std::size_t batch);

}  // namespace cohort::kernels
