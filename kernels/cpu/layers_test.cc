// Finite-difference gradient checks of every CPU layer kernel, plus agreement of the threaded
// and single-threaded paths.
//
// All layers here are piecewise linear, so central differences are exact up to float rounding
// as long as no kink (ReLU at 0, a max-pool tie) lies within h of an input; the inputs are built
// to keep kinks at least 0.05 away, and h = 1e-2. The probe loss is L = sum_i r_i * y_i (r fixed,
// summed in double), so dL/dy = r. Tolerance: |numeric - analytic| <= 2e-3 + 1e-2 * |analytic|,
// well above the ~1e-4 rounding noise of a float forward pass and far below any real bug.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../parallel.h"
#include "cohort/core/thread_pool.h"
#include "gemm.h"
#include "layers.h"

namespace cohort::kernels::cpu {
namespace {

constexpr float kH = 1e-2f;

std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                 float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Values with |v| >= 0.05 and pairwise gaps >= 0.05: a permutation of a spaced grid.
std::vector<float> spaced_vector(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = 0.1f * (static_cast<float>(i) - static_cast<float>(n) / 2.0f) + 0.05f;
  }
  std::mt19937 gen(seed);
  std::shuffle(v.begin(), v.end(), gen);
  return v;
}

double probe(const std::vector<float>& y, const std::vector<float>& r) {
  double sum = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(y[i]) * r[i];
  return sum;
}

// Checks analytic against central differences of loss() for every entry of `values`.
void check_gradient(const char* what, std::vector<float>& values, const std::vector<float>& analytic,
                    const std::function<double()>& loss) {
  REQUIRE(values.size() == analytic.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float saved = values[i];
    values[i] = saved + kH;
    const double up = loss();
    values[i] = saved - kH;
    const double down = loss();
    values[i] = saved;
    const double numeric = (up - down) / (2.0 * kH);
    INFO(what << "[" << i << "] numeric=" << numeric << " analytic=" << analytic[i]);
    CHECK(std::abs(numeric - analytic[i]) <= 2e-3 + 1e-2 * std::abs(analytic[i]));
  }
}

TEST_CASE("gemm matches a naive product for every operand layout and edge size") {
  for (const auto [m, n, k] : {std::array<std::size_t, 3>{1, 1, 1}, {7, 17, 5}, {13, 33, 300},
                               {64, 10, 128}, {100, 40, 600}}) {
    const auto a = random_vector(m * k, 1), b = random_vector(k * n, 2);
    std::vector<double> want(m * n, 0.0);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t p = 0; p < k; ++p) want[i * n + j] += double(a[i * k + p]) * b[p * n + j];
    // The same matrices stored transposed.
    std::vector<float> at(m * k), bt(k * n);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t p = 0; p < k; ++p) at[p * m + i] = a[i * k + p];
    for (std::size_t p = 0; p < k; ++p)
      for (std::size_t j = 0; j < n; ++j) bt[j * k + p] = b[p * n + j];
    const GemmOperand as[] = {row_major(a.data(), k), transposed(at.data(), m)};
    const GemmOperand bs[] = {row_major(b.data(), n), transposed(bt.data(), k)};
    for (const auto& ao : as) {
      for (const auto& bo : bs) {
        std::vector<float> c(m * n, 1.0f);
        gemm(m, n, k, ao, bo, c.data(), n, /*accumulate=*/true);
        for (std::size_t i = 0; i < m * n; ++i) {
          REQUIRE(c[i] == doctest::Approx(want[i] + 1.0).epsilon(1e-4).scale(k));
        }
        gemm(m, n, k, ao, bo, c.data(), n, /*accumulate=*/false);
        for (std::size_t i = 0; i < m * n; ++i) {
          REQUIRE(c[i] == doctest::Approx(want[i]).epsilon(1e-4).scale(k));
        }
      }
    }
  }
}

