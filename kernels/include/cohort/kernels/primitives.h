// Vector primitives over flat float spans, for aggregation rules, compressors and optimizers.
//
// All functions run on the host, vectorised (Eigen). Sizes must match exactly: a mismatch throws
// KernelError naming both sizes. Sums over many buffers accumulate in double in a fixed order, so
// results do not depend on the thread count (docs/ALGORITHMS.md section 0, numerics policy).
// Functions that take a ThreadPool split the coordinates over it (nullptr: the calling thread
// only); do not call them from a task running on that same pool.
#pragma once

#include <cstddef>
#include <span>

namespace cohort {
class ThreadPool;
}  // namespace cohort

namespace cohort::kernels {

// y += alpha * x.
void axpy(float alpha, std::span<const float> x, std::span<float> y);
// x *= alpha.
void scale(float alpha, std::span<float> x);
// dst = src, in one pass that also tells whether every value is finite (no NaN, no Inf). A server
// receiving an update copies it anyway: checking on the way costs no extra pass over memory. The
// whole span is copied even when a non-finite value is found. REQUIRES dst.size() == src.size().
[[nodiscard]] bool copy_finite(std::span<const float> src, std::span<float> dst);
// True when every value is finite: copy_finite's test alone, for data that is used in place.
[[nodiscard]] bool all_finite(std::span<const float> x);
// sum_i x[i] * y[i], accumulated in double.
double dot(std::span<const float> x, std::span<const float> y);
// sqrt(sum_i x[i]^2), accumulated in double.
double l2_norm(std::span<const float> x);

// out = sum_k weights[k] * inputs[k], each coordinate summed in double in input order, rounded to
// float once. REQUIRES inputs.size() == weights.size() >= 1 and every input out.size() long.
// To average, pass weights that sum to 1 (e.g. n_k / sum n).
void weighted_sum(std::span<const std::span<const float>> inputs, std::span<const double> weights,
                  std::span<float> out, ThreadPool* pool = nullptr);

// Streaming form of weighted_sum for inputs that arrive one at a time (FedAvg chunk by chunk):
// acc += weight * x, in double. acc starts zeroed by the caller.
void accumulate(double weight, std::span<const float> x, std::span<double> acc);
// out = scale * acc, rounded to float.
void store(std::span<const double> acc, double scale, std::span<float> out);

}  // namespace cohort::kernels
