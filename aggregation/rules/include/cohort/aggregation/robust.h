// Byzantine-robust aggregation rules (docs/ALGORITHMS.md section 2). All are non-streaming (they
// see every update of the round at once, O(clients x range) memory; see BufferedAggregator) and
// unweighted: a client's sample count does not buy it influence. Aggregate updates, not models.
// None of them works under secure aggregation (the server sees only the sum).
//
// Registry names and options (each rule rejects unknown keys with a ConfigError naming them):
//   median                                coordinate-wise median (even m: mean of the middle two)
//   trimmed_mean  beta = 0.2, f = 0       drop floor(beta m) largest and smallest per coordinate;
//                                         beta in [0, 1/2); refuses a round with floor(beta m) < f
//   krum          f = 0                   the input with the lowest Krum score; needs m > 2f + 2
//   multi_krum    f = 0, m = 0            uniform mean of the m lowest-score inputs (ALGORITHMS'
//                                         q); m = 0 means n - f of the n inputs
//   bulyan        f = 0                   El Mhamdi et al.; needs n >= 4f + 3
// The range a shard sees is a slice of the model: scores and distances are over that slice.
#pragma once

#include <vector>

#include "cohort/aggregation/buffered_aggregator.h"

namespace cohort::aggregation {

class CoordinateMedian final : public BufferedAggregator {
 protected:
  bool combine(std::span<const std::span<const float>> updates, std::span<const ClientId> clients,
               std::span<const double> weights, std::span<float> out) override;
};

class TrimmedMean final : public BufferedAggregator {
 public:
  // Throws ConfigError unless 0 <= beta < 1/2, and for f > 0 with beta == 0.
  explicit TrimmedMean(double beta, std::size_t f = 0);
  // The smallest m with floor(beta m) >= f.
  [[nodiscard]] std::size_t min_updates() const override { return min_updates_; }

 protected:
  bool combine(std::span<const std::span<const float>> updates, std::span<const ClientId> clients,
               std::span<const double> weights, std::span<float> out) override;

 private:
  double beta_;
  std::size_t f_;
  std::size_t min_updates_ = 1;
};

// Krum scores (docs/ALGORITHMS.md 2.1-2.2): score(i) = sum of the (m - f - 2) smallest squared
// distances ||u_i - u_j||^2 over j != i (fewer neighbours than 0 count as 0), in double.
[[nodiscard]] std::vector<double> krum_scores(std::span<const std::span<const float>> updates,
                                              std::size_t f);

// Krum (keep = 1) and Multi-Krum (keep = q, 0 meaning n - f). Ties go to the lower client id.
class Krum final : public BufferedAggregator {
 public:
  explicit Krum(std::size_t f, std::size_t keep = 1) : f_(f), keep_(keep) {}
  [[nodiscard]] std::size_t min_updates() const override { return 2 * f_ + 3; }
  // The clients whose updates the last successful finish_round() averaged, by increasing score.
  [[nodiscard]] const std::vector<ClientId>& selected() const { return selected_; }

 protected:
  bool combine(std::span<const std::span<const float>> updates, std::span<const ClientId> clients,
               std::span<const double> weights, std::span<float> out) override;

 private:
  std::size_t f_, keep_;
  std::vector<ClientId> selected_;
};

// Bulyan: theta = n - 2f inputs chosen by repeated Krum (each winner removed, f fixed), then per
// coordinate the mean of the theta - 2f chosen values closest to their median.
class Bulyan final : public BufferedAggregator {
 public:
  explicit Bulyan(std::size_t f) : f_(f) {}
  [[nodiscard]] std::size_t min_updates() const override { return 4 * f_ + 3; }
  [[nodiscard]] const std::vector<ClientId>& selected() const { return selected_; }

 protected:
  bool combine(std::span<const std::span<const float>> updates, std::span<const ClientId> clients,
               std::span<const double> weights, std::span<float> out) override;

 private:
  std::size_t f_;
  std::vector<ClientId> selected_;
};

}  // namespace cohort::aggregation
