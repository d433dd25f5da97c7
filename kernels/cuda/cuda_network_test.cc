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
#include "cohort/kernels/memory_plan.h"
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
  spec.conv2d(2, 5, 3, 1, 1)
      .relu()
      .maxpool2d(2)
      .conv2d(5, 7, 3, 2, 1)
      .relu()
      .maxpool2d(2, 1)
      .flatten()
      .dropout(0.3f)
      .linear(7 * 2 * 2, 9)
      .relu()
      .linear(9, 4);
  return spec;
}

NetworkSpec mlp() {
  NetworkSpec spec(Shape{20, 1, 1});
  spec.linear(20, 32).relu().dropout(0.2f).linear(32, 16).relu().linear(16, 5);
  return spec;
}

// Every elementwise activation: GELU after a convolution, tanh and sigmoid after linear layers.
NetworkSpec smooth_net() {
  NetworkSpec spec(Shape{2, 9, 9});
  spec.conv2d(2, 4, 3, 1, 1)
      .gelu()
      .maxpool2d(2)
      .flatten()
      .linear(4 * 4 * 4, 12)
      .tanh()
      .linear(12, 8)
      .sigmoid()
      .linear(8, 3);
  return spec;
}

// A small CNN with batch normalisation after convolutions (BatchNorm2d) and after a linear layer
// (BatchNorm1d, whose statistics run over the samples alone).
NetworkSpec batchnorm_net() {
  NetworkSpec spec(Shape{3, 10, 10});
  spec.conv2d(3, 6, 3, 1, 1)
      .batchnorm()
      .relu()
      .maxpool2d(2)
      .conv2d(6, 8, 3)
      .batchnorm()
      .relu()
      .flatten()
      .linear(8 * 3 * 3, 12)
      .batchnorm()
      .relu()
      .linear(12, 4);
  return spec;
}

// Overlapping (3, stride 2) and tiling (2) average pools, then global average pooling.
NetworkSpec pooling_net() {
  NetworkSpec spec(Shape{2, 11, 11});
  spec.conv2d(2, 5, 3, 1, 1)
      .relu()
      .avgpool2d(3, 2)  // 11 -> 5
      .conv2d(5, 6, 3, 1, 1)
      .avgpool2d(2)  // 5 -> 2 (floor mode drops the last row and column)
      .conv2d(6, 7, 1)
      .global_avgpool()
      .linear(7, 3);
  return spec;
}

// A ResNet stem, an identity basic block and a projecting one (stride 2, 4 -> 8 channels).
NetworkSpec residual_net() {
  NetworkSpec spec(Shape{3, 9, 9});
  spec.conv2d(3, 4, 3, 1, 1).batchnorm().relu();
  spec.residual_begin().conv2d(4, 4, 3, 1, 1).batchnorm().relu().conv2d(4, 4, 3, 1, 1).batchnorm();
  spec.residual_end().relu();
  spec.residual_begin().conv2d(4, 8, 3, 2, 1).batchnorm().relu().conv2d(8, 8, 3, 1, 1).batchnorm();
  spec.residual_end().relu();  // 4x9x9 -> 8x5x5: a 1x1 projection with stride 2
  spec.global_avgpool().linear(8, 5);
  return spec;
}

// Nested blocks (an identity block inside a projecting one, two begins in a row) and an identity
// block of linear layers whose last ReLU is fused into its linear layer.
NetworkSpec nested_residual_net() {
  NetworkSpec spec(Shape{4, 6, 6});
  spec.residual_begin().residual_begin().conv2d(4, 4, 3, 1, 1).relu().residual_end();
  spec.conv2d(4, 6, 1, 2).residual_end().relu();  // 4x6x6 -> 6x3x3
  spec.flatten().linear(6 * 3 * 3, 10);
  spec.residual_begin().linear(10, 10).relu().linear(10, 10).relu().residual_end();
  spec.linear(10, 3);
  return spec;
}

std::vector<std::int32_t> cyclic_labels(std::size_t batch, std::size_t classes) {
  std::vector<std::int32_t> y(batch);
  for (std::size_t i = 0; i < batch; ++i) y[i] = static_cast<std::int32_t>((i * 7) % classes);
  return y;
}

std::vector<float> copy_of(std::span<const float> v) { return {v.begin(), v.end()}; }

// The running statistics of `spec` in a parameter vector, in buffer_views() order.
std::vector<float> buffers_of(const NetworkSpec& spec, std::span<const float> params) {
  std::vector<float> out;
  for (const LayerView& v : spec.buffer_views()) {
    out.insert(out.end(), params.begin() + static_cast<std::ptrdiff_t>(v.offset),
               params.begin() + static_cast<std::ptrdiff_t>(v.offset + v.size));
  }
  return out;
}

