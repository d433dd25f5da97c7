#include <string>

#include "builtins.h"
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

template <typename Map, typename Factory>
void add_factory(Map& m, std::string name, Factory factory, const char* kind) {
  if (m.contains(name))
    throw ConfigError(std::string(kind) + " '" + name + "' is registered twice");
  m.emplace(std::move(name), std::move(factory));
}

template <typename Map>
auto create_from(const Map& m, std::string_view name, const ConfigSection& options,
                 const char* kind) {
  auto it = m.find(name);
  if (it == m.end()) {
    throw ConfigError("unknown " + std::string(kind) + " '" + std::string(name) +
                      "' (known: " + joined_names(m) + ")");
  }
  return it->second(options);
}

}  // namespace

void AggregatorRegistry::add(std::string name, AggregatorFactory factory) {
  add_factory(factories_, std::move(name), std::move(factory), "aggregator");
}
std::unique_ptr<Aggregator> AggregatorRegistry::create(std::string_view name,
                                                       const ConfigSection& options) const {
  return create_from(factories_, name, options, "aggregator");
}
bool AggregatorRegistry::contains(std::string_view name) const { return factories_.contains(name); }
std::string AggregatorRegistry::names() const { return joined_names(factories_); }

void ServerOptimizerRegistry::add(std::string name, ServerOptimizerFactory factory) {
  add_factory(factories_, std::move(name), std::move(factory), "server optimizer");
}
std::unique_ptr<ServerOptimizer> ServerOptimizerRegistry::create(
    std::string_view name, const ConfigSection& options) const {
  return create_from(factories_, name, options, "server optimizer");
}
bool ServerOptimizerRegistry::contains(std::string_view name) const {
  return factories_.contains(name);
}
std::string ServerOptimizerRegistry::names() const { return joined_names(factories_); }

void CompressorRegistry::add(std::string name, CompressorFactory factory) {
  add_factory(factories_, std::move(name), std::move(factory), "compressor");
}
std::unique_ptr<Compressor> CompressorRegistry::create(std::string_view name,
                                                       const ConfigSection& options) const {
  return create_from(factories_, name, options, "compressor");
}
bool CompressorRegistry::contains(std::string_view name) const { return factories_.contains(name); }
std::string CompressorRegistry::names() const { return joined_names(factories_); }

void ClientSelectorRegistry::add(std::string name, ClientSelectorFactory factory) {
  add_factory(factories_, std::move(name), std::move(factory), "client selector");
}
std::unique_ptr<ClientSelector> ClientSelectorRegistry::create(std::string_view name,
                                                               const ConfigSection& options) const {
  return create_from(factories_, name, options, "client selector");
}
bool ClientSelectorRegistry::contains(std::string_view name) const {
  return factories_.contains(name);
}
std::string ClientSelectorRegistry::names() const { return joined_names(factories_); }

void add_builtin_aggregators(AggregatorRegistry& registry) {
  detail::add_fedavg_aggregator(registry);
  detail::add_median_aggregator(registry);
  detail::add_trimmed_mean_aggregator(registry);
  detail::add_krum_aggregators(registry);
  detail::add_bulyan_aggregator(registry);
  detail::add_norm_clip_aggregator(registry);
}

void add_builtin_compressors(CompressorRegistry& registry) {
  detail::add_cast_compressors(registry);
  detail::add_qsgd_compressor(registry);
  detail::add_sparse_compressors(registry);
  detail::add_sign_compressor(registry);
  detail::add_powersgd_compressor(registry);
}

std::size_t detail::get_count(const ConfigSection& options, std::string_view name,
                              std::size_t fallback) {
  const std::int64_t v = options.get_int(name, static_cast<std::int64_t>(fallback));
  if (v < 0) {
    throw ConfigError("config key '" + options.prefix() + "." + std::string(name) +
                      "' must be >= 0, got " + std::to_string(v));
  }
  return static_cast<std::size_t>(v);
}

}  // namespace cohort::aggregation

namespace cohort {

Registries builtin_registries() {
  Registries r;
  aggregation::add_builtin_aggregators(r.aggregators);
  aggregation::add_builtin_server_optimizers(r.server_optimizers);
  aggregation::add_builtin_compressors(r.compressors);
  aggregation::add_builtin_client_selectors(r.client_selectors);
  return r;
}

}  // namespace cohort
