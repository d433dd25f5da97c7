// Coordinate-wise robust statistics over many equally long float buffers (docs/ALGORITHMS.md
// section 2): the building blocks of the median and trimmed-mean aggregation rules.
//
// Each output coordinate depends only on that coordinate of the inputs, so results do not depend
// on the thread count. Throws KernelError when there are no inputs or sizes differ. NaN inputs
// give unspecified (but memory-safe) results: reject non-finite updates before calling.
#pragma once

#include <cstddef>
#include <span>

namespace cohort {
class ThreadPool;
}  // namespace cohort

namespace cohort::kernels {

// out[j] = median of inputs[0][j] .. inputs[m-1][j]; for even m the mean of the two middle
// values (numpy's convention), computed in double.
void coordinate_median(std::span<const std::span<const float>> inputs, std::span<float> out,
                       ThreadPool* pool = nullptr);

// out[j] = mean of the values left after dropping the `trim` smallest and `trim` largest of
// inputs[0][j] .. inputs[m-1][j] (scipy.stats.trim_mean with trim = floor(beta * m)); summed in
// double. REQUIRES 2 * trim < m, else KernelError. trim = 0 is the plain mean.
void trimmed_mean(std::span<const std::span<const float>> inputs, std::size_t trim,
                  std::span<float> out, ThreadPool* pool = nullptr);

}  // namespace cohort::kernels
