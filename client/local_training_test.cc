// The local training seam as the client and the simulator use it: names, arguments, refusals, and
// the stock rule being the LocalTrainer it wraps. Plug-ins end to end: examples/custom_trainer.
#include "cohort/client/local_training.h"

#include <doctest/doctest.h>

#include <numeric>
#include <string>

#include "cohort/core/config.h"
#include "cohort/core/error.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/model_zoo.h"

namespace cohort::client {
namespace {

Dataset tiny(std::size_t n) {
  FloatBuffer x(n * 4);
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = static_cast<std::int32_t>(i % 2);
    for (std::size_t j = 0; j < 4; ++j) x[i * 4 + j] = static_cast<float>((i * 7 + j) % 5) / 5.0f;
  }
  return {std::move(x), std::move(y), kernels::Shape{4, 1, 1}, 2};
}

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// A rule that records what it was given and takes exactly the steps asked.
struct Recording final : LocalTraining {
  std::string argument;
  std::size_t seen_rows = 0;
  TrainResult train(const LocalRound& round) override {
    seen_rows = round.rows.size();
    return {.samples = round.rows.size(), .steps = round.steps, .mean_loss = 0.5};
  }
};

TEST_CASE("train.rule picks a registered rule by name; its argument reaches the factory") {
  auto registry = builtin_local_training();
  CHECK(registry.names() == std::vector<std::string>{"stock"});
  std::string got;
  registry.add("recording", [&](kernels::Network&, const TrainerOptions&, std::string_view arg) {
    got = std::string(arg);
    return std::make_unique<Recording>();
  });
  auto device = kernels::make_device("cpu");
  auto net = device->make_network(kernels::make_network_spec("net:4,linear:2"));
  const TrainerOptions options;
  auto rule = registry.make("recording:a:b", *net, options);
  CHECK(got == "a:b");  // everything after the first colon
  const auto data = tiny(10);
  std::vector<std::uint32_t> rows{1, 2, 3};
  const auto r = rule->train({.data = data, .rows = rows, .seed = 1, .steps = 4});
  CHECK(r.steps == 4);
  CHECK(static_cast<Recording&>(*rule).seen_rows == 3);
  (void)registry.make("recording", *net, options);
  CHECK(got.empty());

  CHECK(error_of([&] { registry.check("sgd_plus"); })
            .find("unknown local training rule 'sgd_plus' in train.rule (known: recording, "
                  "stock; a plug-in adds rules: --plugin FILE.so)") != std::string::npos);
  CHECK(error_of([&] { registry.add("stock", {}); }).find("registered twice") != std::string::npos);
  CHECK(error_of([&] { registry.add("a:b", {}); }).find("without ':'") != std::string::npos);
  CHECK(error_of([&] {
          (void)registry.make("stock:1", *net, options);
        }).find("takes no argument") != std::string::npos);
  ConfigSchema schema;
  declare_trainer_options(schema, "train");
  Config config(schema);
  CHECK(trainer_options_from(config.section("train")).rule == "stock");
  config.set("train.rule", "recording:7");
  CHECK(trainer_options_from(config.section("train")).rule == "recording:7");
  config.set("train.rule", ":7");
  CHECK(error_of([&] {
          (void)trainer_options_from(config.section("train"));
        }).find("rule must name a local training rule") != std::string::npos);
}

TEST_CASE("the stock rule trains as LocalTrainer does") {
  const auto spec = kernels::make_network_spec("net:4,linear:8,relu,linear:2");
  auto device = kernels::make_device("cpu");
  auto a = device->make_network(spec), b = device->make_network(spec);
  a->init(4);
  b->init(4);
  TrainerOptions options;
  options.batch_size = 3;
  options.epochs = 2;
  const auto data = tiny(20);
  std::vector<std::uint32_t> rows(17);
  std::iota(rows.begin(), rows.end(), 0U);
  auto rule = builtin_local_training().make("stock", *a, options);
  LocalTrainer trainer(*b, options);
  const auto r1 = rule->train({.data = data, .rows = rows, .seed = 8, .steps = 0});
  const auto r2 = trainer.train(data, rows, 8, 0, 0);
  CHECK(r1.samples == r2.samples);
  CHECK(r1.steps == r2.steps);
  CHECK(std::equal(a->parameters().begin(), a->parameters().end(), b->parameters().begin()));
}

TEST_CASE("a client plug-in that is not there is a one-line ConfigError naming the file") {
  LocalTrainingRegistry registry;
  CHECK(error_of([&] { load_client_plugin("/nonexistent/librule.so", registry); }) ==
        "plug-in /nonexistent/librule.so: no such file");
}

}  // namespace
}  // namespace cohort::client
