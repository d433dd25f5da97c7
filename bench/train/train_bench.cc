// cohort-bench-train: samples per second of local training (LocalTrainer over kernels::Network),
// batch 64, SGD with momentum 0.9, data already in memory: Fashion-MNIST when installed, else
// synthetic data of the same shape. Per model and thread count: a warm-up, then the median of
// several timed repeats, each sized to about --seconds. One JSON object per line on stdout:
//   {"bench":"train","model":"mlp","threads":1,"batch":64,"samples_per_s":...,"epoch_s":...}
// where epoch_s = 60000 / samples_per_s. Logs go to stderr. --quick runs a tiny configuration
// (CTest's smoke test).
//
// --memory-budget: training under memory budgets (kernels/memory_plan.h). Per model and thread
// count, plan_memory() with no budget gives the unconstrained peak U and the minimum M; then for
// --budgets budgets spread from U down to M (both included, plus the budget at which the plan
// needs exactly 4-way accumulation), or the --budget-bytes list, the plan's micro-batch is set on
// a fresh network, training is timed as above, and the peak of the timed repeats is read from the
// network's own tracker. One line per budget:
//   {"bench":"train","model":"mlp","budget_bytes":B,"peak_bytes":P,"micro_batch":m,
//    "accumulation":k,"recompute":false,"samples_per_s":S,"threads":1,"batch":64,
//    "unconstrained_samples_per_s":S0,"ratio_to_unconstrained":S/S0,...}
// then one summary line per model and thread count, with the 4-way line's ratio and, since the
// machine may be shared, the ratio of the whole batch and 4-way accumulation timed in alternating
// pairs (paired_ratio_at_4way). Exits 1 when a peak exceeds its budget.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/client/dataset.h"
#include "cohort/client/idx.h"
#include "cohort/client/trainer.h"
#include "cohort/core/buffer.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/random.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/memory_plan.h"
#include "cohort/kernels/model_zoo.h"

