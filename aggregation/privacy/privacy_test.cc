#include "cohort/aggregation/privacy.h"

#include <doctest/doctest.h>

#include <cmath>

#include "cohort/core/error.h"

using namespace cohort::aggregation;

TEST_CASE("clip_l2: inside the bound untouched, outside scaled to the bound") {
  std::vector<float> in{0.3f, -0.4f};
  CHECK(clip_l2(in, 1.0) == doctest::Approx(0.5));
  CHECK(in == std::vector<float>{0.3f, -0.4f});
  std::vector<float> out{3, 4};
  CHECK(clip_l2(out, 2.0) == doctest::Approx(5.0));
  CHECK(out[0] == doctest::Approx(1.2));
  CHECK(out[1] == doctest::Approx(1.6));
  std::vector<float> zero(4, 0.0f);
  CHECK(clip_l2(zero, 1.0) == 0.0);
  CHECK(zero == std::vector<float>(4, 0.0f));
  CHECK_THROWS_AS(clip_l2(in, 0.0), cohort::ConfigError);
}

TEST_CASE("gaussian noise has the configured standard deviation (statistical, seeded)") {
  // N = 10^6 draws, sigma = 0.7, fixed seed. Failure probability of a correct generator < 1e-6:
  // - mean: P(|mean| >= t sigma / sqrt(N)) <= 2 exp(-t^2 / 2) = 3.3e-7 for t = 5.59;
  // - variance: S = sum n_i^2 / sigma^2 ~ chi^2_N; Laurent & Massart (2000):
  //   P(S - N >= 2 sqrt(N x) + 2x) <= e^-x and P(N - S >= 2 sqrt(N x)) <= e^-x, x = ln(6e6):
  //   3.3e-7 for both sides together;
  // - lag-1 correlation (independence): |r| <= 5.59 / sqrt(N) (normal approximation), 3.3e-7.
  const std::size_t n = 1000000;
  const double sigma = 0.7;
  std::vector<float> x(n, 0.0f);
  add_gaussian_noise(x, sigma, 42);
  double sum = 0, sq = 0, lag = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sum += x[i];
    sq += static_cast<double>(x[i]) * x[i];
    if (i > 0) lag += static_cast<double>(x[i]) * x[i - 1];
  }
  const double t = std::sqrt(2 * std::log(6e6));
  CHECK(std::fabs(sum / n) <= t * sigma / std::sqrt(n));
  const double xx = std::log(6e6), s = sq / (sigma * sigma), nn = static_cast<double>(n);
  CHECK(s <= nn + 2 * std::sqrt(nn * xx) + 2 * xx);
  CHECK(s >= nn - 2 * std::sqrt(nn * xx));
  CHECK(std::fabs(lag / sq) <= t / std::sqrt(nn));
  // Same seed, same noise; another seed, other noise; stddev 0 is a no-op.
  std::vector<float> y(n, 0.0f), z(100, 1.0f);
  add_gaussian_noise(y, sigma, 42);
  CHECK(y == x);
  add_gaussian_noise(y, sigma, 43);
  CHECK(y != x);
  add_gaussian_noise(z, 0.0, 1);
  CHECK(z == std::vector<float>(100, 1.0f));
  CHECK_THROWS_AS(add_gaussian_noise(z, -1.0, 1), cohort::ConfigError);
}

TEST_CASE("DP-FedAvg (8.3): z = 0, identical clipped deltas, W = N, m = qN gives x + Delta") {
  const double q = 0.1, total_weight = 50;  // N = 50 clients, weight 1 each; m = qN = 5 sampled
  CHECK(dp_fedavg_noise_stddev(1.1, 1.0, 0.01, 1000) == doctest::Approx(0.11));
  const std::vector<float> delta{0.1f, -0.2f, 0.05f};
  std::vector<double> sum(3, 0.0);
  for (int k = 0; k < 5; ++k) {
    auto d = delta;
    clip_l2(d, 1.0);
    for (int j = 0; j < 3; ++j) sum[j] += d[j];
  }
  std::vector<float> update(3);
  for (int j = 0; j < 3; ++j) update[j] = static_cast<float>(sum[j] / (q * total_weight));
  add_gaussian_noise(update, dp_fedavg_noise_stddev(0.0, 1.0, q, total_weight), 1);
  for (int j = 0; j < 3; ++j) CHECK(update[j] == doctest::Approx(delta[j]));
}

