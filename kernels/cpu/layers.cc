#include "layers.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "../parallel.h"
#include "gemm.h"
#include "../random.h"
#include "cohort/core/error.h"

namespace cohort::kernels::cpu {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;

inline Eigen::Index ix(std::size_t v) { return static_cast<Eigen::Index>(v); }

// Work below these sizes stays on one thread: a pool hand-off costs ~10-30 us on these VMs.
constexpr std::size_t kLinearRowGrain = 16;
constexpr std::size_t kElementGrain = 1 << 16;

// Floats of im2col scratch per chunk of samples. 256 Ki floats (1 MiB) keeps the packed GEMM
// operand in L2 while amortising the weight packing over many samples.
constexpr std::size_t kColsBudget = std::size_t{1} << 18;

std::size_t chunk_samples(const ConvGeometry& g, std::size_t samples) {
  const std::size_t per_sample = g.patch() * g.positions();
  return std::clamp<std::size_t>(kColsBudget / std::max<std::size_t>(per_sample, 1), 1,
                                 std::max<std::size_t>(samples, 1));
}

// Short contiguous copies (the 8-28 float rows of im2col): full AVX vectors plus one masked tail,
// instead of a memcpy call or a scalar loop per row.
inline void copy_row(float* __restrict dst, const float* __restrict src, std::size_t n) {
#if defined(__AVX2__)
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
  if (i < n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), lanes);
    _mm256_maskstore_ps(dst + i, mask, _mm256_maskload_ps(src + i, mask));
  }
#else
  std::memcpy(dst, src, n * sizeof(float));
#endif
}

// Writes the im2col matrix of one sample into cols (rows = (c, ky, kx), row stride ld, columns
// [0, P) of this sample's block).
void im2col(const float* x, const ConvGeometry& g, float* cols, std::size_t ld) {
  const std::size_t k = g.kernel, s = g.stride, pad = g.padding;
  const std::size_t oh = g.out_height, ow = g.out_width, h = g.height, w = g.width;
  if (s == 1 && pad == 0) {  // every window lies inside the image: straight row copies
    for (std::size_t c = 0; c < g.in_channels; ++c) {
      for (std::size_t ky = 0; ky < k; ++ky) {
        for (std::size_t kx = 0; kx < k; ++kx) {
          const float* src = x + (c * h + ky) * w + kx;
          float* row = cols + ((c * k + ky) * k + kx) * ld;
          for (std::size_t oy = 0; oy < oh; ++oy) copy_row(row + oy * ow, src + oy * w, ow);
        }
      }
    }
    return;
  }
  for (std::size_t c = 0; c < g.in_channels; ++c) {
    const float* plane = x + c * h * w;
    for (std::size_t ky = 0; ky < k; ++ky) {
      for (std::size_t kx = 0; kx < k; ++kx) {
        float* row = cols + ((c * k + ky) * k + kx) * ld;
        // Output columns ox with 0 <= ox * s + kx - pad < w.
        const std::size_t ox_begin = kx >= pad ? 0 : (pad - kx + s - 1) / s;
        const std::size_t ox_end =
            w + pad > kx ? std::min(ow, (w + pad - kx + s - 1) / s) : 0;
        for (std::size_t oy = 0; oy < oh; ++oy) {
          float* out = row + oy * ow;
          const std::size_t iy = oy * s + ky;
          if (iy < pad || iy - pad >= h || ox_begin >= ox_end) {
            std::fill(out, out + ow, 0.0f);
            continue;
          }
          const float* in = plane + (iy - pad) * w;
          std::fill(out, out + ox_begin, 0.0f);
          if (s == 1) {
            copy_row(out + ox_begin, in + ox_begin + kx - pad, ox_end - ox_begin);
          } else {
            for (std::size_t ox = ox_begin; ox < ox_end; ++ox) out[ox] = in[ox * s + kx - pad];
          }
          std::fill(out + ox_end, out + ow, 0.0f);
        }
      }
    }
  }
}

