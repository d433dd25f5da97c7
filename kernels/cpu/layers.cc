#include "layers.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include "microkernels.h"
#define COHORT_LINEAR_MICRO 1
#else
#define COHORT_LINEAR_MICRO 0
#endif

#include "../parallel.h"
#include "../random.h"
#include "cohort/core/error.h"
#include "gemm.h"

namespace cohort::kernels::cpu {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;

inline Eigen::Index ix(std::size_t v) { return static_cast<Eigen::Index>(v); }

// Work below these sizes stays on one thread: it is cheaper than a pool hand-off (a fork-join
// region costs well under a microsecond while the workers spin, thread_pool.h; 8 Ki floats of
// pooling or layout change take a few).
constexpr std::size_t kLinearRowGrain = 16;
constexpr std::size_t kElementGrain = 1 << 13;

// Floats of im2col scratch per chunk of samples. 256 Ki floats (1 MiB) keeps the packed GEMM
// operand in L2 while amortising the weight packing over many samples.
constexpr std::size_t kColsBudget = std::size_t{1} << 18;

std::size_t chunk_samples(const ConvGeometry& g, std::size_t samples) {
  const std::size_t per_sample = g.patch() * g.positions();
  return std::clamp<std::size_t>(kColsBudget / std::max<std::size_t>(per_sample, 1), 1,
                                 std::max<std::size_t>(samples, 1));
}

#if defined(__AVX2__)
// Lanes [0, min(valid, 8)) set.
inline __m256i tail_mask(std::size_t valid) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<std::size_t>(valid, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Loads 8 floats at p of which the first `valid` matter: a plain load unless it would read
// past `end`. (vmaskmovps loads are slow too: they doubled the NHWC pool's time for LeNet's 6
// channels.)
inline __m256 load_lanes(const float* p, std::size_t valid, const float* end) {
  if (valid >= 8 || p + 8 <= end) return _mm256_loadu_ps(p);
  return _mm256_maskload_ps(p, tail_mask(valid));
}

// Stores lanes [0, n) of v, n < 8, without vmaskmovps (microcoded, slow on AMD Zen).
inline void store_partial(float* p, __m256 v, std::size_t n) {
  __m128 part = _mm256_castps256_ps128(v);
  if (n >= 4) {
    _mm_storeu_ps(p, part);
    part = _mm256_extractf128_ps(v, 1);
    p += 4;
    n -= 4;
  }
  if (n >= 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), part);
    part = _mm_movehl_ps(part, part);
    p += 2;
    n -= 2;
  }
  if (n >= 1) _mm_store_ss(p, part);
}
#endif

// Short contiguous copies (the 8-28 float rows of im2col): full AVX vectors plus one masked tail,
// instead of a memcpy call or a scalar loop per row.
inline void copy_row(float* __restrict dst, const float* __restrict src, std::size_t n) {
#if defined(__AVX2__)
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
  if (i < n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), lanes);
    store_partial(dst + i, _mm256_maskload_ps(src + i, mask), n - i);
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
        const std::size_t ox_end = w + pad > kx ? std::min(ow, (w + pad - kx + s - 1) / s) : 0;
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
        const std::size_t ox_end = w + pad > kx ? std::min(ow, (w + pad - kx + s - 1) / s) : 0;
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

Workspace::Workspace(std::size_t parts, MemoryTracker* tracker)
    : slots_(std::max<std::size_t>(parts, 1)), tracker_(tracker) {}

float* Workspace::floats(std::size_t part, std::size_t slot, std::size_t count) {
  COHORT_CHECK(part < slots_.size() && slot < kSlots) << "workspace part " << part;
  FloatBuffer& buffer = slots_[part][slot];
  if (buffer.size() < count) {
    buffer = FloatBuffer();  // the old block goes first: the peak is the larger block alone
    buffer = FloatBuffer(count, tracker_);
  }
  return buffer.data();
}

ConvGeometry conv_geometry(const LayerSpec& l) {
  return {l.input.channels, l.input.height, l.input.width,   l.out,         l.kernel,
          l.stride,         l.padding,      l.output.height, l.output.width};
}