// One training forward, backward and evaluation of `spec` on both devices from the same
// parameters: logits, running statistics, gradients (zero for the buffers), evaluation logits,
// and an evaluation that changes nothing.
void check_forward_backward(const NetworkSpec& spec, std::size_t batch) {
  auto cpu = make_device("cpu");
  auto gpu = make_device("cuda:0");
  auto a = cpu->make_network(spec), b = gpu->make_network(spec);
  a->init(5);
  b->init(5);
  const auto x = random_vector(batch * spec.input_shape().size(), 11);
  const auto y = cyclic_labels(batch, spec.output_size());
  const std::vector<float> logits_a = copy_of(a->forward(x, batch, true));
  check_close(b->forward(x, batch, true), logits_a);
  check_close(b->parameters(), a->parameters());  // the running statistics moved alike
  std::vector<float> dlogits(logits_a.size());
  softmax_cross_entropy(logits_a, y, spec.output_size(), dlogits);
  a->backward(dlogits);
  b->backward(dlogits);
  check_close(b->gradients(), a->gradients(), 1e-3, 1e-5);
  for (const float g : buffers_of(spec, b->gradients())) CHECK(g == 0.0f);

  const std::vector<float> params = copy_of(b->parameters());
  const std::vector<float> eval_a = copy_of(a->forward(x, batch, false));
  check_close(b->forward(x, batch, false), eval_a);
  const Evaluation ea = a->evaluate(x, y, batch), eb = b->evaluate(x, y, batch);
  CHECK(eb.loss_sum == doctest::Approx(ea.loss_sum).epsilon(1e-4));
  CHECK(eb.correct == ea.correct);
  check_close(b->parameters(), params, 0, 0);  // evaluation moves no running statistic
}

// Training steps on both devices: losses, then parameters and running statistics. Each step is
// compute_gradients + step(), checking that step() leaves the running statistics as they were.
// compare_parameters false: only the losses and the buffers' invariance (Adam turns the rounding
// noise of gradients that are zero in exact arithmetic, as a bias before a batchnorm's, into
// steps of the learning rate).
void check_training(const NetworkSpec& spec, const OptimizerOptions& options,
                    bool compare_parameters = true) {
  auto cpu = make_device("cpu");
  auto gpu = make_device("cuda:0");
  auto a = cpu->make_network(spec), b = gpu->make_network(spec);
  for (auto* n : {a.get(), b.get()}) {
    n->init(9);
    n->set_optimizer(options);
  }
  const std::size_t batch = 16;
  const auto x = random_vector(batch * spec.input_shape().size(), 2);
  const auto y = cyclic_labels(batch, spec.output_size());
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    const float loss_a = a->compute_gradients(x, y, batch);
    const float loss_b = b->compute_gradients(x, y, batch);
    CHECK(loss_b == doctest::Approx(loss_a).epsilon(compare_parameters ? 1e-4 : 1e-3));
    const std::vector<float> before = buffers_of(spec, b->parameters());
    a->step();
    b->step();
    check_close(buffers_of(spec, b->parameters()), before, 0, 0);
  }
  if (compare_parameters) check_close(b->parameters(), a->parameters());
}

