#include "cohort/aggregation/registries.h"
#include "cohort/core/error.h"

namespace cohort::aggregation {
namespace {

template <typename Map>
std::string joined_names(const Map& m) {
  std::string out;
  for (const auto& [name, f] : m) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

void AggregatorRegistry::add(std::string name, AggregatorFactory factory) {
  if (factories_.contains(name)) throw ConfigError("aggregator '" + name + "' is registered twice");
  factories_.emplace(std::move(name), std::move(factory));
}

std::unique_ptr<Aggregator> AggregatorRegistry::create(std::string_view name,
                                                       const ConfigSection& options) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    throw ConfigError("unknown aggregator '" + std::string(name) + "' (known: " + names() + ")");
  }
  return it->second(options);
}

bool AggregatorRegistry::contains(std::string_view name) const { return factories_.contains(name); }
std::string AggregatorRegistry::names() const { return joined_names(factories_); }

void ServerOptimizerRegistry::add(std::string name, ServerOptimizerFactory factory) {
  if (factories_.contains(name)) {
    throw ConfigError("server optimizer '" + name + "' is registered twice");
  }
  factories_.emplace(std::move(name), std::move(factory));
}

std::unique_ptr<ServerOptimizer> ServerOptimizerRegistry::create(std::string_view name,
                                                                 const ConfigSection& options) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    throw ConfigError("unknown server optimizer '" + std::string(name) + "' (known: " + names() +
                      ")");
  }
  return it->second(options);
}

bool ServerOptimizerRegistry::contains(std::string_view name) const {
  return factories_.contains(name);
}
std::string ServerOptimizerRegistry::names() const { return joined_names(factories_); }

}  // namespace cohort::aggregation

namespace cohort {

Registries builtin_registries() {
  Registries r;
  aggregation::add_builtin_aggregators(r.aggregators);
  aggregation::add_builtin_server_optimizers(r.server_optimizers);
  return r;
}

}  // namespace cohort
