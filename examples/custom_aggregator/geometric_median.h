// A user's own aggregation rule, outside Cohort: the geometric median of the clients' updates,
// computed with the smoothed Weiszfeld iteration (Weiszfeld 1937; as in RFA, Pillutla, Kakade &
// Harchaoui, "Robust Aggregation for Federated Learning", 2019).
//
//   z_0     = the weighted mean of the updates u_1..u_m (weights w_i, the clients' sample counts,
//             or 1 each with weighted = false)
//   d_i     = max(nu, ||z_t - u_i||)
//   z_{t+1} = sum_i (w_i / d_i) u_i / sum_i (w_i / d_i)
//
// stopping when ||z_{t+1} - z_t|| <= eps * (1 + ||z_t||) or after max_iterations steps. Unlike the
// mean, a minority of arbitrarily large updates moves the result only a bounded distance
// (breakdown point 1/2), and unlike the coordinate-wise median it is rotation-invariant.
//
// Options (aggregator.*): eps = 1e-6, max_iterations = 100, nu = 1e-8 (the distance floor that
// keeps a step finite when z lands on an update), weighted = true.
//
// It needs every update at once, so it derives from BufferedAggregator (not streaming: the shard
// hands it each client's whole update). Memory O(clients x range); cost O(iterations x clients x
// range) per round. Not thread-safe, like every Aggregator.
#pragma once

#include <cstdint>
#include <vector>

#include "cohort/aggregation/aggregator.h"
#include "cohort/aggregation/buffered_aggregator.h"

namespace custom {

struct GeometricMedianOptions {
  double eps = 1e-6;
  std::int64_t max_iterations = 100;
  double nu = 1e-8;
  bool weighted = true;
};

class GeometricMedian : public cohort::aggregation::BufferedAggregator {
 public:
  explicit GeometricMedian(GeometricMedianOptions options) : options_(options) {}

  // Iterations the last finish_round() ran (for tests and logs).
  [[nodiscard]] std::int64_t last_iterations() const { return last_iterations_; }

 protected:
  bool combine(std::span<const std::span<const float>> updates,
               std::span<const cohort::ClientId> clients, std::span<const double> weights,
               std::span<float> out) override;

 private:
  GeometricMedianOptions options_;
  std::vector<double> z_, next_;  // reused from round to round
  std::int64_t last_iterations_ = 0;
};

// Registers "geometric_median"; throws cohort::ConfigError for an unknown or out-of-range option.
void add_geometric_median(cohort::aggregation::AggregatorRegistry& registry);

}  // namespace custom
