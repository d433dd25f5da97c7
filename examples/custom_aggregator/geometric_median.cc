#include "geometric_median.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <string_view>

#include "cohort/core/error.h"

namespace custom {

bool GeometricMedian::combine(std::span<const std::span<const float>> updates,
                              std::span<const cohort::ClientId> /*clients*/,
                              std::span<const double> weights, std::span<float> out) {
  const std::size_t m = updates.size();
  const std::size_t d = out.size();
  auto weight = [&](std::size_t i) { return options_.weighted ? weights[i] : 1.0; };

  // z_0: the weighted mean. Sums in double: float sums of many clients lose digits.
  z_.assign(d, 0.0);
  double total = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const double w = weight(i);
    total += w;
    for (std::size_t j = 0; j < d; ++j) z_[j] += w * updates[i][j];
  }
  for (double& v : z_) v /= total;

  last_iterations_ = 0;
  next_.resize(d);
  for (std::int64_t t = 0; t < options_.max_iterations && m > 1; ++t) {
    std::fill(next_.begin(), next_.end(), 0.0);
    double denominator = 0;
    for (std::size_t i = 0; i < m; ++i) {
      double dist2 = 0;
      for (std::size_t j = 0; j < d; ++j) {
        const double diff = z_[j] - updates[i][j];
        dist2 += diff * diff;
      }
      const double beta = weight(i) / std::max(options_.nu, std::sqrt(dist2));
      denominator += beta;
      for (std::size_t j = 0; j < d; ++j) next_[j] += beta * updates[i][j];
    }
    double step2 = 0, norm2 = 0;
    for (std::size_t j = 0; j < d; ++j) {
      next_[j] /= denominator;
      const double diff = next_[j] - z_[j];
      step2 += diff * diff;
      norm2 += z_[j] * z_[j];
    }
    z_.swap(next_);
    last_iterations_ = t + 1;
    if (std::sqrt(step2) <= options_.eps * (1.0 + std::sqrt(norm2))) break;
  }
  for (std::size_t j = 0; j < d; ++j) out[j] = static_cast<float>(z_[j]);
  return true;
}

void add_geometric_median(cohort::aggregation::AggregatorRegistry& registry) {
  registry.add("geometric_median", [](const cohort::ConfigSection& options) {
    const std::string_view known[] = {"name", "eps", "max_iterations", "nu", "weighted"};
    options.require_known(known);
    GeometricMedianOptions o;
    o.eps = options.get_double("eps", o.eps);
    o.max_iterations = options.get_int("max_iterations", o.max_iterations);
    o.nu = options.get_double("nu", o.nu);
    o.weighted = options.get_bool("weighted", o.weighted);
    if (!(o.eps > 0) || o.max_iterations < 1 || !(o.nu > 0)) {
      throw cohort::ConfigError(options.prefix() +
                                ": eps and nu must be > 0 and max_iterations >= 1");
    }
    return std::make_unique<GeometricMedian>(o);
  });
}

}  // namespace custom
