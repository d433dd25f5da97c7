// cohort-sim's memory budgets (memory_budgets.h).
#include "memory_budgets.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include "cohort/client/trainer.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/memory_plan.h"
#include "cohort/kernels/model_zoo.h"

namespace cohort::sim {
namespace {

// Probe steps per budget before falling back to micro-batch 1: kMaxProbes of
// kernels/memory_plan.cc, so that each client gets plan_memory()'s micro-batch.
constexpr int kMaxProbes = 6;

// plan_memory()'s choice for any number of budgets, with its probe steps shared: the minimum is
// measured once and each candidate micro-batch's peak at most once. As in plan_memory(), a
// budget that holds the whole batch's measured peak trains whole batches, one below the
// micro-batch-1 peak recomputes activations (in the largest micro-batch, doubling from 1, that
// then fits), and the minimum is the least of the whole-batch and micro-batch-1 peaks, kept or
// recomputed.
class BudgetPlanner {
 public:
  struct Choice {
    std::size_t micro_batch = 0;
    bool recompute = false;
  };

  BudgetPlanner(const kernels::NetworkSpec& spec, const kernels::Device& device,
                const kernels::OptimizerOptions& optimizer, std::size_t batch)
      : spec_(spec), device_(device), optimizer_(optimizer), batch_(batch) {
    whole_ = kernels::measure_peak_bytes(spec_, device_, optimizer_, batch_, batch_);
    single_ = kernels::measure_peak_bytes(spec_, device_, optimizer_, batch_, 1);
    minimum_ = std::min({whole_, single_, peak(1, true)});
    // Candidates: the largest micro-batch for each accumulation count k = 1, 2, ...
    for (std::size_t k = 1; k <= batch_; ++k) {
      const std::size_t m = (batch_ + k - 1) / k;
      if (candidates_.empty() || m < candidates_.back()) candidates_.push_back(m);
    }
  }

  // The least budget that trains (see above).
  [[nodiscard]] std::size_t minimum() const { return minimum_; }

  // The plan plan_memory() picks under `budget` (micro-batch batch: whole batches); nullopt
  // when not even one sample fits.
  std::optional<Choice> choose(std::size_t budget) {
    if (budget == 0 || budget >= whole_) return Choice{batch_};
    if (budget < minimum_) return std::nullopt;
    if (budget < single_) {  // recompute, in the largest micro-batch that fits
      std::size_t m = 1;
      while (m < batch_ && peak(std::min(2 * m, batch_), true) <= budget)
        m = std::min(2 * m, batch_);
      return Choice{m, true};
    }
    if (!model_) model_ = kernels::measure_memory_model(spec_, device_, optimizer_);
    int probes = 0;
    for (const std::size_t m : candidates_) {
      if (m == 1) break;
      if (model_->bytes(batch_, m) > budget) continue;
      if (++probes > kMaxProbes) break;
      if (peak(m, false) <= budget) return Choice{m};
    }
    return Choice{1};
  }

 private:
  std::size_t peak(std::size_t m, bool recompute) {
    auto [it, fresh] = peaks_.try_emplace({m, recompute}, 0);
    if (fresh) {
      it->second = kernels::measure_peak_bytes(spec_, device_, optimizer_, batch_, m, recompute);
    }
    return it->second;
  }

