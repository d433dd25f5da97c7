// Decentralized optimizers: a local step plus mixing with neighbours through Gossip (the
// DecentralizedOptimizer plug-in; docs/ALGORITHMS.md 5.2, 5.4, 6.1, 6.2, 7.7).
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
//   ring_allreduce: momentum = 0.9, nesterov = false, weight_decay = 0, allreduce = "auto"
//                exact gradient average by AllReduce over the Comm (allreduce = ring |
//                recursive_doubling | auto, allreduce.h), then a momentum step: the data-parallel
//                baseline
// Only choco has a compressed form (7.7): the others take no compressor.
// Thread-safety: one instance per node, driven by the node's thread.
#pragma once

#include <chrono>
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
#include "cohort/aggregation/topology.h"
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

// The settings of a decentralized run: the [decentralized] section, which the rendezvous checks at
// start-up and sends to every peer, and every peer reads back with the same function. Keys:
//   peers = 4 (1..4096)     steps = 100 (>= 1)      lr = 0.05 (> 0)     batch = 32 (>= 1)
//   partition = ""          the data split (empty: each peer's data.partition)
//   gossip_timeout_ms = 5000 (>= 1)     staleness = 0 (asynchronous gossip: the mix() algorithms
//                           dpsgd, dsgdm*, qg_dsgdm*, on a static topology)
//   algorithm = "dpsgd" and the options it takes (weight_decay, overlap, momentum, nesterov, mu,
//                           gamma, seed, allreduce; see the built-ins above)
//   topology = "ring" and topology_options.* (torus: rows, cols; random_regular: degree, seed;
//                           time_varying: seed), checked against `peers`
//   compressor = "none" and compressor_options.* (compressor.h's keys; error_feedback defaults to
//                           false, as CHOCO's public copies already carry the error): choco only
struct DecentralizedSettings {
  std::int64_t peers = 4;
  std::uint64_t steps = 100;
  double lr = 0.05;
  std::size_t batch = 32;
  std::string partition;
  std::chrono::milliseconds gossip_timeout{5000};
  std::uint64_t staleness = 0;
  std::string algorithm = "dpsgd";
  ConfigSection optimizer_options;
  std::string topology = "ring";
  ConfigSection topology_options;
  std::string compressor = "none";
  ConfigSection compressor_options;
};

// Reads and checks every key and value of `section`, and makes the topology (for `peers` nodes),
// the compressor and the optimizer once so that their own checks run. Throws ConfigError naming
// the key: an unknown key, a bad value, an option the algorithm does not take, a compressor for
// an algorithm without a compressed form, a graph that does not exist for `peers` nodes, a
// directed graph for an algorithm that needs a symmetric one. `check_partition`, when given,
// checks `partition` (the spec language lives above aggregation/).
[[nodiscard]] DecentralizedSettings decentralized_settings_from(
    const ConfigSection& section,
    const std::function<void(const std::string&)>& check_partition = {});

// The run's parts from the built-in registries (settings from decentralized_settings_from()).
[[nodiscard]] std::unique_ptr<Topology> make_topology(const DecentralizedSettings& settings);
// nullptr unless the algorithm takes a compressor.
[[nodiscard]] std::shared_ptr<const Compressor> make_compressor(
    const DecentralizedSettings& settings);
// One per node; `compressor` from make_compressor().
[[nodiscard]] std::unique_ptr<DecentralizedOptimizer> make_optimizer(
    const DecentralizedSettings& settings, std::shared_ptr<const Compressor> compressor);

// Consensus distance sqrt(sum_i ||x_i - mean||^2) of models held side by side (tests, sims).
[[nodiscard]] double consensus_distance(const std::vector<std::vector<float>>& models);

}  // namespace cohort::aggregation
