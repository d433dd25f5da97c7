#include <doctest/doctest.h>

#include <cmath>

#include "cohort/aggregation/registries.h"
#include "cohort/core/error.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::TestRng;

namespace {

std::unique_ptr<Compressor> make_qsgd(std::int64_t s, std::int64_t bucket) {
  static const auto reg = cohort::builtin_registries();
  return reg.compressors.create(
      "qsgd", cohort::ConfigSection("compressor", {{"s", s}, {"bucket_size", bucket}}));
}

// The three kinds of vector docs/ALGORITHMS.md 7.2 checked: Gaussian, equal magnitude, 10-sparse.
std::vector<float> test_vector(int kind, std::size_t d) {
  TestRng rng(100 + kind);
  std::vector<float> v(d, 0.0f);
  for (std::size_t j = 0; j < d; ++j) {
    if (kind == 0) v[j] = static_cast<float>(rng.normal());
    if (kind == 1) v[j] = rng.uniform() < 0.5 ? -0.25f : 0.25f;
    if (kind == 2 && j % (d / 10) == 3) v[j] = static_cast<float>(rng.normal());
  }
  return v;
}

double norm2(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

// p_j = r_j - floor(r_j), r_j = s |v_j| / ||v||, with the norm rounded to float as the encoder
// does.
std::vector<double> probabilities(const std::vector<float>& v, double s) {
  const double norm = static_cast<float>(std::sqrt(norm2(v)));
  std::vector<double> p;
  for (float x : v) {
    const double r = s * std::fabs(x) / norm;
    p.push_back(r - std::floor(r));
  }
  return p;
}

}  // namespace

TEST_CASE("qsgd: the exact variance is within Lemma 3.1's bound (deterministic, 7.2 (i))") {
  const std::size_t d = 1000;
  const double expected_bound[] = {31.62, 7.906, 2.108, 0.01538};  // x ||v||^2, docs/ALGORITHMS.md
  int i = 0;
  for (double s : {1.0, 4.0, 15.0, 255.0}) {
    const double bound = std::min(d / (s * s), std::sqrt(static_cast<double>(d)) / s);
    CHECK(bound == doctest::Approx(expected_bound[i++]).epsilon(1e-3));
    for (int kind = 0; kind < 3; ++kind) {
      const auto v = test_vector(kind, d);
      double var = 0;
      for (double p : probabilities(v, s)) var += p * (1 - p);
      var *= norm2(v) / (s * s);
      CHECK(var <= bound * norm2(v));
    }
  }
}

TEST_CASE("qsgd is unbiased and has its exact variance (Monte Carlo, 7.2 (ii))") {
  // N = 10^4 draws, one bucket (the whole vector, so the formulas' ||v|| is the scale).
  // Mean: one draw of coordinate j spans ||v||/s, so by Hoeffding
  // P(|mean_j - v_j| >= 3.6 ||v|| / (s sqrt N)) <= 2 exp(-2 * 3.6^2) = 1.1e-11; over 1000
  // coordinates and 12 configurations the test fails with probability < 1.3e-7.
  // Squared error: its sample mean is within 6 sigma of the exact variance, sigma =
  // (||v||^2 / s^2) sqrt(sum_j p_j (1 - p_j) (1 - 2 p_j)^2 / N) (normal approximation of a sum of
  // 10^4 bounded terms: 2e-9 per configuration), plus 1e-6 relative for float rounding.
  const std::size_t d = 1000;
  const int n = 10000;
  for (std::int64_t s : {1, 4, 15, 255}) {
    auto q = make_qsgd(s, 0);
    CHECK(q->is_unbiased());
    for (int kind = 0; kind < 3; ++kind) {
      CAPTURE(s);
      CAPTURE(kind);
      const auto v = test_vector(kind, d);
      const double nv2 = norm2(v), nv = std::sqrt(nv2);
      std::vector<double> mean(d, 0.0);
      double sq = 0;
      std::vector<std::byte> bytes;
      std::vector<float> y(d);
      for (int t = 0; t < n; ++t) {
        q->encode(v, nullptr, compression_seed(7, t, kind), bytes);
        q->decode(bytes, y);
        double e = 0;
        for (std::size_t j = 0; j < d; ++j) {
          mean[j] += y[j];
          const double diff = static_cast<double>(y[j]) - v[j];
          e += diff * diff;
        }
        sq += e / n;
      }
      const double tol = 3.6 * nv / (static_cast<double>(s) * std::sqrt(n));
      double worst = 0;
      for (std::size_t j = 0; j < d; ++j) worst = std::max(worst, std::fabs(mean[j] / n - v[j]));
      CHECK(worst <= tol);
      const auto p = probabilities(v, static_cast<double>(s));
      double var = 0, spread = 0;
      for (double pj : p) {
        var += pj * (1 - pj);
        spread += pj * (1 - pj) * (1 - 2 * pj) * (1 - 2 * pj);
      }
      const double scale = nv2 / (static_cast<double>(s) * s);
      var *= scale;
      const double sigma = scale * std::sqrt(spread / n);
      CHECK(std::fabs(sq - var) <= 6 * sigma + 1e-6 * var);
    }
  }
}

TEST_CASE("qsgd: wire size, zero vector, bad levels refused") {
  auto q = make_qsgd(255, 512);
  const auto v = test_vector(0, 10000);
  std::vector<std::byte> bytes;
  q->encode(v, nullptr, 1, bytes);
  // 8 header + 4 bucket size + 20 scales * 4 + 10000 * 9 bits.
  CHECK(bytes.size() == 12 + 80 + 11250);
  CHECK(bytes.size() * 3 < 4 * v.size());
  auto q1 = make_qsgd(1, 0);
  q1->encode(v, nullptr, 1, bytes);
  CHECK(bytes.size() == 12 + 4 + 2500);  // 2 bits per element

  const std::vector<float> zero(100, 0.0f);
  q->encode(zero, nullptr, 1, bytes);
  std::vector<float> y(100, 1.0f);
  q->decode(bytes, y);
  for (float x : y) CHECK(x == 0.0f);

  // A level above s: s = 4 packs a sign bit and 3 level bits per element; write level 7.
  auto q4 = make_qsgd(4, 0);
  q4->encode(std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}, nullptr, 1, bytes);
  REQUIRE(bytes.size() == 8 + 4 + 4 + 2);
  bytes[16] = std::byte{0x0e};
  std::vector<float> out(4);
  CHECK_THROWS_AS(q4->decode(bytes, out), cohort::ProtocolError);
  CHECK_THROWS_AS(make_qsgd(0, 0), cohort::ConfigError);
  CHECK_THROWS_AS(make_qsgd(40000, 0), cohort::ConfigError);
}
