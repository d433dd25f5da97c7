#include "cohort/aggregation/fedopt.h"

#include <cmath>
#include <string>
#include <vector>

#include "builtins.h"
#include "cohort/core/error.h"

namespace cohort::aggregation {

FedOpt::FedOpt(const FedOptOptions& options) : options_(options) {
  const auto& o = options_;
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw ConfigError("server_optimizer.lr must be > 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) throw ConfigError("server_optimizer.beta1 must be in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) throw ConfigError("server_optimizer.beta2 must be in [0, 1)");
  if (!(o.tau >= 0) || !std::isfinite(o.tau))
    throw ConfigError("server_optimizer.tau must be >= 0");
  if (!(o.initial_v >= 0) || !std::isfinite(o.initial_v)) {
    throw ConfigError("server_optimizer.initial_v must be >= 0");
  }
  if (o.tau == 0 && o.initial_v == 0) {
    throw ConfigError("server_optimizer: tau = 0 needs initial_v > 0 (else 0/0 on zero deltas)");
  }
}

void FedOpt::reset(std::size_t size) {
  m_ = FloatBuffer(size);
  v_ = FloatBuffer(size);
  v_.fill(static_cast<float>(options_.initial_v));
  step_.fill(0.0f);
}

void FedOpt::apply_delta(std::span<float> params, std::span<const float> delta) {
  COHORT_CHECK(delta.size() == m_.size()) << "delta " << delta.size() << ", state " << m_.size();
  step_range(0, params, delta, 1.0, next_step());
}

void FedOpt::apply_gradient(std::span<float> params, std::span<const float> gradient) {
  COHORT_CHECK(gradient.size() == m_.size())
      << "gradient " << gradient.size() << ", state " << m_.size();
  step_range(0, params, gradient, -1.0, next_step());  // Delta = -g (docs/ALGORITHMS.md section 0)
}

void FedOpt::begin_gradient_step() { step_lr_ = next_step(); }

void FedOpt::apply_gradient_range(std::size_t offset, std::span<float> params,
                                  std::span<const float> gradient) {
  step_range(offset, params, gradient, -1.0, step_lr_);
}

double FedOpt::next_step() {
  const auto& o = options_;
  const double t = static_cast<double>(step_[0]) + 1.0;
  step_[0] = static_cast<float>(t);
  double lr = o.lr;
  if (o.bias_correction && o.variant == FedOptOptions::Variant::kAdam) {
    lr *= std::sqrt(1.0 - std::pow(o.beta2, t)) / (1.0 - std::pow(o.beta1, t));
  }
  return lr;
}

void FedOpt::step_range(std::size_t offset, std::span<float> params,
                        std::span<const float> direction, double sign, double lr) {
  COHORT_CHECK(params.size() == direction.size() && offset + direction.size() <= m_.size())
      << "params " << params.size() << ", delta " << direction.size() << " at " << offset
      << ", state " << m_.size();
  const auto& o = options_;
  const double b1 = o.beta1, b2 = o.beta2, tau = o.tau;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const double d = sign * static_cast<double>(direction[i]);
    const double d2 = d * d;
    const double m = b1 * m_[offset + i] + (1.0 - b1) * d;
    double v = v_[offset + i];
    switch (o.variant) {
      case FedOptOptions::Variant::kAdagrad: v += d2; break;
      case FedOptOptions::Variant::kYogi:
        v -= (1.0 - b2) * d2 * (v - d2 >= 0 ? 1.0 : -1.0);  // sign(0) = +1
        break;
      case FedOptOptions::Variant::kAdam: v = b2 * v + (1.0 - b2) * d2; break;
    }
    m_[offset + i] = static_cast<float>(m);
    v_[offset + i] = static_cast<float>(v);
    params[i] = static_cast<float>(params[i] + lr * m / (std::sqrt(v) + tau));
  }
}

std::vector<std::pair<std::string, std::span<float>>> FedOpt::state() {
  return {{"m", m_.span()}, {"v", v_.span()}, {"step", step_.span()}};
}

void detail::add_fedopt_server_optimizers(ServerOptimizerRegistry& registry) {
  using V = FedOptOptions::Variant;
  auto add = [&](const char* name, V variant, double beta1) {
    const double lr = *default_server_lr(name, ServerInput::kDelta);
    registry.add(name, [variant, lr, beta1](const ConfigSection& o) {
      const bool adam = variant == V::kAdam;
      // beta2 means nothing to fedadagrad, bias_correction exists for fedadam only.
      std::vector<std::string_view> known{"name", "lr", "beta1", "tau", "initial_v"};
      if (variant != V::kAdagrad) known.push_back("beta2");
      if (adam) known.push_back("bias_correction");
      o.require_known(known);
      FedOptOptions opts;
      opts.variant = variant;
      opts.lr = o.get_double("lr", lr);
      opts.beta1 = o.get_double("beta1", beta1);
      opts.beta2 = o.get_double("beta2", 0.99);
      opts.tau = o.get_double("tau", 1e-3);
      opts.initial_v = o.get_double("initial_v", 0.0);
      opts.bias_correction = adam && o.get_bool("bias_correction", false);
      return std::make_unique<FedOpt>(opts);
    });
  };
  add("fedadagrad", V::kAdagrad, 0.0);
  add("fedyogi", V::kYogi, 0.9);
  add("fedadam", V::kAdam, 0.9);
}

}  // namespace cohort::aggregation
