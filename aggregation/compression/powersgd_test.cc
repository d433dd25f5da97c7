#include "cohort/aggregation/powersgd.h"

#include <doctest/doctest.h>

#include <cmath>

#include "cohort/aggregation/error_feedback.h"
#include "cohort/aggregation/registries.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::TestRng;

namespace {

// A row-major a x b matrix of rank exactly `rank` (product of random a x rank and rank x b
// factors), flattened, with the first `d` entries kept.
std::vector<float> low_rank(std::size_t a, std::size_t b, std::size_t rank, std::uint64_t seed) {
  TestRng rng(seed);
  std::vector<double> u(a * rank), v(rank * b);
  for (auto& x : u) x = rng.normal();
  for (auto& x : v) x = rng.normal();
  std::vector<float> m(a * b);
  for (std::size_t i = 0; i < a; ++i) {
    for (std::size_t j = 0; j < b; ++j) {
      double s = 0;
      for (std::size_t c = 0; c < rank; ++c) s += u[i * rank + c] * v[c * b + j];
      m[i * b + j] = static_cast<float>(s);
    }
  }
  return m;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, n = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    e += static_cast<double>(got[i] - want[i]) * (got[i] - want[i]);
    n += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(e / n);
}

}  // namespace

TEST_CASE("powersgd views a flat update as a x b, b = ceil(sqrt(d)) or cols, zero-padded") {
  CHECK(powersgd_shape(12, 0).rows == 3);
  CHECK(powersgd_shape(12, 0).cols == 4);
  CHECK(powersgd_shape(10, 4).rows == 3);  // 2 padding zeros
  CHECK(powersgd_shape(1000, 0).cols == 32);
  CHECK(powersgd_shape(1000, 0).rows == 32);
  CHECK(powersgd_shape(5, 100).cols == 5);
  CHECK(powersgd_shape(0, 0).rows == 0);
}

TEST_CASE("powersgd reconstructs a rank-r input to 1e-3, also at rank r - 1 (7.4)") {
  TestRng shapes(21);
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t r = 1 + shapes.next() % 4;
    const std::size_t a = 8 + shapes.next() % 60, b = 8 + shapes.next() % 60;
    const std::size_t true_rank = (trial % 2 == 0 || r == 1) ? r : r - 1;
    CAPTURE(a);
    CAPTURE(b);
    CAPTURE(r);
    CAPTURE(true_rank);
    const auto m = low_rank(a, b, true_rank, 1000 + trial);
    PowerSgd c(r, b);
    auto state = c.make_state(m.size());
    std::vector<std::byte> bytes;
    c.encode(m, state.get(), 5, bytes);
    CHECK(bytes.size() == 17 + 4 * r * (a + b));
    std::vector<float> y(m.size());
    c.decode(bytes, y);
    CHECK(rel_error(y, m) <= 1e-3);
    // Warm start: the next step, from the stored Q, is exact too.
    c.encode(m, state.get(), 6, bytes);
    c.decode(bytes, y);
    CHECK(rel_error(y, m) <= 1e-3);
  }
}

TEST_CASE("powersgd with error feedback: residual ~ 0 for a rank-r input") {
  const auto m = low_rank(40, 30, 2, 9);
  ErrorFeedback ef(std::make_unique<PowerSgd>(2, 30));
  auto state = ef.make_state(m.size());
  std::vector<std::byte> bytes;
  ef.encode(m, state.get(), 1, bytes);
  const auto& e = dynamic_cast<ErrorFeedback::State&>(*state).residual();
  double en = 0, mn = 0;
  for (std::size_t i = 0; i < m.size(); ++i) {
    en += static_cast<double>(e[i]) * e[i];
    mn += static_cast<double>(m[i]) * m[i];
  }
  CHECK(std::sqrt(en / mn) <= 1e-3);
}

TEST_CASE("powersgd sends dense floats when the factors would not be smaller") {
  PowerSgd c(4, 0);  // d = 30: 6 x 5 view, 4 * 11 = 44 >= 30
  std::vector<float> x(30);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 7.5f;
  auto state = c.make_state(30);
  std::vector<std::byte> bytes;
  c.encode(x, state.get(), 0, bytes);
  CHECK(bytes.size() == 9 + 4 * 30);
  std::vector<float> y(30);
  c.decode(bytes, y);
  CHECK(y == x);
}

TEST_CASE("orthonormalize_columns: orthonormal output, dependent and zero columns handled") {
  TestRng rng(3);
  const std::size_t rows = 50, cols = 4;
  std::vector<double> p(rows * cols);
  for (auto& v : p) v = rng.normal();
  for (std::size_t i = 0; i < rows; ++i) {
    p[i * cols + 2] = p[i * cols + 0] + 2 * p[i * cols + 1];  // dependent
    p[i * cols + 3] = 0;                                      // zero
  }
  orthonormalize_columns(p, rows, cols);
  for (std::size_t a = 0; a < cols; ++a) {
    for (std::size_t b = 0; b < cols; ++b) {
      double s = 0;
      for (std::size_t i = 0; i < rows; ++i) s += p[i * cols + a] * p[i * cols + b];
      if (a == 3 || b == 3) {
        CHECK(s == 0.0);
      } else if (a == b) {
        CHECK(s == doctest::Approx(1.0).epsilon(1e-12));
      } else {
        CHECK(std::fabs(s) <= 1e-12);
      }
    }
  }
}
