#include "cohort/kernels/robust.h"

#include <algorithm>
#include <string>
#include <vector>

#include "check.h"
#include "parallel.h"

namespace cohort::kernels {
namespace {

// Coordinates gathered per block: m * 256 floats transposed so each coordinate's m values are
// contiguous for nth_element; the inputs are read in 1 KiB runs.
constexpr std::size_t kBlock = 256;
constexpr std::size_t kParallelGrain = 4096;

void check_inputs(const char* what, std::span<const std::span<const float>> inputs, std::size_t d) {
  if (inputs.empty()) throw KernelError(std::string(what) + ": no inputs");
  for (const auto& in : inputs) detail::check_size(what, in.size(), d);
}

// Calls reduce(values, m) for each coordinate j with that coordinate's m values (mutable
// scratch), writing the result to out[j].
template <typename Reduce>
void for_each_coordinate(std::span<const std::span<const float>> inputs, std::span<float> out,
                         ThreadPool* pool, Reduce reduce) {
  const std::size_t m = inputs.size();
  detail::parallel_ranges(pool, out.size(), kParallelGrain,
                          [&](std::size_t begin, std::size_t end) {
                            std::vector<float> scratch(m * kBlock);
                            for (std::size_t b = begin; b < end; b += kBlock) {
                              const std::size_t len = std::min(kBlock, end - b);
                              for (std::size_t k = 0; k < m; ++k) {
                                const float* src = inputs[k].data() + b;
                                for (std::size_t j = 0; j < len; ++j) scratch[j * m + k] = src[j];
                              }
                              for (std::size_t j = 0; j < len; ++j)
                                out[b + j] = reduce(scratch.data() + j * m, m);
                            }
                          });
}

}  // namespace

void coordinate_median(std::span<const std::span<const float>> inputs, std::span<float> out,
                       ThreadPool* pool) {
  check_inputs("coordinate_median", inputs, out.size());
  for_each_coordinate(inputs, out, pool, [](float* v, std::size_t m) {
    const std::size_t mid = m / 2;
    std::nth_element(v, v + mid, v + m);
    if (m % 2 == 1) return v[mid];
    const float below = *std::max_element(v, v + mid);
    return static_cast<float>(0.5 * (static_cast<double>(below) + static_cast<double>(v[mid])));
  });
}

void trimmed_mean(std::span<const std::span<const float>> inputs, std::size_t trim,
                  std::span<float> out, ThreadPool* pool) {
  check_inputs("trimmed_mean", inputs, out.size());
  const std::size_t m = inputs.size();
  if (2 * trim >= m) {
    throw KernelError("trimmed_mean: trimming " + std::to_string(trim) +
                      " per side leaves none of " + std::to_string(m) + " inputs");
  }
  const double inv_kept = 1.0 / static_cast<double>(m - 2 * trim);
  for_each_coordinate(inputs, out, pool, [trim, inv_kept](float* v, std::size_t n) {
    if (trim > 0) {
      std::nth_element(v, v + trim, v + n);               // [0, trim) are the smallest
      std::nth_element(v + trim, v + (n - trim), v + n);  // [n - trim, n) the largest
    }
    double sum = 0.0;
    for (std::size_t i = trim; i < n - trim; ++i) sum += v[i];
    return static_cast<float>(sum * inv_kept);
  });
}

}  // namespace cohort::kernels
