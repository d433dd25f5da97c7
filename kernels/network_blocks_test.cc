// Batch normalisation, average pooling, global average pooling and residual blocks on the CPU
// network: gradients against finite differences, values against their definitions, and
// ResNet-20 training.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/loss.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/kernels/network.h"
#include "gradient_check.h"

namespace cohort::kernels {
namespace {

using testing::gradient_mismatches;
using testing::random_vector;

std::vector<std::int32_t> labels_mod(std::size_t n, std::size_t classes) {
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) y[i] = static_cast<std::int32_t>((i * 7 + 3) % classes);
  return y;
}

// A small network with every new layer kind, smooth activations (no kinks for the finite
// differences): batchnorm on the channels-last path (after a stride-1 conv) and on NCHW (after
// a stride-2 conv and after a linear layer), an identity block nested in a projection block,
// average pooling and global average pooling.
NetworkSpec smooth_blocks() {
  NetworkSpec spec(Shape{2, 8, 8});
  spec.conv2d(2, 3, 3, 1, 1).batchnorm().tanh();
  spec.residual_begin();                          // projection: 3x8x8 -> 4x4x4
  spec.conv2d(3, 4, 3, 2, 1).batchnorm().tanh();  // NCHW conv
  spec.residual_begin();                          // identity, nested
  spec.conv2d(4, 4, 3, 1, 1).batchnorm().gelu();
  spec.residual_end();
  spec.residual_end().tanh();
  spec.avgpool2d(2).global_avgpool().linear(4, 5).batchnorm().sigmoid().linear(5, 3);
  return spec;
}

TEST_CASE("batchnorm, pooling and residual blocks: gradients match finite differences") {
  // Every parameter, h = 1e-2, tolerance 5e-4 + 2e-2 * |g| (as the smooth-activation check).
  // The running statistics are entries too: their gradient is 0 both ways.
  const NetworkSpec spec = smooth_blocks();
  for (const std::size_t threads : {1u, 2u}) {
    CAPTURE(threads);
    auto device = make_device("cpu", {.threads = threads});
    auto net = device->make_network(spec);
    net->init(13);
    const std::size_t batch = 4;
    const auto x = random_vector(batch * spec.input_shape().size(), 21);
    std::size_t checked = 0;
    CHECK(gradient_mismatches(*net, x, labels_mod(batch, 3), 1e-2f, 5e-4, 2e-2, 1, checked) == 0);
    CHECK(checked == spec.parameter_count());
  }
}

TEST_CASE("resnet20's block structure: gradients match finite differences") {
  // The layers of resnet20 (conv-bn-act-conv-bn + shortcut, act; an identity shortcut on the
  // channels-last path and a projection shortcut; global average pooling), small, with tanh for
  // ReLU: after a batchnorm half the activations sit near ReLU's kink, where central differences
  // are meaningless (ReLU's own gradient is checked in layers_test.cc).
  NetworkSpec spec(Shape{3, 8, 8});
  spec.conv2d(3, 4, 3, 1, 1).batchnorm().tanh();
  for (const std::size_t width : {4, 6}) {
    const std::size_t in = spec.output_shape().channels;
    spec.residual_begin();
    spec.conv2d(in, width, 3, width == in ? 1 : 2, 1).batchnorm().tanh();
    spec.conv2d(width, width, 3, 1, 1).batchnorm();
    spec.residual_end().tanh();
  }
  spec.global_avgpool().linear(6, 4);
  auto device = make_device("cpu", {.threads = 1});
  auto net = device->make_network(spec);
  net->init(3);
  const std::size_t batch = 3;
  const auto x = random_vector(batch * spec.input_shape().size(), 5);
  std::size_t checked = 0;
  CHECK(gradient_mismatches(*net, x, labels_mod(batch, 4), 1e-2f, 5e-4, 2e-2, 1, checked) == 0);
  CHECK(checked == spec.parameter_count());
}

TEST_CASE("batchnorm: batch statistics in training, running statistics in evaluation") {
  const std::size_t c = 2, plane = 3, batch = 4;
  NetworkSpec spec(Shape{c, 1, plane});
  spec.batchnorm();
  CHECK(spec.parameter_count() == 4 * c);
  REQUIRE(spec.buffer_views().size() == 2);
  CHECK(spec.buffer_views()[0].name == "0.batchnorm.running_mean");
  CHECK(spec.buffer_views()[1].offset == 3 * c);
  auto device = make_device("cpu");
  auto net = device->make_network(spec);
  net->init(1);
  const std::vector<float> fresh(net->parameters().begin(), net->parameters().end());
  CHECK(fresh == std::vector<float>{1, 1, 0, 0, 0, 0, 1, 1});  // weight, bias, mean, var
  const auto x = random_vector(batch * c * plane, 8);
  const auto y = net->forward(x, batch, /*training=*/true);
  for (std::size_t ch = 0; ch < c; ++ch) {
    double mean = 0, squares = 0, out_mean = 0, out_squares = 0;
    for (std::size_t s = 0; s < batch; ++s) {
      for (std::size_t p = 0; p < plane; ++p) {
        const std::size_t i = (s * c + ch) * plane + p;
        mean += x[i];
        squares += double{x[i]} * x[i];
        out_mean += y[i];
        out_squares += double{y[i]} * y[i];
      }
    }
    const double m = batch * plane;
    mean /= m;
    const double var = squares / m - mean * mean;
    CHECK(out_mean / m == doctest::Approx(0.0).epsilon(1e-5).scale(1));
    CHECK(out_squares / m == doctest::Approx(var / (var + kBatchNormEpsilon)).epsilon(1e-4));
    const auto params = net->parameters();
    CHECK(params[2 * c + ch] == doctest::Approx(0.1 * mean).epsilon(1e-5));
    CHECK(params[3 * c + ch] == doctest::Approx(0.9 + 0.1 * var * m / (m - 1)).epsilon(1e-5));
  }
  // Evaluation: (x - running_mean) / sqrt(running_var + eps) * weight + bias, nothing changes.
  std::vector<float> p(net->parameters().begin(), net->parameters().end());
  p[0] = 2.0f;   // weight of channel 0
  p[3] = -1.0f;  // bias of channel 1
  net->set_parameters(p);
  const auto e = net->forward(x, batch, /*training=*/false);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t ch = (i / plane) % c;
    const float want =
        (x[i] - p[2 * c + ch]) / std::sqrt(p[3 * c + ch] + kBatchNormEpsilon) * p[ch] + p[c + ch];
    CHECK(e[i] == doctest::Approx(want).epsilon(1e-5));
  }
  CHECK(std::equal(p.begin(), p.end(), net->parameters().begin()));
}

