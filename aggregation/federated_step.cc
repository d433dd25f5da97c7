#include "cohort/aggregation/federated_step.h"

#include <cmath>
#include <string>

#include "cohort/core/error.h"

namespace cohort::aggregation {

FederatedStep::FederatedStep(std::size_t size, Options options, const Registries& registries)
    : size_(size), options_(std::move(options)) {
  if (size_ == 0) throw ConfigError("FederatedStep: the model has no parameters (size 0)");
  aggregator_ = registries.aggregators.create(options_.rule, options_.rule_options);
  optimizer_ = registries.server_optimizers.create(options_.optimizer, options_.optimizer_options);
  optimizer_->reset(size_);
  delta_.assign(size_, 0.0f);
}

std::span<const float> FederatedStep::apply(std::span<float> params,
                                            std::span<const WeightedUpdate> updates) {
  const std::string rule = "aggregation rule '" + options_.rule + "'";
  if (params.size() != size_) {
    throw DataError("FederatedStep: params has " + std::to_string(params.size()) +
                    " values, the step was made for " + std::to_string(size_));
  }
  if (updates.empty()) throw DataError(rule + ": no update to aggregate");
  if (updates.size() < aggregator_->min_updates()) {
    throw DataError(rule + ": " + std::to_string(updates.size()) +
                    " update(s), it needs at least " + std::to_string(aggregator_->min_updates()));
  }
  for (std::size_t c = 0; c < updates.size(); ++c) {
    const WeightedUpdate& u = updates[c];
    if (u.delta.size() != size_) {
      throw DataError(rule + ": update " + std::to_string(c) + " has " +
                      std::to_string(u.delta.size()) + " values, the model " +
                      std::to_string(size_));
    }
    if (!(u.weight > 0) || !std::isfinite(u.weight)) {
      throw DataError(rule + ": update " + std::to_string(c) + " has weight " +
                      std::to_string(u.weight) + " (it must be positive and finite)");
    }
    for (std::size_t i = 0; i < size_; ++i) {
      if (!std::isfinite(u.delta[i])) {
        throw DataError(rule + ": update " + std::to_string(c) + " has a non-finite value at " +
                        std::to_string(i));
      }
    }
  }
  aggregator_->begin_round(++rounds_, size_);
  for (std::size_t c = 0; c < updates.size(); ++c) {
    const auto client = static_cast<ClientId>(c);
    if (aggregator_->accept({client, 0, updates[c].delta, updates[c].weight}) !=
        Verdict::kAccepted) {
      aggregator_->end_update(client, false);
      throw DataError(rule + ": update " + std::to_string(c) + " was refused by the rule");
    }
    aggregator_->end_update(client, true);
  }
  if (!aggregator_->finish_round(delta_)) {
    throw DataError(rule + " produced no aggregate from " + std::to_string(updates.size()) +
                    " update(s) (it needs at least " + std::to_string(aggregator_->min_updates()) +
                    ")");
  }
  optimizer_->apply_delta(params, delta_);
  return delta_;
}

}  // namespace cohort::aggregation
