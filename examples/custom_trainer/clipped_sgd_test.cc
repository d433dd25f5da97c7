// Checks the rule against what it promises (clipped_sgd.h), through the same interface the client
// and the simulator call: the stock rule's work, a norm bound per step, and refusals.
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "clipped_sgd.h"
#include "cohort/core/error.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/model_zoo.h"

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// Two Gaussian blobs per class in 8 dimensions, 3 classes: learnable by an MLP in a few steps.
cohort::client::Dataset blobs(std::size_t n) {
  std::mt19937 gen(7);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  cohort::FloatBuffer x(n * 8);
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = static_cast<std::int32_t>(i % 3);
    for (std::size_t j = 0; j < 8; ++j) x[i * 8 + j] = (j % 3 == i % 3 ? 2.0f : 0.0f) + noise(gen);
  }
  return {std::move(x), std::move(y), cohort::kernels::Shape{8, 1, 1}, 3};
}

double distance(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

}  // namespace

int main() {
  const auto data = blobs(300);
  std::vector<std::uint32_t> rows(250);
  std::iota(rows.begin(), rows.end(), 0U);
  const auto spec = cohort::kernels::make_network_spec("net:8,linear:16,relu,linear:3");
  auto device = cohort::kernels::make_device("cpu");
  const auto registry = [] {
    auto r = cohort::client::builtin_local_training();
    r.add("clipped_sgd", [](cohort::kernels::Network& net, const cohort::client::TrainerOptions& o,
                            std::string_view arg) {
      return std::make_unique<example::ClippedSgd>(net, o, example::parse_max_norm(arg));
    });
    return r;
  }();
  cohort::client::TrainerOptions options;
  options.batch_size = 32;
  options.epochs = 2;
  options.optimizer.learning_rate = 0.1f;

  // 1. Unclipped, it does the stock rule's work (samples and steps) and learns.
  for (std::size_t steps : {std::size_t{0}, std::size_t{11}}) {
    auto a = device->make_network(spec), b = device->make_network(spec);
    a->init(1);
    b->init(1);
    auto ours = registry.make("clipped_sgd:1e9", *a, options);
    auto stock = registry.make("stock", *b, options);
    const cohort::client::LocalRound round{.data = data, .rows = rows, .seed = 5, .steps = steps};
    const auto r1 = ours->train(round), r2 = stock->train(round);
    check(r1.samples == r2.samples && r1.steps == r2.steps,
          "steps " + std::to_string(steps) + ": " + std::to_string(r1.samples) + " samples in " +
              std::to_string(r1.steps) + " steps, as the stock rule (" +
              std::to_string(r2.samples) + " in " + std::to_string(r2.steps) + ")");
    check(static_cast<example::ClippedSgd&>(*ours).clipped_steps() == 0,
          "a norm no gradient reaches clips nothing");
  }
  {
    auto net = device->make_network(spec);
    net->init(2);
    auto rule = registry.make("clipped_sgd:1e9", *net, options);
    double first = 0, last = 0;
    for (int r = 0; r < 5; ++r) {
      const auto res = rule->train({.data = data, .rows = rows, .seed = std::uint64_t(r)});
      (r == 0 ? first : last) = res.mean_loss;
    }
    check(last < 0.5 * first,
          "it learns: mean loss " + std::to_string(first) + " -> " + std::to_string(last));
  }
  // 2. Clipped hard, plain SGD moves the model at most lr * max_norm per step.
  {
    auto net = device->make_network(spec);
    net->init(3);
    const std::vector<float> start(net->parameters().begin(), net->parameters().end());
    auto rule = registry.make("clipped_sgd:0.001", *net, options);
    const auto res = rule->train({.data = data, .rows = rows, .seed = 9});
    const double moved = distance(net->parameters(), start);
    const double bound = res.steps * 0.1 * 0.001;
    check(static_cast<example::ClippedSgd&>(*rule).clipped_steps() == res.steps,
          "every one of " + std::to_string(res.steps) + " steps clipped");
    check(
        moved <= bound * (1 + 1e-4) && moved > 0,
        "moved " + std::to_string(moved) + " <= steps * lr * max_norm = " + std::to_string(bound));
  }
  // 3. Refusals, each a ConfigError naming what is wrong.
  for (const char* bad : {"clipped_sgd:0", "clipped_sgd:-1", "clipped_sgd:x", "clipped_sgd"}) {
    auto net = device->make_network(spec);
    bool refused = false;
    try {
      (void)registry.make(bad, *net, options);
    } catch (const cohort::ConfigError& e) {
      refused = std::string(e.what()).find("MAX_NORM") != std::string::npos;
    }
    check(refused, std::string("'") + bad + "' refused, naming MAX_NORM");
  }
  {
    auto net = device->make_network(spec);
    auto with_prox = options;
    with_prox.prox_mu = 0.1;
    bool refused = false;
    try {
      (void)registry.make("clipped_sgd:1", *net, with_prox);
    } catch (const cohort::ConfigError& e) {
      refused = std::string(e.what()).find("prox_mu") != std::string::npos;
    }
    check(refused, "train.prox_mu refused");
  }
  std::printf("%s\n",
              failures == 0 ? "clipped_sgd_test: all checks passed" : "clipped_sgd_test: FAILED");
  return failures == 0 ? 0 : 1;
}
