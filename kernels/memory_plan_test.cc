#include "cohort/kernels/memory_plan.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/loss.h"
#include "cohort/kernels/model_zoo.h"

namespace cohort::kernels {
namespace {

std::vector<float> random_vector(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

std::vector<std::int32_t> random_labels(std::size_t n, std::size_t classes, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> v(n);
  for (auto& y : v) y = static_cast<std::int32_t>(gen() % classes);
  return v;
}

// ||a - b|| / ||a||.
double relative_difference(std::span<const float> a, std::span<const float> b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// The models the planner is for, and one with dropout (its masks must not depend on the split).
std::vector<std::pair<std::string, NetworkSpec>> models() {
  NetworkSpec dropout(Shape{1, 28, 28});
  dropout.flatten().linear(784, 128).relu().dropout(0.5f).linear(128, 10);
  // A stride-2 convolution takes the im2col path (the others run channels-last).
  NetworkSpec strided(Shape{1, 12, 12});
  strided.conv2d(1, 4, 3, 1, 1)
      .relu()
      .maxpool2d(2)
      .conv2d(4, 6, 3, 2, 0)
      .relu()
      .flatten()
      .dropout(0.25f)
      .linear(6 * 2 * 2, 8)
      .relu()
      .linear(8, 3);
  return {{"mlp:784-256-128-10", make_network_spec("mlp:784-256-128-10")},
          {"cnn:lenet5", make_network_spec("cnn:lenet5")},
          {"cnn:2conv", make_network_spec("cnn:2conv")},
          {"mlp with dropout", dropout},
          {"strided conv with dropout", strided}};
}

TEST_CASE("accumulated micro-batches and recomputed activations give the full batch's update, for every model") {
  constexpr std::size_t kBatch = 64;
  for (const std::size_t threads : {1, 2}) {
    const auto device = make_device("cpu", {.threads = threads});
    for (const auto& [name, spec] : models()) {
      CAPTURE(name);
      CAPTURE(threads);
      const auto x = random_vector(kBatch * spec.input_shape().size(), 7);
      const auto y = random_labels(kBatch, spec.output_size(), 8);
      const OptimizerOptions sgd{.learning_rate = 0.05f, .momentum = 0.9f};
      auto whole = device->make_network(spec);
      whole->init(3);
      whole->set_optimizer(sgd);
      // Two steps, so that the second runs with momentum and a second dropout stream.
      const float whole_loss = whole->train_step(x, y, kBatch);
      whole->train_step(x, y, kBatch);
      // 4-way, uneven 10-way, one sample at a time; then with activations recomputed, whole
      // and one sample at a time.
      for (const auto [m, recompute] : {std::pair<std::size_t, bool>{16, false}, {7, false},
                                        {1, false}, {0, true}, {1, true}}) {
        CAPTURE(m);
        CAPTURE(recompute);
        auto split = device->make_network(spec);
        split->init(3);
        split->set_optimizer(sgd);
        split->set_micro_batch(m);
        split->set_recompute(recompute);
        CHECK(split->recompute() == recompute);
        const float split_loss = split->train_step(x, y, kBatch);
        split->train_step(x, y, kBatch);
        CHECK(split_loss == doctest::Approx(whole_loss).epsilon(1e-5));
        CHECK(relative_difference(whole->gradients(), split->gradients()) < 1e-5);
        CHECK(relative_difference(whole->parameters(), split->parameters()) < 1e-5);
        const auto e_whole = whole->evaluate(x, y, kBatch);
        const auto e_split = split->evaluate(x, y, kBatch);
        CHECK(e_split.correct == e_whole.correct);
        CHECK(e_split.loss_sum == doctest::Approx(e_whole.loss_sum).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("micro-batching bounds the activation memory the network allocates") {
  const auto device = make_device("cpu", {.threads = 2});
  const NetworkSpec spec = make_network_spec("cnn:2conv");
  const auto x = random_vector(64 * spec.input_shape().size(), 1);
  const auto y = random_labels(64, 10, 2);
  const auto peak = [&](std::size_t m) {
    auto net = device->make_network(spec);
    net->init(1);
    net->set_optimizer({.learning_rate = 0.01f});
    net->set_micro_batch(m);
    net->train_step(x, y, 64);
    net->evaluate(x, y, 64);
    const MemoryReport r = net->memory();
    REQUIRE(r.tracked);
    CHECK(r.peak.total <= r.peak.parameters + r.peak.gradients + r.peak.optimizer +
                              r.peak.activations + r.peak.workspace);
    CHECK(r.peak.parameters == r.current.parameters);
    return r.peak;
  };
  const MemoryUse whole = peak(0), quarter = peak(16);
  CHECK(quarter.activations * 3 < whole.activations);  // ~1/4, plus fixed buffers
  CHECK(quarter.gradients == whole.gradients);         // accumulated in place
  CHECK(quarter.total < whole.total);
}

TEST_CASE("recomputation keeps fewer activations, and forward + backward match without it") {
  const auto device = make_device("cpu", {.threads = 1});
  for (const auto& [name, spec] : models()) {
    CAPTURE(name);
    const auto x = random_vector(8 * spec.input_shape().size(), 4);
    const auto y = random_labels(8, spec.output_size(), 5);
    const auto run = [&](bool recompute) {
      auto net = device->make_network(spec);
      net->init(2);
      net->set_recompute(recompute);
      // The public forward + backward: dropout's stream advances after the forward, and the
      // recomputed segments must still draw the forward's masks.
      const auto logits = net->forward(x, 8, /*training=*/true);
      std::vector<float> dlogits(logits.size());
      (void)softmax_cross_entropy(logits, y, spec.output_size(), dlogits);
      net->backward(dlogits);
      return std::pair{std::vector<float>(net->gradients().begin(), net->gradients().end()),
                       net->memory().peak.activations};
    };
    const auto [plain, plain_bytes] = run(false);
    const auto [again, again_bytes] = run(true);
    CHECK(relative_difference(plain, again) < 1e-6);
    CHECK(again_bytes <= plain_bytes);
    // An MLP's few outputs gain nothing from segments; convolutional stacks keep fewer.
    if (name.starts_with("cnn")) CHECK(again_bytes < plain_bytes);
    MESSAGE(name << ": activations " << plain_bytes << " B kept, " << again_bytes
                 << " B recomputing");
  }
  auto cuda_like = device->make_network(make_network_spec("cnn:lenet5"));
  cuda_like->set_recompute(true);
  cuda_like->set_recompute(false);  // and back: buffers laid out anew
  CHECK_FALSE(cuda_like->recompute());
}

TEST_CASE("a network under a memory limit refuses the allocation that would pass it") {
  const auto device = make_device("cpu", {.threads = 1});
  const NetworkSpec spec = make_network_spec("cnn:lenet5");
  const auto x = random_vector(64 * spec.input_shape().size(), 1);
  const auto y = random_labels(64, 10, 2);
  const OptimizerOptions sgd{.learning_rate = 0.01f};
  const std::size_t limit = measure_peak_bytes(spec, *device, sgd, 64, 16) -
                            64 * (spec.input_shape().size() + 1) * sizeof(float);
  auto net = device->make_network(spec);
  net->init(1);
  net->set_optimizer(sgd);
  net->set_memory_limit(limit);
  CHECK_THROWS_AS(net->train_step(x, y, 64), std::bad_alloc);  // whole batches need more
  CHECK(net->memory().peak.total <= limit);
  auto fits = device->make_network(spec);
  fits->init(1);
  fits->set_optimizer(sgd);
  fits->set_memory_limit(limit);
  fits->set_micro_batch(16);
  fits->train_step(x, y, 64);  // what the plan measured
  CHECK(fits->memory().peak.total <= limit);
}

TEST_CASE("the memory model predicts the measured peak at the batches it was not fitted at") {
  const auto device = make_device("cpu", {.threads = 2});
  for (const auto& [name, spec] : models()) {
    CAPTURE(name);
    const OptimizerOptions sgd{.learning_rate = 0.01f, .momentum = 0.9f};
    const MemoryModel model = measure_memory_model(spec, *device, sgd);
    CHECK(model.parameters >= spec.parameter_count() * sizeof(float));
    CHECK(model.optimizer == model.parameters);  // one velocity per parameter
    CHECK(model.activations_per_sample > 0);
    for (const std::size_t m : {24, 64, 100}) {
      CAPTURE(m);
      const double measured = static_cast<double>(measure_peak_bytes(spec, *device, sgd, m, m));
      const double predicted = static_cast<double>(model.bytes(m, m));
      CHECK(std::abs(predicted - measured) <= 0.05 * measured);
    }
  }
}

TEST_CASE("the plan fits the budget, keeps the batch and refuses naming the minimum") {
  const auto device = make_device("cpu", {.threads = 1});
  const NetworkSpec spec = make_network_spec("cnn:lenet5");
  const OptimizerOptions sgd{.learning_rate = 0.01f, .momentum = 0.9f};
  const MemoryPlan free = plan_memory(spec, *device, sgd, 64, 0, "cnn:lenet5");
  CHECK(free.micro_batch == 64);
  CHECK(free.accumulation == 1);
  CHECK(free.network_micro_batch() == 0);
  CHECK(free.minimum_bytes < free.peak_bytes);
  // Budgets from the unconstrained peak down to the minimum: every plan's measured peak fits.
  std::size_t previous = 65;
  for (int i = 0; i <= 8; ++i) {
    const std::size_t budget =
        free.minimum_bytes + (free.peak_bytes - free.minimum_bytes) * (8 - i) / 8;
    CAPTURE(budget);
    const MemoryPlan plan = plan_memory(spec, *device, sgd, 64, budget, "cnn:lenet5");
    CHECK(plan.peak_bytes <= budget);
    CHECK(plan.batch == 64);
    CHECK(plan.accumulation == (64 + plan.micro_batch - 1) / plan.micro_batch);
    if (!plan.recompute) CHECK(plan.micro_batch <= previous);
    CHECK(plan.peak_bytes ==
          measure_peak_bytes(spec, *device, sgd, 64, plan.micro_batch, plan.recompute));
    CHECK(plan.predicted_bytes > 0);
    previous = plan.micro_batch;
    // At the minimum, one sample fits only with its activations recomputed (LeNet-5's
    // convolutions keep more than their segment boundaries).
    if (i == 8) CHECK(plan.recompute);
  }
  CHECK(previous == 1);
  try {
    (void)plan_memory(spec, *device, sgd, 64, free.minimum_bytes - 1, "cnn:lenet5");
    FAIL("a budget below the minimum was accepted");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    CHECK(what.find("cnn:lenet5") != std::string::npos);
    CHECK(what.find(std::to_string(free.minimum_bytes)) != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
  CHECK(describe(free, "cnn:lenet5").find("minimum budget") != std::string::npos);
}

TEST_CASE("the minimum is the least of the one-sample (kept or recomputed) and whole-batch peaks") {
  const auto device = make_device("cpu", {.threads = 1});
  const NetworkSpec spec = make_network_spec("mlp:784-256-128-10");
  const OptimizerOptions sgd{.learning_rate = 0.01f};
  const std::size_t whole = measure_peak_bytes(spec, *device, sgd, 32, 32);
  const std::size_t single = measure_peak_bytes(spec, *device, sgd, 32, 1);
  const std::size_t recomputed = measure_peak_bytes(spec, *device, sgd, 32, 1, true);
  const MemoryPlan plan = plan_memory(spec, *device, sgd, 32, whole, "mlp");
  CHECK(plan.micro_batch == 32);  // a budget that holds the whole batch trains it whole
  CHECK(plan.peak_bytes == whole);
  CHECK(plan.minimum_bytes == std::min({whole, single, recomputed}));
  CHECK_THROWS_AS((void)plan_memory(spec, *device, sgd, 32, plan.minimum_bytes - 1, "mlp"),
                  ConfigError);
}

}  // namespace
}  // namespace cohort::kernels