TEST_CASE("linear gradients match finite differences") {
  const std::size_t n = 3, in = 5, out = 4;
  auto x = random_vector(n * in, 1), w = random_vector(out * in, 2), b = random_vector(out, 3);
  const auto r = random_vector(n * out, 4);
  Workspace ws;
  Exec exec{nullptr, &ws};
  std::vector<float> y(n * out), dy = r, dw(out * in), db(out), dx(n * in);
  const auto loss = [&] {
    linear_forward(exec, x.data(), w.data(), b.data(), y.data(), n, in, out, false);
    return probe(y, r);
  };
  linear_backward(exec, x.data(), w.data(), dy.data(), nullptr, dw.data(), db.data(), dx.data(), n,
                  in, out);
  check_gradient("dx", x, dx, loss);
  check_gradient("dw", w, dw, loss);
  check_gradient("db", b, db, loss);
}

TEST_CASE("linear with fused relu equals linear then relu") {
  const std::size_t n = 4, in = 6, out = 5;
  const auto x = random_vector(n * in, 5), w = random_vector(out * in, 6), b = random_vector(out, 7);
  const auto r = random_vector(n * out, 8);
  Workspace ws;
  Exec exec{nullptr, &ws};
  std::vector<float> fused(n * out), plain(n * out), relu(n * out);
  linear_forward(exec, x.data(), w.data(), b.data(), fused.data(), n, in, out, true);
  linear_forward(exec, x.data(), w.data(), b.data(), plain.data(), n, in, out, false);
  relu_forward(plain.data(), relu.data(), n * out);
  CHECK(fused == relu);
  std::vector<float> dy1 = r, dy2(n * out), dw1(out * in), dw2(out * in), db1(out), db2(out),
                     dx1(n * in), dx2(n * in);
  linear_backward(exec, x.data(), w.data(), dy1.data(), fused.data(), dw1.data(), db1.data(),
                  dx1.data(), n, in, out);
  relu_backward(relu.data(), r.data(), dy2.data(), n * out);
  linear_backward(exec, x.data(), w.data(), dy2.data(), nullptr, dw2.data(), db2.data(),
                  dx2.data(), n, in, out);
  CHECK(dw1 == dw2);
  CHECK(db1 == db2);
  CHECK(dx1 == dx2);
}

TEST_CASE("relu gradient matches finite differences away from zero") {
  auto x = spaced_vector(24, 9);
  const auto r = random_vector(24, 10);
  std::vector<float> y(24), dx(24);
  const auto loss = [&] {
    relu_forward(x.data(), y.data(), x.size());
    return probe(y, r);
  };
  loss();
  relu_backward(y.data(), r.data(), dx.data(), x.size());
  check_gradient("dx", x, dx, loss);
}

void check_conv(std::size_t n, const ConvGeometry& g, ThreadPool* pool) {
  CAPTURE(g.kernel);
  CAPTURE(g.stride);
  CAPTURE(g.padding);
  auto x = random_vector(n * g.in_size(), 11), w = random_vector(g.out_channels * g.patch(), 12);
  auto b = random_vector(g.out_channels, 13);
  const auto r = random_vector(n * g.out_size(), 14);
  Workspace ws(pool != nullptr ? pool->size() : 1);
  Exec exec{pool, &ws};
  std::vector<float> y(n * g.out_size());
  // Direct convolution as the reference for the forward pass.
  conv2d_forward(exec, x.data(), w.data(), b.data(), y.data(), n, g, false);
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t co = 0; co < g.out_channels; ++co) {
      for (std::size_t oy = 0; oy < g.out_height; ++oy) {
        for (std::size_t ox = 0; ox < g.out_width; ++ox) {
          double want = b[co];
          for (std::size_t ci = 0; ci < g.in_channels; ++ci) {
            for (std::size_t ky = 0; ky < g.kernel; ++ky) {
              for (std::size_t kx = 0; kx < g.kernel; ++kx) {
                const auto iy = static_cast<long>(oy * g.stride + ky) - static_cast<long>(g.padding);
                const auto ix = static_cast<long>(ox * g.stride + kx) - static_cast<long>(g.padding);
                if (iy < 0 || ix < 0 || iy >= long(g.height) || ix >= long(g.width)) continue;
                want += double(w[((co * g.in_channels + ci) * g.kernel + ky) * g.kernel + kx]) *
                        x[((s * g.in_channels + ci) * g.height + iy) * g.width + ix];
              }
            }
          }
          REQUIRE(y[((s * g.out_channels + co) * g.out_height + oy) * g.out_width + ox] ==
                  doctest::Approx(want).epsilon(1e-5));
        }
      }
    }
  }
  std::vector<float> dw(w.size()), db(b.size()), dx(x.size());
  conv2d_backward(exec, x.data(), w.data(), r.data(), nullptr, dw.data(), db.data(), dx.data(), n,
                  g);
  const auto loss = [&] {
    conv2d_forward(exec, x.data(), w.data(), b.data(), y.data(), n, g, false);
    return probe(y, r);
  };
  check_gradient("dx", x, dx, loss);
  check_gradient("dw", w, dw, loss);
  check_gradient("db", b, db, loss);
}