// dx (one sample, zeroed by the caller) += col2im(dcols).
void col2im(const float* dcols, std::size_t ld, const ConvGeometry& g, float* dx) {
  const std::size_t k = g.kernel, s = g.stride, pad = g.padding;
  const std::size_t oh = g.out_height, ow = g.out_width, h = g.height, w = g.width;
  for (std::size_t c = 0; c < g.in_channels; ++c) {
    float* plane = dx + c * h * w;
    for (std::size_t ky = 0; ky < k; ++ky) {
      for (std::size_t kx = 0; kx < k; ++kx) {
        const float* row = dcols + ((c * k + ky) * k + kx) * ld;
        const std::size_t ox_begin = kx >= pad ? 0 : (pad - kx + s - 1) / s;
        const std::size_t ox_end =
            w + pad > kx ? std::min(ow, (w + pad - kx + s - 1) / s) : 0;
        for (std::size_t oy = 0; oy < oh; ++oy) {
          const std::size_t iy = oy * s + ky;
          if (iy < pad || iy - pad >= h) continue;
          float* __restrict out = plane + (iy - pad) * w;
          const float* __restrict in = row + oy * ow;
          if (s == 1) {
            float* __restrict dst = out + ox_begin + kx - pad;  // ox_begin + kx >= pad
            const float* __restrict src = in + ox_begin;
            for (std::size_t j = 0; j < ox_end - ox_begin; ++j) dst[j] += src[j];
          } else {
            for (std::size_t ox = ox_begin; ox < ox_end; ++ox) out[ox * s + kx - pad] += in[ox];
          }
        }
      }
    }
  }
}

}  // namespace

Workspace::Workspace(std::size_t parts) : slots_(std::max<std::size_t>(parts, 1)) {}

float* Workspace::floats(std::size_t part, std::size_t slot, std::size_t count) {
  COHORT_CHECK(part < slots_.size() && slot < kSlots) << "workspace part " << part;
  FloatBuffer& buffer = slots_[part][slot];
  if (buffer.size() < count) buffer = FloatBuffer(count);
  return buffer.data();
}

ConvGeometry conv_geometry(const LayerSpec& l) {
  return {l.input.channels, l.input.height, l.input.width, l.out, l.kernel, l.stride, l.padding,
          l.output.height, l.output.width};
}

PoolGeometry pool_geometry(const LayerSpec& l) {
  return {l.input.channels, l.input.height, l.input.width, l.kernel, l.stride, l.output.height,
          l.output.width};
}

void linear_forward(Exec& exec, const float* x, const float* w, const float* b, float* y,
                    std::size_t n, std::size_t in, std::size_t out, bool relu) {
  detail::parallel_ranges(exec.pool, n, kLinearRowGrain, [&](std::size_t r0, std::size_t r1) {
    gemm(r1 - r0, out, in, row_major(x + r0 * in, in), transposed(w, in), y + r0 * out, out,
         /*accumulate=*/false);
    for (std::size_t r = r0; r < r1; ++r) {
      float* row = y + r * out;
      if (relu) {
        for (std::size_t j = 0; j < out; ++j) row[j] = std::max(row[j] + b[j], 0.0f);
      } else {
        for (std::size_t j = 0; j < out; ++j) row[j] += b[j];
      }
    }
  });
}

void linear_backward(Exec& exec, const float* x, const float* w, float* dy, const float* relu_y,
                     float* dw, float* db, float* dx, std::size_t n, std::size_t in,
                     std::size_t out) {
  if (relu_y != nullptr) relu_backward(relu_y, dy, dy, n * out);
  // Part p computes rows [o0, o1) of dw and db and rows [r0, r1) of dx: no reduction needed.
  const std::size_t parts = detail::part_count(exec.pool, std::min(n, out), kLinearRowGrain);
  detail::parallel_parts(exec.pool, parts, 1, [&](std::size_t p, std::size_t, std::size_t) {
    const std::size_t o0 = out * p / parts, o1 = out * (p + 1) / parts;
    gemm(o1 - o0, in, n, transposed(dy + o0, out), row_major(x, in), dw + o0 * in, in,
         /*accumulate=*/false);
    std::fill(db + o0, db + o1, 0.0f);
    for (std::size_t r = 0; r < n; ++r) {
      const float* row = dy + r * out;
      for (std::size_t j = o0; j < o1; ++j) db[j] += row[j];
    }
    if (dx != nullptr) {
      const std::size_t r0 = n * p / parts, r1 = n * (p + 1) / parts;
      gemm(r1 - r0, in, out, row_major(dy + r0 * out, out), row_major(w, in), dx + r0 * in, in,
           /*accumulate=*/false);
    }
  });
}

void relu_forward(const float* x, float* y, std::size_t count) {
  VectorMap(y, ix(count)) = ConstVectorMap(x, ix(count)).cwiseMax(0.0f);
}

