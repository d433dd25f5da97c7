// The channels-last path (NhwcConv, NHWC max pooling, layout changes) against the NCHW kernels
// of layers.h, which layers_test.cc checks against a direct reference and finite differences;
// then a whole network on that path against finite differences.
#include "nhwc_conv.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cohort/core/thread_pool.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/loss.h"
#include "layers.h"

namespace cohort::kernels::cpu {
namespace {

using Algorithm = NhwcConv::Algorithm;

std::vector<float> random_vector(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

ConvGeometry geometry(std::size_t cin, std::size_t h, std::size_t w, std::size_t cout,
                      std::size_t k, std::size_t pad) {
  return {cin, h, w, cout, k, 1, pad, h + 2 * pad - k + 1, w + 2 * pad - k + 1};
}

std::vector<float> to_nhwc(const std::vector<float>& x, std::size_t n, std::size_t c,
                           std::size_t plane) {
  std::vector<float> y(x.size());
  Exec exec{};
  nchw_to_nhwc(exec, x.data(), y.data(), n, c, plane);
  return y;
}

std::vector<float> to_nchw(const std::vector<float>& x, std::size_t n, std::size_t c,
                           std::size_t plane) {
  std::vector<float> y(x.size());
  Exec exec{};
  nhwc_to_nchw(exec, x.data(), y.data(), n, c, plane);
  return y;
}

// |got - want| <= tol * (1 + max |want|), element by element.
void check_close(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                 double tol) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(static_cast<double>(got[i]) - want[i]) > tol * (1 + scale)) {
      if (bad++ < 5) MESSAGE(what << "[" << i << "] = " << got[i] << ", want " << want[i]);
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.size() << " differ");
}

void check_against_nchw(std::size_t n, const ConvGeometry& g, Algorithm algorithm, bool relu,
                        ThreadPool* pool) {
  CAPTURE(g.in_channels);
  CAPTURE(g.out_channels);
  CAPTURE(g.height);
  CAPTURE(g.width);
  CAPTURE(g.kernel);
  CAPTURE(g.padding);
  CAPTURE(relu);
  CAPTURE(static_cast<int>(algorithm));
  if (!NhwcConv::supports(geometry(1, 8, 8, 8, 3, 1))) return;  // no AVX2 in this build
  REQUIRE(NhwcConv::can_run(g, algorithm));
  const auto x = random_vector(n * g.in_size(), 1),
             w = random_vector(g.out_channels * g.patch(), 2);
  const auto b = random_vector(g.out_channels, 3), r = random_vector(n * g.out_size(), 4);
  Workspace ws(pool != nullptr ? pool->size() : 1);
  Exec exec{pool, &ws};
  std::vector<float> y(n * g.out_size()), dw(w.size()), db(b.size()), dx(x.size());
  conv2d_forward(exec, x.data(), w.data(), b.data(), y.data(), n, g, relu);
  conv2d_backward(exec, x.data(), w.data(), r.data(), relu ? y.data() : nullptr, dw.data(),
                  db.data(), dx.data(), n, g);

  // Winograd rounds differently from a direct sum: allow a little more.
  const double tol = algorithm == Algorithm::kWinograd ? 2e-5 : 1e-5;
  const std::size_t in_plane = g.height * g.width, out_plane = g.positions();
  NhwcConv conv(g, algorithm);
  // Twice: the second pass reuses every buffer (and must not see stale contents).
  for (int pass = 0; pass < 2; ++pass) {
    CAPTURE(pass);
    std::vector<float> fy(y.size()), fdw(dw.size(), 7.0f), fdb(db.size(), 7.0f),
        fdx(dx.size(), 7.0f);
    const auto xh = to_nhwc(x, n, g.in_channels, in_plane);
    conv.forward(exec, xh.data(), w.data(), b.data(), fy.data(), n, relu);
    check_close("y", to_nchw(fy, n, g.out_channels, out_plane), y, tol);
    const auto rh = to_nhwc(r, n, g.out_channels, out_plane);
    conv.backward(exec, w.data(), rh.data(), relu ? fy.data() : nullptr, fdw.data(), fdb.data(),
                  fdx.data(), n);
    check_close("dw", fdw, dw, tol * 10);  // sums over every position of the batch
    check_close("db", fdb, db, tol * 10);
    check_close("dx", to_nchw(fdx, n, g.in_channels, in_plane), dx, tol);
    // Without dx (a first layer): the same weight gradients.
    std::vector<float> dw2(dw.size()), db2(db.size());
    conv.backward(exec, w.data(), rh.data(), relu ? fy.data() : nullptr, dw2.data(), db2.data(),
                  nullptr, n);
    CHECK(dw2 == fdw);
    CHECK(db2 == fdb);
  }
}

TEST_CASE("nhwc direct conv matches the nchw kernels for padding and shape combinations") {
  const std::vector<ConvGeometry> shapes{
      geometry(1, 6, 6, 3, 5, 2),     // one input channel (a first layer), padding 2
      geometry(3, 7, 5, 10, 3, 0),    // no padding, non-square, partial 16-column panel
      geometry(2, 5, 5, 17, 3, 1),    // 17 outputs: a full and a 1-wide panel
      geometry(6, 10, 10, 16, 5, 0),  // LeNet's second convolution (8-wide dx panels)
      geometry(4, 6, 6, 5, 3, 2),     // padding = kernel - 1
      geometry(5, 4, 4, 7, 1, 0),     // 1x1
      geometry(9, 3, 3, 20, 3, 1),    // more taps (81) than positions (9)
      geometry(16, 4, 4, 8, 3, 1),    // exactly one 8-wide panel
  };
  for (const auto& g : shapes) {
    for (const bool relu : {false, true})
      check_against_nchw(3, g, Algorithm::kDirect, relu, nullptr);
  }
}

TEST_CASE("nhwc winograd conv matches the nchw kernels for 3x3 and 5x5, odd sizes, all paddings") {
  const std::vector<ConvGeometry> shapes{
      geometry(8, 7, 7, 16, 5, 2),     // odd output: partial 2x2 tiles
      geometry(16, 6, 9, 8, 3, 1),     // F(4x4, 3x3), partial 4x4 tiles, 8-wide panels
      geometry(8, 9, 9, 8, 5, 0),      // no padding
      geometry(8, 5, 5, 24, 3, 2),     // padding = kernel - 1
      geometry(8, 8, 8, 8, 5, 4),      // padding = kernel - 1
      geometry(32, 14, 14, 64, 5, 2),  // the FedAvg CNN's second convolution
  };
  for (const auto& g : shapes) {
    for (const bool relu : {false, true}) {
      check_against_nchw(g.in_channels >= 32 ? 2 : 3, g, Algorithm::kWinograd, relu, nullptr);
    }
  }
}

TEST_CASE("nhwc conv on two threads matches the nchw kernels") {
  ThreadPool pool(2);
  check_against_nchw(5, geometry(3, 6, 6, 9, 5, 2), Algorithm::kDirect, true, &pool);
  check_against_nchw(5, geometry(8, 6, 6, 16, 5, 2), Algorithm::kWinograd, true, &pool);
  check_against_nchw(1, geometry(8, 6, 6, 16, 3, 1), Algorithm::kWinograd, false, &pool);
}

TEST_CASE("nhwc conv picks winograd only where it can run and pays off") {
  CHECK_FALSE(NhwcConv::supports({1, 8, 8, 4, 3, 2, 1, 4, 4}));    // stride 2
  CHECK_FALSE(NhwcConv::supports({1, 8, 8, 4, 3, 1, 3, 12, 12}));  // padding >= kernel
  if (!NhwcConv::supports(geometry(1, 28, 28, 32, 5, 2))) return;  // no AVX2 in this build
  CHECK(NhwcConv::choose(geometry(1, 28, 28, 32, 5, 2)) == Algorithm::kDirect);
  CHECK(NhwcConv::choose(geometry(6, 14, 14, 16, 5, 0)) == Algorithm::kDirect);
  CHECK(NhwcConv::choose(geometry(32, 14, 14, 64, 5, 2)) == Algorithm::kWinograd);
  CHECK(NhwcConv::choose(geometry(32, 14, 14, 64, 7, 3)) == Algorithm::kDirect);
  CHECK_FALSE(NhwcConv::can_run(geometry(12, 14, 14, 64, 5, 2), Algorithm::kWinograd));
}

TEST_CASE("nhwc max pooling matches the nchw kernels, overlapping windows, fused relu") {
  for (const PoolGeometry& g :
       {PoolGeometry{11, 6, 6, 2, 2, 3, 3}, PoolGeometry{16, 7, 7, 3, 2, 3, 3},
        PoolGeometry{3, 5, 5, 2, 2, 2, 2}}) {
    CAPTURE(g.channels);
    CAPTURE(g.kernel);
    const std::size_t n = 3, in_plane = g.height * g.width, out_plane = g.out_height * g.out_width;
    const auto x = random_vector(n * g.in_size(), 5), r = random_vector(n * g.out_size(), 6);
    Exec exec{};
    std::vector<float> y(n * g.out_size()), dx(x.size()), hy(y.size()), hdx(dx.size());
    std::vector<std::int32_t> arg(y.size()), harg(y.size());
    maxpool2d_forward(exec, x.data(), y.data(), arg.data(), n, g);
    maxpool2d_backward(exec, r.data(), arg.data(), dx.data(), n, g);
    const auto xh = to_nhwc(x, n, g.channels, in_plane);
    maxpool2d_forward_nhwc(exec, xh.data(), hy.data(), harg.data(), n, g);
    CHECK(to_nchw(hy, n, g.channels, out_plane) == y);
    const auto rh = to_nhwc(r, n, g.channels, out_plane);
    maxpool2d_backward_nhwc(exec, rh.data(), harg.data(), hdx.data(), n, g);
    CHECK(to_nchw(hdx, n, g.channels, in_plane) == dx);

    // A ReLU before the pool, its backward fused into the pool's (masked by the pool output).
    std::vector<float> xr(x.size()), want(x.size()), fused(x.size());
    relu_forward(x.data(), xr.data(), x.size());
    maxpool2d_forward(exec, xr.data(), y.data(), arg.data(), n, g);
    maxpool2d_backward(exec, r.data(), arg.data(), dx.data(), n, g);
    relu_backward(xr.data(), dx.data(), want.data(), x.size());
    maxpool2d_backward(exec, r.data(), arg.data(), fused.data(), n, g, y.data());
    CHECK(fused == want);
    const auto xrh = to_nhwc(xr, n, g.channels, in_plane);
    maxpool2d_forward_nhwc(exec, xrh.data(), hy.data(), harg.data(), n, g);
    maxpool2d_backward_nhwc(exec, rh.data(), harg.data(), hdx.data(), n, g, hy.data());
    CHECK(to_nchw(hdx, n, g.channels, in_plane) == want);
  }
}

// Loss of one training forward on a network whose convolutions take the NHWC path (a
// multi-channel input, so the network converts layouts at both ends).
double network_loss(Network& net, const std::vector<float>& x, const std::vector<std::int32_t>& y) {
  const auto logits = net.forward(x, y.size(), /*training=*/true);
  return softmax_cross_entropy(logits, y, net.output_size());
}

TEST_CASE(
    "a network on the nhwc path (winograd, direct, pooling, layout changes) has exact gradients") {
  // As in network_test.cc: a perturbation that crosses a ReLU or max-pool kink shows up as a
  // mismatch; this seed has none (checked once, and the one-sided slopes of the mismatches of
  // other seeds matched the analytic gradients).
  NetworkSpec spec(Shape{3, 8, 8});
  spec.conv2d(3, 16, 3, 1, 1)
      .relu()
      .maxpool2d(2)
      .conv2d(16, 16, 5, 1, 2)
      .relu()
      .conv2d(16, 8, 3, 1, 1)
      .relu()
      .maxpool2d(2)
      .flatten()
      .linear(8 * 2 * 2, 3);
  for (const std::size_t threads : {1u, 2u}) {
    CAPTURE(threads);
    auto device = make_device("cpu", {.threads = threads});
    auto net = device->make_network(spec);
    net->init(4);
    const std::size_t batch = 3;
    const auto x = random_vector(batch * spec.input_shape().size(), 8);
    const std::vector<std::int32_t> y{0, 2, 1};
    std::vector<float> dlogits(batch * 3);
    const auto logits = net->forward(x, batch, true);
    softmax_cross_entropy(logits, y, 3, dlogits);
    net->backward(dlogits);
    const std::vector<float> grads(net->gradients().begin(), net->gradients().end());
    auto params = net->parameters();
    std::size_t checked = 0, bad = 0;
    for (std::size_t j = 0; j < params.size(); j += 7) {
      const float saved = params[j];
      const float h = 2e-3f;
      params[j] = saved + h;
      const double up = network_loss(*net, x, y);
      params[j] = saved - h;
      const double down = network_loss(*net, x, y);
      params[j] = saved;
      const double numeric = (up - down) / (2 * h);
      ++checked;
      if (std::abs(numeric - grads[j]) > 2e-3 + 5e-2 * std::abs(grads[j])) {
        ++bad;
        MESSAGE("param " << j << " numeric " << numeric << " analytic " << grads[j]);
      }
    }
    CHECK(checked > 100);
    CHECK(bad == 0);
  }
}

}  // namespace
}  // namespace cohort::kernels::cpu
