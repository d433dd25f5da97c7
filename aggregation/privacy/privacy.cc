#include "cohort/aggregation/privacy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cohort/core/error.h"
#include "cohort/core/random.h"

namespace cohort::aggregation {

double clip_l2(std::span<float> x, double bound) {
  if (!(bound > 0) || !std::isfinite(bound)) throw ConfigError("clip bound must be > 0");
  double norm2 = 0;
  for (float v : x) norm2 += static_cast<double>(v) * v;
  const double norm = std::sqrt(norm2);
  if (norm > bound) {
    const double factor = bound / norm;
    for (float& v : x) v = static_cast<float>(v * factor);
  }
  return norm;
}

void add_gaussian_noise(std::span<float> x, double stddev, std::uint64_t seed) {
  if (!(stddev >= 0) || !std::isfinite(stddev)) throw ConfigError("noise stddev must be >= 0");
  if (stddev == 0) return;
  SplitMixRng rng(derive_seed(seed, 0xd9));
  for (float& v : x) v = static_cast<float>(v + stddev * rng.normal());
}

double dp_fedavg_noise_stddev(double noise_multiplier, double clip, double sampling_rate,
                              double total_weight) {
  if (!(noise_multiplier >= 0) || !(clip > 0) || !(sampling_rate > 0 && sampling_rate <= 1) ||
      !(total_weight > 0)) {
    throw ConfigError("dp: need z >= 0, clip > 0, 0 < q <= 1 and total weight > 0");
  }
  return noise_multiplier * clip / (sampling_rate * total_weight);
}

namespace {

std::vector<double> integer_orders() {
  std::vector<double> out;
  for (int a = 2; a <= 256; ++a) out.push_back(a);
  return out;
}

double log_add(double a, double b) {
  if (a == -std::numeric_limits<double>::infinity()) return b;
  if (b == -std::numeric_limits<double>::infinity()) return a;
  const double hi = std::max(a, b), lo = std::min(a, b);
  return hi + std::log1p(std::exp(lo - hi));
}

}  // namespace

RdpAccountant::RdpAccountant() : RdpAccountant(integer_orders()) {}

RdpAccountant::RdpAccountant(std::vector<double> orders) : orders_(std::move(orders)) {
  if (orders_.empty()) throw ConfigError("rdp accountant: no orders");
  for (double a : orders_) {
    if (!(a > 1) || !std::isfinite(a)) throw ConfigError("rdp accountant: orders must be > 1");
  }
  rdp_.assign(orders_.size(), 0.0);
}

double RdpAccountant::rdp_of_step(double q, double z, double alpha) {
  if (q == 0) return 0;
  if (q == 1) return alpha / (2 * z * z);  // (8.5)
  if (alpha != std::floor(alpha)) return std::numeric_limits<double>::infinity();
  // (8.6) in log space: log C(alpha, k) + (alpha - k) log(1 - q) + k log q + (k^2 - k) / (2 z^2).
  const auto n = static_cast<long>(alpha);
  const double log_q = std::log(q), log_1mq = std::log1p(-q);
  double log_sum = -std::numeric_limits<double>::infinity();
  for (long k = 0; k <= n; ++k) {
    const double kd = static_cast<double>(k);
    const double log_binom =
        std::lgamma(alpha + 1) - std::lgamma(kd + 1) - std::lgamma(alpha - kd + 1);
    const double term =
        log_binom + (alpha - kd) * log_1mq + kd * log_q + (kd * kd - kd) / (2 * z * z);
    log_sum = log_add(log_sum, term);
  }
  return log_sum / (alpha - 1);
}

void RdpAccountant::add_steps(double q, double z, std::uint64_t steps) {
  if (!(q >= 0 && q <= 1)) throw ConfigError("rdp accountant: sampling rate must be in [0, 1]");
  if (!(z > 0) || !std::isfinite(z))
    throw ConfigError("rdp accountant: noise multiplier must be > 0");
  for (std::size_t i = 0; i < orders_.size(); ++i) {
    rdp_[i] += static_cast<double>(steps) * rdp_of_step(q, z, orders_[i]);
  }
}

RdpAccountant::Result RdpAccountant::epsilon(double delta, Conversion conversion) const {
  if (!(delta > 0 && delta < 1)) throw ConfigError("rdp accountant: delta must be in (0, 1)");
  Result best{std::numeric_limits<double>::infinity(), 0};
  for (std::size_t i = 0; i < orders_.size(); ++i) {
    const double a = orders_[i];
    double eps;
    if (conversion == Conversion::kClassic) {
      eps = rdp_[i] + std::log(1 / delta) / (a - 1);  // (8.8)
    } else {
      eps = rdp_[i] + std::log((a - 1) / a) - (std::log(delta) + std::log(a)) / (a - 1);
    }
    if (eps < best.epsilon) best = {std::max(eps, 0.0), a};
  }
  return best;
}

}  // namespace cohort::aggregation