TEST_CASE("optimizer steps leave the running statistics alone; their gradients are zero") {
  NetworkSpec spec(Shape{3, 1, 1});
  spec.linear(3, 4).batchnorm().relu().linear(4, 2);
  auto device = make_device("cpu");
  for (const OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam}) {
    auto net = device->make_network(spec);
    net->init(2);
    net->set_optimizer({.kind = kind, .learning_rate = 0.1f, .weight_decay = 0.5f});
    const auto x = random_vector(6 * 3, 3);
    const auto y = labels_mod(6, 2);
    const auto running = spec.buffer_views();
    const float loss = net->compute_gradients(x, y, 6);
    CHECK(std::isfinite(loss));
    std::vector<float> before(net->parameters().begin(), net->parameters().end());
    for (const LayerView& v : running) {
      for (std::size_t j = v.offset; j < v.offset + v.size; ++j) {
        CHECK(net->gradients()[j] == 0.0f);
        net->gradients()[j] = 5.0f;  // as a trainer's proximal term might
      }
    }
    net->step();
    for (const LayerView& v : running) {
      for (std::size_t j = v.offset; j < v.offset + v.size; ++j) {
        CHECK(net->parameters()[j] == before[j]);
      }
    }
    CHECK(net->parameters()[0] != before[0]);  // while the parameters moved
  }
}

