// FedAdagrad, FedYogi and FedAdam (docs/ALGORITHMS.md 1.3, Reddi et al. 2021): adaptive server
// optimizers over the aggregate client delta.
//
//   m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
//   v_t = v_{t-1} + Delta_t^2                                   (adagrad)
//   v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   (yogi, sign(0) = +1)
//   v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                 (adam)
//   x_{t+1} = x_t + lr * m_t / (sqrt(v_t) + tau)
//
// No bias correction by default (the paper's algorithm); FedAdam takes bias_correction = true for
// the Keras/Flower form, step lr * sqrt(1 - beta2^t) / (1 - beta1^t). Each coordinate is computed
// in double and stored as float. Registry names fedadagrad, fedyogi, fedadam; option keys lr,
// beta1, beta2, tau, initial_v (v_{-1}; 0 as in Flower and TFF, the paper asks for >= tau^2) and,
// for fedadam, bias_correction. Defaults: beta1 = 0.9 (fedadagrad: 0, the paper's experiments
// used Keras Adagrad, which has no first moment), beta2 = 0.99, tau = 1e-3 (the paper's
// recommendation), lr = default_server_lr(name, ServerInput::kDelta): 0.03 for fedadam and
// fedyogi, 0.02 for fedadagrad (why: server_optimizer.h; 0.1, Flower's rate for fedadam and
// fedadagrad, collapsed to chance accuracy when clients did little local work).
// Data-parallel mode (apply_gradient) feeds Delta = -gradient, at a smaller rate that the server
// sets (default_server_lr(name, ServerInput::kGradient)). State for checkpoints: "m", "v", and
// "step" (one float: the number of steps taken, exact up to 2^24). Not thread-safe.
#pragma once

#include <cstdint>

#include "cohort/aggregation/server_optimizer.h"
#include "cohort/core/buffer.h"

namespace cohort::aggregation {

struct FedOptOptions {
  enum class Variant { kAdagrad, kYogi, kAdam };
  Variant variant = Variant::kAdam;
  double lr = 0.03;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double tau = 1e-3;
  double initial_v = 0.0;
  bool bias_correction = false;  // FedAdam only
};

class FedOpt final : public ServerOptimizer {
 public:
  // Throws ConfigError for lr <= 0, beta1 or beta2 outside [0, 1), tau < 0, initial_v < 0, or
  // tau == 0 with initial_v == 0 (0/0 on a zero coordinate).
  explicit FedOpt(const FedOptOptions& options);
  void reset(std::size_t size) override;
  void apply_delta(std::span<float> params, std::span<const float> delta) override;
  void apply_gradient(std::span<float> params, std::span<const float> gradient) override;
  std::vector<std::pair<std::string, std::span<float>>> state() override;
  bool elementwise() const override { return true; }
  void begin_gradient_step() override;
  void apply_gradient_range(std::size_t offset, std::span<float> params,
                            std::span<const float> gradient) override;

 private:
  // Counts the step and returns its learning rate (with bias correction where asked).
  double next_step();
  void step_range(std::size_t offset, std::span<float> params, std::span<const float> direction,
                  double sign, double lr);
  FedOptOptions options_;
  FloatBuffer m_, v_;
  FloatBuffer step_{1};
  double step_lr_ = 0;  // of the step begun by begin_gradient_step()
};

}  // namespace cohort::aggregation
