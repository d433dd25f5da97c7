// The trainer on "cuda:0" against the CPU reference, through the device-neutral interface. Skips
// at run time when the build or the machine has no CUDA device: CTest reports it as skipped.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "cohort/kernels/model_zoo.h"
#include "cohort/client/trainer.h"
#include "cohort/core/random.h"
#include "cohort/kernels/device.h"
#include "skip.h"

namespace cohort::client {
using kernels::make_network_spec;
namespace {

Dataset noisy_blobs(std::size_t n) {
  Rng rng(3);
  FloatBuffer x(n * 16);
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = static_cast<std::int32_t>(i % 4);
    for (std::size_t k = 0; k < 16; ++k) {
      x[i * 16 + k] = static_cast<float>((k % 4 == i % 4 ? 1.0 : 0.0) + 0.5 * rng.normal());
    }
  }
  return Dataset(std::move(x), std::move(y), Shape{16, 1, 1}, 4);
}

std::vector<float> train_on(std::string_view device_name, const TrainerOptions& options,
                            const Dataset& data, EvalResult& eval) {
  auto device = kernels::make_device(device_name);
  const auto spec = make_network_spec("mlp:16-32-4");
  auto net = device->make_network(spec);
  net->init(7);
  LocalTrainer trainer(*net, options);
  (void)trainer.train(data, 11);
  eval = trainer.evaluate(data);
  const auto p = std::as_const(*net).parameters();
  return {p.begin(), p.end()};
}

TEST_CASE("training on cuda:0 matches the CPU, with and without FedProx") {
  if (kernels::cuda_device_count() == 0) {
    test::skip_test_case(kernels::built_with_cuda() ? "no CUDA device"
                                                    : "no CUDA device (built without CUDA)");
    return;
  }
  const Dataset data = noisy_blobs(256);
  for (const double mu : {0.0, 0.1}) {
    CAPTURE(mu);
    TrainerOptions options;
    options.batch_size = 32;
    options.epochs = 2;
    options.prox_mu = mu;
    options.optimizer = {
        .kind = kernels::OptimizerKind::kSgd, .learning_rate = 0.1f, .momentum = 0.9f};
    EvalResult cpu_eval;
    EvalResult gpu_eval;
    const auto cpu = train_on("cpu", options, data, cpu_eval);
    const auto gpu = train_on("cuda:0", options, data, gpu_eval);
    REQUIRE(cpu.size() == gpu.size());
    double worst = 0;
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(cpu[i] - gpu[i])) /
                                  (1.0 + std::abs(static_cast<double>(cpu[i]))));
    }
    CHECK(worst < 1e-2);  // 16 momentum steps amplify summation-order differences
    CHECK(gpu_eval.accuracy == doctest::Approx(cpu_eval.accuracy).epsilon(0.02));
  }
}

}  // namespace
}  // namespace cohort::client
