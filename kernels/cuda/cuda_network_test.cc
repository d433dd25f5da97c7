// CUDA networks against the CPU reference, through the public API only. Without a device (or
// without CUDA in the build) every test case skips, and CTest reports the binary as skipped.
//
// Tolerances: cuBLAS sums in a different order (and may use FMA where the CPU path does not), so
// float results agree to ~1e-6 relative per op; after a few training steps 1e-4 relative (plus a
// 1e-5 absolute floor for near-zero values) is ample, while any indexing bug is off by O(1).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/loss.h"
#include "skip.h"

namespace cohort::kernels {
namespace {

// True with a device; otherwise marks the test case skipped, and the caller returns.
bool have_cuda() {
  if (cuda_device_count() > 0) return true;
  test::skip_test_case(built_with_cuda() ? "no CUDA device"
                                         : "no CUDA device (built without CUDA)");
  return false;
}

std::vector<float> random_vector(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

void check_close(std::span<const float> got, std::span<const float> want, double rel = 1e-4,
                 double abs = 1e-5) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::abs(double(got[i]) - want[i]) > abs + rel * std::abs(double(want[i]))) {
      if (++bad <= 5) MESSAGE("index " << i << " got " << got[i] << " want " << want[i]);
    }
  }
  CHECK(bad == 0);
}

NetworkSpec conv_net() {
  NetworkSpec spec(Shape{2, 13, 13});
  spec.conv2d(2, 5, 3, 1, 1).relu().maxpool2d(2).conv2d(5, 7, 3, 2, 1).relu().maxpool2d(2, 1)
      .flatten().dropout(0.3f).linear(7 * 2 * 2, 9).relu().linear(9, 4);
  return spec;
}

NetworkSpec mlp() {
  NetworkSpec spec(Shape{20, 1, 1});
  spec.linear(20, 32).relu().dropout(0.2f).linear(32, 16).relu().linear(16, 5);
  return spec;
}

TEST_CASE("cuda forward, backward and evaluate match the CPU") {
  if (!have_cuda()) return;
  auto cpu = make_device("cpu");
  auto gpu = make_device("cuda:0");
  MESSAGE(gpu->description());
  for (const NetworkSpec& spec : {conv_net(), mlp()}) {
    auto a = cpu->make_network(spec), b = gpu->make_network(spec);
    CHECK(b->device_name() == "cuda:0");
    a->init(3);
    b->init(3);
    check_close(b->parameters(), a->parameters(), 0, 0);
    const std::size_t batch = 37;  // not a multiple of any tile size
    const auto x = random_vector(batch * spec.input_shape().size(), 1);
    std::vector<std::int32_t> y(batch);
    for (std::size_t i = 0; i < batch; ++i) y[i] = static_cast<std::int32_t>(i % spec.output_size());
    const auto la = a->forward(x, batch, true);
    const std::vector<float> logits_a(la.begin(), la.end());
    const auto lb = b->forward(x, batch, true);
    check_close(lb, logits_a);  // same dropout masks on both devices
    std::vector<float> dlogits(logits_a.size());
    softmax_cross_entropy(logits_a, y, spec.output_size(), dlogits);
    a->backward(dlogits);
    b->backward(dlogits);
    check_close(b->gradients(), a->gradients(), 1e-3, 1e-5);
    const Evaluation ea = a->evaluate(x, y, batch), eb = b->evaluate(x, y, batch);
    CHECK(eb.loss_sum == doctest::Approx(ea.loss_sum).epsilon(1e-4));
    CHECK(eb.correct == ea.correct);
  }
}

TEST_CASE("cuda training steps match the CPU for SGD and Adam") {
  if (!have_cuda()) return;
  auto cpu = make_device("cpu");
  auto gpu = make_device("cuda");
  const OptimizerOptions options[] = {
      {.learning_rate = 0.05f, .momentum = 0.9f, .nesterov = true, .weight_decay = 1e-4f},
      {.kind = OptimizerKind::kAdam, .learning_rate = 1e-3f, .weight_decay = 1e-4f},
      {.kind = OptimizerKind::kAdamW, .learning_rate = 1e-3f, .weight_decay = 1e-2f}};
  for (const auto& o : options) {
    CAPTURE(to_string(o.kind));
    const NetworkSpec spec = conv_net();
    auto a = cpu->make_network(spec), b = gpu->make_network(spec);
    for (auto* n : {a.get(), b.get()}) {
      n->init(9);
      n->set_optimizer(o);
    }
    const std::size_t batch = 16;
    const auto x = random_vector(batch * spec.input_shape().size(), 2);
    std::vector<std::int32_t> y(batch);
    for (std::size_t i = 0; i < batch; ++i) y[i] = static_cast<std::int32_t>((i * 7) % 4);
    for (int step = 0; step < 4; ++step) {
      const float loss_a = a->train_step(x, y, batch), loss_b = b->train_step(x, y, batch);
      CHECK(loss_b == doctest::Approx(loss_a).epsilon(1e-4));
    }
    check_close(b->parameters(), a->parameters());
  }
}

TEST_CASE("cuda host views: replacing parameters and editing gradients reach the device") {
  if (!have_cuda()) return;
  auto cpu = make_device("cpu");
  auto gpu = make_device("cuda:0");
  const NetworkSpec spec = mlp();
  auto a = cpu->make_network(spec), b = gpu->make_network(spec);
  a->init(1);
  b->init(2);
  const std::vector<float> server(a->parameters().begin(), a->parameters().end());
  std::copy(server.begin(), server.end(), b->parameters().begin());
  const auto x = random_vector(8 * 20, 3);
  const auto la = a->forward(x, 8, false);
  const std::vector<float> want(la.begin(), la.end());
  check_close(b->forward(x, 8, false), want);

  // Backward, halve the gradients on the host, step: same as the CPU doing the same.
  for (auto* n : {a.get(), b.get()}) n->set_optimizer({.learning_rate = 0.1f});
  std::vector<float> dlogits(8 * 5, 0.01f);
  for (auto* n : {a.get(), b.get()}) {
    n->set_seed(4);
    n->forward(x, 8, true);
    n->backward(dlogits);
    for (float& g : n->gradients()) g *= 0.5f;
    n->step();
  }
  check_close(b->parameters(), a->parameters());
}

TEST_CASE("cuda network reports misuse as KernelError") {
  if (!have_cuda()) return;
  auto gpu = make_device("cuda:0");
  auto net = gpu->make_network(mlp());
  net->init(1);
  const std::vector<float> x(20);
  CHECK_THROWS_AS(net->backward(std::vector<float>(5)), KernelError);
  CHECK_THROWS_AS(net->forward(std::span<const float>(x).first(19), 1, true), KernelError);
  net->set_optimizer({});
  CHECK_THROWS_AS(net->train_step(x, std::vector<std::int32_t>{5}, 1), KernelError);
}

}  // namespace
}  // namespace cohort::kernels