PoolGeometry pool_geometry(const LayerSpec& l) {
  return {l.input.channels, l.input.height,  l.input.width, l.kernel,
          l.stride,         l.output.height, l.output.width};
}

namespace {

#if !COHORT_LINEAR_MICRO
// The portable linear layer: row-split GEMMs (each packs the weight matrix).
void linear_forward_gemm(Exec& exec, const float* x, const float* w, const float* b, float* y,
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

void linear_backward_gemm(Exec& exec, const float* x, const float* w, float* dy,
                          const float* relu_y, float* dw, float* db, float* dx, std::size_t n,
                          std::size_t in, std::size_t out, bool accumulate) {
  if (relu_y != nullptr) relu_backward(relu_y, dy, dy, n * out);
  // Part p computes rows [o0, o1) of dw and db and rows [r0, r1) of dx: no reduction needed.
  const std::size_t parts = detail::part_count(exec.pool, std::min(n, out), kLinearRowGrain);
  detail::parallel_parts(exec.pool, parts, 1, [&](std::size_t p, std::size_t, std::size_t) {
    const std::size_t o0 = out * p / parts, o1 = out * (p + 1) / parts;
    gemm(o1 - o0, in, n, transposed(dy + o0, out), row_major(x, in), dw + o0 * in, in, accumulate);
    if (!accumulate) std::fill(db + o0, db + o1, 0.0f);
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

#else
// The AVX2 linear layer. At training batch sizes (tens) the weight matrix is by far the
// largest operand and each pass touches it once, so no pass packs it (packing would cost as
// much as the pass): the micro-kernels broadcast weight rows in place (forward) or load
// 16-column strips of them in place (input gradient); only the small batch-sized operands
// are transposed or packed. Each output element is computed by exactly one kernel call over
// a fixed k order, so any split over threads gives identical results.
using micro::kMr;
using micro::rows_kernel;
using micro::store_tile;
using micro::Tile;

constexpr std::size_t kPanel = 16;
// k block of the forward pass: 256 x 16 floats of each packed-input panel stay in L1.
constexpr std::size_t kLinearKc = 256;
// Multiply-adds below which a linear pass stays on one thread (a few microseconds: cheaper than a
// hand-off).
constexpr std::size_t kLinearParallelWork = std::size_t{1} << 18;

// dst[p][k][l] = src[(16 p + l) * ld + k] (zero for rows >= rows): the columns of src^T as
// 16-wide panels of depth k.
void pack_transposed(const float* src, std::size_t rows, std::size_t depth, std::size_t ld,
                     float* dst) {
  for (std::size_t r0 = 0; r0 < rows; r0 += kPanel) {
    float* panel = dst + r0 * depth;
    const std::size_t valid = std::min(kPanel, rows - r0);
    micro::transpose(src + r0 * ld, valid, depth, ld, panel, kPanel);
    for (std::size_t k = 0; valid < kPanel && k < depth; ++k) {
      std::fill(panel + k * kPanel + valid, panel + (k + 1) * kPanel, 0.0f);
    }
  }
}

// dst[r][0..16) = src[r * ld + 0..width), zero past width, for r < rows.
void copy_strip(const float* src, std::size_t rows, std::size_t ld, std::size_t width, float* dst) {
  if (width == kPanel) {
    for (std::size_t r = 0; r < rows; ++r) {
      _mm256_storeu_ps(dst + r * kPanel, _mm256_loadu_ps(src + r * ld));
      _mm256_storeu_ps(dst + r * kPanel + 8, _mm256_loadu_ps(src + r * ld + 8));
    }
    return;
  }
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t l = 0; l < kPanel; ++l)
      dst[r * kPanel + l] = l < width ? src[r * ld + l] : 0.0f;
  }
}

// Outputs [o0, o1) of the backward prologue: dy masked in place by relu_y > 0 (when not null),
// dyt[o][r] = dy[r][o] and db[o] = sum_r dyt[o][r].
void linear_bias_grad(float* dy, const float* relu_y, float* dyt, float* db, std::size_t n,
                      std::size_t out, std::size_t o0, std::size_t o1, bool accumulate) {
  if (relu_y != nullptr) {
    for (std::size_t r = 0; r < n; ++r) {
      relu_backward(relu_y + r * out + o0, dy + r * out + o0, dy + r * out + o0, o1 - o0);
    }
  }
  micro::transpose(dy + o0, n, o1 - o0, out, dyt + o0 * n, n);
  for (std::size_t o = o0; o < o1; ++o) {
    float sum = 0.0f;
    for (std::size_t r = 0; r < n; ++r) sum += dyt[o * n + r];
    db[o] = accumulate ? db[o] + sum : sum;
  }
}

std::size_t linear_parts(const ThreadPool* pool, std::size_t work, std::size_t units) {
  return work < kLinearParallelWork ? 1 : detail::part_count(pool, units, 1);
}

void linear_forward_micro(Exec& exec, const float* x, const float* w, const float* b, float* y,
                          std::size_t n, std::size_t in, std::size_t out, bool relu) {
  // Y^T = W X^T: rows are outputs (6 weight rows broadcast in place), columns are samples
  // (16-sample panels of X^T), then a transposing pass adds the bias (and ReLU).
  const std::size_t panels = (n + kPanel - 1) / kPanel, n_pad = panels * kPanel;
  float* yt = exec.workspace->floats(0, 1, out * n_pad);  // rows [o0, o1) per part
  const std::size_t groups = (out + kMr - 1) / kMr;
  const std::size_t k_blocks = (in + kLinearKc - 1) / kLinearKc;
  const std::size_t kc_step = (in + k_blocks - 1) / k_blocks;
  const std::size_t parts = linear_parts(exec.pool, n * in * out, groups);
  // Every part packs all of X^T into its own buffer: packing is ~3% of the pass, while sharing
  // one buffer makes each core fetch the lines the other wrote (~40 us per 200 KiB here).
  detail::parallel_parts(exec.pool, parts, 1, [&](std::size_t part, std::size_t, std::size_t) {
    const std::size_t g0 = groups * part / parts, g1 = groups * (part + 1) / parts;
    float* xt = exec.workspace->floats(part, 0, n_pad * in);
    pack_transposed(x, n, in, in, xt);
    Tile<2> acc;
    const float* rows[kMr];
    for (std::size_t k0 = 0; k0 < in; k0 += kc_step) {
      const std::size_t kc = std::min(kc_step, in - k0);
      for (std::size_t g = g0; g < g1; ++g) {
        const std::size_t o = g * kMr, mr = std::min(kMr, out - o);
        for (std::size_t i = 0; i < kMr; ++i) rows[i] = w + (o + std::min(i, mr - 1)) * in + k0;
        for (std::size_t p = 0; p < panels; ++p) {
          rows_kernel<2, false>(kc, rows, nullptr, xt + (p * in + k0) * kPanel, kPanel, acc);
          store_tile<2>(acc, yt + o * n_pad + p * kPanel, n_pad, mr, kPanel, nullptr, false,
                        k0 > 0);
        }
      }
    }
    const std::size_t o0 = std::min(out, g0 * kMr), o1 = std::min(out, g1 * kMr);
    micro::transpose(yt + o0 * n_pad, o1 - o0, n, n_pad, y + o0, out);
    for (std::size_t r = 0; r < n; ++r) {
      float* __restrict row = y + r * out;
      if (relu) {
        for (std::size_t o = o0; o < o1; ++o) row[o] = std::max(row[o] + b[o], 0.0f);
      } else {
        for (std::size_t o = o0; o < o1; ++o) row[o] += b[o];
      }
    }
  });
}

void linear_backward_micro(Exec& exec, const float* x, const float* w, float* dy,
                           const float* relu_y, float* dw, float* db, float* dx, std::size_t n,
                           std::size_t in, std::size_t out, bool accumulate) {
  const std::size_t strips = (in + kPanel - 1) / kPanel;
  const std::size_t parts = linear_parts(exec.pool, n * in * out, strips);
  // dy^T, contiguous per output: the broadcast rows of dW = dy^T X; db from the same rows. Split
  // over 8-output blocks (the fused ReLU's mask first, in place on dy); every part reads all.
  float* dyt = exec.workspace->floats(0, 2, out * n);
  const std::size_t blocks = (out + 7) / 8;
  detail::parallel_ranges(parts > 1 ? exec.pool : nullptr, blocks, 1,
                          [&](std::size_t b0, std::size_t b1) {
                            const std::size_t o0 = b0 * 8, o1 = std::min(out, b1 * 8);
                            linear_bias_grad(dy, relu_y, dyt, db, n, out, o0, o1, accumulate);
                          });
  // Columns of dW and dx in 16-wide strips. Each part copies its strip of x (n x 16) and of w
  // (out x 16) into contiguous zero-padded panels: read in place, their rows (a whole input
  // row apart, e.g. 12.5 KiB) fall into a few L1 sets and miss on every pass.
  const auto strip_range = [&](std::size_t part, std::size_t p0, std::size_t p1) {
    float* xs = exec.workspace->floats(part, 0, (n + (dx != nullptr ? out : 0)) * kPanel);
    float* ws = xs + n * kPanel;
    Tile<2> acc;
    const float* rows[kMr];
    for (std::size_t p = p0; p < p1; ++p) {
      const std::size_t i0 = p * kPanel, width = std::min(kPanel, in - i0);
      copy_strip(x + i0, n, in, width, xs);
      for (std::size_t o = 0; o < out; o += kMr) {  // dW[o][i0..] = sum_r dy[r][o] x[r][i0..]
        const std::size_t mr = std::min(kMr, out - o);
        for (std::size_t i = 0; i < kMr; ++i) rows[i] = dyt + (o + std::min(i, mr - 1)) * n;
        rows_kernel<2, false>(n, rows, nullptr, xs, kPanel, acc);
        store_tile<2>(acc, dw + o * in + i0, in, mr, width, nullptr, false, accumulate);
      }
      if (dx == nullptr) continue;
      copy_strip(w + i0, out, in, width, ws);
      for (std::size_t r = 0; r < n; r += kMr) {  // dx[r][i0..] = sum_o dy[r][o] w[o][i0..]
        const std::size_t mr = std::min(kMr, n - r);
        for (std::size_t i = 0; i < kMr; ++i) rows[i] = dy + (r + std::min(i, mr - 1)) * out;
        rows_kernel<2, false>(out, rows, nullptr, ws, kPanel, acc);
        store_tile<2>(acc, dx + r * in + i0, in, mr, width, nullptr, false, false);
      }
    }
  };
  detail::parallel_parts(exec.pool, strips, std::max<std::size_t>(1, strips / parts), strip_range);
}
#endif

}  // namespace

void linear_forward(Exec& exec, const float* x, const float* w, const float* b, float* y,
                    std::size_t n, std::size_t in, std::size_t out, bool relu) {
#if COHORT_LINEAR_MICRO
  linear_forward_micro(exec, x, w, b, y, n, in, out, relu);
#else
  linear_forward_gemm(exec, x, w, b, y, n, in, out, relu);
#endif
}

void linear_backward(Exec& exec, const float* x, const float* w, float* dy, const float* relu_y,
                     float* dw, float* db, float* dx, std::size_t n, std::size_t in,
                     std::size_t out, bool accumulate) {
#if COHORT_LINEAR_MICRO
  linear_backward_micro(exec, x, w, dy, relu_y, dw, db, dx, n, in, out, accumulate);
#else
  linear_backward_gemm(exec, x, w, dy, relu_y, dw, db, dx, n, in, out, accumulate);
#endif
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
                     const ConvGeometry& g, bool accumulate) {
  const std::size_t K = g.patch(), P = g.positions(), C = g.out_channels;
  const std::size_t parts = detail::part_count(exec.pool, n, 1);
  // Part 0 sums straight into dw/db (unless accumulating into them); other parts into scratch
  // slot 3, added after.
  const bool direct = !accumulate;
  detail::parallel_parts(exec.pool, n, 1, [&](std::size_t part, std::size_t s0, std::size_t s1) {
    const std::size_t chunk = chunk_samples(g, s1 - s0);
    float* cols = exec.workspace->floats(part, 0, K * P * chunk);
    float* grad = exec.workspace->floats(part, 1, C * P * chunk);
    float* dcols = dx != nullptr ? exec.workspace->floats(part, 2, K * P * chunk) : nullptr;
    float* partial_w = part == 0 && direct ? dw : exec.workspace->floats(part, 3, C * K + C);
    float* partial_b = part == 0 && direct ? db : partial_w + C * K;
    std::fill(partial_w, partial_w + C * K, 0.0f);
    VectorMap grad_b(partial_b, ix(C));
    // A thin patch (conv1: K = 25 < C = 32) wastes a third of the 16-wide GEMM panels as the N
    // side; computing dw^T [K][C] instead is faster (docs/PERFORMANCE.md 4).
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
        gemm(C, K, ld, row_major(grad, ld), transposed(cols, ld), partial_w, K,
             /*accumulate=*/true);
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
  for (std::size_t part = direct ? 1 : 0; part < parts; ++part) {
    const float* partial = exec.workspace->floats(part, 3, C * K + C);
    VectorMap(dw, ix(C * K)) += ConstVectorMap(partial, ix(C * K));
    VectorMap(db, ix(C)) += ConstVectorMap(partial + C * K, ix(C));
  }
}

void maxpool2d_forward(Exec& exec, const float* x, float* y, std::int32_t* argmax, std::size_t n,
                       const PoolGeometry& g) {
  const std::size_t planes = n * g.channels;
  const std::size_t grain =
      std::max<std::size_t>(1, kElementGrain / std::max<std::size_t>(g.in_size() / g.channels, 1));
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
                        std::size_t n, const PoolGeometry& g, const float* pool_y) {
  const std::size_t planes = n * g.channels;
  const std::size_t in_plane = g.height * g.width, out_plane = g.out_height * g.out_width;
  const std::size_t grain =
      std::max<std::size_t>(1, kElementGrain / std::max<std::size_t>(in_plane, 1));
  detail::parallel_ranges(exec.pool, planes, grain, [&](std::size_t p0, std::size_t p1) {
    std::fill(dx + p0 * in_plane, dx + p1 * in_plane, 0.0f);
    for (std::size_t p = p0; p < p1; ++p) {
      float* plane = dx + p * in_plane;
      const float* grad = dy + p * out_plane;
      const std::int32_t* arg = argmax + p * out_plane;
      if (pool_y == nullptr) {
        for (std::size_t q = 0; q < out_plane; ++q) plane[arg[q]] += grad[q];
      } else {
        const float* out = pool_y + p * out_plane;
        for (std::size_t q = 0; q < out_plane; ++q) {
          if (out[q] > 0.0f) plane[arg[q]] += grad[q];
        }
      }
    }
  });
}

void maxpool2d_forward_nhwc(Exec& exec, const float* x, float* y, std::int32_t* argmax,
                            std::size_t n, const PoolGeometry& g) {
  const std::size_t c_count = g.channels, in_plane = g.height * g.width;
  const std::size_t out_plane = g.out_height * g.out_width;
  const std::size_t grain =
      std::max<std::size_t>(1, kElementGrain / std::max<std::size_t>(g.in_size(), 1));
  [[maybe_unused]] const float* x_end = x + n * in_plane * c_count;
  detail::parallel_ranges(exec.pool, n, grain, [&](std::size_t s0, std::size_t s1) {
    for (std::size_t s = s0; s < s1; ++s) {
      const float* in = x + s * in_plane * c_count;
      for (std::size_t q = 0; q < out_plane; ++q) {
        const std::size_t oy = q / g.out_width, ox = q % g.out_width;
        float* out = y + (s * out_plane + q) * c_count;
        std::int32_t* arg = argmax + (s * out_plane + q) * c_count;
        const std::size_t first = oy * g.stride * g.width + ox * g.stride;
        std::size_t c = 0;
#if defined(__AVX2__)
        // 8 channels per vector; a partial last vector (e.g. LeNet's 6 channels) is masked.
        for (; c < c_count; c += 8) {
          const std::size_t valid = c_count - c;
          __m256 best = load_lanes(in + first * c_count + c, valid, x_end);
          __m256 best_at = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(first)));
          for (std::size_t ky = 0; ky < g.kernel; ++ky) {
            for (std::size_t kx = 0; kx < g.kernel; ++kx) {
              const std::size_t at = first + ky * g.width + kx;
              const __m256 v = load_lanes(in + at * c_count + c, valid, x_end);
              // v > best, or v is NaN and best is not: as the NCHW path.
              const __m256 take =
                  _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ),
                               _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q),
                                             _mm256_cmp_ps(best, best, _CMP_ORD_Q)));
              best = _mm256_blendv_ps(best, v, take);
              best_at = _mm256_blendv_ps(
                  best_at, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(at))), take);
            }
          }
          if (c + 8 <= c_count) {
            _mm256_storeu_ps(out + c, best);
            _mm256_storeu_ps(reinterpret_cast<float*>(arg + c), best_at);
          } else {
            store_partial(out + c, best, c_count - c);
            store_partial(reinterpret_cast<float*>(arg + c), best_at, c_count - c);
          }
        }
#endif
        for (; c < c_count; ++c) {
          std::size_t best_at = first;
          float best = in[first * c_count + c];
          for (std::size_t ky = 0; ky < g.kernel; ++ky) {
            for (std::size_t kx = 0; kx < g.kernel; ++kx) {
              const std::size_t at = first + ky * g.width + kx;
              const float v = in[at * c_count + c];
              if (v > best || (std::isnan(v) && !std::isnan(best))) {
                best = v;
                best_at = at;
              }
            }
          }
          out[c] = best;
          arg[c] = static_cast<std::int32_t>(best_at);
        }
      }
    }
  });
}

