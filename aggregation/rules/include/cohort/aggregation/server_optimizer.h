// How the aggregate moves the model (the ServerOptimizer plug-in): x_{t+1} = x_t + step(Delta_t).
//
// Federated rules hand over the aggregate client delta Delta_t (new minus old, docs/ALGORITHMS.md
// section 0); the pseudo-gradient is g_t = -Delta_t. Data-parallel mode hands over the averaged
// gradient instead (apply_gradient). State (momentum, moments) is exposed for checkpoints.
// Not thread-safe; a shard drives its optimizer from one thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
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

// What a server optimizer steps on: the aggregate client delta of a federated round or FedBuff
// step (apply_delta), or a data-parallel step's gradient (apply_gradient: one worker's batch-mean
// gradient under ASP and SSP, the sum of the workers' under BSP).
enum class ServerInput { kDelta, kGradient };

// The learning rate a built-in server optimizer takes when server_optimizer.lr is not set, for
// what it steps on; std::nullopt for a name that is not built in (a plug-in's factory picks its
// own). The factories use the kDelta rate, so a data-parallel server sets server_optimizer.lr to
// the kGradient rate itself when the configuration leaves it unset.
//
//   name        kDelta  kGradient
//   sgd         1       0.02       (kDelta 1 is plain FedAvg)
//   fedavgm     1       0.002      (beta 0.9 makes the effective rate 10x: 0.02 on gradients)
//   fedadagrad  0.02    0.01
//   fedyogi     0.03    0.001
//   fedadam     0.03    0.001
//
// Chosen on the main job's model and data: every rate above trains as FedAvg does, also with
// little local work per round, where Flower's 0.1 for fedadam and fedadagrad collapsed to chance
// (figures: docs/PERFORMANCE.md 5; tests/integration/optimizer_defaults_test.cc guards them). The
// adaptive rules move every coordinate by about lr on their first step whatever the size of the
// delta, so their rate cannot be FedAvg's 1. kGradient: BSP sums the workers' gradients, and sgd
// diverges from lr 0.1 under BSP, so lr 1 (the delta rate) leaves the model at chance.
[[nodiscard]] std::optional<double> default_server_lr(std::string_view optimizer,
                                                      ServerInput input);

}  // namespace cohort::aggregation