TEST_CASE("cuda forward, backward and evaluate match the CPU") {
  if (!have_cuda()) return;
  auto cpu = make_device("cpu");
  auto gpu = make_device("cuda:0");
  MESSAGE(gpu->description());
  for (const NetworkSpec& spec : {conv_net(), mlp(), smooth_net()}) {
    auto a = cpu->make_network(spec), b = gpu->make_network(spec);
    CHECK(b->device_name() == "cuda:0");
    a->init(3);
    b->init(3);
    check_close(b->parameters(), a->parameters(), 0, 0);
    const std::size_t batch = 37;  // not a multiple of any tile size
    const auto x = random_vector(batch * spec.input_shape().size(), 1);
    std::vector<std::int32_t> y(batch);
    for (std::size_t i = 0; i < batch; ++i)
      y[i] = static_cast<std::int32_t>(i % spec.output_size());
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

TEST_CASE("cuda micro-batches give the whole batch's update and the CPU's, dropout included") {
  if (!have_cuda()) return;
  auto cpu = make_device("cpu");
  auto gpu = make_device("cuda:0");
  const OptimizerOptions sgd{.learning_rate = 0.05f, .momentum = 0.9f};
  for (const NetworkSpec& spec : {conv_net(), mlp()}) {
    const std::size_t batch = 24;
    const auto x = random_vector(batch * spec.input_shape().size(), 5);
    std::vector<std::int32_t> y(batch);
    for (std::size_t i = 0; i < batch; ++i)
      y[i] = static_cast<std::int32_t>(i % spec.output_size());
    auto whole = gpu->make_network(spec), reference = cpu->make_network(spec);
    for (auto* n : {whole.get(), reference.get()}) {
      n->init(3);
      n->set_optimizer(sgd);
      n->train_step(x, y, batch);
      n->train_step(x, y, batch);
    }
    for (const std::size_t m : {8, 5, 1}) {
      CAPTURE(m);
      auto split = gpu->make_network(spec);
      split->init(3);
      split->set_optimizer(sgd);
      split->set_micro_batch(m);
      CHECK(split->micro_batch() == m);
      split->train_step(x, y, batch);
      split->train_step(x, y, batch);
      check_close(split->parameters(), whole->parameters());
      check_close(split->parameters(), reference->parameters());
      const Evaluation ew = whole->evaluate(x, y, batch), es = split->evaluate(x, y, batch);
      CHECK(es.correct == ew.correct);
      CHECK(es.loss_sum == doctest::Approx(ew.loss_sum).epsilon(1e-4));
    }
  }
}

TEST_CASE("cuda batchnorm matches the CPU in training and evaluation, running statistics too") {
  if (!have_cuda()) return;
  const NetworkSpec spec = batchnorm_net();
  check_forward_backward(spec, 37);
  check_forward_backward(spec, 1);  // BatchNorm1d over one sample: the biased variance, 0
  check_training(spec, {.learning_rate = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f});
  check_training(spec,
                 {.kind = OptimizerKind::kAdam, .learning_rate = 1e-3f, .weight_decay = 1e-2f},
                 /*compare_parameters=*/false);

  // A training forward moves the running statistics: after it the evaluation differs from one
  // with the initial statistics (mean 0, variance 1), and a train_step leaves the same statistics
  // on both devices.
  auto cpu = make_device("cpu");
  auto gpu = make_device("cuda:0");
  auto a = cpu->make_network(spec), b = gpu->make_network(spec);
  for (auto* n : {a.get(), b.get()}) {
    n->init(4);
    n->set_optimizer({.learning_rate = 0.1f});
  }
  const std::vector<float> initial = buffers_of(spec, b->parameters());
  const auto x = random_vector(20 * spec.input_shape().size(), 8);
  const auto y = cyclic_labels(20, spec.output_size());
  const float loss_a = a->train_step(x, y, 20), loss_b = b->train_step(x, y, 20);
  CHECK(loss_b == doctest::Approx(loss_a).epsilon(1e-4));
  const std::vector<float> moved = buffers_of(spec, b->parameters());
  check_close(moved, buffers_of(spec, a->parameters()));
  std::size_t changed = 0;
  for (std::size_t i = 0; i < moved.size(); ++i) changed += moved[i] != initial[i] ? 1 : 0;
  CHECK(changed == moved.size());
}

TEST_CASE("cuda avgpool2d and global average pooling match the CPU") {
  if (!have_cuda()) return;
  const NetworkSpec spec = pooling_net();
  check_forward_backward(spec, 37);
  check_training(spec, {.learning_rate = 0.05f, .momentum = 0.9f, .nesterov = true});
  check_training(spec, {.kind = OptimizerKind::kAdam, .learning_rate = 1e-3f});
}

TEST_CASE("cuda residual blocks, identity and projecting, nested, match the CPU") {
  if (!have_cuda()) return;
  for (const NetworkSpec& spec : {residual_net(), nested_residual_net()}) {
    CAPTURE(spec.summary());
    check_forward_backward(spec, 37);
    check_training(spec, {.learning_rate = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f});
  }
  check_training(nested_residual_net(), {.kind = OptimizerKind::kAdamW, .learning_rate = 1e-3f});
}

TEST_CASE("cuda micro-batched compute_gradients on a batchnorm network matches the CPU's") {
  if (!have_cuda()) return;
  auto cpu = make_device("cpu");
  auto gpu = make_device("cuda:0");
  const NetworkSpec spec = batchnorm_net();
  const std::size_t batch = 24;
  const auto x = random_vector(batch * spec.input_shape().size(), 5);
  const auto y = cyclic_labels(batch, spec.output_size());
  const OptimizerOptions sgd{.learning_rate = 0.05f, .momentum = 0.9f, .weight_decay = 1e-3f};
  for (const std::size_t m : {8, 5, 1}) {
    CAPTURE(m);
    // Each micro-batch normalises with its own statistics and moves the running ones once.
    auto a = cpu->make_network(spec), b = gpu->make_network(spec);
    for (auto* n : {a.get(), b.get()}) {
      n->init(3);
      n->set_optimizer(sgd);
      n->set_micro_batch(m);
    }
    const float loss_a = a->compute_gradients(x, y, batch);
    const float loss_b = b->compute_gradients(x, y, batch);
    CHECK(loss_b == doctest::Approx(loss_a).epsilon(1e-4));
    check_close(b->gradients(), a->gradients(), 1e-3, 1e-5);
    for (const float g : buffers_of(spec, b->gradients())) CHECK(g == 0.0f);
    check_close(b->parameters(), a->parameters());
    const std::vector<float> before = buffers_of(spec, b->parameters());
    a->step();
    b->step();
    check_close(buffers_of(spec, b->parameters()), before, 0, 0);
    for (int step = 0; step < 2; ++step) {
      const float la = a->train_step(x, y, batch), lb = b->train_step(x, y, batch);
      CHECK(lb == doctest::Approx(la).epsilon(1e-4));
    }
    check_close(b->parameters(), a->parameters());
    const Evaluation ea = a->evaluate(x, y, batch), eb = b->evaluate(x, y, batch);
    CHECK(eb.loss_sum == doctest::Approx(ea.loss_sum).epsilon(1e-4));
    CHECK(eb.correct == ea.correct);
  }
}

TEST_CASE(
    "cuda networks count their device memory; the model and plan hold against cudaMemGetInfo") {
  if (!have_cuda()) return;
  auto gpu = make_device("cuda:0");
  NetworkSpec wide(Shape{784, 1, 1});  // 1.6M parameters: allocations far above the driver's pages
  wide.linear(784, 2048).relu().linear(2048, 10);
  const NetworkSpec& spec = wide;
  const OptimizerOptions adam{.kind = OptimizerKind::kAdam, .learning_rate = 1e-3f};
  auto net = gpu->make_network(spec);
  const auto x = random_vector(64 * spec.input_shape().size(), 6);
  const std::vector<std::int32_t> y(64, 1);
  const std::size_t used_before = cuda_used_bytes(0);
  net->init(1);
  net->set_optimizer(adam);
  net->train_step(x, y, 64);
  const std::size_t used_after = cuda_used_bytes(0);
  REQUIRE(used_before > 0);
  const MemoryReport r = net->memory();
  REQUIRE(r.tracked);
  const std::size_t p = spec.parameter_count() * sizeof(float);
  CHECK(r.current.parameters == p);
  CHECK(r.current.gradients == p);
  CHECK(r.current.optimizer == 2 * p);
  CHECK(r.peak.activations > 0);
  CHECK(r.peak.total >= r.current.total);
  // Allocated between the two readings: the optimizer state, activations and workspace. The
  // driver rounds allocations up and cuBLAS makes a workspace of its own at its first GEMM, so
  // the device's growth is at least the optimizer state and at most what was counted plus 96 MiB.
  const std::size_t counted = r.current.total - r.current.parameters - r.current.gradients;
  const std::size_t device_growth = used_after - used_before;
  MESSAGE("counted after construction " << counted << " B (peak total " << r.peak.total
                                        << " B); the device's used memory grew by " << device_growth
                                        << " B");
  CHECK(device_growth >= r.current.optimizer);
  CHECK(device_growth <= counted + (std::size_t{96} << 20));

  // The plan on CUDA: micro-batches under a budget below the whole batch's peak, measured there.
  const NetworkSpec small = conv_net();
  const MemoryModel model = measure_memory_model(small, *gpu, adam);
  CHECK(model.device.find("cuda") != std::string::npos);
  CHECK_FALSE(model.recompute_measured);  // CUDA does not recompute
  const std::size_t whole = measure_peak_bytes(small, *gpu, adam, 64, 64);
  const MemoryPlan plan = plan_memory(small, *gpu, adam, 64, whole - 1, "conv_net");
  CHECK(plan.micro_batch < 64);
  CHECK(plan.peak_bytes < whole);
  CHECK_FALSE(plan.recompute);
  CHECK(
      std::abs(static_cast<double>(plan.predicted_bytes) - static_cast<double>(plan.peak_bytes)) <=
      0.05 * static_cast<double>(plan.peak_bytes));
  CHECK_THROWS_AS(net->set_recompute(true), KernelError);
}

}  // namespace
}  // namespace cohort::kernels
