// Speed-proportional batches for BSP data-parallel training (docs/ALGORITHMS.md 3.4): the global
// batch B stays fixed and each worker takes a share in proportion to its measured speed, so that
// all finish a step together instead of waiting for the slowest. Shard 0 keeps the balancer: it
// sees each step close and each worker's gradient arrive, and tells each worker its batch in
// the PullReply of the step. Internal to the server library.
//
// Thread-safety: none; the shard's thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "cohort/core/ids.h"

namespace cohort::server {

// (3.2): integer batches b_p in proportion to `speeds` (samples/s, each > 0 and finite) with
// sum b_p = global_batch, 1 <= b_p <= cap (cap = 0: no cap). The real shares are
// clamp(lambda s_p, 1, cap) with lambda such that they sum to B: what a capped worker cannot take
// goes to the others in proportion to their speed (so the uncapped ones still finish together),
// not all to the fastest. Each share is then rounded down and the samples left over go, one
// each, to the largest remainders (ties: the faster worker, then the lower index), never past
// the cap. Deterministic. REQUIRES: speeds not empty, speeds.size() <= global_batch, and cap = 0
// or speeds.size() * cap >= global_batch (COHORT_CHECK otherwise).
std::vector<std::uint64_t> speed_batches(std::span<const double> speeds, std::uint64_t global_batch,
                                         std::uint64_t cap);

// Shard 0's per-worker batches over a BSP run. Every worker starts at `batch_size` (B = workers x
// batch_size, as the equal policy); once every worker has a measured step, and then every
// `rebalance_every` steps, the batches from the next step on follow speed_batches(). A change
// takes effect only between steps: step_closed() is called after a step's last gradient and
// before any pull for the next step is answered.
class BatchBalancer {
 public:
  // REQUIRES: workers >= 1, batch_size >= 1, rebalance_every >= 1, cap = 0 or cap >= batch_size.
  BatchBalancer(std::size_t workers, std::uint64_t batch_size, std::uint64_t cap,
                std::uint64_t rebalance_every);

  // The batch worker `w` takes at `step` (batch_size for a worker not balanced yet).
  [[nodiscard]] std::uint64_t batch(const NodeId& w, std::uint64_t step) const;

  // Worker `w` took `seconds` from the start of `step` (the step before it closed) to its
  // gradient arriving, over batch(w, step) samples: one sample of its speed, smoothed by an
  // exponential moving average. This is the worker's whole share of the step's critical path
  // (its pull, compute and push), so equalising it is what makes the workers finish together.
  // Step 0 is not measured (it has no common start, and carries start-up costs), nor is a
  // time <= 0.
  void measured(const NodeId& w, std::uint64_t step, double seconds);

  // Step `step` closed (all its gradients applied). Returns true when the batches change from
  // step + 1 on: the first time every worker has a speed, then every rebalance_every steps.
  bool step_closed(std::uint64_t step);

  // The smoothed speeds (samples/s) by worker, and the batches from the last rebalance on.
  [[nodiscard]] const std::map<NodeId, double>& speeds() const { return speeds_; }
  [[nodiscard]] const std::map<NodeId, std::uint64_t>& batches() const { return current_; }

  // Weight of the newest sample in the moving average.
  static constexpr double kSmoothing = 0.25;

 private:
  std::size_t workers_;
  std::uint64_t batch_size_, cap_, every_;
  bool balanced_ = false;
  std::map<NodeId, double> speeds_;
  // Batches from step current_from_ on, and the ones before (a late message of the last step).
  std::map<NodeId, std::uint64_t> current_, previous_;
  std::uint64_t current_from_ = 0;
};

}  // namespace cohort::server