ConvGeometry geometry(std::size_t cin, std::size_t side, std::size_t cout, std::size_t k,
                      std::size_t stride, std::size_t pad) {
  const std::size_t out = (side + 2 * pad - k) / stride + 1;
  return {cin, side, side, cout, k, stride, pad, out, out};
}

TEST_CASE("conv2d gradients match finite differences, with stride and padding") {
  check_conv(2, geometry(2, 5, 3, 3, 1, 0), nullptr);
  check_conv(2, geometry(2, 5, 3, 3, 2, 1), nullptr);
  check_conv(3, geometry(1, 6, 2, 5, 1, 2), nullptr);
  check_conv(2, geometry(3, 7, 2, 3, 3, 2), nullptr);
}

TEST_CASE("conv2d on two threads matches the direct reference and finite differences") {
  ThreadPool pool(2);
  check_conv(5, geometry(2, 6, 3, 3, 1, 1), &pool);
}

TEST_CASE("conv2d with fused relu equals conv2d then relu") {
  const std::size_t n = 2;
  const ConvGeometry g = geometry(2, 6, 3, 3, 1, 1);
  const auto x = random_vector(n * g.in_size(), 15), w = random_vector(g.out_channels * g.patch(), 16);
  const auto b = random_vector(g.out_channels, 17), r = random_vector(n * g.out_size(), 18);
  Workspace ws;
  Exec exec{nullptr, &ws};
  std::vector<float> fused(n * g.out_size()), plain(fused.size()), relu(fused.size()),
      masked(fused.size());
  conv2d_forward(exec, x.data(), w.data(), b.data(), fused.data(), n, g, true);
  conv2d_forward(exec, x.data(), w.data(), b.data(), plain.data(), n, g, false);
  relu_forward(plain.data(), relu.data(), plain.size());
  CHECK(fused == relu);
  std::vector<float> dw1(w.size()), dw2(w.size()), db1(b.size()), db2(b.size()), dx1(x.size()),
      dx2(x.size());
  conv2d_backward(exec, x.data(), w.data(), r.data(), fused.data(), dw1.data(), db1.data(),
                  dx1.data(), n, g);
  relu_backward(relu.data(), r.data(), masked.data(), r.size());
  conv2d_backward(exec, x.data(), w.data(), masked.data(), nullptr, dw2.data(), db2.data(),
                  dx2.data(), n, g);
  CHECK(dw1 == dw2);
  CHECK(db1 == db2);
  CHECK(dx1 == dx2);
}