  const kernels::NetworkSpec& spec_;
  const kernels::Device& device_;
  kernels::OptimizerOptions optimizer_;
  std::size_t batch_ = 0, whole_ = 0, single_ = 0, minimum_ = 0;
  std::vector<std::size_t> candidates_;
  std::optional<kernels::MemoryModel> model_;
  std::map<std::pair<std::size_t, bool>, std::size_t> peaks_;  // by (micro-batch, recompute)
};

// A profile's memory in whole bytes; a budget beyond any host's is no limit worth probing.
std::size_t budget_bytes(double memory) {
  constexpr double kMax = static_cast<double>(std::size_t{1} << 62);
  return memory >= kMax ? std::size_t{1} << 62 : static_cast<std::size_t>(std::floor(memory));
}

}  // namespace

FleetMemory FleetMemory::plan(const kernels::NetworkSpec& spec, const kernels::Device& device,
                              const kernels::OptimizerOptions& optimizer, std::size_t batch,
                              std::span<const std::size_t> budgets, double slowdown) {
  COHORT_CHECK(batch >= 1);
  FleetMemory out;
  out.batch_ = batch;
  out.parameters_ = spec.parameter_count();
  out.micro_batch_.assign(budgets.size(), 0);
  out.recompute_.assign(budgets.size(), 0);
  BudgetPlanner planner(spec, device, optimizer, batch);
  out.minimum_bytes_ = planner.minimum();
  // Distinct budgets, planned once.
  std::map<std::size_t, std::optional<BudgetPlanner::Choice>> by_budget;
  for (std::size_t c = 0; c < budgets.size(); ++c) {
    auto [it, fresh] = by_budget.try_emplace(budgets[c]);
    if (fresh) it->second = planner.choose(budgets[c]);
    if (!it->second) {
      out.micro_batch_[c] = kUnfit;
      ++out.unfit_;
      continue;
    }
    const auto [m, recompute] = *it->second;
    if (recompute) {
      out.recompute_[c] = 1;
      out.recompute_slowdown_.try_emplace(m, 0.0);
      ++out.recomputing_;
    }
    if (m < batch) {
      out.micro_batch_[c] = static_cast<std::uint32_t>(m);
      if (!recompute) out.slowdown_.try_emplace(m, 0.0);
      ++out.micro_batched_;
    }
  }
  out.measured_ = slowdown <= 0;
  for (auto* factors : {&out.slowdown_, &out.recompute_slowdown_}) {
    const bool recompute = factors == &out.recompute_slowdown_;
    for (auto& [m, r] : *factors) {
      r = out.measured_ ? measure_micro_batch_slowdown(spec, device, optimizer, batch, m, recompute)
                        : slowdown;
    }
  }
  return out;
}

bool FleetMemory::fits(std::uint32_t c) const {
  return micro_batch_.empty() || micro_batch_.at(c) != kUnfit;
}

std::size_t FleetMemory::micro_batch(std::uint32_t c) const {
  if (micro_batch_.empty()) return 0;
  const std::uint32_t m = micro_batch_.at(c);
  return m == kUnfit ? 0 : m;
}

bool FleetMemory::recompute(std::uint32_t c) const {
  return !recompute_.empty() && recompute_.at(c) != 0;
}

double FleetMemory::slowdown(std::uint32_t c) const {
  const std::size_t m = micro_batch(c);
  if (recompute(c)) return recompute_slowdown_.at(m == 0 ? batch_ : m);
  return m == 0 ? 1.0 : slowdown_.at(m);
}

double measure_micro_batch_slowdown(const kernels::NetworkSpec& spec, const kernels::Device& device,
                                    const kernels::OptimizerOptions& optimizer, std::size_t batch,
                                    std::size_t micro_batch, bool recompute) {
  constexpr int kSteps = 5;
  kernels::OptimizerOptions frozen = optimizer;
  frozen.learning_rate = 0.0f;  // the same arithmetic every step: nothing drifts or diverges
  const auto make = [&](std::size_t m, bool segments) {
    auto net = device.make_network(spec);
    net->init(1);
    net->set_optimizer(frozen);
    net->set_micro_batch(m < batch ? m : 0);
    net->set_recompute(segments);
    return net;
  };
  const auto whole_net = make(batch, false);
  const auto split_net = make(micro_batch, recompute);
  const std::size_t d = spec.input_shape().size();
  std::vector<float> x(batch * d);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 251) / 251.0f;
  const std::vector<std::int32_t> y(batch, 0);
  const auto seconds = [&](kernels::Network& net) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < kSteps; ++s) (void)net.train_step(x, y, batch);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  (void)seconds(*whole_net);  // warm-up: buffers grow, caches fill
  (void)seconds(*split_net);
  std::array<double, 3> ratios{};
  for (auto& r : ratios) {
    const double whole = seconds(*whole_net);
    r = seconds(*split_net) / std::max(whole, 1e-9);
  }
  std::sort(ratios.begin(), ratios.end());
  return std::max(1.0, ratios[1]);
}

FleetMemory plan_fleet_memory(const Config& config, const SimOptions& options) {
  const ProfileSpec& draw = options.profile.spec;
  if (options.profile.trace.empty() && draw.memory_bytes.kind == Distribution::Kind::kConst &&
      draw.memory_bytes.a == 0) {
    return {};
  }
  const std::vector<DeviceProfile> trace = options.profile.trace.empty()
                                               ? std::vector<DeviceProfile>{}
                                               : read_profile_trace(options.profile.trace);
  std::vector<std::size_t> budgets(options.clients);
  for (std::size_t c = 0; c < budgets.size(); ++c) {
    const DeviceProfile p =
        trace.empty() ? draw_profile(draw, options.seed, c) : trace[c % trace.size()];
    budgets[c] = budget_bytes(p.memory_bytes);
  }
  if (std::all_of(budgets.begin(), budgets.end(), [](std::size_t b) { return b == 0; })) return {};
  const std::string model = config.get_string("model.spec");
  const auto train = client::trainer_options_from(config.section("train"));
  const auto spec = kernels::make_network_spec(model);
  const auto device = kernels::make_device("cpu", {.threads = 1});
  FleetMemory memory = FleetMemory::plan(spec, *device, train.optimizer, train.batch_size, budgets,
                                         options.micro_batch_slowdown);
  const std::string minimum = std::to_string(memory.minimum_bytes()) + " bytes (" +
                              kernels::format_bytes(memory.minimum_bytes()) + ")";
  const std::string what = model + " at batch " + std::to_string(train.batch_size);
  if (memory.unfit() == memory.clients()) {
    throw ConfigError("none of the " + std::to_string(memory.clients()) + " clients can train " +
                      what + ": every memory budget (profile.memory, or the trace's memory " +
                      "column) is below the minimum of " + minimum);
  }
  if (memory.unfit() > 0) {
    COHORT_LOG(Warn) << memory.unfit() << " of " << memory.clients() << " clients cannot train "
                     << what << ": their memory is below the minimum of " << minimum
                     << "; they are never selected";
  }
  for (const bool recompute : {false, true}) {
    for (const auto& [m, r] : recompute ? memory.recompute_slowdowns() : memory.slowdowns()) {
      char factor[32];
      std::snprintf(factor, sizeof factor, "%.3f", r);
      COHORT_LOG(Info) << "cohort-sim: memory budgets: micro-batches of " << m << " (batch "
                       << train.batch_size << " in " << (train.batch_size + m - 1) / m << ")"
                       << (recompute ? ", recomputing activations" : "") << ", compute time x "
                       << factor
                       << (memory.slowdown_measured() ? " measured on this host "
                                                        "(sim.micro_batch_slowdown pins it)"
                                                      : " (sim.micro_batch_slowdown)");
    }
  }
  return memory;
}

}  // namespace cohort::sim