TEST_CASE("residual blocks add the shortcut: identity, and a strided 1x1 projection") {
  auto device = make_device("cpu");
  const std::size_t batch = 2;
  // Identity: block(x) = conv(x) + x, with the same parameters as the bare conv.
  NetworkSpec bare(Shape{3, 5, 5});
  bare.conv2d(3, 3, 3, 1, 1);
  NetworkSpec block(Shape{3, 5, 5});
  block.residual_begin().conv2d(3, 3, 3, 1, 1).residual_end();
  CHECK(block.parameter_count() == bare.parameter_count());
  auto a = device->make_network(bare);
  auto b = device->make_network(block);
  a->init(4);
  b->init(4);
  const auto x = random_vector(batch * 75, 10);
  const std::vector<float> conv(a->forward(x, batch, false).begin(),
                                a->forward(x, batch, false).end());
  const auto sum = b->forward(x, batch, false);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(sum[i] == doctest::Approx(conv[i] + x[i]));

  // Projection: 3x5x5 -> 4x3x3 by a stride-2 conv; the shortcut is w x[:, ::2, ::2] + b.
  NetworkSpec main(Shape{3, 5, 5});
  main.conv2d(3, 4, 3, 2, 1);
  NetworkSpec proj(Shape{3, 5, 5});
  proj.residual_begin().conv2d(3, 4, 3, 2, 1).residual_end();
  const LayerSpec& end = proj.layers().back();
  CHECK(end.stride == 2);
  CHECK(end.weight_count == 12);
  CHECK(proj.parameter_count() == main.parameter_count() + 12 + 4);
  auto m = device->make_network(main);
  auto p = device->make_network(proj);
  m->init(6);
  p->init(6);  // the conv's entries come first in both, drawn from the same counter stream
  const std::vector<float> mo(m->forward(x, batch, false).begin(),
                              m->forward(x, batch, false).end());
  const auto out = p->forward(x, batch, false);
  const auto w = p->parameters().subspan(end.weight_offset, 12);
  const auto bias = p->parameters().subspan(end.bias_offset, 4);
  for (std::size_t s = 0; s < batch; ++s) {
    for (std::size_t o = 0; o < 4; ++o) {
      for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t j = 0; j < 3; ++j) {
          double want = bias[o];
          for (std::size_t ch = 0; ch < 3; ++ch) {
            want += double{w[o * 3 + ch]} * x[((s * 3 + ch) * 5 + 2 * i) * 5 + 2 * j];
          }
          const std::size_t k = ((s * 4 + o) * 3 + i) * 3 + j;
          CHECK(out[k] == doctest::Approx(mo[k] + want).epsilon(1e-5));
        }
      }
    }
  }
  // A block that cannot be matched, and one left open.
  NetworkSpec odd(Shape{1, 5, 5});
  odd.residual_begin().conv2d(1, 1, 2);  // 5x5 -> 4x4: no stride maps 5 to 4
  CHECK_THROWS_AS(odd.residual_end(), KernelError);
  CHECK(odd.open_blocks() == 1);
  CHECK_THROWS_AS(device->make_network(odd), KernelError);
  NetworkSpec none(Shape{1, 5, 5});
  CHECK_THROWS_AS(none.residual_end(), KernelError);
}

