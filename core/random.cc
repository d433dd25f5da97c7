#include "cohort/core/random.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cohort/core/error.h"

namespace cohort {
namespace {

std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(std::uint64_t seed) {
  // SplitMix64 never yields four zero words in a row, so the xoshiro state is never all zero.
  for (auto& word : s_) word = splitmix64(seed);
}

Rng Rng::for_stream(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t mix = seed ^ 0x6a09e667f3bcc909ULL;
  const std::uint64_t a = splitmix64(mix);
  std::uint64_t s = stream ^ 0xbb67ae8584caa73bULL;
  return Rng(a ^ rotl(splitmix64(s), 17));
}

std::uint64_t Rng::next() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

std::uint64_t Rng::below(std::uint64_t n) {
  COHORT_CHECK(n > 0) << "Rng::below(0)";
  return random_detail::below(*this, n);
}

double Rng::normal() {
  for (;;) {
    const double u = 2.0 * uniform() - 1.0;
    const double v = 2.0 * uniform() - 1.0;
    const double s = u * u + v * v;
    if (s > 0.0 && s < 1.0) return u * std::sqrt(-2.0 * std::log(s) / s);
  }
}

double Rng::log_gamma_variate(double shape) {
  COHORT_CHECK(shape > 0.0) << "gamma shape " << shape;
  if (shape < 1.0) {
    // G(a) = G(a + 1) * U^(1/a); in logs so that U^(1/a) cannot underflow for tiny a.
    double u = uniform();
    while (u == 0.0) u = uniform();
    return log_gamma_variate(shape + 1.0) + std::log(u) / shape;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0;
    double v = 0;
    do {
      x = normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = uniform();
    if (u < 1.0 - 0.0331 * (x * x) * (x * x)) return std::log(d * v);
    if (u > 0.0 && std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) {
      return std::log(d * v);
    }
  }
}

std::vector<double> Rng::dirichlet(std::size_t n, double alpha, const std::vector<bool>& eligible) {
  COHORT_CHECK(alpha > 0.0) << "dirichlet alpha " << alpha;
  COHORT_CHECK(eligible.empty() || eligible.size() == n) << "eligible mask size";
  std::vector<double> logs(n);
  for (auto& l : logs) l = log_gamma_variate(alpha);
  auto is_eligible = [&](std::size_t i) { return eligible.empty() || eligible[i]; };
  double max_log = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    if (is_eligible(i)) max_log = std::max(max_log, logs[i]);
  }
  COHORT_CHECK(max_log > -std::numeric_limits<double>::infinity()) << "no eligible entry";
  std::vector<double> p(n, 0.0);
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (is_eligible(i)) {
      p[i] = std::exp(logs[i] - max_log);
      sum += p[i];
    }
  }
  for (auto& x : p) x /= sum;
  return p;
}

}  // namespace cohort
