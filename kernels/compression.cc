#include "cohort/kernels/compression.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "check.h"
#include "random.h"

namespace cohort::kernels {
namespace {

// Magnitude used for ranking: NaN ranks above everything, so a comparison never sees a NaN.
inline float rank_magnitude(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
}

void check_qsgd(const QsgdOptions& options) {
  if (options.levels < 1 || options.levels > 32767) {
    throw KernelError("qsgd: levels " + std::to_string(options.levels) + " outside [1, 32767]");
  }
}

std::size_t bucket_length(std::size_t d, const QsgdOptions& options) {
  return options.bucket_size == 0 ? d : options.bucket_size;
}

float bucket_scale(const float* x, std::size_t n, QsgdNorm norm) {
  if (norm == QsgdNorm::kMaxAbs) {
    float top = 0.0f;
    for (std::size_t j = 0; j < n; ++j) top = std::max(top, std::fabs(x[j]));
    return top;
  }
  double sum = 0.0;
  for (std::size_t j = 0; j < n; ++j) sum += static_cast<double>(x[j]) * x[j];
  return static_cast<float>(std::sqrt(sum));
}

// Calls emit(j, level) for every element; returns nothing. Bucket scales go to scale_out.
template <typename Emit, typename EmitScale>
void qsgd_walk(std::span<const float> x, const QsgdOptions& options, std::uint64_t seed,
               EmitScale emit_scale, Emit emit) {
  const std::size_t d = x.size();
  const std::size_t len = bucket_length(d, options);
  const std::uint64_t key = detail::derive_key(seed, detail::kQsgdStream);
  const auto s = static_cast<float>(options.levels);
  const auto max_level = static_cast<std::int32_t>(options.levels);
  for (std::size_t b = 0, bucket = 0; b < d; b += len, ++bucket) {
    const std::size_t n = std::min(len, d - b);
    const float scale = bucket_scale(x.data() + b, n, options.norm);
    emit_scale(bucket, scale);
    if (!(scale > 0.0f) || !std::isfinite(scale)) {
      for (std::size_t j = b; j < b + n; ++j) emit(j, 0);
      continue;
    }
    const float ratio = s / scale;
    for (std::size_t j = b; j < b + n; ++j) {
      const float r = std::fabs(x[j]) * ratio;  // in [0, s] up to rounding
      const float floor_r = std::floor(r);
      auto level = static_cast<std::int32_t>(floor_r);
      if (detail::counter_uniform(key, j) < r - floor_r) ++level;
      level = std::min(level, max_level);
      emit(j, std::signbit(x[j]) ? -level : level);
    }
  }
}

}  // namespace

void top_k(std::span<const float> x, std::size_t k, std::span<std::uint32_t> indices,
           std::span<float> values) {
  const std::size_t d = x.size();
  if (k > d) throw KernelError("top_k: k " + std::to_string(k) + " > size " + std::to_string(d));
  if (d > std::numeric_limits<std::uint32_t>::max()) throw KernelError("top_k: size >= 2^32");
  detail::check_size("top_k indices", indices.size(), k);
  detail::check_size("top_k values", values.size(), k);
  if (k == 0) return;
  // Threshold = the k-th largest magnitude; take everything above it, then ties by index.
  thread_local std::vector<float> magnitudes;
  magnitudes.resize(d);
  for (std::size_t j = 0; j < d; ++j) magnitudes[j] = rank_magnitude(x[j]);
  std::nth_element(magnitudes.begin(), magnitudes.begin() + static_cast<std::ptrdiff_t>(d - k),
                   magnitudes.end());
  const float threshold = magnitudes[d - k];
  std::size_t above = 0;
  for (std::size_t j = 0; j < d; ++j) above += rank_magnitude(x[j]) > threshold ? 1 : 0;
  std::size_t ties_left = k - above;
  std::size_t out = 0;
  for (std::size_t j = 0; j < d && out < k; ++j) {
    const float mag = rank_magnitude(x[j]);
    bool take = mag > threshold;
    if (!take && mag == threshold && ties_left > 0) {
      take = true;
      --ties_left;
    }
    if (take) {
      indices[out] = static_cast<std::uint32_t>(j);
      values[out] = x[j];
      ++out;
    }
  }
}

std::size_t qsgd_bucket_count(std::size_t d, const QsgdOptions& options) {
  if (d == 0) return 0;
  const std::size_t len = bucket_length(d, options);
  return (d + len - 1) / len;
}

void qsgd_quantize(std::span<const float> x, const QsgdOptions& options, std::uint64_t seed,
                   std::span<float> scales, std::span<std::int16_t> levels) {
  check_qsgd(options);
  detail::check_size("qsgd_quantize scales", scales.size(), qsgd_bucket_count(x.size(), options));
  detail::check_size("qsgd_quantize levels", levels.size(), x.size());
  qsgd_walk(
      x, options, seed, [&](std::size_t b, float scale) { scales[b] = scale; },
      [&](std::size_t j, std::int32_t level) { levels[j] = static_cast<std::int16_t>(level); });
}

void qsgd_dequantize(std::span<const float> scales, std::span<const std::int16_t> levels,
                     const QsgdOptions& options, std::span<float> out) {
  check_qsgd(options);
  detail::check_size("qsgd_dequantize out", out.size(), levels.size());
  detail::check_size("qsgd_dequantize scales", scales.size(),
                     qsgd_bucket_count(levels.size(), options));
  const std::size_t d = levels.size();
  const std::size_t len = bucket_length(d, options);
  const auto s = static_cast<float>(options.levels);
  for (std::size_t b = 0, bucket = 0; b < d; b += len, ++bucket) {
    const float unit = scales[bucket] / s;
    const std::size_t end = std::min(d, b + len);
    for (std::size_t j = b; j < end; ++j) out[j] = unit * static_cast<float>(levels[j]);
  }
}

void qsgd_apply(std::span<const float> x, const QsgdOptions& options, std::uint64_t seed,
                std::span<float> out) {
  check_qsgd(options);
  detail::check_size("qsgd_apply out", out.size(), x.size());
  float unit = 0.0f;
  const auto s = static_cast<float>(options.levels);
  qsgd_walk(
      x, options, seed, [&](std::size_t, float scale) { unit = scale / s; },
      [&](std::size_t j, std::int32_t level) { out[j] = unit * static_cast<float>(level); });
}

// fp16 after F. Giesen, "float->half variants" (public domain): exact round to nearest even,
// subnormals included, using the FPU for the subnormal shift.
std::uint16_t float_to_fp16(float value) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  std::uint32_t o;
  if (u >= (127u + 16u) << 23) {  // >= 65536: inf, or NaN -> quiet NaN
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 113u << 23) {  // below 2^-14: subnormal or zero
    constexpr std::uint32_t kMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    const float f = std::bit_cast<float>(u) + std::bit_cast<float>(kMagic);
    o = std::bit_cast<std::uint32_t>(f) - kMagic;
  } else {
    const std::uint32_t mant_odd = (u >> 13) & 1u;
    u += ((15u - 127u) << 23) + 0xfffu;  // rebias and round half up ...
    u += mant_odd;                       // ... to even; may carry into inf
    o = u >> 13;
  }
  return static_cast<std::uint16_t>(o | (sign >> 16));
}

