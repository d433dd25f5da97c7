#include "cohort/aggregation/server_optimizer.h"

#include "builtins.h"

#include "cohort/core/error.h"

namespace cohort::aggregation {
namespace {

// sgd: x += lr * Delta (lr = 1 is plain FedAvg); data-parallel: x -= lr * g.
class ServerSgd final : public ServerOptimizer {
 public:
  explicit ServerSgd(double lr) : lr_(static_cast<float>(lr)) {}
  void reset(std::size_t) override {}
  void apply_delta(std::span<float> params, std::span<const float> delta) override {
    COHORT_CHECK(params.size() == delta.size());
    for (std::size_t i = 0; i < params.size(); ++i) params[i] += lr_ * delta[i];
  }
  void apply_gradient(std::span<float> params, std::span<const float> gradient) override {
    apply_gradient_range(0, params, gradient);
  }
  std::vector<std::pair<std::string, std::span<float>>> state() override { return {}; }
  bool elementwise() const override { return true; }
  void apply_gradient_range(std::size_t, std::span<float> params,
                            std::span<const float> gradient) override {
    COHORT_CHECK(params.size() == gradient.size());
    float* __restrict x = params.data();
    const float* __restrict g = gradient.data();
    const float lr = lr_;
    for (std::size_t i = 0; i < params.size(); ++i) x[i] -= lr * g[i];
  }

 private:
  float lr_;
};

// fedavgm (docs/ALGORITHMS.md 1.2): v = beta * v + Delta; x += lr * v.
class ServerMomentum final : public ServerOptimizer {
 public:
  ServerMomentum(double lr, double beta)
      : lr_(static_cast<float>(lr)), beta_(static_cast<float>(beta)) {}
  void reset(std::size_t size) override { v_ = FloatBuffer(size); }
  void apply_delta(std::span<float> params, std::span<const float> delta) override {
    COHORT_CHECK(params.size() == delta.size() && delta.size() == v_.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      v_[i] = beta_ * v_[i] + delta[i];
      params[i] += lr_ * v_[i];
    }
  }
  void apply_gradient(std::span<float> params, std::span<const float> gradient) override {
    COHORT_CHECK(gradient.size() == v_.size());
    apply_gradient_range(0, params, gradient);
  }
  std::vector<std::pair<std::string, std::span<float>>> state() override {
    return {{"momentum", v_.span()}};
  }
  bool elementwise() const override { return true; }
  void apply_gradient_range(std::size_t offset, std::span<float> params,
                            std::span<const float> gradient) override {
    COHORT_CHECK(params.size() == gradient.size() && offset + gradient.size() <= v_.size());
    float* __restrict x = params.data();
    float* __restrict v = v_.data() + offset;
    const float* __restrict g = gradient.data();
    for (std::size_t i = 0; i < params.size(); ++i) {
      v[i] = beta_ * v[i] + g[i];
      x[i] -= lr_ * v[i];
    }
  }

 private:
  float lr_, beta_;
  FloatBuffer v_;
};

}  // namespace

void ServerOptimizer::apply_gradient_range(std::size_t, std::span<float>, std::span<const float>) {
  throw Error("this server optimizer cannot step piecewise (elementwise() is false)");
}

std::optional<double> default_server_lr(std::string_view optimizer, ServerInput input) {
  struct Rates {
    std::string_view name;
    double delta, gradient;
  };
  // Measurements behind each number: server_optimizer.h.
  static constexpr Rates kRates[] = {{"sgd", 1.0, 0.02},
                                     {"fedavgm", 1.0, 0.002},
                                     {"fedadagrad", 0.02, 0.01},
                                     {"fedyogi", 0.03, 0.001},
                                     {"fedadam", 0.03, 0.001}};
  for (const auto& r : kRates) {
    if (r.name == optimizer) return input == ServerInput::kDelta ? r.delta : r.gradient;
  }
  return std::nullopt;
}

void add_builtin_server_optimizers(ServerOptimizerRegistry& registry) {
  registry.add("sgd", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "lr"};
    o.require_known(known);
    const double lr = o.get_double("lr", *default_server_lr("sgd", ServerInput::kDelta));
    if (!(lr > 0)) throw ConfigError("server_optimizer.lr must be positive");
    return std::make_unique<ServerSgd>(lr);
  });
  registry.add("fedavgm", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "lr", "beta"};
    o.require_known(known);
    const double lr = o.get_double("lr", *default_server_lr("fedavgm", ServerInput::kDelta));
    const double beta = o.get_double("beta", 0.9);
    if (!(lr > 0) || beta < 0 || beta >= 1) {
      throw ConfigError("server_optimizer: fedavgm needs lr > 0 and 0 <= beta < 1");
    }
    return std::make_unique<ServerMomentum>(lr, beta);
  });
  detail::add_fedopt_server_optimizers(registry);
}

}  // namespace cohort::aggregation
