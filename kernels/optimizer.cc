#include "cohort/kernels/optimizer.h"

#include <cmath>
#include <string>

#include "check.h"
#include "cohort/core/error.h"

namespace cohort::kernels {
namespace {

void require(bool ok, const char* what) {
  if (!ok) throw ConfigError(std::string("optimizer: ") + what);
}

}  // namespace

OptimizerKind parse_optimizer_kind(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "adamw") return OptimizerKind::kAdamW;
  throw ConfigError("unknown optimizer '" + std::string(name) + "' (known: sgd, adam, adamw)");
}

std::string_view to_string(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kAdamW: return "adamw";
  }
  return "unknown";
}

void validate(const OptimizerOptions& o) {
  require(std::isfinite(o.learning_rate) && o.learning_rate >= 0.0f,
          "learning_rate must be finite and >= 0");
  require(o.momentum >= 0.0f && o.momentum < 1.0f, "momentum must be in [0, 1)");
  require(!o.nesterov || o.momentum > 0.0f, "nesterov needs momentum > 0");
  require(o.weight_decay >= 0.0f, "weight_decay must be >= 0");
  require(o.beta1 >= 0.0f && o.beta1 < 1.0f, "beta1 must be in [0, 1)");
  require(o.beta2 >= 0.0f && o.beta2 < 1.0f, "beta2 must be in [0, 1)");
  require(o.epsilon > 0.0f, "epsilon must be > 0");
}

std::size_t state_floats_per_parameter(const OptimizerOptions& o) {
  if (o.kind == OptimizerKind::kSgd) return o.momentum > 0.0f ? 1 : 0;
  return 2;
}

void sgd_step(const OptimizerOptions& o, std::span<float> params, std::span<const float> grads,
              std::span<float> velocity) {
  detail::check_size("sgd_step grads", grads.size(), params.size());
  const std::size_t n = params.size();
  float* __restrict p = params.data();
  const float* __restrict g = grads.data();
  const float lr = o.learning_rate;
  const float wd = o.weight_decay;
  if (o.momentum == 0.0f) {
    for (std::size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  detail::check_size("sgd_step velocity", velocity.size(), n);
  float* __restrict v = velocity.data();
  const float mu = o.momentum;
  if (o.nesterov) {
    for (std::size_t i = 0; i < n; ++i) {
      const float d = g[i] + wd * p[i];
      v[i] = mu * v[i] + d;
      p[i] -= lr * (d + mu * v[i]);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = mu * v[i] + (g[i] + wd * p[i]);
      p[i] -= lr * v[i];
    }
  }
}

void adam_step(const OptimizerOptions& o, std::uint64_t step, std::span<float> params,
               std::span<const float> grads, std::span<float> m, std::span<float> v) {
  const std::size_t n = params.size();
  detail::check_size("adam_step grads", grads.size(), n);
  detail::check_size("adam_step m", m.size(), n);
  detail::check_size("adam_step v", v.size(), n);
  if (step == 0) throw KernelError("adam_step: step counts from 1");
  const double t = static_cast<double>(step);
  const auto step_size =
      static_cast<float>(o.learning_rate / (1.0 - std::pow(static_cast<double>(o.beta1), t)));
  const auto inv_sqrt_bc2 =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), t)));
  const float b1 = o.beta1, b2 = o.beta2, eps = o.epsilon;
  const bool decoupled = o.kind == OptimizerKind::kAdamW;
  const float l2 = decoupled ? 0.0f : o.weight_decay;
  const float shrink = decoupled ? 1.0f - o.learning_rate * o.weight_decay : 1.0f;
  float* __restrict p = params.data();
  const float* __restrict gr = grads.data();
  float* __restrict mm = m.data();
  float* __restrict vv = v.data();
  for (std::size_t i = 0; i < n; ++i) {
    const float pi = p[i] * shrink;
    const float g = gr[i] + l2 * p[i];
    mm[i] = b1 * mm[i] + (1.0f - b1) * g;
    vv[i] = b2 * vv[i] + (1.0f - b2) * g * g;
    p[i] = pi - step_size * mm[i] / (std::sqrt(vv[i]) * inv_sqrt_bc2 + eps);
  }
}

Optimizer::Optimizer(const OptimizerOptions& options, std::size_t parameter_count)
    : options_(options), parameter_count_(parameter_count) {
  validate(options_);
  state_ = FloatBuffer(parameter_count_ * state_floats_per_parameter(options_));
}

void Optimizer::step(std::span<float> params, std::span<const float> grads) {
  detail::check_size("Optimizer::step params", params.size(), parameter_count_);
  detail::check_size("Optimizer::step grads", grads.size(), parameter_count_);
  ++steps_;
  const std::size_t n = parameter_count_;
  if (options_.kind == OptimizerKind::kSgd) {
    sgd_step(options_, params, grads, state_.span());
  } else {
    adam_step(options_, steps_, params, grads, state_.span().subspan(0, n),
              state_.span().subspan(n, n));
  }
}

void Optimizer::reset() {
  state_.fill(0.0f);
  steps_ = 0;
}

void Optimizer::set_learning_rate(float learning_rate) {
  OptimizerOptions next = options_;
  next.learning_rate = learning_rate;
  validate(next);
  options_ = next;
}

}  // namespace cohort::kernels
