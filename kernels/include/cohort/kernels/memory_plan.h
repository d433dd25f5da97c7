// Training memory as a function of the batch, and the plan that keeps a device's training under a
// memory budget (ALGORITHMS.md 3.5).
//
// The model is measured, not guessed: a throw-away Network on the same device (same threads, so
// the same kernel scratch) runs one training step on zeros at two micro-batch sizes, and its
// tracking allocator (Network::memory()) gives the bytes of every kind. Parameters, gradients
// and optimizer state do not depend on the batch (micro-batches add their gradients in place:
// no accumulator); activations and kernel workspace are fitted as fixed + per-sample bytes. The
// trainer's own batch buffer (features and labels of one full batch) is added.
//
// The plan keeps the configured batch B (the effective batch of each optimizer step) and picks a
// micro-batch m and k = ceil(B / m) accumulation steps: the largest m whose peak fits the
// budget. Each candidate the model says fits is checked by a probe step on the device itself, so
// the plan's peak is a measurement. Evaluation runs in micro-batches of m too. When not even one
// sample fits with its activations kept, the plan recomputes them by segment
// (Network::set_recompute), in the largest micro-batch that then fits.
//
//   auto plan = plan_memory(spec, *device, optimizer, 64, 48 << 20);
//   net->set_micro_batch(plan.network_micro_batch());
//   net->set_recompute(plan.recompute);
#pragma once

#include <cstddef>
#include <string>

#include "cohort/kernels/device.h"
#include "cohort/kernels/network.h"
#include "cohort/kernels/optimizer.h"

namespace cohort::kernels {

struct MemoryModel {
  std::string device;  // e.g. "cpu (2 threads)"
  std::size_t parameters = 0;
  std::size_t gradients = 0;
  std::size_t optimizer = 0;
  std::size_t input_per_sample = 0;  // the trainer's batch buffer: features and label
  // Activations kept for the backward pass; kept_activations is false when a plan under a
  // budget could not measure them (not even one sample fits with them kept).
  bool kept_activations = true;
  // False when a budget held one sample but not two: the terms are one sample's, 0 per sample.
  bool per_sample_measured = true;
  double activations_fixed = 0, activations_per_sample = 0;
  // Activations with recomputation (Network::set_recompute): kept segment boundaries plus the
  // largest segment's scratch; recompute_measured is false where the device cannot recompute
  // (CUDA) or not even one such sample fits the budget.
  bool recompute_measured = true;
  double recompute_activations_fixed = 0, recompute_activations_per_sample = 0;
  double workspace_fixed = 0, workspace_per_sample = 0;

  // Predicted peak bytes of a step of `batch` samples run in micro-batches of micro_batch,
  // keeping or recomputing the activations.
  [[nodiscard]] std::size_t bytes(std::size_t batch, std::size_t micro_batch,
                                  bool recompute = false) const;
};

// Measures the model of spec on device (see above). Throws KernelError when the device does not
// track its memory, naming it.
MemoryModel measure_memory_model(const NetworkSpec& spec, const Device& device,
                                 const OptimizerOptions& optimizer);

// The peak bytes of one training step and one evaluation of `batch` samples in micro-batches of
// micro_batch on device, measured by running them (zeros in, a fresh network): what
// plan_memory() checks its candidates with.
std::size_t measure_peak_bytes(const NetworkSpec& spec, const Device& device,
                               const OptimizerOptions& optimizer, std::size_t batch,
                               std::size_t micro_batch, bool recompute = false);

struct MemoryPlan {
  std::size_t budget = 0;  // bytes; 0: none (micro_batch == batch)
  std::size_t batch = 0;   // the effective batch, unchanged
  std::size_t micro_batch = 0;
  std::size_t accumulation = 1;  // micro-batches per step: ceil(batch / micro_batch)
  bool recompute = false;        // activations recomputed by segment (Network::set_recompute)
  std::size_t predicted_bytes = 0;
  std::size_t peak_bytes = 0;  // measured by a probe step at micro_batch
  // The least budget that trains: the smallest measured peak of micro-batches of one sample
  // (activations kept or recomputed) and of the whole batch (kernels whose scratch is padded to
  // whole panels can need as much for one sample as for a small batch).
  std::size_t minimum_bytes = 0;
  MemoryModel model;

  // The value for Network::set_micro_batch(): 0 when the batch runs whole.
  [[nodiscard]] std::size_t network_micro_batch() const {
    return micro_batch < batch ? micro_batch : 0;
  }
};

// The plan for training spec (called model_name in messages) at `batch` under `budget` bytes
// (0: no budget, the whole batch). Throws ConfigError with one line naming the model, the budget
// and the minimum budget when not even one sample per micro-batch fits; KernelError on a device
// that cannot micro-batch.
MemoryPlan plan_memory(const NetworkSpec& spec, const Device& device,
                       const OptimizerOptions& optimizer, std::size_t batch, std::size_t budget,
                       std::string_view model_name);

// Multi-line, human-readable: the model's terms and the plan (cohort-client --print-plan).
std::string describe(const MemoryPlan& plan, std::string_view model_name);

// "1.5 MiB"-style.
std::string format_bytes(std::size_t bytes);

}  // namespace cohort::kernels
