// What every registry in aggregation/ shares (private header, included as "../registry_detail.h"
// from the concept folders): the name -> factory map operations behind AggregatorRegistry,
// ServerOptimizerRegistry (rules/), CompressorRegistry (compression/) and ClientSelectorRegistry
// (selection/), and the option reader the built-ins use. Header-only, so that no concept library
// links another for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "cohort/core/config.h"
#include "cohort/core/error.h"

namespace cohort::aggregation::detail {

// "a, b, c": the registered names in map order, for --help and error messages.
template <typename Map>
std::string joined_names(const Map& m) {
  std::string out;
  for (const auto& [name, f] : m) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Adds `factory` under `name`; ConfigError "<kind> 'name' is registered twice" when it is taken.
template <typename Map, typename Factory>
void add_factory(Map& m, std::string name, Factory factory, const char* kind) {
  if (m.contains(name))
    throw ConfigError(std::string(kind) + " '" + name + "' is registered twice");
  m.emplace(std::move(name), std::move(factory));
}

// Calls the factory registered under `name`; ConfigError naming the known ones when there is none.
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

// Reads the size_t option `name` (an int >= 0), or fallback when absent; ConfigError otherwise.
inline std::size_t get_count(const ConfigSection& options, std::string_view name,
                             std::size_t fallback) {
  const std::int64_t v = options.get_int(name, static_cast<std::int64_t>(fallback));
  if (v < 0) {
    throw ConfigError("config key '" + options.prefix() + "." + std::string(name) +
                      "' must be >= 0, got " + std::to_string(v));
  }
  return static_cast<std::size_t>(v);
}

}  // namespace cohort::aggregation::detail
