#include "cohort/kernels/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <vector>

#include "cohort/core/buffer.h"
#include "cohort/core/error.h"

namespace cohort::kernels {
namespace {

// The model is fitted at micro-batches 16 and 32 (every kernel splits its work over all its parts
// and pads whole panels, as at the batches people train with), or smaller under a tight budget.
constexpr std::size_t kFitSmall = 16;
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

// One training step and one evaluation of `batch` zero samples on a fresh network: its peak, or
// nullopt when that would take more than `limit` bytes (0: no limit; nothing past the limit is
// ever allocated, so probing never costs more memory than the budget being planned for).
std::optional<MemoryUse> probe(const NetworkSpec& spec, const Device& device,
                               const OptimizerOptions& optimizer, std::size_t batch,
                               std::size_t micro_batch, std::size_t limit, bool recompute) {
  const std::size_t input = input_bytes(spec, batch);
  if (limit != 0 && limit <= input) return std::nullopt;
  try {
    auto net = device.make_network(spec);
    if (!net->memory().tracked) {
      throw KernelError("the " + device.name() +
                        " device does not count its memory: train.memory_budget needs cpu");
    }
    if (limit != 0) {
      if (net->memory().current.total > limit - input) return std::nullopt;
      net->set_memory_limit(limit - input);
    }
    net->init(1);
    net->set_optimizer(optimizer);
    net->set_micro_batch(micro_batch < batch ? micro_batch : 0);
    if (recompute) {
      try {
        net->set_recompute(true);
      } catch (const KernelError&) {
        return std::nullopt;  // the device cannot (CUDA): no such plan
      }
    }
    const std::vector<float> x(batch * spec.input_shape().size(), 0.0f);
    const std::vector<std::int32_t> y(batch, 0);
    net->train_step(x, y, batch);
    (void)net->evaluate(x, y, batch);
    return net->memory().peak;
  } catch (const std::bad_alloc&) {
    if (limit == 0) throw;
    return std::nullopt;
  }
}

std::optional<std::size_t> probe_total(const NetworkSpec& spec, const Device& device,
                                       const OptimizerOptions& optimizer, std::size_t batch,
                                       std::size_t micro_batch, std::size_t limit,
                                       bool recompute = false) {
  const auto peak = probe(spec, device, optimizer, batch, micro_batch, limit, recompute);
  if (!peak) return std::nullopt;
  return peak->total + input_bytes(spec, batch);
}

// The batch-dependent terms fitted at micro-batches a and 2a (a whole step each), the largest a
// in 16, 4, 1 whose probes stay within limit; nullopt when not even a = 1 does.
struct Fit {
  MemoryUse small;
  bool per_sample = false;  // false: only one sample fitted (the per-sample terms are 0)
  double activations_fixed = 0, activations_per_sample = 0;
  double workspace_fixed = 0, workspace_per_sample = 0;
};

std::optional<Fit> fit(const NetworkSpec& spec, const Device& device,
                       const OptimizerOptions& optimizer, std::size_t limit, bool recompute) {
  for (const std::size_t a : {kFitSmall, std::size_t{4}, std::size_t{1}}) {
    const auto small = probe(spec, device, optimizer, a, a, limit, recompute);
    if (!small) continue;
    const auto large = probe(spec, device, optimizer, 2 * a, 2 * a, limit, recompute);
    if (!large) continue;
    Fit f{.small = *small, .per_sample = true};
    const auto at = static_cast<double>(a);
    f.activations_per_sample =
        (static_cast<double>(large->activations) - static_cast<double>(small->activations)) / at;
    f.activations_fixed = static_cast<double>(small->activations) - f.activations_per_sample * at;
    f.workspace_per_sample =
        (static_cast<double>(large->workspace) - static_cast<double>(small->workspace)) / at;
    f.workspace_fixed = static_cast<double>(small->workspace) - f.workspace_per_sample * at;
    return f;
  }
  // Two samples do not fit: the terms of one, with nothing per sample.
  const auto one = probe(spec, device, optimizer, 1, 1, limit, recompute);
  if (!one) return std::nullopt;
  return Fit{.small = *one,
             .activations_fixed = static_cast<double>(one->activations),
             .workspace_fixed = static_cast<double>(one->workspace)};
}

// The model of both ways of training: activations kept, and recomputed by segment. nullopt when
// neither fits within limit; with only the recomputing one, kept_activations is false.
std::optional<MemoryModel> fit_model(const NetworkSpec& spec, const Device& device,
                                     const OptimizerOptions& optimizer, std::size_t limit) {
  const auto kept = fit(spec, device, optimizer, limit, false);
  const auto recomputed = fit(spec, device, optimizer, limit, true);
  if (!kept && !recomputed) return std::nullopt;
  const Fit& any = kept ? *kept : *recomputed;
  MemoryModel m;
  m.device = device.description();
  m.parameters = any.small.parameters;
  m.gradients = any.small.gradients;
  m.optimizer = any.small.optimizer;
  m.input_per_sample = (input_bytes(spec, 1024) + 1023) / 1024;
  m.workspace_fixed = any.workspace_fixed;
  m.workspace_per_sample = any.workspace_per_sample;
  m.kept_activations = kept.has_value();
  m.per_sample_measured = any.per_sample && (!kept || !recomputed || recomputed->per_sample);
  if (kept) {
    m.activations_fixed = kept->activations_fixed;
    m.activations_per_sample = kept->activations_per_sample;
  }
  m.recompute_measured = recomputed.has_value();
  if (recomputed) {
    m.recompute_activations_fixed = recomputed->activations_fixed;
    m.recompute_activations_per_sample = recomputed->activations_per_sample;
  }
  return m;
}

}  // namespace

std::size_t MemoryModel::bytes(std::size_t batch, std::size_t micro_batch, bool recompute) const {
  const std::size_t m = std::clamp<std::size_t>(micro_batch, 1, std::max<std::size_t>(batch, 1));
  const double fixed = recompute ? recompute_activations_fixed : activations_fixed;
  const double per_sample = recompute ? recompute_activations_per_sample : activations_per_sample;
  const double per_batch =
      fixed + workspace_fixed + (per_sample + workspace_per_sample) * static_cast<double>(m);
  return parameters + gradients + optimizer + input_per_sample * batch +
         static_cast<std::size_t>(std::ceil(std::max(per_batch, 0.0)));
}

MemoryModel measure_memory_model(const NetworkSpec& spec, const Device& device,
                                 const OptimizerOptions& optimizer) {
  return *fit_model(spec, device, optimizer, 0);
}

std::size_t measure_peak_bytes(const NetworkSpec& spec, const Device& device,
                               const OptimizerOptions& optimizer, std::size_t batch,
                               std::size_t micro_batch, bool recompute) {
  return *probe_total(spec, device, optimizer, batch, micro_batch, 0, recompute);
}

MemoryPlan plan_memory(const NetworkSpec& spec, const Device& device,
                       const OptimizerOptions& optimizer, std::size_t batch, std::size_t budget,
                       std::string_view model_name) {
  if (batch == 0) throw ConfigError("memory plan: the batch must be at least 1");
  MemoryPlan plan;
  plan.budget = budget;
  plan.batch = batch;
  // Every probe runs under the budget: planning never allocates more than training may.
  const auto single = probe_total(spec, device, optimizer, batch, 1, budget);
  const auto fitted = fit_model(spec, device, optimizer, budget);
  if (fitted) plan.model = *fitted;
  // The whole batch is always tried (under the limit, so the try costs at most the budget).
  const auto whole = probe_total(spec, device, optimizer, batch, batch, budget);
  // One sample recomputing its activations: what the least budget may need.
  const auto single_recomputed = probe_total(spec, device, optimizer, batch, 1, budget, true);
  const auto choose = [&](std::size_t m, std::size_t peak, bool recompute = false) {
    plan.micro_batch = m;
    plan.accumulation = (batch + m - 1) / m;
    plan.recompute = recompute;
    plan.predicted_bytes = plan.model.bytes(batch, m, recompute);
    plan.peak_bytes = peak;
    return plan;
  };
  plan.minimum_bytes = std::numeric_limits<std::size_t>::max();
  for (const auto& peak : {single, whole, single_recomputed}) {
    if (peak) plan.minimum_bytes = std::min(plan.minimum_bytes, *peak);
  }
  if (whole) return choose(batch, *whole);
  if (!single && single_recomputed) {
    // Not one sample fits with its activations kept: recompute them by segment, in the largest
    // micro-batch (doubling from 1, then the whole batch) that fits.
    std::size_t m = 1, peak = *single_recomputed;
    while (m < batch) {
      const std::size_t next = std::min(2 * m, batch);
      const auto p = probe_total(spec, device, optimizer, batch, next, budget, true);
      if (!p) break;
      m = next;
      peak = *p;
    }
    return choose(m, peak, true);
  }
  if (!single) {
    // Nothing fits: measure the minimum without the budget, for the message (the whole batch
    // only where the model says it could be the smaller).
    plan.minimum_bytes = std::min(measure_peak_bytes(spec, device, optimizer, batch, 1, false),
                                  measure_peak_bytes(spec, device, optimizer, batch, 1, true));
    if (fitted && fitted->kept_activations && plan.model.bytes(batch, batch) < plan.minimum_bytes) {
      plan.minimum_bytes =
          std::min(plan.minimum_bytes, measure_peak_bytes(spec, device, optimizer, batch, batch));
    }
    throw ConfigError("cannot train " + std::string(model_name) + " at batch " +
                      std::to_string(batch) + " under a memory budget of " +
                      std::to_string(budget) + " bytes (" + format_bytes(budget) +
                      "): it needs at least " + std::to_string(plan.minimum_bytes) + " bytes (" +
                      format_bytes(plan.minimum_bytes) + ")");
  }
  // Candidates: the largest micro-batch for each accumulation count k = 2, 3, ...; the first
  // the model says fits and a probe confirms wins.
  std::size_t previous = batch;
  int probes = 0;
  for (std::size_t k = 2; k <= batch && probes < kMaxProbes; ++k) {
    const std::size_t m = (batch + k - 1) / k;
    if (m == previous || m == 1) continue;
    previous = m;
    if (plan.model.bytes(batch, m) > budget) continue;
    ++probes;
    if (const auto peak = probe_total(spec, device, optimizer, batch, m, budget)) {
      return choose(m, *peak);
    }
  }
  return choose(1, *single);
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
  out << std::fixed << std::setprecision(0);
  if (m.kept_activations) {
    out << "  activations              " << std::setw(12) << m.activations_fixed << " + "
        << m.activations_per_sample << " per sample\n";
  } else {
    out << "  activations              (kept: more than the budget, not measured)\n";
  }
  if (m.recompute_measured) {
    out << "  activations, recomputed  " << std::setw(12) << m.recompute_activations_fixed << " + "
        << m.recompute_activations_per_sample << " per sample\n";
  } else {
    out << "  activations, recomputed  (not on this device, or more than the budget)\n";
  }
  out << "  workspace                " << std::setw(12) << m.workspace_fixed << " + "
      << m.workspace_per_sample << " per sample\n";
  if (!m.per_sample_measured) {
    out << "  (the budget holds one sample, so the per-sample terms were not measured)\n";
  }
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
