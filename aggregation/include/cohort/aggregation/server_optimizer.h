// How the aggregate moves the model (the ServerOptimizer plug-in): x_{t+1} = x_t + step(Delta_t).
//
// Federated rules hand over the aggregate client delta Delta_t (new minus old, ALGORITHMS.md
// section 0); the pseudo-gradient is g_t = -Delta_t. Data-parallel mode hands over the averaged
// gradient instead (apply_gradient). State (momentum, moments) is exposed for checkpoints.
// Not thread-safe; a shard drives its optimizer from one thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/core/buffer.h"
#include "cohort/core/config.h"

namespace cohort::aggregation {

class ServerOptimizer {
 public:
  virtual ~ServerOptimizer() = default;
  // Sizes the state for a range of `size` parameters (zeroed). Called once before any step.
  virtual void reset(std::size_t size) = 0;
  // x += rule(delta). REQUIRES params.size() == delta.size() == size.
  virtual void apply_delta(std::span<float> params, std::span<const float> delta) = 0;
  // x -= rule(gradient), for data-parallel training. Defaults to apply_delta(-lr * gradient)
  // semantics of each rule; see the rule's comment.
  virtual void apply_gradient(std::span<float> params, std::span<const float> gradient) = 0;
  // Named state buffers, for checkpoints (empty for stateless rules). Restoring writes into them.
  virtual std::vector<std::pair<std::string, std::span<float>>> state() = 0;

  // Optional piecewise stepping, for rules in which a coordinate's update depends only on that
  // coordinate, its own state and a per-step scalar (sgd, fedavgm, the FedOpt family). Such a rule
  // returns true from elementwise(); a data-parallel shard then applies a gradient straight from
  // the chunks it arrived in, on several threads: begin_gradient_step() once per step, then
  // apply_gradient_range() over disjoint pieces that cover [0, size), possibly concurrently.
  // Together they must equal one apply_gradient() call. The defaults say "not elementwise".
  [[nodiscard]] virtual bool elementwise() const { return false; }
  virtual void begin_gradient_step() {}
  // x[offset, offset + n) -= rule(gradient) for one piece of the step begun last.
  // REQUIRES elementwise(); params and gradient are the piece (size n), offset is its position.
  virtual void apply_gradient_range(std::size_t offset, std::span<float> params,
                                    std::span<const float> gradient);
};

using ServerOptimizerFactory =
    std::function<std::unique_ptr<ServerOptimizer>(const ConfigSection& options)>;

class ServerOptimizerRegistry {
 public:
  void add(std::string name, ServerOptimizerFactory factory);
  [[nodiscard]] std::unique_ptr<ServerOptimizer> create(std::string_view name,
                                                        const ConfigSection& options) const;
  [[nodiscard]] bool contains(std::string_view name) const;
  [[nodiscard]] std::string names() const;

 private:
  std::map<std::string, ServerOptimizerFactory, std::less<>> factories_;
};

void add_builtin_server_optimizers(ServerOptimizerRegistry& registry);

}  // namespace cohort::aggregation
