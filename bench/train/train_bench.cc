// cohort-bench-train: samples per second of local training (LocalTrainer over kernels::Network),
// batch 64, SGD with momentum 0.9, data already in memory: Fashion-MNIST when installed, else
// synthetic data of the same shape. Per model and thread count: a warm-up, then the median of
// several timed repeats, each sized to about --seconds. One JSON object per line on stdout:
//   {"bench":"train","model":"mlp","threads":1,"batch":64,"samples_per_s":...,"epoch_s":...}
// where epoch_s = 60000 / samples_per_s. Logs go to stderr. --quick runs a tiny configuration
// (CTest's smoke test).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/client/dataset.h"
#include "cohort/client/idx.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/client/trainer.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/random.h"
#include "cohort/kernels/device.h"

namespace {

using cohort::client::Dataset;

constexpr double kEpochSamples = 60000;

struct Options {
  bool quick = false;
  std::vector<std::string> models{"mlp", "lenet5", "2conv"};
  std::vector<std::size_t> threads{1, 2};
  std::size_t batch = 64;
  std::size_t repeats = 5;
  double seconds = 1.0;  // target duration of one timed repeat
  std::string data_dir{cohort::client::kFashionMnistDir};
};

const std::map<std::string, std::string>& model_specs() {
  static const std::map<std::string, std::string> specs{{"mlp", "mlp:784-256-128-10"},
                                                        {"lenet5", "cnn:lenet5"},
                                                        {"2conv", "cnn:2conv"},
                                                        {"2conv1024", "cnn:2conv:1024"}};
  return specs;
}

Dataset synthetic(std::size_t n) {
  cohort::Rng rng(1);
  cohort::FloatBuffer x(n * 784);
  for (float& v : x) v = static_cast<float>(rng.uniform());
  std::vector<std::int32_t> y(n);
  for (auto& label : y) label = static_cast<std::int32_t>(rng.below(10));
  return Dataset(std::move(x), std::move(y), cohort::kernels::Shape{1, 28, 28}, 10);
}

std::pair<Dataset, std::string> load_data(const Options& options) {
  if (options.quick) return {synthetic(512), "synthetic"};
  if (std::filesystem::is_directory(options.data_dir)) {
    return {cohort::client::load_fashion_mnist(options.data_dir).train, "fashion-mnist"};
  }
  COHORT_LOG(Warn) << "no Fashion-MNIST at " << options.data_dir << "; using synthetic data";
  return {synthetic(60000), "synthetic"};
}

double run_steps(cohort::client::LocalTrainer& trainer, const Dataset& data, std::uint64_t seed) {
  const auto start = std::chrono::steady_clock::now();
  const auto result = trainer.train(data, seed);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(result.samples) / seconds;
}

void bench_one(const Options& options, const Dataset& data, const std::string& data_name,
               const std::string& model, std::size_t threads) {
  auto device = cohort::kernels::make_device("cpu", {.threads = threads});
  // The spec outlives the network: a Network may refer to it.
  const auto spec = cohort::kernels::make_network_spec(model_specs().at(model),
                                                      {.input = data.shape(), .classes = 10});
  auto net = device->make_network(spec);
  net->init(1);
  cohort::client::TrainerOptions trainer_options;
  trainer_options.batch_size = options.batch;
  trainer_options.optimizer = {
      .kind = cohort::kernels::OptimizerKind::kSgd, .learning_rate = 0.01f, .momentum = 0.9f};

  // Warm-up: touches every buffer once and estimates the rate to size the timed repeats.
  trainer_options.steps = options.quick ? 2 : 10;
  double rate = 0;
  {
    cohort::client::LocalTrainer warm(*net, trainer_options);
    (void)run_steps(warm, data, 0);
    rate = run_steps(warm, data, 1);
  }
  const auto steps = std::max<std::size_t>(
      options.quick ? 2 : 10,
      static_cast<std::size_t>(rate * options.seconds / static_cast<double>(options.batch)));
  trainer_options.steps = steps;
  cohort::client::LocalTrainer trainer(*net, trainer_options);
  std::vector<double> rates;
  for (std::size_t r = 0; r < options.repeats; ++r)
    rates.push_back(run_steps(trainer, data, 2 + r));
  std::sort(rates.begin(), rates.end());
  const double median = rates.size() % 2 == 1
                            ? rates[rates.size() / 2]
                            : 0.5 * (rates[rates.size() / 2 - 1] + rates[rates.size() / 2]);
  COHORT_LOG(Info) << "model=" << model << " threads=" << threads << " steps=" << steps
                   << " repeats=" << rates.size() << " min=" << rates.front()
                   << " median=" << median << " max=" << rates.back();
  std::printf(
      "{\"bench\":\"train\",\"model\":\"%s\",\"threads\":%zu,\"batch\":%zu,\"samples_per_s\":%.1f,"
      "\"epoch_s\":%.3f,\"min_samples_per_s\":%.1f,\"max_samples_per_s\":%.1f,\"repeats\":%zu,"
      "\"steps\":%zu,\"params\":%zu,\"data\":\"%s\"}\n",
      model.c_str(), threads, options.batch, median, kEpochSamples / median, rates.front(),
      rates.back(), rates.size(), steps, spec.parameter_count(), data_name.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"cohort-bench-train: local-training throughput, JSON lines on stdout"};
  app.add_flag("--quick", options.quick, "tiny run for CTest: synthetic data, few steps");
  app.add_option("--models", options.models, "models: mlp, lenet5, 2conv, 2conv1024")
      ->delimiter(',');
  app.add_option("--threads", options.threads, "CPU kernel thread counts")->delimiter(',');
  app.add_option("--batch", options.batch, "minibatch size")->check(CLI::PositiveNumber);
  app.add_option("--repeats", options.repeats, "timed repeats per configuration")
      ->check(CLI::PositiveNumber);
  app.add_option("--seconds", options.seconds, "target seconds per timed repeat")
      ->check(CLI::PositiveNumber);
  app.add_option("--data-dir", options.data_dir, "Fashion-MNIST directory");
  CLI11_PARSE(app, argc, argv);
  try {
    cohort::set_log_level(cohort::LogLevel::Info);
    if (options.quick) {
      options.repeats = 1;
      options.seconds = 0.01;
    }
    for (const auto& model : options.models) {
      if (!model_specs().contains(model)) {
        throw cohort::ConfigError("unknown model '" + model +
                                  "' (known: mlp, lenet5, 2conv, 2conv1024)");
      }
    }
    const auto [data, data_name] = load_data(options);
    COHORT_LOG(Info) << "data=" << data_name << " examples=" << data.size();
    for (const auto& model : options.models) {
      for (const std::size_t threads : options.threads) {
        bench_one(options, data, data_name, model, threads);
      }
    }
  } catch (const std::exception& e) {
    COHORT_LOG(Error) << e.what();
    return 1;
  }
  return 0;
}