namespace {

using cohort::client::Dataset;

constexpr double kEpochSamples = 60000;

struct Options {
  bool quick = false;
  std::vector<std::string> models{"mlp", "lenet5", "2conv"};
  std::vector<std::size_t> threads{1, 2};
  std::string device = "cpu";  // or cuda[:N] (threads then only label the lines)
  std::size_t batch = 64;
  std::size_t repeats = 5;
  double seconds = 1.0;  // target duration of one timed repeat
  std::string data_dir{cohort::client::kFashionMnistDir};
  bool memory_budget = false;
  std::size_t budgets = 6;                // spread from the unconstrained peak to the minimum
  std::vector<std::size_t> budget_bytes;  // explicit budgets instead
};

const std::map<std::string, std::string>& model_specs() {
  static const std::map<std::string, std::string> specs{{"mlp", "mlp:784-256-128-10"},
                                                        {"lenet5", "cnn:lenet5"},
                                                        {"2conv", "cnn:2conv"},
                                                        {"2conv1024", "cnn:2conv:1024"},
                                                        {"resnet20", "cnn:resnet20"}};
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

cohort::client::TrainerOptions trainer_options(const Options& options) {
  cohort::client::TrainerOptions o;
  o.batch_size = options.batch;
  o.optimizer = {
      .kind = cohort::kernels::OptimizerKind::kSgd, .learning_rate = 0.01f, .momentum = 0.9f};
  return o;
}

struct Timing {
  double median = 0, min = 0, max = 0;  // samples per second
  std::size_t repeats = 0, steps = 0;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// A warm-up (touches every buffer once and estimates the rate), then a trainer whose train() runs
// about --seconds; *steps is its step count.
std::unique_ptr<cohort::client::LocalTrainer> warmed_trainer(const Options& options,
                                                             const Dataset& data,
                                                             cohort::kernels::Network& net,
                                                             std::size_t* steps) {
  auto trainer_opts = trainer_options(options);
  trainer_opts.steps = options.quick ? 2 : 10;
  double rate = 0;
  {
    cohort::client::LocalTrainer warm(net, trainer_opts);
    (void)run_steps(warm, data, 0);
    rate = run_steps(warm, data, 1);
  }
  *steps = std::max<std::size_t>(
      options.quick ? 2 : 10,
      static_cast<std::size_t>(rate * options.seconds / static_cast<double>(options.batch)));
  trainer_opts.steps = *steps;
  return std::make_unique<cohort::client::LocalTrainer>(net, trainer_opts);
}

// The warm-up, then the timed repeats. The network's memory peak is reset just before the timed
// repeats, so net.memory().peak afterwards is theirs.
Timing time_training(const Options& options, const Dataset& data, cohort::kernels::Network& net) {
  Timing t;
  const auto trainer = warmed_trainer(options, data, net, &t.steps);
  net.reset_memory_peak();
  std::vector<double> rates;
  for (std::size_t r = 0; r < options.repeats; ++r)
    rates.push_back(run_steps(*trainer, data, 2 + r));
  t.median = median(rates);
  t.min = *std::min_element(rates.begin(), rates.end());
  t.max = *std::max_element(rates.begin(), rates.end());
  t.repeats = rates.size();
  return t;
}

void bench_one(const Options& options, const Dataset& data, const std::string& data_name,
               const std::string& model, std::size_t threads) {
  auto device = cohort::kernels::make_device(options.device, {.threads = threads});
  // The spec outlives the network: a Network may refer to it.
  const auto spec = cohort::kernels::make_network_spec(model_specs().at(model),
                                                       {.input = data.shape(), .classes = 10});
  auto net = device->make_network(spec);
  net->init(1);
  const Timing t = time_training(options, data, *net);
  COHORT_LOG(Info) << "model=" << model << " threads=" << threads << " steps=" << t.steps
                   << " repeats=" << t.repeats << " min=" << t.min << " median=" << t.median
                   << " max=" << t.max;
  std::printf(
      "{\"bench\":\"train\",\"device\":\"%s\",\"model\":\"%s\",\"threads\":%zu,\"batch\":%zu,"
      "\"samples_per_s\":%.1f,"
      "\"epoch_s\":%.3f,\"min_samples_per_s\":%.1f,\"max_samples_per_s\":%.1f,\"repeats\":%zu,"
      "\"steps\":%zu,\"params\":%zu,\"data\":\"%s\"}\n",
      options.device.c_str(), model.c_str(), threads, options.batch, t.median,
      kEpochSamples / t.median, t.min, t.max, t.repeats, t.steps, spec.parameter_count(),
      data_name.c_str());
  std::fflush(stdout);
}

// --- --memory-budget -------------------------------------------------------------------------

// The trainer's batch buffer, which the network's tracker does not see (LocalTrainer's batch_x_
// and batch_y_): batch * input floats and batch int32 labels, each rounded up to the buffer
// alignment, exactly as memory_plan.cc's input_bytes() adds it to every planned and probed peak.
// (The trainer's shuffle order, 4 bytes per dataset row, and the dataset itself are outside the
// planner's accounting, so outside this one too.)
std::size_t trainer_batch_bytes(const cohort::kernels::NetworkSpec& spec, std::size_t batch) {
  const auto aligned = [](std::size_t bytes) {
    constexpr std::size_t a = cohort::kBufferAlignment;
    return std::max(a, (bytes + a - 1) / a * a);
  };
  return aligned(batch * spec.input_shape().size() * sizeof(float)) +
         aligned(batch * sizeof(std::int32_t));
}

struct BudgetRun {
  cohort::kernels::MemoryPlan plan;
  bool forced = false;         // micro-batch set by the bench, not chosen by plan_memory()
  std::size_t peak_bytes = 0;  // measured over the timed repeats, trainer's batch buffer included
  Timing timing;
};

struct MemorySummary {
  std::string model;
  std::size_t threads = 0;
  std::size_t unconstrained_peak = 0, minimum = 0, budgets = 0, refused = 0, over_budget = 0;
  double unconstrained_rate = 0;
  std::optional<double> rate_4way;  // the run that accumulates exactly 4 micro-batches
  bool forced_4way = false;         // ... set by the bench: no budget made the planner choose it
  // The 4-way rate over the whole batch's, timed in alternating pairs (see paired_4way_ratio):
  // the median of the pairs' ratios, and best 4-way rate over best whole-batch rate.
  double paired_ratio = 0, paired_best_ratio = 0;
};

// Micro-batches of ceil(batch / 4): the planner's candidate for 4-way accumulation.
std::size_t micro_batch_4way(std::size_t batch) { return (batch + 3) / 4; }

// The budgets to run, largest first: the explicit list, or the unconstrained peak U, `count`
// budgets spread evenly from max(U, minimum) down to the minimum (the planner's, at micro-batch
// 1), and the peak of 4-way accumulation. When the minimum exceeds U (the MLP at batch 64: the
// accumulator outweighs the activations micro-batching saves), the spread collapses to the
// minimum; U is kept, and plan_memory() refuses it (it rejects every budget below the
// micro-batch-1 peak, even one the whole batch fits).
std::vector<std::size_t> budgets_for(const Options& options,
                                     const cohort::kernels::MemoryPlan& unconstrained,
                                     std::size_t budget_4way) {
  std::vector<std::size_t> budgets = options.budget_bytes;
  if (budgets.empty()) {
    const std::size_t lo = unconstrained.minimum_bytes;
    const std::size_t hi = std::max(unconstrained.peak_bytes, lo);
    const std::size_t n = std::max<std::size_t>(options.budgets, 2);
    for (std::size_t i = 0; i < n; ++i) budgets.push_back(hi - (hi - lo) * i / (n - 1));
    budgets.push_back(unconstrained.peak_bytes);
    if (budget_4way > 0) budgets.push_back(budget_4way);
  }
  std::sort(budgets.begin(), budgets.end(), std::greater<>());
  budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
  return budgets;
}

// Trains a fresh network in micro-batches of plan.network_micro_batch() (recomputing activations
// where the plan does) and measures the peak.
BudgetRun run_plan(const Options& options, const Dataset& data,
                   const cohort::kernels::NetworkSpec& spec, const cohort::kernels::Device& device,
                   cohort::kernels::MemoryPlan plan) {
  BudgetRun run{.plan = std::move(plan)};
  auto net = device.make_network(spec);
  net->init(1);
  net->set_micro_batch(run.plan.network_micro_batch());
  net->set_recompute(run.plan.recompute);
  run.timing = time_training(options, data, *net);
  run.peak_bytes = net->memory().peak.total + trainer_batch_bytes(spec, options.batch);
  return run;
}

// Plans for `budget` (0: none), then trains under the plan; nullopt when the planner refuses.
std::optional<BudgetRun> run_budget(const Options& options, const Dataset& data,
                                    const std::string& model,
                                    const cohort::kernels::NetworkSpec& spec,
                                    const cohort::kernels::Device& device, std::size_t budget) {
  cohort::kernels::MemoryPlan plan;
  try {
    plan = cohort::kernels::plan_memory(spec, device, trainer_options(options).optimizer,
                                        options.batch, budget, model);
  } catch (const cohort::ConfigError& e) {
    COHORT_LOG(Warn) << "planner refused budget " << budget << ": " << e.what();
    return std::nullopt;
  }
  return run_plan(options, data, spec, device, std::move(plan));
}

// 4-way accumulation without the planner, under the budget of its own measured peak.
BudgetRun run_forced_4way(const Options& options, const Dataset& data,
                          const cohort::kernels::NetworkSpec& spec,
                          const cohort::kernels::Device& device,
                          const cohort::kernels::MemoryPlan& unconstrained,
                          std::size_t budget_4way) {
  cohort::kernels::MemoryPlan plan = unconstrained;
  plan.budget = budget_4way;
  plan.micro_batch = micro_batch_4way(options.batch);
  plan.accumulation = (options.batch + plan.micro_batch - 1) / plan.micro_batch;
  plan.predicted_bytes = plan.model.bytes(options.batch, plan.micro_batch);
  plan.peak_bytes = budget_4way;
  BudgetRun run = run_plan(options, data, spec, device, std::move(plan));
  run.forced = true;
  return run;
}

// The machine is shared, so rates timed a minute apart differ by more than accumulation costs.
// This times the whole batch (A) and 4-way accumulation (B) on two fresh networks in --repeats
// alternating pairs (AB, BA, AB, ...), so both see the same load.
void paired_4way_ratio(const Options& options, const Dataset& data,
                       const cohort::kernels::NetworkSpec& spec,
                       const cohort::kernels::Device& device, MemorySummary& summary) {
  auto whole = device.make_network(spec);
  auto split = device.make_network(spec);
  whole->init(1);
  split->init(1);
  split->set_micro_batch(micro_batch_4way(options.batch));
  std::size_t steps_a = 0, steps_b = 0;
  const auto a = warmed_trainer(options, data, *whole, &steps_a);
  const auto b = warmed_trainer(options, data, *split, &steps_b);
  std::vector<double> ratios;
  double best_a = 0, best_b = 0;
  for (std::size_t r = 0; r < options.repeats; ++r) {
    double rate_a = 0, rate_b = 0;
    if (r % 2 == 0) {
      rate_a = run_steps(*a, data, 2 + r);
      rate_b = run_steps(*b, data, 2 + r);
    } else {
      rate_b = run_steps(*b, data, 2 + r);
      rate_a = run_steps(*a, data, 2 + r);
    }
    ratios.push_back(rate_b / rate_a);
    best_a = std::max(best_a, rate_a);
    best_b = std::max(best_b, rate_b);
  }
  summary.paired_ratio = median(ratios);
  summary.paired_best_ratio = best_b / best_a;
  COHORT_LOG(Info) << "model=" << summary.model << " threads=" << summary.threads
                   << " paired 4-way: best whole=" << best_a << " best 4-way=" << best_b
                   << " median ratio=" << summary.paired_ratio;
}

void print_budget_line(const Options& options, const std::string& model, std::size_t threads,
                       const BudgetRun& run, double unconstrained_rate) {
  const auto& p = run.plan;
  const auto& t = run.timing;
  std::printf(
      "{\"bench\":\"train\",\"model\":\"%s\",\"budget_bytes\":%zu,\"peak_bytes\":%zu,"
      "\"micro_batch\":%zu,\"accumulation\":%zu,\"recompute\":%s,\"samples_per_s\":%.1f,"
      "\"threads\":%zu,\"batch\":%zu,\"unconstrained_samples_per_s\":%.1f,"
      "\"ratio_to_unconstrained\":%.3f,\"planned_peak_bytes\":%zu,\"predicted_bytes\":%zu,"
      "\"within_budget\":%s,\"forced\":%s,\"min_samples_per_s\":%.1f,"
      "\"max_samples_per_s\":%.1f,\"repeats\":%zu,\"steps\":%zu,\"device\":\"%s\"}\n",
      model.c_str(), p.budget, run.peak_bytes, p.micro_batch, p.accumulation,
      p.recompute ? "true" : "false", t.median, threads, options.batch, unconstrained_rate,
      t.median / unconstrained_rate, p.peak_bytes, p.predicted_bytes,
      run.peak_bytes <= p.budget ? "true" : "false", run.forced ? "true" : "false", t.min, t.max,
      t.repeats, t.steps, options.device.c_str());
  std::fflush(stdout);
}

// Counts and prints one budget run.
void record(const Options& options, const BudgetRun& run, MemorySummary& summary) {
  ++summary.budgets;
  if (run.peak_bytes > run.plan.budget) {
    ++summary.over_budget;
    COHORT_LOG(Error) << "model=" << summary.model << " threads=" << summary.threads << " budget "
                      << run.plan.budget << ": measured peak " << run.peak_bytes << " exceeds it";
  }
  if (run.plan.accumulation == 4 && !summary.rate_4way) {
    summary.rate_4way = run.timing.median;
    summary.forced_4way = run.forced;
  }
  print_budget_line(options, summary.model, summary.threads, run, summary.unconstrained_rate);
}

MemorySummary bench_memory(const Options& options, const Dataset& data, const std::string& model,
                           std::size_t threads) {
  auto device = cohort::kernels::make_device(options.device, {.threads = threads});
  const auto spec = cohort::kernels::make_network_spec(model_specs().at(model),
                                                       {.input = data.shape(), .classes = 10});
  MemorySummary summary{.model = model, .threads = threads};
  // The unconstrained run: the whole batch, the rate every budget is compared with.
  const BudgetRun unconstrained = *run_budget(options, data, model, spec, *device, 0);
  summary.unconstrained_peak = unconstrained.plan.peak_bytes;
  summary.minimum = unconstrained.plan.minimum_bytes;
  summary.unconstrained_rate = unconstrained.timing.median;
  const std::size_t budget_4way =
      options.batch < 4
          ? 0
          : cohort::kernels::measure_peak_bytes(spec, *device, trainer_options(options).optimizer,
                                                options.batch, micro_batch_4way(options.batch));
  COHORT_LOG(Info) << "model=" << model << " threads=" << threads
                   << " unconstrained: plan peak=" << summary.unconstrained_peak
                   << " timed peak=" << unconstrained.peak_bytes << " minimum=" << summary.minimum
                   << " 4-way peak=" << budget_4way
                   << " samples_per_s=" << summary.unconstrained_rate;
  for (const std::size_t budget : budgets_for(options, unconstrained.plan, budget_4way)) {
    const auto run = run_budget(options, data, model, spec, *device, budget);
    if (run) {
      record(options, *run, summary);
    } else {
      ++summary.refused;
    }
  }
  // No budget made the planner accumulate 4 micro-batches (the MLP at batch 64, where its
  // 4-way peak is above the whole batch's): time 4-way accumulation anyway, for its cost.
  if (!summary.rate_4way && budget_4way > 0 && options.budget_bytes.empty()) {
    record(options, run_forced_4way(options, data, spec, *device, unconstrained.plan, budget_4way),
           summary);
  }
  if (options.batch >= 4) paired_4way_ratio(options, data, spec, *device, summary);
  return summary;
}

void print_summary(const Options& options, const MemorySummary& s) {
  char rate[32] = "null", ratio[32] = "null";
  if (s.rate_4way) {
    std::snprintf(rate, sizeof rate, "%.1f", *s.rate_4way);
    std::snprintf(ratio, sizeof ratio, "%.3f", *s.rate_4way / s.unconstrained_rate);
  }
  std::printf(
      "{\"bench\":\"train\",\"summary\":\"memory_budget\",\"model\":\"%s\",\"threads\":%zu,"
      "\"batch\":%zu,\"unconstrained_peak_bytes\":%zu,\"minimum_bytes\":%zu,\"budgets\":%zu,"
      "\"refused\":%zu,\"over_budget\":%zu,\"all_within_budget\":%s,"
      "\"unconstrained_samples_per_s\":%.1f,\"accumulation4_samples_per_s\":%s,"
      "\"ratio_at_4way\":%s,\"4way_forced\":%s,\"paired_ratio_at_4way\":%.3f,"
      "\"paired_best_ratio_at_4way\":%.3f,\"device\":\"%s\"}\n",
      s.model.c_str(), s.threads, options.batch, s.unconstrained_peak, s.minimum, s.budgets,
      s.refused, s.over_budget, s.over_budget == 0 ? "true" : "false", s.unconstrained_rate, rate,
      ratio, s.forced_4way ? "true" : "false", s.paired_ratio, s.paired_best_ratio,
      options.device.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"cohort-bench-train: local-training throughput, JSON lines on stdout"};
  app.add_flag("--quick", options.quick, "tiny run for CTest: synthetic data, few steps");
  app.add_option("--models", options.models,
                 "models: mlp, lenet5, 2conv, 2conv1024, resnet20 (on the data's 1x28x28)")
      ->delimiter(',');
  app.add_option("--threads", options.threads, "CPU kernel thread counts")->delimiter(',');
  app.add_option("--device", options.device,
                 "cpu, or cuda[:N]: the device trained on (--threads then only labels the lines)");
  app.add_option("--batch", options.batch, "minibatch size")->check(CLI::PositiveNumber);
  app.add_option("--repeats", options.repeats, "timed repeats per configuration")
      ->check(CLI::PositiveNumber);
  app.add_option("--seconds", options.seconds, "target seconds per timed repeat")
      ->check(CLI::PositiveNumber);
  app.add_option("--data-dir", options.data_dir, "Fashion-MNIST directory");
  app.add_flag("--memory-budget", options.memory_budget,
               "train under memory budgets from the unconstrained peak down to the minimum");
  app.add_option("--budgets", options.budgets,
                 "--memory-budget: budgets per model (the 4-way accumulation budget is added)")
      ->check(CLI::Range(std::size_t{2}, std::size_t{100}));
  app.add_option("--budget-bytes", options.budget_bytes,
                 "--memory-budget: explicit budgets in bytes instead of the spread")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    cohort::set_log_level(cohort::LogLevel::Info);
    if (options.quick) {
      options.repeats = 1;
      options.seconds = 0.01;
      options.budgets = std::min<std::size_t>(options.budgets, 3);
    }
    for (const auto& model : options.models) {
      if (!model_specs().contains(model)) {
        throw cohort::ConfigError("unknown model '" + model +
                                  "' (known: mlp, lenet5, 2conv, 2conv1024, resnet20)");
      }
    }
    const auto [data, data_name] = load_data(options);
    COHORT_LOG(Info) << "data=" << data_name << " examples=" << data.size();
    std::vector<MemorySummary> summaries;
    for (const auto& model : options.models) {
      for (const std::size_t threads : options.threads) {
        if (options.memory_budget) {
          summaries.push_back(bench_memory(options, data, model, threads));
        } else {
          bench_one(options, data, data_name, model, threads);
        }
      }
    }
    std::size_t over = 0;
    for (const auto& s : summaries) {
      print_summary(options, s);
      over += s.over_budget;
    }
    if (over > 0) {
      COHORT_LOG(Error) << over << " budget run(s) peaked above their budget";
      return 1;
    }
  } catch (const std::exception& e) {
    COHORT_LOG(Error) << e.what();
    return 1;
  }
  return 0;
}
