// Coordinate-wise median (docs/ALGORITHMS.md section 2; Yin et al. 2018).
#include "builtins.h"
#include "cohort/aggregation/robust.h"
#include "cohort/kernels/robust.h"

namespace cohort::aggregation {

bool CoordinateMedian::combine(std::span<const std::span<const float>> updates,
                               std::span<const ClientId> /*clients*/,
                               std::span<const double> /*weights*/, std::span<float> out) {
  kernels::coordinate_median(updates, out);
  return true;
}

void detail::add_median_aggregator(AggregatorRegistry& registry) {
  registry.add("median", [](const ConfigSection& options) {
    const std::string_view known[] = {"name"};
    options.require_known(known);
    return std::make_unique<CoordinateMedian>();
  });
}

}  // namespace cohort::aggregation
