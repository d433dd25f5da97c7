// Losses on the host: softmax cross-entropy over logits and argmax accuracy (classification), and
// the mean squared error (regression, train.loss = mse).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace cohort::kernels {

// Mean over the batch of -log softmax(logits[i])[labels[i]], computed stably (max subtracted,
// log-sum-exp in double). logits: batch x classes row-major with batch = labels.size().
// If dlogits is not empty it receives d(mean loss)/d(logits) = (softmax - onehot) / batch, same
// layout; it may alias logits. Throws KernelError on mismatched sizes, classes == 0 or a label
// outside [0, classes).
float softmax_cross_entropy(std::span<const float> logits, std::span<const std::int32_t> labels,
                            std::size_t classes, std::span<float> dlogits = {});

// Number of rows whose largest logit (first one on ties) is at the label's index.
std::size_t count_correct(std::span<const float> logits, std::span<const std::int32_t> labels,
                          std::size_t classes);

// Mean squared error as PyTorch's MSELoss (reduction = 'mean'): the mean over all batch x T
// elements of (outputs - targets)^2, where outputs and targets are batch x T row-major (T = the
// network's output size; only their sizes are compared, so T need not be given). Accumulated
// in double. If dloss is not empty it receives d(loss)/d(outputs) = 2 (outputs - targets) / n,
// n = outputs.size(), in the same layout; it may alias outputs. An empty batch has loss 0.
// Throws KernelError on mismatched sizes.
float mean_squared_error(std::span<const float> outputs, std::span<const float> targets,
                         std::span<float> dloss = {});

}  // namespace cohort::kernels
