// Compression kernels over flat float spans (docs/ALGORITHMS.md section 7): top-k selection, QSGD
// stochastic quantisation and fp16 / bf16 casts. Error feedback, packing and wire formats belong
// to the compressors in aggregation/; these are the hot loops.
//
// Randomised kernels take an explicit seed and draw the random number for element j from a
// counter-based generator of (seed, j) only, so results are reproducible and independent of the
// thread count. Sizes must match: a mismatch throws KernelError naming both sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace cohort::kernels {

// Selects the k coordinates of x with the largest |x[j]| (ties: the lower index wins). Writes
// their indices in increasing order to indices[0..k) and the matching x values to values[0..k).
// REQUIRES k <= x.size() < 2^32 and indices.size() == values.size() == k. O(d) expected time.
void top_k(std::span<const float> x, std::size_t k, std::span<std::uint32_t> indices,
           std::span<float> values);

// QSGD (docs/ALGORITHMS.md 7.2) with s = levels, in buckets of bucket_size consecutive coordinates
// (0: the whole vector is one bucket). Per bucket the scale is ||bucket||_2 (kL2, the paper's) or
// max_j |x_j| (kMaxAbs, unbiased too, lower variance); per element the signed level
// l in [-s, s], so that the decoded value is scale * l / s and E[decoded] = x.
enum class QsgdNorm { kL2, kMaxAbs };
struct QsgdOptions {
  std::uint32_t levels = 255;   // s; REQUIRES 1 <= s <= 32767
  std::size_t bucket_size = 0;  // 0: one bucket
  QsgdNorm norm = QsgdNorm::kL2;
};

// Number of buckets (scales) for d coordinates: ceil(d / bucket_size), 1 when bucket_size == 0
// (0 when d == 0).
std::size_t qsgd_bucket_count(std::size_t d, const QsgdOptions& options);

// scales.size() == qsgd_bucket_count(x.size()), levels.size() == x.size(). A zero bucket gets
// scale 0 and levels 0 (no division by zero). Throws KernelError on bad options or sizes.
void qsgd_quantize(std::span<const float> x, const QsgdOptions& options, std::uint64_t seed,
                   std::span<float> scales, std::span<std::int16_t> levels);
// out[j] = scales[bucket(j)] * levels[j] / s.
void qsgd_dequantize(std::span<const float> scales, std::span<const std::int16_t> levels,
                     const QsgdOptions& options, std::span<float> out);
// qsgd_quantize then qsgd_dequantize without the intermediate buffers: out = Q_s(x).
void qsgd_apply(std::span<const float> x, const QsgdOptions& options, std::uint64_t seed,
                std::span<float> out);

// IEEE binary16 and bfloat16 casts, round to nearest even, with inf and NaN preserved
// (fp16: overflow past 65519.99 goes to inf; subnormals are kept). Scalar and span forms; the
// span forms use F16C when the CPU has it.
std::uint16_t float_to_fp16(float value);
float fp16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);

void to_fp16(std::span<const float> in, std::span<std::uint16_t> out);
void from_fp16(std::span<const std::uint16_t> in, std::span<float> out);
void to_bf16(std::span<const float> in, std::span<std::uint16_t> out);
void from_bf16(std::span<const std::uint16_t> in, std::span<float> out);

}  // namespace cohort::kernels