void relu_backward(const float* y, const float* dy, float* dx, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void conv2d_forward(Exec& exec, const float* x, const float* w, const float* b, float* y,
                    std::size_t n, const ConvGeometry& g, bool relu) {
  const std::size_t K = g.patch(), P = g.positions(), C = g.out_channels;
  detail::parallel_parts(exec.pool, n, 1, [&](std::size_t part, std::size_t s0, std::size_t s1) {
    const std::size_t chunk = chunk_samples(g, s1 - s0);
    float* cols = exec.workspace->floats(part, 0, K * P * chunk);
    float* result = exec.workspace->floats(part, 1, C * P * chunk);
    for (std::size_t c0 = s0; c0 < s1; c0 += chunk) {
      const std::size_t m = std::min(chunk, s1 - c0);
      const std::size_t ld = m * P;
      for (std::size_t i = 0; i < m; ++i) im2col(x + (c0 + i) * g.in_size(), g, cols + i * P, ld);
      gemm(C, ld, K, row_major(w, K), row_major(cols, ld), result, ld, /*accumulate=*/false);
      // Scatter [C][m*P] into NCHW with the bias (and ReLU) fused.
      for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t c = 0; c < C; ++c) {
          const float* src = result + c * ld + i * P;
          float* dst = y + (c0 + i) * g.out_size() + c * P;
          const float bias = b[c];
          if (relu) {
            for (std::size_t q = 0; q < P; ++q) dst[q] = std::max(src[q] + bias, 0.0f);
          } else {
            for (std::size_t q = 0; q < P; ++q) dst[q] = src[q] + bias;
          }
        }
      }
    }
  });
}

void conv2d_backward(Exec& exec, const float* x, const float* w, const float* dy,
                     const float* relu_y, float* dw, float* db, float* dx, std::size_t n,
                     const ConvGeometry& g) {
  const std::size_t K = g.patch(), P = g.positions(), C = g.out_channels;
  const std::size_t parts = detail::part_count(exec.pool, n, 1);
  // Part 0 accumulates straight into dw/db; other parts into scratch slot 3, summed after.
  detail::parallel_parts(exec.pool, n, 1, [&](std::size_t part, std::size_t s0, std::size_t s1) {
    const std::size_t chunk = chunk_samples(g, s1 - s0);
    float* cols = exec.workspace->floats(part, 0, K * P * chunk);
    float* grad = exec.workspace->floats(part, 1, C * P * chunk);
    float* dcols = dx != nullptr ? exec.workspace->floats(part, 2, K * P * chunk) : nullptr;
    float* partial_w = part == 0 ? dw : exec.workspace->floats(part, 3, C * K + C);
    float* partial_b = part == 0 ? db : partial_w + C * K;
    std::fill(partial_w, partial_w + C * K, 0.0f);
    VectorMap grad_b(partial_b, ix(C));
    // A thin patch (conv1: K = 25 < C = 32) wastes a third of the 16-wide GEMM panels as the N
    // side; computing dw^T [K][C] instead measured 43 against 33 GFLOP/s.
    const bool transpose_dw = K < C;
    float* weight_t = transpose_dw ? exec.workspace->floats(part, 4, K * C) : nullptr;
    grad_b.setZero();
    for (std::size_t c0 = s0; c0 < s1; c0 += chunk) {
      const std::size_t m = std::min(chunk, s1 - c0);
      const std::size_t ld = m * P;
      // Gather dy (NCHW) into [C][m*P], applying the fused ReLU's mask.
      for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t c = 0; c < C; ++c) {
          const std::size_t at = (c0 + i) * g.out_size() + c * P;
          float* dst = grad + c * ld + i * P;
          if (relu_y != nullptr) {
            relu_backward(relu_y + at, dy + at, dst, P);
          } else {
            std::memcpy(dst, dy + at, P * sizeof(float));
          }
        }
      }
      for (std::size_t i = 0; i < m; ++i) im2col(x + (c0 + i) * g.in_size(), g, cols + i * P, ld);
      if (transpose_dw) {
        gemm(K, C, ld, row_major(cols, ld), transposed(grad, ld), weight_t, C, c0 > s0);
      } else {
        gemm(C, K, ld, row_major(grad, ld), transposed(cols, ld), partial_w, K, /*accumulate=*/true);
      }
      grad_b += ConstMatrixMap(grad, ix(C), ix(ld)).rowwise().sum();
      if (dx != nullptr) {
        gemm(K, ld, C, transposed(w, K), row_major(grad, ld), dcols, ld, /*accumulate=*/false);
        for (std::size_t i = 0; i < m; ++i) {
          float* sample = dx + (c0 + i) * g.in_size();
          std::fill(sample, sample + g.in_size(), 0.0f);
          col2im(dcols + i * P, ld, g, sample);
        }
      }
    }
    if (transpose_dw && s1 > s0) {
      for (std::size_t c = 0; c < C; ++c) {
        for (std::size_t kk = 0; kk < K; ++kk) partial_w[c * K + kk] += weight_t[kk * C + c];
      }
    }
  });
  for (std::size_t part = 1; part < parts; ++part) {
    const float* partial = exec.workspace->floats(part, 3, C * K + C);
    VectorMap(dw, ix(C * K)) += ConstVectorMap(partial, ix(C * K));
    VectorMap(db, ix(C)) += ConstVectorMap(partial + C * K, ix(C));
  }
}

