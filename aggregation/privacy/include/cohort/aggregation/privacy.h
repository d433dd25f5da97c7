// Client-level differential privacy (docs/ALGORITHMS.md 8.3, DP-FedAvg) and its accounting (8.4).
//
// Mechanism: every client's update is clipped to L2 norm S (clip_l2), the server sums or averages
// them and adds Gaussian noise of standard deviation z S / (q W) to the average
// (dp_fedavg_noise_stddev; with uniform weights sigma = z S / m). Noise comes from a seeded
// generator so that a run is reproducible; it is not a cryptographic generator: the noise is
// secret only while its seed is, so in production seed it from a CSPRNG (e.g. secure
// aggregation's random_seed()) and never log it.
//
// Accounting: RdpAccountant composes Poisson-subsampled Gaussian mechanisms (rate q, noise
// multiplier z) with Renyi DP and converts to (epsilon, delta). Sampling: the bound assumes each
// client joins each round independently with probability q (the "poisson" client selector), not
// a fixed-size cohort.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace cohort::aggregation {

// Scales x to L2 norm at most `bound` (x <- x min(1, bound / ||x||), norm in double); returns the
// norm before clipping. Throws ConfigError unless bound > 0. A zero vector stays zero.
double clip_l2(std::span<float> x, double bound);

// x[i] += stddev * N(0, 1), i.i.d., drawn from `seed` (the same seed gives the same noise).
// Throws ConfigError unless stddev >= 0 and finite.
void add_gaussian_noise(std::span<float> x, double stddev, std::uint64_t seed);

// sigma of (8.4) for the fixed-denominator estimator (8.3): z S / (q W), W the total weight of all
// clients (N with uniform weights). Throws ConfigError unless z >= 0, S > 0, 0 < q <= 1, W > 0.
double dp_fedavg_noise_stddev(double noise_multiplier, double clip, double sampling_rate,
                              double total_weight);

// Renyi-DP accountant (Mironov 2017; Mironov, Talwar, Zhang 2019).
//   (8.5) no sampling (q = 1): eps_alpha = alpha / (2 z^2), any order alpha > 1
//   (8.6) q < 1, integer alpha >= 2: eps_alpha = log(sum_k C(alpha,k) (1-q)^(alpha-k) q^k
//         exp((k^2 - k) / (2 z^2))) / (alpha - 1), evaluated in log space
//   (8.7) steps compose additively per order
// Fractional orders with q < 1 need the general series (not implemented): they are skipped,
// which can only make the reported epsilon larger (safe). Not thread-safe.
class RdpAccountant {
 public:
  enum class Conversion {
    // (8.8) eps = min_alpha [ eps_alpha + log(1/delta) / (alpha - 1) ]   (Mironov 2017)
    kClassic,
    // eps = min_alpha [ eps_alpha + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha - 1) ]
    // (Balle et al. 2020; Google's dp_accounting): about 10-15% smaller, still a valid bound.
    kTight,
  };
  struct Result {
    double epsilon = 0;
    double order = 0;  // the alpha that attained the minimum
  };

  // Integer orders 2..256.
  RdpAccountant();
  // REQUIRES every order > 1 (ConfigError otherwise).
  explicit RdpAccountant(std::vector<double> orders);

  // Composes `steps` rounds of the Poisson-subsampled Gaussian mechanism. Throws ConfigError
  // unless 0 <= q <= 1 and z > 0.
  void add_steps(double sampling_rate, double noise_multiplier, std::uint64_t steps);
  // epsilon for `delta` (0 < delta < 1, ConfigError otherwise). Cohort prints kClassic: it is the
  // formula (8.8) the literature's tables use; kTight is there for comparison with TF-Privacy.
  [[nodiscard]] Result epsilon(double delta, Conversion conversion = Conversion::kClassic) const;
  [[nodiscard]] const std::vector<double>& orders() const { return orders_; }
  // Accumulated eps_alpha per order (+inf where an order is skipped).
  [[nodiscard]] const std::vector<double>& rdp() const { return rdp_; }

  // eps_alpha of one step of the subsampled Gaussian mechanism; +inf when alpha is fractional and
  // q < 1.
  [[nodiscard]] static double rdp_of_step(double sampling_rate, double noise_multiplier,
                                          double order);

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
};

}  // namespace cohort::aggregation
