#include <string>

#include "builtins.h"
#include "cohort/aggregation/aggregator.h"
#include "cohort/aggregation/server_optimizer.h"

namespace cohort::aggregation {

void AggregatorRegistry::add(std::string name, AggregatorFactory factory) {
  detail::add_factory(factories_, std::move(name), std::move(factory), "aggregator");
}
std::unique_ptr<Aggregator> AggregatorRegistry::create(std::string_view name,
                                                       const ConfigSection& options) const {
  return detail::create_from(factories_, name, options, "aggregator");
}
bool AggregatorRegistry::contains(std::string_view name) const { return factories_.contains(name); }
std::string AggregatorRegistry::names() const { return detail::joined_names(factories_); }

void ServerOptimizerRegistry::add(std::string name, ServerOptimizerFactory factory) {
  detail::add_factory(factories_, std::move(name), std::move(factory), "server optimizer");
}
std::unique_ptr<ServerOptimizer> ServerOptimizerRegistry::create(
    std::string_view name, const ConfigSection& options) const {
  return detail::create_from(factories_, name, options, "server optimizer");
}
bool ServerOptimizerRegistry::contains(std::string_view name) const {
  return factories_.contains(name);
}
std::string ServerOptimizerRegistry::names() const { return detail::joined_names(factories_); }

void add_builtin_aggregators(AggregatorRegistry& registry) {
  detail::add_fedavg_aggregator(registry);
  detail::add_median_aggregator(registry);
  detail::add_trimmed_mean_aggregator(registry);
  detail::add_krum_aggregators(registry);
  detail::add_bulyan_aggregator(registry);
  detail::add_norm_clip_aggregator(registry);
}

}  // namespace cohort::aggregation