TEST_CASE("RDP accountant: the docs/ALGORITHMS.md 8.4 test vectors") {
  using C = RdpAccountant::Conversion;
  SUBCASE("q = 1, z = 1, T = 1, delta = 1e-5") {
    RdpAccountant acc;  // integer orders 2..256
    acc.add_steps(1.0, 1.0, 1);
    auto r = acc.epsilon(1e-5);
    CHECK(r.epsilon == doctest::Approx(5.3026).epsilon(1e-5));
    CHECK(r.order == 6);
    r = acc.epsilon(1e-5, C::kTight);
    CHECK(r.epsilon == doctest::Approx(4.7527).epsilon(1e-5));
    CHECK(r.order == 5);
    std::vector<double> opacus;  // {1 + x/10 : x = 1..99} U {12..63}
    for (int x = 1; x <= 99; ++x) opacus.push_back(1 + x / 10.0);
    for (int a = 12; a <= 63; ++a) opacus.push_back(a);
    RdpAccountant frac(opacus);
    frac.add_steps(1.0, 1.0, 1);
    r = frac.epsilon(1e-5);
    CHECK(r.epsilon == doctest::Approx(5.2985).epsilon(1e-5));
    CHECK(r.order == doctest::Approx(5.8));
  }
  SUBCASE("q = 256/60000, z = 1.1, T = 14062") {
    RdpAccountant acc;
    acc.add_steps(256.0 / 60000, 1.1, 14062);
    auto r = acc.epsilon(1e-5);
    CHECK(r.epsilon == doctest::Approx(3.009).epsilon(2e-4));
    CHECK(r.order == 9);
    r = acc.epsilon(1e-5, C::kTight);
    CHECK(r.epsilon == doctest::Approx(2.5970).epsilon(2e-5));
    CHECK(r.order == 8);
  }
  SUBCASE("q = 0.01, z = 1.1, T = 10000") {
    RdpAccountant acc;
    acc.add_steps(0.01, 1.1, 10000);
    auto r = acc.epsilon(1e-5);
    CHECK(r.epsilon == doctest::Approx(6.280).epsilon(1e-4));
    CHECK(r.order == 5);
    CHECK(acc.epsilon(1e-5, C::kTight).epsilon == doctest::Approx(5.6543).epsilon(2e-5));
  }
  SUBCASE("TF-Privacy cross-check of the tight conversion on its order grid") {
    // Fractional orders are skipped for q < 1 (the argmin is an integer order here).
    std::vector<double> grid{1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5};
    for (int a = 5; a <= 63; ++a) grid.push_back(a);
    for (double a : {128.0, 256.0, 512.0}) grid.push_back(a);
    RdpAccountant a(grid), b(grid);
    a.add_steps(150.0 / 60000, 1.3, 15 * 60000 / 150);
    auto r = a.epsilon(1e-5, C::kTight);
    CHECK(r.epsilon == doctest::Approx(0.72422).epsilon(2e-5));
    CHECK(r.order == 19);
    b.add_steps(100.0 / 100000, 1.0, 30 * 100000 / 100);
    r = b.epsilon(1e-7, C::kTight);
    CHECK(r.epsilon == doctest::Approx(1.41550).epsilon(2e-5));
    CHECK(r.order == 13);
  }
  SUBCASE("composition adds, and bad arguments are refused") {
    RdpAccountant once, twice;
    once.add_steps(0.01, 1.1, 20000);
    twice.add_steps(0.01, 1.1, 10000);
    twice.add_steps(0.01, 1.1, 10000);
    CHECK(once.epsilon(1e-5).epsilon == doctest::Approx(twice.epsilon(1e-5).epsilon));
    CHECK(RdpAccountant::rdp_of_step(0.5, 1.0, 2.5) == INFINITY);
    CHECK_THROWS_AS(once.add_steps(1.5, 1.0, 1), cohort::ConfigError);
    CHECK_THROWS_AS(once.add_steps(0.5, 0.0, 1), cohort::ConfigError);
    CHECK_THROWS_AS((void)once.epsilon(0.0), cohort::ConfigError);
    CHECK_THROWS_AS(RdpAccountant(std::vector<double>{1.0}), cohort::ConfigError);
  }
}