void check_pool(std::size_t n, const PoolGeometry& g) {
  CAPTURE(g.kernel);
  CAPTURE(g.stride);
  auto x = spaced_vector(n * g.in_size(), 19);
  const auto r = random_vector(n * g.out_size(), 20);
  Workspace ws;
  Exec exec{nullptr, &ws};
  std::vector<float> y(n * g.out_size()), dx(x.size());
  std::vector<std::int32_t> arg(y.size());
  const auto loss = [&] {
    maxpool2d_forward(exec, x.data(), y.data(), arg.data(), n, g);
    return probe(y, r);
  };
  loss();
  for (std::size_t p = 0; p < n * g.channels; ++p) {  // each output is its window's maximum
    for (std::size_t oy = 0; oy < g.out_height; ++oy) {
      for (std::size_t ox = 0; ox < g.out_width; ++ox) {
        float want = -1e30f;
        for (std::size_t ky = 0; ky < g.kernel; ++ky)
          for (std::size_t kx = 0; kx < g.kernel; ++kx)
            want = std::max(want, x[p * g.height * g.width + (oy * g.stride + ky) * g.width +
                                    ox * g.stride + kx]);
        CHECK(y[(p * g.out_height + oy) * g.out_width + ox] == want);
      }
    }
  }
  maxpool2d_backward(exec, r.data(), arg.data(), dx.data(), n, g);
  check_gradient("dx", x, dx, loss);
}

TEST_CASE("maxpool2d gradients match finite differences") {
  check_pool(2, {3, 6, 6, 2, 2, 3, 3});   // the common 2x2 path
  check_pool(2, {2, 7, 7, 3, 2, 3, 3});   // overlapping windows, generic path
  check_pool(1, {2, 5, 5, 2, 2, 2, 2});   // floor mode drops the last row and column
}

TEST_CASE("dropout with a fixed mask: gradient, scaling and drop rate") {
  const std::size_t count = 40;
  auto x = random_vector(count, 21);
  const auto r = random_vector(count, 22);
  const float p = 0.3f;
  std::vector<float> y(count), mask(count), dx(count);
  const auto loss = [&] {
    dropout_forward(x.data(), y.data(), mask.data(), count, p, /*key=*/1234);
    return probe(y, r);
  };
  loss();
  for (std::size_t i = 0; i < count; ++i) {
    CHECK((mask[i] == 0.0f || mask[i] == doctest::Approx(1.0f / (1.0f - p))));
  }
  dropout_backward(r.data(), mask.data(), dx.data(), count);
  check_gradient("dx", x, dx, loss);

  // Drop rate over many draws: 1e5 Bernoulli(0.3) trials, sd = sqrt(0.21/1e5) = 0.00145; a 6-sigma
  // band (failure probability < 1e-8) is +-0.0087.
  const std::size_t big = 100000;
  std::vector<float> ones(big, 1.0f), out(big), big_mask(big);
  dropout_forward(ones.data(), out.data(), big_mask.data(), big, p, 99);
  std::size_t dropped = 0;
  for (float m : big_mask) dropped += m == 0.0f ? 1 : 0;
  CHECK(std::abs(static_cast<double>(dropped) / big - p) < 0.0087);
}

TEST_CASE("linear on two threads equals one thread") {
  const std::size_t n = 64, in = 70, out = 40;
  const auto x = random_vector(n * in, 23), w = random_vector(out * in, 24), b = random_vector(out, 25);
  const auto r = random_vector(n * out, 26);
  ThreadPool pool(2);
  Workspace ws1, ws2(2);
  Exec serial{nullptr, &ws1}, threaded{&pool, &ws2};
  std::vector<float> y1(n * out), y2(n * out);
  linear_forward(serial, x.data(), w.data(), b.data(), y1.data(), n, in, out, true);
  linear_forward(threaded, x.data(), w.data(), b.data(), y2.data(), n, in, out, true);
  CHECK(y1 == y2);
  std::vector<float> dy1 = r, dy2 = r, dw1(out * in), dw2(out * in), db1(out), db2(out), dx1(n * in),
                     dx2(n * in);
  linear_backward(serial, x.data(), w.data(), dy1.data(), y1.data(), dw1.data(), db1.data(),
                  dx1.data(), n, in, out);
  linear_backward(threaded, x.data(), w.data(), dy2.data(), y2.data(), dw2.data(), db2.data(),
                  dx2.data(), n, in, out);
  CHECK(dw1 == dw2);
  CHECK(db1 == db2);
  CHECK(dx1 == dx2);
}


