#include "cohort/client/trainer.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <vector>

#include "cohort/client/idx.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/core/error.h"
#include "cohort/core/random.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/loss.h"

namespace cohort::client {
using kernels::make_network_spec;
namespace {

// Two Gaussian blobs in 8 dimensions, classes 0 and 1, centres at -1 and +1 on every axis.
Dataset blobs(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  FloatBuffer x(n * 8);
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = static_cast<std::int32_t>(i % 2);
    for (std::size_t k = 0; k < 8; ++k) {
      x[i * 8 + k] = static_cast<float>((y[i] ? 1.0 : -1.0) + 0.8 * rng.normal());
    }
  }
  return Dataset(std::move(x), std::move(y), Shape{8, 1, 1}, 2);
}

std::vector<float> copy_params(const kernels::Network& net) {
  const auto p = net.parameters();
  return {p.begin(), p.end()};
}

TEST_CASE("learning-rate schedules") {
  LrSchedule constant;
  CHECK(constant.rate(0.1, 12345, 10) == doctest::Approx(0.1));
  const LrSchedule step = parse_lr_schedule("step:10:0.5");
  CHECK(step.rate(0.1, 9, 0) == doctest::Approx(0.1));
  CHECK(step.rate(0.1, 10, 0) == doctest::Approx(0.05));
  CHECK(step.rate(0.1, 25, 0) == doctest::Approx(0.025));
  const LrSchedule cosine = parse_lr_schedule("cosine:100:0.01");
  CHECK(cosine.rate(0.1, 0, 0) == doctest::Approx(0.1));
  CHECK(cosine.rate(0.1, 50, 0) == doctest::Approx(0.055));
  CHECK(cosine.rate(0.1, 100, 0) == doctest::Approx(0.01));
  CHECK(cosine.rate(0.1, 200, 0) == doctest::Approx(0.01));
  const LrSchedule per_call = parse_lr_schedule("cosine");
  CHECK(per_call.rate(1.0, 5, 10) == doctest::Approx(0.5));
  for (const char* s : {"constant", "step:10:0.5", "cosine:100:0.01"}) {
    CHECK(parse_lr_schedule(parse_lr_schedule(s).to_string()).to_string() ==
          parse_lr_schedule(s).to_string());
  }
  for (const char* bad : {"", "linear", "step", "step:0:0.5", "step:10:-1", "cosine:x",
                          "constant:1", "cosine:10:-0.1"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS((void)parse_lr_schedule(bad), ConfigError);
  }
}

TEST_CASE("trainer options come from a config section, declared with their defaults") {
  ConfigSchema schema;
  declare_trainer_options(schema, "train");
  Config config(schema);
  config.set("train.optimizer", "adamw");
  config.set("train.lr", "0.003");
  config.set("train.weight_decay", "0.01");
  config.set("train.lr_schedule", "cosine:500");
  config.set("train.prox_mu", "0.01");
  config.set("train.batch_size", "32");
  config.set("train.device", "cpu");
  const TrainerOptions o = trainer_options_from(config.section("train"));
  CHECK(o.optimizer.kind == kernels::OptimizerKind::kAdamW);
  CHECK(o.optimizer.learning_rate == doctest::Approx(0.003));
  CHECK(o.optimizer.weight_decay == doctest::Approx(0.01));
  CHECK(o.schedule.kind == ScheduleKind::kCosine);
  CHECK(o.schedule.total_steps == 500);
  CHECK(o.prox_mu == doctest::Approx(0.01));
  CHECK(o.batch_size == 32);
  CHECK(o.epochs == 1);
  CHECK(device_choice_from(config.section("train")).device == "cpu");

  using Values = std::map<std::string, Value, std::less<>>;
  CHECK_THROWS_AS(
      (void)trainer_options_from(ConfigSection("train", Values{{"learning_rate", 0.1}})),
      ConfigError);
  CHECK_THROWS_AS((void)trainer_options_from(
                      ConfigSection("train", Values{{"optimizer", std::string("lbfgs")}})),
                  ConfigError);
  CHECK_THROWS_AS(
      (void)trainer_options_from(ConfigSection("train", Values{{"batch_size", std::int64_t{0}}})),
      ConfigError);
  CHECK_THROWS_AS((void)trainer_options_from(ConfigSection("train", Values{{"prox_mu", -1.0}})),
                  ConfigError);
  CHECK_THROWS_AS((void)trainer_options_from(
                      ConfigSection("train", Values{{"nesterov", true}, {"momentum", 0.0}})),
                  ConfigError);
}

TEST_CASE("local training learns, counts samples and steps, and is reproducible for a seed") {
  const Dataset data = blobs(200, 1);
  auto device = kernels::make_device("cpu");
  const auto spec = make_network_spec("mlp:8-16-2");
  TrainerOptions options;
  options.batch_size = 32;
  options.epochs = 3;
  options.optimizer = {
      .kind = kernels::OptimizerKind::kSgd, .learning_rate = 0.1f, .momentum = 0.9f};

  auto net = device->make_network(spec);
  net->init(3);
  LocalTrainer trainer(*net, options);
  const EvalResult before = trainer.evaluate(data);
  const TrainResult r = trainer.train(data, /*seed=*/5);
  CHECK(r.samples == 600);
  CHECK(r.steps == 21);  // 3 epochs of ceil(200 / 32) = 7 batches
  CHECK(std::isfinite(r.mean_loss));
  const EvalResult after = trainer.evaluate(data);
  CHECK(after.count == 200);
  CHECK(after.loss < before.loss);
  CHECK(after.accuracy > 0.95);

  // Same init and seed: the same bits. Another shuffle seed: different parameters.
  auto twin = device->make_network(spec);
  twin->init(3);
  LocalTrainer twin_trainer(*twin, options);
  (void)twin_trainer.train(data, 5);
  CHECK(copy_params(*twin) == copy_params(*net));
  auto other = device->make_network(spec);
  other->init(3);
  LocalTrainer other_trainer(*other, options);
  (void)other_trainer.train(data, 6);
  CHECK(copy_params(*other) != copy_params(*net));

  // Steps mode wraps epochs; drop_last drops partial batches; an index list restricts the rows.
  options.steps = 10;
  LocalTrainer steps_trainer(*net, options);
  std::vector<std::uint32_t> rows(50);
  std::iota(rows.begin(), rows.end(), 100u);
  const TrainResult s = steps_trainer.train(data, rows, 1);
  CHECK(s.steps == 10);
  CHECK(s.samples == 32 + 18 + 32 + 18 + 32 + 18 + 32 + 18 + 32 + 18);
  // A round's RoundStart.local_steps overrides the options (epochs or steps); 0 keeps them.
  const TrainResult override_steps = steps_trainer.train(data, rows, 1, 0, /*steps=*/3);
  CHECK(override_steps.steps == 3);
  CHECK(override_steps.samples == 32 + 18 + 32);
  CHECK(steps_trainer.train(data, rows, 1, 0, /*steps=*/0).steps == 10);
  options.steps = 0;
  options.epochs = 2;
  options.drop_last = true;
  LocalTrainer drop_trainer(*net, options);
  CHECK(drop_trainer.train(data, rows, 1, 0, /*steps=*/5).steps == 5);  // past one epoch
  CHECK(drop_trainer.options().epochs == 2);
  const TrainResult d = drop_trainer.train(data, rows, 1);
  CHECK(d.steps == 2);
  CHECK(d.samples == 64);

  // An empty index list (a client without data) trains nothing; it never means "all rows".
  const auto before_empty = copy_params(*net);
  const TrainResult none = drop_trainer.train(data, std::span<const std::uint32_t>{}, 1);
  CHECK(none.steps == 0);
  CHECK(none.samples == 0);
  CHECK(copy_params(*net) == before_empty);
  CHECK(drop_trainer.evaluate(data, std::span<const std::uint32_t>{}).count == 0);
}

TEST_CASE("evaluation over an index list matches evaluation of the same rows") {
  const Dataset data = blobs(300, 2);
  auto device = kernels::make_device("cpu");
  const auto spec = make_network_spec("mlp:8-4-2");
  auto net = device->make_network(spec);
  net->init(1);
  TrainerOptions options;
  options.eval_batch_size = 64;
  LocalTrainer trainer(*net, options);
  std::vector<std::uint32_t> all(300);
  std::iota(all.begin(), all.end(), 0u);
  const EvalResult a = trainer.evaluate(data);
  const EvalResult b = trainer.evaluate(data, all);
  CHECK(a.count == b.count);
  CHECK(a.loss == doctest::Approx(b.loss).epsilon(1e-6));
  CHECK(a.accuracy == b.accuracy);
  const std::vector<std::uint32_t> some{5, 7, 299};
  CHECK(trainer.evaluate(data, some).count == 3);
  const std::vector<std::uint32_t> bad{300};
  CHECK_THROWS_AS((void)trainer.evaluate(data, bad), DataError);
  CHECK_THROWS_AS((void)trainer.train(data, bad, 1), DataError);
}

TEST_CASE("data that does not fit the model is a DataError") {
  const Dataset data = blobs(10, 3);
  auto device = kernels::make_device("cpu");
  const auto spec = make_network_spec("mlp:9-2");
  auto net = device->make_network(spec);
  LocalTrainer trainer(*net, {});
  CHECK_THROWS_AS((void)trainer.train(data, 1), DataError);
  CHECK_THROWS_AS((void)trainer.evaluate(data), DataError);
}

TEST_CASE("FedProx adds mu * (w - w_start) to every gradient (docs/ALGORITHMS.md 1.12)") {
  // Full-batch plain SGD, two steps. Step 1 starts at w_start, so the proximal term is zero; step 2
  // adds mu * (w1 - w0). Rebuild that by hand through the Network API and compare.
  const Dataset data = blobs(64, 4);
  auto device = kernels::make_device("cpu");
  const auto spec = make_network_spec("mlp:8-6-2");
  const float lr = 0.5f;
  const double mu = 0.7;
  TrainerOptions options;
  options.batch_size = 64;
  options.steps = 2;
  options.optimizer = {.kind = kernels::OptimizerKind::kSgd, .learning_rate = lr};
  options.prox_mu = mu;

  auto net = device->make_network(spec);
  net->init(9);
  const auto w0 = copy_params(*net);
  LocalTrainer trainer(*net, options);
  (void)trainer.train(data, 1);

  auto ref = device->make_network(spec);
  ref->init(9);
  ref->set_optimizer(options.optimizer);
  (void)ref->train_step(data.features(), data.labels(), 64);
  const auto w1 = copy_params(*ref);
  auto logits = ref->forward(data.features(), 64, true);
  std::vector<float> dlogits(logits.size());
  (void)kernels::softmax_cross_entropy(logits, data.labels(), 2, dlogits);
  ref->backward(dlogits);
  auto grads = ref->gradients();
  std::vector<float> expected(w1.size());
  double moved = 0;
  for (std::size_t i = 0; i < w1.size(); ++i) {
    expected[i] = w1[i] - lr * (grads[i] + static_cast<float>(mu) * (w1[i] - w0[i]));
    moved = std::max(moved, std::abs(static_cast<double>(w1[i] - w0[i])));
  }
  REQUIRE(moved > 1e-3);  // the proximal term is not vacuous
  const auto got = copy_params(*net);
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i] == doctest::Approx(expected[i]).epsilon(1e-4).scale(1.0));
  }
}

