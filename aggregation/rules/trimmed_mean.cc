// Coordinate-wise trimmed mean (docs/ALGORITHMS.md section 2; Yin et al. 2018), scipy trim_mean
// semantics: b = floor(beta m) dropped at each end.
#include <cmath>
#include <string>

#include "builtins.h"
#include "cohort/aggregation/robust.h"
#include "cohort/core/error.h"
#include "cohort/kernels/robust.h"

namespace cohort::aggregation {
namespace {

std::size_t trim_count(double beta, std::size_t m) {
  return static_cast<std::size_t>(std::floor(beta * static_cast<double>(m)));
}

}  // namespace

TrimmedMean::TrimmedMean(double beta, std::size_t f) : beta_(beta), f_(f) {
  if (!(beta >= 0 && beta < 0.5)) {
    throw ConfigError("aggregator.beta must be in [0, 0.5), got " + std::to_string(beta));
  }
  if (f > 0 && beta == 0) throw ConfigError("aggregator: trimmed_mean with f > 0 needs beta > 0");
  // floor(beta m) >= f first holds near m = f / beta; walk up from below to be exact.
  std::size_t m = f == 0 ? 1 : static_cast<std::size_t>(std::floor(static_cast<double>(f) / beta));
  m = m > 2 ? m - 2 : 1;
  while (trim_count(beta, m) < f) ++m;
  min_updates_ = m;
}

bool TrimmedMean::combine(std::span<const std::span<const float>> updates,
                          std::span<const ClientId> /*clients*/,
                          std::span<const double> /*weights*/, std::span<float> out) {
  const std::size_t b = trim_count(beta_, updates.size());
  if (b < f_) return false;  // docs/ALGORITHMS.md: require b >= f
  kernels::trimmed_mean(updates, b, out);
  return true;
}

void detail::add_trimmed_mean_aggregator(AggregatorRegistry& registry) {
  registry.add("trimmed_mean", [](const ConfigSection& options) {
    const std::string_view known[] = {"name", "beta", "f"};
    options.require_known(known);
    return std::make_unique<TrimmedMean>(options.get_double("beta", 0.2),
                                         detail::get_count(options, "f", 0));
  });
}

}  // namespace cohort::aggregation
