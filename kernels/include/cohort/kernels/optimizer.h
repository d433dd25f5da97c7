// Local optimizers (SGD with momentum / Nesterov / weight decay, Adam, AdamW) over flat spans.
//
// The update rules are PyTorch's (torch.optim.SGD with dampening 0, torch.optim.Adam/AdamW with
// amsgrad off), so hyper-parameters carry over:
//   SGD:   g = grad + wd * p;  v = momentum * v + g;  d = nesterov ? g + momentum * v : v
//          (d = g when momentum == 0);  p -= lr * d.          (v starts at 0, so v_1 = g_1)
//   Adam:  g = grad + wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//          p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)      (t counts from 1)
//   AdamW: as Adam with g = grad, after p *= 1 - lr * wd (decoupled weight decay).
// Networks (network.h) run the same rules on their own device; these are the host versions,
// also usable for server-side or test code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "cohort/core/buffer.h"

namespace cohort::kernels {

enum class OptimizerKind { kSgd, kAdam, kAdamW };

// "sgd", "adam", "adamw"; throws ConfigError listing these for anything else.
OptimizerKind parse_optimizer_kind(std::string_view name);
std::string_view to_string(OptimizerKind kind);

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.0f;      // SGD only; 0 disables the velocity buffer
  bool nesterov = false;      // SGD only; REQUIRES momentum > 0
  float weight_decay = 0.0f;  // SGD, Adam: L2 term added to the gradient; AdamW: decoupled
  float beta1 = 0.9f;         // Adam, AdamW
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

// Throws ConfigError naming the field for a negative learning rate, momentum or weight decay,
// betas outside [0, 1), a non-positive epsilon, or Nesterov without momentum.
void validate(const OptimizerOptions& options);

// Floats of optimizer state per parameter: 0 (plain SGD), 1 (SGD with momentum), 2 (Adam, AdamW).
std::size_t state_floats_per_parameter(const OptimizerOptions& options);

// One SGD step. velocity: params.size() floats (zero before the first step), or empty when
// options.momentum == 0. Element-wise, so callers may split a vector into ranges and step each
// range separately, on different threads. Throws KernelError on mismatched sizes.
void sgd_step(const OptimizerOptions& options, std::span<float> params,
              std::span<const float> grads, std::span<float> velocity);

// One Adam or AdamW step (options.kind decides), step = 1 on the first call. m and v:
// params.size() floats each, zero before the first step. Element-wise like sgd_step.
void adam_step(const OptimizerOptions& options, std::uint64_t step, std::span<float> params,
               std::span<const float> grads, std::span<float> m, std::span<float> v);

// An optimizer with its state for a parameter vector of fixed size. Not thread-safe.
class Optimizer {
 public:
  // Validates options (ConfigError). State is zero.
  Optimizer(const OptimizerOptions& options, std::size_t parameter_count);

  // REQUIRES params.size() == grads.size() == parameter_count(), else KernelError.
  void step(std::span<float> params, std::span<const float> grads);
  // Zeroes the state and the step count.
  void reset();
  void set_learning_rate(float learning_rate);

  [[nodiscard]] const OptimizerOptions& options() const { return options_; }
  [[nodiscard]] std::size_t parameter_count() const { return parameter_count_; }
  // Steps taken since construction or reset().
  [[nodiscard]] std::uint64_t steps() const { return steps_; }
  // SGD: the velocity; Adam: m followed by v. Empty for plain SGD.
  [[nodiscard]] std::span<const float> state() const { return state_; }

 private:
  OptimizerOptions options_;
  std::size_t parameter_count_;
  std::uint64_t steps_ = 0;
  FloatBuffer state_;
};

}  // namespace cohort::kernels
