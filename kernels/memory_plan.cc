#include "cohort/kernels/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <vector>

#include "cohort/core/buffer.h"
#include "cohort/core/error.h"

namespace cohort::kernels {
namespace {

// Micro-batch sizes the model is fitted at: big enough that every kernel splits its work over
// all its parts and pads whole panels, as it does at the batches people train with.
constexpr std::size_t kFitSmall = 16;
constexpr std::size_t kFitLarge = 32;
// Probe steps plan_memory() runs on candidates the model says fit, before it tries micro-batch 1.
constexpr int kMaxProbes = 6;

std::size_t aligned(std::size_t bytes) {
  return std::max(kBufferAlignment,
                  (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment);
}

// The trainer's batch buffer of `batch` samples: features, and int32 labels.
std::size_t input_bytes(const NetworkSpec& spec, std::size_t batch) {
  return aligned(batch * spec.input_shape().size() * sizeof(float)) +
         aligned(batch * sizeof(std::int32_t));
}

struct Probe {
  MemoryUse peak;
};

// One training step and one evaluation of `batch` zero samples on a fresh network.
Probe probe(const NetworkSpec& spec, const Device& device, const OptimizerOptions& optimizer,
            std::size_t batch, std::size_t micro_batch) {
  auto net = device.make_network(spec);
  if (!net->memory().tracked) {
    throw KernelError("the " + device.name() +
                      " device does not count its memory: train.memory_budget needs cpu");
  }
  net->init(1);
  net->set_optimizer(optimizer);
  net->set_micro_batch(micro_batch < batch ? micro_batch : 0);
  const std::vector<float> x(batch * spec.input_shape().size(), 0.0f);
  const std::vector<std::int32_t> y(batch, 0);
  net->train_step(x, y, batch);
  (void)net->evaluate(x, y, batch);
  return {net->memory().peak};
}

}  // namespace

std::size_t MemoryModel::bytes(std::size_t batch, std::size_t micro_batch) const {
  const std::size_t m = std::clamp<std::size_t>(micro_batch, 1, std::max<std::size_t>(batch, 1));
  const double per_batch = activations_fixed + workspace_fixed +
                           (activations_per_sample + workspace_per_sample) * static_cast<double>(m);
  return parameters + gradients + optimizer + input_per_sample * batch +
         static_cast<std::size_t>(std::ceil(std::max(per_batch, 0.0)));
}

MemoryModel measure_memory_model(const NetworkSpec& spec, const Device& device,
                                 const OptimizerOptions& optimizer) {
  const Probe a = probe(spec, device, optimizer, kFitSmall, kFitSmall);
  const Probe b = probe(spec, device, optimizer, kFitLarge, kFitLarge);
  MemoryModel m;
  m.device = device.description();
  m.parameters = a.peak.parameters;
  m.gradients = a.peak.gradients;
  m.optimizer = a.peak.optimizer;
  m.input_per_sample = (input_bytes(spec, 1024) + 1023) / 1024;
  const double span = static_cast<double>(kFitLarge - kFitSmall);
  m.activations_per_sample =
      (static_cast<double>(b.peak.activations) - static_cast<double>(a.peak.activations)) / span;
  m.activations_fixed = static_cast<double>(a.peak.activations) -
                        m.activations_per_sample * static_cast<double>(kFitSmall);
  m.workspace_per_sample =
      (static_cast<double>(b.peak.workspace) - static_cast<double>(a.peak.workspace)) / span;
  m.workspace_fixed = static_cast<double>(a.peak.workspace) -
                      m.workspace_per_sample * static_cast<double>(kFitSmall);
  return m;
}

std::size_t measure_peak_bytes(const NetworkSpec& spec, const Device& device,
                               const OptimizerOptions& optimizer, std::size_t batch,
                               std::size_t micro_batch) {
  return probe(spec, device, optimizer, batch, micro_batch).peak.total + input_bytes(spec, batch);
}

MemoryPlan plan_memory(const NetworkSpec& spec, const Device& device,
                       const OptimizerOptions& optimizer, std::size_t batch, std::size_t budget,
                       std::string_view model_name) {
  if (batch == 0) throw ConfigError("memory plan: the batch must be at least 1");
  MemoryPlan plan;
  plan.budget = budget;
  plan.batch = batch;
  plan.model = measure_memory_model(spec, device, optimizer);
  // Kernel scratch padded to whole panels can make one sample cost as much as a small batch.
  const std::size_t whole = measure_peak_bytes(spec, device, optimizer, batch, batch);
  const std::size_t single =
      batch > 1 ? measure_peak_bytes(spec, device, optimizer, batch, 1) : whole;
  plan.minimum_bytes = std::min(whole, single);
  const auto choose = [&](std::size_t m, std::size_t peak) {
    plan.micro_batch = m;
    plan.accumulation = (batch + m - 1) / m;
    plan.predicted_bytes = plan.model.bytes(batch, m);
    plan.peak_bytes = peak;
    return plan;
  };
  if (budget == 0 || whole <= budget) return choose(batch, whole);
  if (budget < plan.minimum_bytes) {
    throw ConfigError("cannot train " + std::string(model_name) + " at batch " +
                      std::to_string(batch) + " under a memory budget of " +
                      std::to_string(budget) + " bytes (" + format_bytes(budget) +
                      "): it needs at least " + std::to_string(plan.minimum_bytes) + " bytes (" +
                      format_bytes(plan.minimum_bytes) + ")");
  }
  // Candidates: the largest micro-batch for each accumulation count k = 1, 2, ...
  std::vector<std::size_t> candidates;
  for (std::size_t k = 1; k <= batch; ++k) {
    const std::size_t m = (batch + k - 1) / k;
    if (candidates.empty() || m < candidates.back()) candidates.push_back(m);
  }
  int probes = 0;
  for (const std::size_t m : candidates) {
    if (m == batch) continue;  // measured above: it does not fit
    if (m == 1) break;
    if (plan.model.bytes(batch, m) > budget) continue;
    if (++probes > kMaxProbes) break;
    const std::size_t peak = measure_peak_bytes(spec, device, optimizer, batch, m);
    if (peak <= budget) return choose(m, peak);
  }
  return choose(1, single);
}

std::string format_bytes(std::size_t bytes) {
  std::ostringstream out;
  const auto b = static_cast<double>(bytes);
  if (bytes < 1024) {
    out << bytes << " B";
  } else if (bytes < (std::size_t{1} << 20)) {
    out << std::fixed << std::setprecision(1) << b / 1024 << " KiB";
  } else if (bytes < (std::size_t{1} << 30)) {
    out << std::fixed << std::setprecision(1) << b / (1 << 20) << " MiB";
  } else {
    out << std::fixed << std::setprecision(2) << b / (1 << 30) << " GiB";
  }
  return out.str();
}

std::string describe(const MemoryPlan& plan, std::string_view model_name) {
  const MemoryModel& m = plan.model;
  std::ostringstream out;
  const auto row = [&](std::string_view what, std::size_t bytes, std::string_view note = {}) {
    out << "  " << std::left << std::setw(24) << what << std::right << std::setw(12) << bytes
        << "  " << format_bytes(bytes) << note << "\n";
  };
  out << "training memory of " << model_name << " on " << m.device << " (measured)\n";
  row("parameters", m.parameters);
  row("gradients", m.gradients);
  row("optimizer state", m.optimizer);
  row("batch input / sample", m.input_per_sample);
  out << "  activations              " << std::fixed << std::setprecision(0) << std::setw(12)
      << m.activations_fixed << " + " << m.activations_per_sample << " per sample\n";
  out << "  workspace                " << std::setw(12) << m.workspace_fixed << " + "
      << m.workspace_per_sample << " per sample\n";
  out << "plan: batch " << plan.batch << " as " << plan.accumulation << " micro-batch"
      << (plan.accumulation == 1 ? "" : "es") << " of " << plan.micro_batch
      << (plan.recompute ? ", recomputing activations" : "") << "\n";
  row("budget", plan.budget, plan.budget == 0 ? "  (none)" : "");
  row("predicted peak", plan.predicted_bytes);
  row("measured peak", plan.peak_bytes);
  row("minimum budget", plan.minimum_bytes);
  return out.str();
}

}  // namespace cohort::kernels