// The acceptance bar for the kernels and the trainer together: a PyTorch-style MLP reaches
// 80% on Fashion-MNIST in one epoch, quickly. The dataset is installed by the install script, so a
// missing directory is a failure, not a skip.
TEST_CASE("centralized: MLP 784-256-128-10 reaches 80% on Fashion-MNIST in one epoch") {
  const std::filesystem::path dir{kFashionMnistDir};
  REQUIRE_MESSAGE(std::filesystem::is_directory(dir),
                  "Fashion-MNIST not found at "
                      << dir.string() << " (install the Debian package dataset-fashion-mnist)");
  const auto start = std::chrono::steady_clock::now();
  const TrainTest data = load_fashion_mnist(dir);
  REQUIRE(data.train.size() == 60000);
  REQUIRE(data.test.size() == 10000);
  const auto loaded = std::chrono::steady_clock::now();

  auto device = kernels::make_device("cpu", {.threads = 2});
  const auto spec = make_network_spec("mlp:784-256-128-10", {.input = data.train.shape()});
  auto net = device->make_network(spec);
  net->init(1);
  TrainerOptions options;
  options.batch_size = 64;
  options.epochs = 1;
  options.optimizer = {
      .kind = kernels::OptimizerKind::kSgd, .learning_rate = 0.05f, .momentum = 0.9f};
  LocalTrainer trainer(*net, options);
  const TrainResult r = trainer.train(data.train, 1);
  const auto trained = std::chrono::steady_clock::now();
  const EvalResult test = trainer.evaluate(data.test);
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  MESSAGE("fashion-mnist mlp: load " << secs(start, loaded) << " s, train " << secs(loaded, trained)
                                     << " s, train loss " << r.mean_loss << ", test loss "
                                     << test.loss << ", test accuracy " << test.accuracy);
  CHECK(r.samples == 60000);
  CHECK(test.accuracy >= 0.80);
  CHECK(secs(start, std::chrono::steady_clock::now()) < 60.0);
}

}  // namespace
}  // namespace cohort::client
