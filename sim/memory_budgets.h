// cohort-sim's memory budgets (docs/ALGORITHMS.md 3.5.2). A virtual client's device profile may
// carry a memory size (DeviceProfile::memory_bytes, profile.memory or a trace's memory column;
// 0: unlimited). Before the shards start, every budget is planned as kernels::plan_memory()
// plans it, on the device the fleet's slots train on (CPU, one thread), so the plan's peak is
// the slots' own:
//
//   - fits whole:   the client trains whole batches (factor 1);
//   - fits in m:    its local training runs in micro-batches of m with gradient accumulation
//                   (Network::set_micro_batch on whichever slot trains it), and the virtual clock
//                   multiplies its compute time by r(m) >= 1, the slowdown of micro-batching;
//   - fits only recomputing: (below micro-batch 1's peak, at or above its peak with activations
//                   recomputed) micro-batches of the largest m that then fits, doubling from 1,
//                   with Network::set_recompute, and the factor r_rc(m) >= 1 of both;
//   - fits nothing: (below the minimum: micro-batches of one sample, kept or recomputed, or the
//                   whole batch if that needs less) the client never registers, as a real
//                   cohort-client whose plan fails never does, so the coordinator never selects it;
//                   the run counts it (Summary::clients_unfit).
//
// Cost: plan_memory() runs probe steps, so they are shared rather than run per budget: the
// model, the whole batch's peak and the minimum are measured once, and each candidate
// micro-batch is probed at most once for the whole fleet (a batch B has about 2 sqrt(B)
// candidates, however many distinct budgets a continuous distribution draws). r(m) is timed
// once per micro-batch (and recomputation) in use, unless sim.micro_batch_slowdown pins it: a
// timing varies from host to host and run to run, the only part of a simulation that does, so
// reproducible runs pin it (one factor for all).
// Private to sim/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string_view>
#include <vector>

#include "cohort/core/config.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/network.h"
#include "cohort/kernels/optimizer.h"
#include "options.h"

namespace cohort::sim {

// Each client's micro-batch under its budget and the compute-time factor that comes with it.
// Immutable once planned: the training threads read it without a lock.
class FleetMemory {
 public:
  // No budgets: every client fits and trains whole batches at factor 1.
  FleetMemory() = default;

  // Plans budgets[c] (bytes, 0: unlimited) of client c for spec trained at `batch` with
  // `optimizer` on `device` (kernels::plan_memory's micro-batch for each budget). slowdown > 0
  // pins r(m) of every micro-batch m < batch; 0 measures it (measure_micro_batch_slowdown). Does
  // not refuse a fleet without a fitting client (plan_fleet_memory does).
  static FleetMemory plan(const kernels::NetworkSpec& spec, const kernels::Device& device,
                          const kernels::OptimizerOptions& optimizer, std::size_t batch,
                          std::span<const std::size_t> budgets, double slowdown);

  [[nodiscard]] bool has_budgets() const { return !micro_batch_.empty(); }
  [[nodiscard]] bool fits(std::uint32_t c) const;
  // The value for Network::set_micro_batch(): 0 for whole batches (and for an unfit client).
  [[nodiscard]] std::size_t micro_batch(std::uint32_t c) const;
  // Whether the client recomputes activations (Network::set_recompute).
  [[nodiscard]] bool recompute(std::uint32_t c) const;
  // r(m) of the client's micro-batch (r_rc(m) when it recomputes): 1 for whole batches.
  [[nodiscard]] double slowdown(std::uint32_t c) const;
  [[nodiscard]] std::size_t clients() const { return micro_batch_.size(); }
  [[nodiscard]] std::size_t unfit() const { return unfit_; }
  // Clients that train in micro-batches; that recompute activations.
  [[nodiscard]] std::size_t micro_batched() const { return micro_batched_; }
  [[nodiscard]] std::size_t recomputing() const { return recomputing_; }
  [[nodiscard]] std::size_t batch() const { return batch_; }
  [[nodiscard]] std::size_t parameters() const { return parameters_; }
  // The least budget that trains (0 without budgets): micro-batches of one sample (kept or
  // recomputed), or the whole batch when that needs less (memory_budgets.cc).
  [[nodiscard]] std::size_t minimum_bytes() const { return minimum_bytes_; }
  // r(m) of every micro-batch m < batch in use; whether they were measured.
  [[nodiscard]] const std::map<std::size_t, double>& slowdowns() const { return slowdown_; }
  // r_rc(m) of every micro-batch m (batch: whole) that recomputes activations.
  [[nodiscard]] const std::map<std::size_t, double>& recompute_slowdowns() const {
    return recompute_slowdown_;
  }
  [[nodiscard]] bool slowdown_measured() const { return measured_; }

 private:
  static constexpr std::uint32_t kUnfit = 0xffffffffu;
  std::vector<std::uint32_t> micro_batch_;  // per client: set_micro_batch()'s value, or kUnfit
  std::vector<std::uint8_t> recompute_;     // per client: 1 recomputes activations
  std::map<std::size_t, double> slowdown_, recompute_slowdown_;
  std::size_t batch_ = 0, parameters_ = 0, minimum_bytes_ = 0, unfit_ = 0, micro_batched_ = 0;
  std::size_t recomputing_ = 0;
  bool measured_ = false;
};

// How much slower a training step of `batch` samples runs in micro-batches of micro_batch
// (recomputing activations, or not) than whole with activations kept, on `device` (fresh
// networks, learning rate 0 so nothing diverges): the median over 3 rounds of the time of 5
// such steps over that of 5 whole ones, after one warm-up of each; at least 1. A measurement
// of the host: it varies between runs.
double measure_micro_batch_slowdown(const kernels::NetworkSpec& spec, const kernels::Device& device,
                                    const kernels::OptimizerOptions& optimizer, std::size_t batch,
                                    std::size_t micro_batch, bool recompute = false);

// The fleet's plan from the simulation's configuration: the memory of options.clients profiles
// (sim.profile_trace, else profile.*), model.spec, train.batch_size and train's optimizer,
// sim.micro_batch_slowdown. An empty FleetMemory (nothing measured) when no client has a
// budget. Logs one warning line when some clients cannot train, and each micro-batch in use
// with its factor. Throws ConfigError (one line, naming the minimum) when no client can train,
// DataError for a bad trace.
FleetMemory plan_fleet_memory(const Config& config, const SimOptions& options);

}  // namespace cohort::sim