float fp16_to_float(std::uint16_t bits) {
  constexpr std::uint32_t kShiftedExp = 0x7c00u << 13;
  std::uint32_t o = (bits & 0x7fffu) << 13;
  const std::uint32_t exp = kShiftedExp & o;
  o += (127u - 15u) << 23;
  if (exp == kShiftedExp) {
    o += (128u - 16u) << 23;  // inf / NaN
  } else if (exp == 0) {      // zero / subnormal: renormalise via the FPU
    o += 1u << 23;
    o = std::bit_cast<std::uint32_t>(std::bit_cast<float>(o) - std::bit_cast<float>(113u << 23));
  }
  return std::bit_cast<float>(o | (static_cast<std::uint32_t>(bits & 0x8000u) << 16));
}

std::uint16_t float_to_bf16(float value) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

void to_fp16(std::span<const float> in, std::span<std::uint16_t> out) {
  detail::check_size("to_fp16", out.size(), in.size());
  std::size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= in.size(); i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in.data() + i),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.data() + i), h);
  }
#endif
  for (; i < in.size(); ++i) out[i] = float_to_fp16(in[i]);
}

void from_fp16(std::span<const std::uint16_t> in, std::span<float> out) {
  detail::check_size("from_fp16", out.size(), in.size());
  std::size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= in.size(); i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in.data() + i));
    _mm256_storeu_ps(out.data() + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < in.size(); ++i) out[i] = fp16_to_float(in[i]);
}

void to_bf16(std::span<const float> in, std::span<std::uint16_t> out) {
  detail::check_size("to_bf16", out.size(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = float_to_bf16(in[i]);
}

void from_bf16(std::span<const std::uint16_t> in, std::span<float> out) {
  detail::check_size("from_bf16", out.size(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = bf16_to_float(in[i]);
}

}  // namespace cohort::kernels
