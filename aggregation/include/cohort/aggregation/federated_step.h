// Cohort's aggregation rules and server optimizers in your own program, one call per round:
//
//   cohort::aggregation::FederatedStep step(params.size(), {.rule = "median", .optimizer =
//   "fedadam"}); for (each round) {
//     std::vector<cohort::aggregation::WeightedUpdate> updates = ...;  // (delta, weight) per
//     client step.apply(params, updates);  // params += fedadam(median(updates)); its state
//     persists
//   }
//
// The rule sees each update whole (as a shard's non-streaming path does), so every rule works
// the same here. What a shard would refuse is refused here with one line saying why (a
// DataError): no update, fewer than the rule needs (Krum: 2f + 3), an update of the wrong size,
// a weight that is not positive and finite, a non-finite value (naming the update and element).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cohort/aggregation/registries.h"
#include "cohort/core/config.h"

namespace cohort::aggregation {

struct WeightedUpdate {
  std::span<const float> delta;  // a client's model change (new - old), the model's size
  double weight = 1.0;           // e.g. its sample count
};

class FederatedStep {
 public:
  struct Options {
    std::string rule = "fedavg";      // an aggregator name: fedavg, median, trimmed_mean, krum, ...
    ConfigSection rule_options;       // its options (as [aggregator] in a server config)
    std::string optimizer = "sgd";    // a server optimizer name: sgd, fedavgm, fedadam, ...
    ConfigSection optimizer_options;  // its options (lr: each one's own default)
  };

  // ConfigError for an unknown name or option (listing the known ones).
  FederatedStep(std::size_t size, Options options,
                const Registries& registries = builtin_registries());

  // Aggregates the updates with the rule and applies the result to params with the optimizer.
  // Returns the aggregate delta (valid until the next call). params is untouched when it throws.
  std::span<const float> apply(std::span<float> params, std::span<const WeightedUpdate> updates);

  // The fewest updates the rule aggregates.
  [[nodiscard]] std::size_t min_updates() const { return aggregator_->min_updates(); }
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] std::uint64_t rounds() const { return rounds_; }

 private:
  std::size_t size_;
  Options options_;
  std::unique_ptr<Aggregator> aggregator_;
  std::unique_ptr<ServerOptimizer> optimizer_;
  std::vector<float> delta_;
  std::uint64_t rounds_ = 0;
};

}  // namespace cohort::aggregation