void maxpool2d_forward(Exec& exec, const float* x, float* y, std::int32_t* argmax, std::size_t n,
                       const PoolGeometry& g) {
  const std::size_t planes = n * g.channels;
  const std::size_t grain = std::max<std::size_t>(1, kElementGrain / std::max<std::size_t>(g.in_size() / g.channels, 1));
  detail::parallel_ranges(exec.pool, planes, grain, [&](std::size_t p0, std::size_t p1) {
    for (std::size_t p = p0; p < p1; ++p) {
      const float* in = x + p * g.height * g.width;
      float* out = y + p * g.out_height * g.out_width;
      std::int32_t* arg = argmax + p * g.out_height * g.out_width;
      if (g.kernel == 2 && g.stride == 2) {  // the common case, branch-free
        for (std::size_t oy = 0; oy < g.out_height; ++oy) {
          const std::size_t r0 = 2 * oy * g.width, r1 = r0 + g.width;
          for (std::size_t ox = 0; ox < g.out_width; ++ox) {
            const std::size_t i0 = r0 + 2 * ox, i1 = i0 + 1, i2 = r1 + 2 * ox, i3 = i2 + 1;
            const std::size_t top = in[i1] > in[i0] ? i1 : i0;
            const std::size_t bottom = in[i3] > in[i2] ? i3 : i2;
            const std::size_t best = in[bottom] > in[top] ? bottom : top;
            out[oy * g.out_width + ox] = in[best];
            arg[oy * g.out_width + ox] = static_cast<std::int32_t>(best);
          }
        }
        continue;
      }
      for (std::size_t oy = 0; oy < g.out_height; ++oy) {
        for (std::size_t ox = 0; ox < g.out_width; ++ox) {
          std::size_t best = oy * g.stride * g.width + ox * g.stride;
          float best_value = in[best];
          for (std::size_t ky = 0; ky < g.kernel; ++ky) {
            const std::size_t row = (oy * g.stride + ky) * g.width + ox * g.stride;
            for (std::size_t kx = 0; kx < g.kernel; ++kx) {
              // '>' keeps the first maximum, as PyTorch does; a NaN wins and stays.
              const float v = in[row + kx];
              if (v > best_value || (std::isnan(v) && !std::isnan(best_value))) {
                best_value = v;
                best = row + kx;
              }
            }
          }
          out[oy * g.out_width + ox] = best_value;
          arg[oy * g.out_width + ox] = static_cast<std::int32_t>(best);
        }
      }
    }
  });
}

void maxpool2d_backward(Exec& exec, const float* dy, const std::int32_t* argmax, float* dx,
                        std::size_t n, const PoolGeometry& g) {
  const std::size_t planes = n * g.channels;
  const std::size_t in_plane = g.height * g.width, out_plane = g.out_height * g.out_width;
  const std::size_t grain = std::max<std::size_t>(1, kElementGrain / std::max<std::size_t>(in_plane, 1));
  detail::parallel_ranges(exec.pool, planes, grain, [&](std::size_t p0, std::size_t p1) {
    std::fill(dx + p0 * in_plane, dx + p1 * in_plane, 0.0f);
    for (std::size_t p = p0; p < p1; ++p) {
      float* plane = dx + p * in_plane;
      const float* grad = dy + p * out_plane;
      const std::int32_t* arg = argmax + p * out_plane;
      for (std::size_t q = 0; q < out_plane; ++q) plane[arg[q]] += grad[q];
    }
  });
}

void dropout_forward(const float* x, float* y, float* mask, std::size_t count, float p,
                     std::uint64_t key) {
  const float keep_scale = 1.0f / (1.0f - p);
  for (std::size_t i = 0; i < count; ++i) {
    mask[i] = detail::counter_uniform(key, i) < p ? 0.0f : keep_scale;
    y[i] = x[i] * mask[i];
  }
}

void dropout_backward(const float* dy, const float* mask, float* dx, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dx[i] = dy[i] * mask[i];
}

}  // namespace cohort::kernels::cpu