struct LinearResult {
  std::vector<float> y, dw, db, dx;
  bool operator==(const LinearResult&) const = default;
};

// Forward (with fused ReLU) and backward of one linear layer on `exec`, from fixed inputs.
LinearResult run_linear(Exec& exec, std::size_t n, std::size_t in, std::size_t out) {
  const auto x = random_vector(n * in, 41), w = random_vector(out * in, 42);
  const auto b = random_vector(out, 43);
  LinearResult r{std::vector<float>(n * out), std::vector<float>(out * in), std::vector<float>(out),
                 std::vector<float>(n * in)};
  linear_forward(exec, x.data(), w.data(), b.data(), r.y.data(), n, in, out, true);
  auto dy = random_vector(n * out, 44);
  linear_backward(exec, x.data(), w.data(), dy.data(), r.y.data(), r.dw.data(), r.db.data(),
                  r.dx.data(), n, in, out);
  return r;
}

TEST_CASE("linear layers big enough to split: threaded equals serial, run after run") {
  // The MLP's first two layers at batch 64, and odd sizes (partial panels, strips and groups).
  for (const auto [n, in, out] : {std::array<std::size_t, 3>{64, 784, 256},
                                  {64, 256, 128},
                                  {37, 333, 181},
                                  {100, 129, 170}}) {
    INFO("n=" << n << " in=" << in << " out=" << out);
    Workspace ws1;
    Exec serial{nullptr, &ws1};
    const LinearResult want = run_linear(serial, n, in, out);
    ThreadPool pool(2);
    Workspace ws2(pool.size());
    Exec threaded{&pool, &ws2};
    for (int repeat = 0; repeat < 3; ++repeat) CHECK(run_linear(threaded, n, in, out) == want);
  }
}

TEST_CASE("linear layers from two threads sharing one pool equal serial") {
  const std::size_t n = 64, in = 784, out = 256;
  Workspace ws0;
  Exec serial{nullptr, &ws0};
  const LinearResult want = run_linear(serial, n, in, out);
  ThreadPool pool(2);
  // Concurrent regions: one runs as a fork-join region, the other queues its parts.
  std::vector<LinearResult> got(2 * 4);
  std::vector<std::thread> callers;
  for (std::size_t t = 0; t < 2; ++t) {
    callers.emplace_back([&, t] {
      Workspace ws(pool.size());
      Exec exec{&pool, &ws};
      for (std::size_t i = 0; i < 4; ++i) got[t * 4 + i] = run_linear(exec, n, in, out);
    });
  }
  for (auto& c : callers) c.join();
  for (const LinearResult& r : got) CHECK(r == want);
}

TEST_CASE("parallel_parts runs every part once, nested and after a throw") {
  ThreadPool pool(2);
  for (int repeat = 0; repeat < 200; ++repeat) {
    std::vector<std::atomic<int>> hits(2 * 100);
    detail::parallel_parts(&pool, 2, 1, [&](std::size_t part, std::size_t, std::size_t) {
      // A nested split (the region is taken) goes through the queue.
      detail::parallel_parts(&pool, 100, 1, [&](std::size_t, std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) hits[part * 100 + i]++;
      });
    });
    for (auto& h : hits) REQUIRE(h.load() == 1);
  }
  CHECK_THROWS_AS(detail::parallel_parts(&pool, 2, 1,
                                         [](std::size_t part, std::size_t, std::size_t) {
                                           if (part == 1) throw std::runtime_error("part 1");
                                         }),
                  std::runtime_error);
  std::atomic<int> parts{0};
  detail::parallel_parts(&pool, 2, 1, [&](std::size_t, std::size_t, std::size_t) { parts++; });
  CHECK(parts.load() == 2);
}

}  // namespace
}  // namespace cohort::kernels::cpu
