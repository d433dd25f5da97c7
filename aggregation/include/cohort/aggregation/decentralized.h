// Decentralized optimizers: a local step plus mixing with neighbours through Gossip (the
// DecentralizedOptimizer plug-in; ALGORITHMS.md 5.2, 5.4, 6.1, 6.2, 7.7).
//
// The caller owns the model x and computes gradients; each step():
//   1. takes g = grad F_i(at eval_point()) (weight decay lambda x is added here),
//   2. updates x in place to x_i^{t+1}, exchanging with neighbours through `gossip` at step t.
// Every node must call step() with the same t sequence. State lives in the optimizer (momentum,
// CHOCO's public copies, push-sum's weight), sized on the first step.
//
// Built-ins (registry name: options):
//   dpsgd:       weight_decay = 0, overlap = false     (5.2) adapt-then-combine; overlap: (5.1)
//   dsgdm:       momentum = 0.9, weight_decay = 0      (6.1) heavy ball then gossip
//   dsgdm_n:     same, Nesterov
//   qg_dsgdm:    momentum = 0.9, mu = 0.9 (slow-buffer factor 1-mu = 0.1), weight_decay = 0  (6.2)
//   qg_dsgdm_n:  same, Nesterov
//   choco:       gamma = 0.5, momentum = 0, nesterov = false, weight_decay = 0, seed = 1  (7.7)
//                with the Compressor given to create(); memory-efficient form (x, x_hat, s)
//   push_sum:    momentum = 0, weight_decay = 0   (5.4) SGP for directed / time-varying graphs;
//                gradients must be taken at eval_point() = x / w  (alias "sgp")
//   ring_allreduce: momentum = 0.9, nesterov = false, weight_decay = 0   exact gradient average
//                by AllReduce over the Comm, then a momentum step: the data-parallel baseline
// Thread-safety: one instance per node, driven by the node's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/aggregation/compressor.h"
#include "cohort/aggregation/gossip.h"
#include "cohort/core/config.h"

namespace cohort::aggregation {

class DecentralizedOptimizer {
 public:
  virtual ~DecentralizedOptimizer() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;
  // x <- x_i^{t+1}. REQUIRES: grad.size() == x.size(), the same size on every call.
  virtual void step(std::uint64_t t, std::span<float> x, std::span<const float> grad, float lr,
                    Gossip& gossip) = 0;
  // Where to take the next gradient and what to evaluate: x itself, except push-sum's x / w.
  [[nodiscard]] virtual std::span<const float> eval_point(std::span<const float> x) { return x; }
  // Whether the algorithm needs a symmetric mixing matrix (all but push-sum).
  [[nodiscard]] virtual bool needs_symmetric() const { return true; }
};

using DecentralizedOptimizerFactory = std::function<std::unique_ptr<DecentralizedOptimizer>(
    const ConfigSection& options, std::shared_ptr<const Compressor> compressor)>;

class DecentralizedOptimizerRegistry {
 public:
  void add(std::string name, DecentralizedOptimizerFactory factory);  // ConfigError if taken
  // ConfigError listing the known names if unknown, or naming a bad option. `compressor` is
  // used by choco (ConfigError when it is null there) and ignored by the others.
  [[nodiscard]] std::unique_ptr<DecentralizedOptimizer> create(
      std::string_view name, const ConfigSection& options,
      std::shared_ptr<const Compressor> compressor = nullptr) const;
  [[nodiscard]] bool contains(std::string_view name) const;
  [[nodiscard]] std::string names() const;

 private:
  std::map<std::string, DecentralizedOptimizerFactory, std::less<>> factories_;
};

void add_builtin_decentralized_optimizers(DecentralizedOptimizerRegistry& registry);

// Consensus distance sqrt(sum_i ||x_i - mean||^2) of models held side by side (tests, sims).
[[nodiscard]] double consensus_distance(const std::vector<std::vector<float>>& models);

}  // namespace cohort::aggregation
