// Train-step throughput of the reference networks (forward + loss + backward + SGD momentum) and
// the speed of the aggregation primitives. One JSON object per line on stdout.
//
//   cohort_kernels_bench [--device cpu|cuda:0] [--threads N] [--batch 64] [--seconds 3]
//                        [--only mlp|cnn|primitives] [--smoke]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cohort/kernels/compression.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/kernels/primitives.h"
#include "cohort/kernels/robust.h"

namespace {

using Clock = std::chrono::steady_clock;
using cohort::kernels::NetworkSpec;
using cohort::kernels::Shape;

struct Args {
  std::string device = "cpu";
  std::size_t threads = 1;
  std::size_t batch = 64;
  double seconds = 3.0;
  std::string only;
  bool smoke = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--device") a.device = value, ++i;
    else if (flag == "--threads") a.threads = std::strtoul(value, nullptr, 10), ++i;
    else if (flag == "--batch") a.batch = std::strtoul(value, nullptr, 10), ++i;
    else if (flag == "--seconds") a.seconds = std::strtod(value, nullptr), ++i;
    else if (flag == "--only") a.only = value, ++i;
    else if (flag == "--smoke") a.smoke = true;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  if (a.smoke) {
    a.batch = 8;
    a.seconds = 0.05;
  }
  return a;
}

// CPU seconds used by the whole process: on a shared machine, samples per CPU-second shows what
// the kernels would do on an idle core, where wall time mostly measures the neighbours.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void bench_network(const Args& a, const cohort::kernels::Device& device, const char* name,
                   const NetworkSpec& spec) {
  auto net = device.make_network(spec);
  net->init(1);
  net->set_optimizer({.learning_rate = 0.01f, .momentum = 0.9f});
  const std::size_t in = spec.input_shape().size();
  std::vector<float> x(a.batch * in);
  std::vector<std::int32_t> y(a.batch);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % spec.output_size());
  // Warm up (buffers grow on the first step), then time repetitions of ~seconds/5 each.
  for (int i = 0; i < 3; ++i) net->train_step(x, y, a.batch);
  std::vector<double> rates, cpu_rates;
  double best_step = 1e30;  // fastest single step: what an idle core does on a shared machine
  const int reps = a.smoke ? 1 : 5;
  float loss = 0;
  for (int r = 0; r < reps; ++r) {
    std::size_t steps = 0;
    const auto start = Clock::now();
    const double cpu_start = process_cpu_seconds();
    double elapsed = 0;
    do {
      const auto step_start = Clock::now();
      loss = net->train_step(x, y, a.batch);
      const auto now = Clock::now();
      best_step = std::min(best_step, std::chrono::duration<double>(now - step_start).count());
      ++steps;
      elapsed = std::chrono::duration<double>(now - start).count();
    } while (elapsed < a.seconds / reps);
    rates.push_back(static_cast<double>(steps * a.batch) / elapsed);
    cpu_rates.push_back(static_cast<double>(steps * a.batch * a.threads) /
                        (process_cpu_seconds() - cpu_start));
  }
  std::printf(
      "{\"bench\":\"kernels\",\"case\":\"train_step\",\"model\":\"%s\",\"device\":\"%s\","
      "\"threads\":%zu,\"batch\":%zu,\"params\":%zu,\"samples_per_s\":%.0f,\"min\":%.0f,"
      "\"max\":%.0f,\"best_step_samples_per_s\":%.0f,\"samples_per_cpu_s_x_threads\":%.0f,"
      "\"loss\":%.4f}\n",
      name, device.name().c_str(), a.threads, a.batch, spec.parameter_count(), median(rates),
      *std::min_element(rates.begin(), rates.end()), *std::max_element(rates.begin(), rates.end()),
      static_cast<double>(a.batch) / best_step, median(cpu_rates), static_cast<double>(loss));
  std::fflush(stdout);
}

template <typename F>
double time_ms(int reps, F&& fn) {
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return median(times);
}

void bench_primitives(const Args& a) {
  const std::size_t d = a.smoke ? 4096 : std::size_t{1} << 22;
  const std::size_t m = 8;
  std::vector<std::vector<float>> inputs(m, std::vector<float>(d));
  for (std::size_t k = 0; k < m; ++k)
    for (std::size_t j = 0; j < d; ++j) inputs[k][j] = static_cast<float>((j * 31 + k * 17) % 997) - 498.0f;
  std::vector<std::span<const float>> views(inputs.begin(), inputs.end());
  std::vector<double> weights(m, 1.0 / m);
  std::vector<float> out(d);
  std::vector<std::uint16_t> half(d);
  std::vector<std::uint32_t> idx(d / 100);
  std::vector<float> vals(d / 100);
  const int reps = a.smoke ? 1 : 5;
  const auto report = [&](const char* what, double ms) {
    std::printf("{\"bench\":\"kernels\",\"case\":\"%s\",\"d\":%zu,\"inputs\":%zu,\"median_ms\":%.3f}\n",
                what, d, m, ms);
  };
  report("weighted_sum", time_ms(reps, [&] { cohort::kernels::weighted_sum(views, weights, out); }));
  report("coordinate_median", time_ms(reps, [&] { cohort::kernels::coordinate_median(views, out); }));
  report("trimmed_mean", time_ms(reps, [&] { cohort::kernels::trimmed_mean(views, 2, out); }));
  report("top_k_1pct", time_ms(reps, [&] { cohort::kernels::top_k(inputs[0], idx.size(), idx, vals); }));
  report("qsgd_apply", time_ms(reps, [&] { cohort::kernels::qsgd_apply(inputs[0], {.levels = 15, .bucket_size = 512}, 1, out); }));
  report("to_fp16", time_ms(reps, [&] { cohort::kernels::to_fp16(inputs[0], half); }));
  report("to_bf16", time_ms(reps, [&] { cohort::kernels::to_bf16(inputs[0], half); }));
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    const auto device = cohort::kernels::make_device(a.device, {.threads = a.threads});
    std::fprintf(stderr, "device: %s\n", device->description().c_str());
    if (a.only.empty() || a.only == "mlp") {
      bench_network(a, *device, "mlp:784-256-128-10",
                    cohort::kernels::make_network_spec("mlp:784-256-128-10"));
    }
    if (a.only.empty() || a.only == "cnn") {
      // The FedAvg CNN as the model zoo builds it ("same" padding: conv2 runs on 14x14) ...
      bench_network(a, *device, "cnn:2conv", cohort::kernels::make_network_spec("cnn:2conv"));
      // ... and without padding (PyTorch's nn.Conv2d(1, 32, 5) default; 3x fewer FLOPs).
      NetworkSpec cnn(Shape{1, 28, 28});
      cnn.conv2d(1, 32, 5).relu().maxpool2d(2).conv2d(32, 64, 5).relu().maxpool2d(2).flatten()
          .linear(1024, 512).relu().linear(512, 10);
      bench_network(a, *device, "cnn:2conv-nopad", cnn);
      bench_network(a, *device, "cnn:lenet5", cohort::kernels::make_network_spec("cnn:lenet5"));
    }
    if (a.only.empty() || a.only == "primitives") bench_primitives(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