TEST_CASE("average pooling: values are window means; global pooling is the plane mean") {
  NetworkSpec spec(Shape{2, 4, 4});
  spec.avgpool2d(3, 1);  // overlapping windows: 2x2 outputs
  auto device = make_device("cpu");
  auto net = device->make_network(spec);
  std::vector<float> x(32);
  std::iota(x.begin(), x.end(), 0.0f);
  const auto y = net->forward(x, 1, false);
  REQUIRE(y.size() == 8);
  CHECK(y[0] == doctest::Approx(5.0f));   // mean of rows 0-2, cols 0-2 of plane 0
  CHECK(y[3] == doctest::Approx(10.0f));  // rows 1-3, cols 1-3
  CHECK(y[4] == doctest::Approx(21.0f));  // plane 1
  NetworkSpec g(Shape{2, 4, 4});
  g.global_avgpool();
  CHECK(g.output_shape() == Shape{2, 1, 1});
  auto gap = device->make_network(g);
  const auto z = gap->forward(x, 1, false);
  CHECK(z[0] == doctest::Approx(7.5f));
  CHECK(z[1] == doctest::Approx(23.5f));
}

TEST_CASE("recomputation never cuts a residual block and gives the same gradients") {
  const NetworkSpec spec = make_network_spec("cnn:resnet20", {.input = Shape{3, 12, 12}});
  auto device = make_device("cpu", {.threads = 1});
  const std::size_t batch = 2;
  const auto x = random_vector(batch * spec.input_shape().size(), 2);
  const auto y = labels_mod(batch, 10);
  std::vector<std::vector<float>> grads, params;
  for (const bool recompute : {false, true}) {
    auto net = device->make_network(spec);
    net->init(9);
    net->set_recompute(recompute);
    net->compute_gradients(x, y, batch);
    grads.emplace_back(net->gradients().begin(), net->gradients().end());
    params.emplace_back(net->parameters().begin(), net->parameters().end());
  }
  // Identical arithmetic both ways; the running statistics updated once, not again when
  // recomputed.
  CHECK(grads[0] == grads[1]);
  CHECK(params[0] == params[1]);
}

TEST_CASE("resnet20: PyTorch's layout and size, and it trains on the CPU (loss falls)") {
  const NetworkSpec spec = make_network_spec("cnn:resnet20");
  CHECK(spec.input_shape() == Shape{3, 32, 32});
  CHECK(spec.output_size() == 10);
  // 273,066 trainable (the paper's 0.27M, with conv biases and projection shortcuts) plus the
  // running statistics of 19 batchnorms: 2 * (16 + 6 * 16 + 6 * 32 + 6 * 64) = 1,376.
  CHECK(spec.parameter_count() == 274'442);
  std::size_t buffers = 0;
  for (const LayerView& v : spec.buffer_views()) buffers += v.size;
  CHECK(buffers == 1'376);
  auto device = make_device("cpu");
  auto net = device->make_network(spec);
  net->init(1);
  net->set_optimizer({.kind = OptimizerKind::kSgd, .learning_rate = 0.05f, .momentum = 0.9f});
  // 16 images whose class is given by which of four quadrants is bright, plus noise.
  const std::size_t batch = 16, d = spec.input_shape().size();
  auto x = random_vector(batch * d, 12);
  std::vector<std::int32_t> labels(batch);
  for (std::size_t s = 0; s < batch; ++s) {
    labels[s] = static_cast<std::int32_t>(s % 4);
    for (std::size_t c = 0; c < 3; ++c) {
      for (std::size_t i = 0; i < 16; ++i) {
        for (std::size_t j = 0; j < 16; ++j) {
          const std::size_t row = i + (s % 2) * 16, col = j + ((s / 2) % 2) * 16;
          x[s * d + (c * 32 + row) * 32 + col] += 2.0f;
        }
      }
    }
  }
  const float first = net->train_step(x, labels, batch);
  float last = first;
  for (int step = 0; step < 24; ++step) last = net->train_step(x, labels, batch);
  MESSAGE("resnet20 loss " << first << " -> " << last);
  CHECK(last < 0.5f * first);
  const Evaluation e = net->evaluate(x, labels, batch);  // with the running statistics
  CHECK(std::isfinite(e.loss_sum));
}

}  // namespace
}  // namespace cohort::kernels