void maxpool2d_backward_nhwc(Exec& exec, const float* dy, const std::int32_t* argmax, float* dx,
                             std::size_t n, const PoolGeometry& g, const float* pool_y) {
  const std::size_t c_count = g.channels, in_plane = g.height * g.width;
  const std::size_t out_plane = g.out_height * g.out_width;
  const std::size_t grain =
      std::max<std::size_t>(1, kElementGrain / std::max<std::size_t>(g.in_size(), 1));
  // Windows that tile the input exactly (kernel == stride) write every input they cover, so
  // only the floor-mode remainder needs zeroing; otherwise zero everything and accumulate.
  const bool tiled = g.kernel == g.stride;
  const std::size_t total = n * out_plane * c_count;
  [[maybe_unused]] const float* dy_end = dy + total;
  detail::parallel_ranges(exec.pool, n, grain, [&](std::size_t s0, std::size_t s1) {
    for (std::size_t s = s0; s < s1; ++s) {
      float* sample = dx + s * in_plane * c_count;
      if (!tiled) {
        std::fill(sample, sample + in_plane * c_count, 0.0f);
      } else {
        const std::size_t covered_w = g.out_width * g.kernel, covered_h = g.out_height * g.kernel;
        for (std::size_t iy = 0; iy < g.height; ++iy) {
          float* row = sample + iy * g.width * c_count;
          if (iy >= covered_h) {
            std::fill(row, row + g.width * c_count, 0.0f);
          } else {
            std::fill(row + covered_w * c_count, row + g.width * c_count, 0.0f);
          }
        }
      }
      for (std::size_t q = 0; q < out_plane; ++q) {
        const float* grad = dy + (s * out_plane + q) * c_count;
        const float* out = pool_y != nullptr ? pool_y + (s * out_plane + q) * c_count : nullptr;
        const std::int32_t* arg = argmax + (s * out_plane + q) * c_count;
        const std::size_t oy = q / g.out_width, ox = q % g.out_width;
        const std::size_t first = oy * g.stride * g.width + ox * g.stride;
        if (!tiled) {
          for (std::size_t c = 0; c < c_count; ++c) {
            if (out == nullptr || out[c] > 0.0f) {
              sample[static_cast<std::size_t>(arg[c]) * c_count + c] += grad[c];
            }
          }
          continue;
        }
        std::size_t c = 0;
#if defined(__AVX2__)
        for (; c < c_count; c += 8) {
          const std::size_t valid = c_count - c;
          __m256 d = load_lanes(grad + c, valid, dy_end);
          if (out != nullptr) {
            d = _mm256_and_ps(d, _mm256_cmp_ps(load_lanes(out + c, valid, pool_y + total),
                                               _mm256_setzero_ps(), _CMP_GT_OQ));
          }
          const __m256i a =
              _mm256_castps_si256(load_lanes(reinterpret_cast<const float*>(arg + c), valid,
                                             reinterpret_cast<const float*>(argmax + total)));
          for (std::size_t ky = 0; ky < g.kernel; ++ky) {
            for (std::size_t kx = 0; kx < g.kernel; ++kx) {
              const std::size_t at = first + ky * g.width + kx;
              const __m256 hit = _mm256_castsi256_ps(
                  _mm256_cmpeq_epi32(a, _mm256_set1_epi32(static_cast<int>(at))));
              if (c + 8 <= c_count) {
                _mm256_storeu_ps(sample + at * c_count + c, _mm256_and_ps(d, hit));
              } else {
                store_partial(sample + at * c_count + c, _mm256_and_ps(d, hit), c_count - c);
              }
            }
          }
        }
#endif
        for (; c < c_count; ++c) {
          const float d = out == nullptr || out[c] > 0.0f ? grad[c] : 0.0f;
          for (std::size_t ky = 0; ky < g.kernel; ++ky) {
            for (std::size_t kx = 0; kx < g.kernel; ++kx) {
              const std::size_t at = first + ky * g.width + kx;
              sample[at * c_count + c] = static_cast<std::size_t>(arg[c]) == at ? d : 0.0f;
            }
          }
        }
      }
    }
  });
}

namespace {

// dst[j][i] = src[i][j] for an rows x cols block of src (row stride cols).
void transpose_plane(const float* src, float* dst, std::size_t rows, std::size_t cols) {
  constexpr std::size_t kBlock = 16;
  for (std::size_t i0 = 0; i0 < rows; i0 += kBlock) {
    for (std::size_t j0 = 0; j0 < cols; j0 += kBlock) {
      const std::size_t i1 = std::min(rows, i0 + kBlock), j1 = std::min(cols, j0 + kBlock);
      for (std::size_t i = i0; i < i1; ++i) {
        for (std::size_t j = j0; j < j1; ++j) dst[j * rows + i] = src[i * cols + j];
      }
    }
  }
}

}  // namespace

void nchw_to_nhwc(Exec& exec, const float* x, float* y, std::size_t n, std::size_t channels,
                  std::size_t plane) {
  const std::size_t size = channels * plane;
  const std::size_t grain =
      std::max<std::size_t>(1, kElementGrain / std::max<std::size_t>(size, 1));
  detail::parallel_ranges(exec.pool, n, grain, [&](std::size_t s0, std::size_t s1) {
    for (std::size_t s = s0; s < s1; ++s)
      transpose_plane(x + s * size, y + s * size, channels, plane);
  });
}

void nhwc_to_nchw(Exec& exec, const float* x, float* y, std::size_t n, std::size_t channels,
                  std::size_t plane) {
  const std::size_t size = channels * plane;
  const std::size_t grain =
      std::max<std::size_t>(1, kElementGrain / std::max<std::size_t>(size, 1));
  detail::parallel_ranges(exec.pool, n, grain, [&](std::size_t s0, std::size_t s1) {
    for (std::size_t s = s0; s < s1; ++s)
      transpose_plane(x + s * size, y + s * size, plane, channels);
  });
}

void dropout_forward(const float* x, float* y, float* mask, std::size_t count, float p,
                     std::uint64_t key, std::uint64_t first) {
  const float keep_scale = 1.0f / (1.0f - p);
  for (std::size_t i = 0; i < count; ++i) {
    mask[i] = detail::counter_uniform(key, first + i) < p ? 0.0f : keep_scale;
    y[i] = x[i] * mask[i];
  }
}

void dropout_backward(const float* dy, const float* mask, float* dx, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dx[i] = dy[i] * mask[i];
}

}  // namespace cohort::kernels::cpu
