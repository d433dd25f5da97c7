#include "nhwc_conv.h"

#include <algorithm>
#include <cstring>

#include "../parallel.h"
#include "cohort/core/error.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "microkernels.h"
#define COHORT_NHWC_AVX2 1
#else
#define COHORT_NHWC_AVX2 0
#endif

namespace cohort::kernels::cpu {

struct NhwcConv::Part {
  FloatBuffer v;   // Winograd: transformed input block [36][block][Ci]
  FloatBuffer mz;  // Winograd: products (forward) or transformed dy (backward) [36][block][Co]
  FloatBuffer dv;  // Winograd: transformed input gradient block [36][block][Ci]
  FloatBuffer dw;  // partial weight gradient (direct: [taps][Co]; Winograd: [36][Co][Ci])
  FloatBuffer db;  // partial bias gradient
};

NhwcConv::~NhwcConv() = default;
NhwcConv::NhwcConv(NhwcConv&&) noexcept = default;
NhwcConv& NhwcConv::operator=(NhwcConv&&) noexcept = default;

bool NhwcConv::can_run(const ConvGeometry& g, Algorithm algorithm) {
  if (!COHORT_NHWC_AVX2 || g.stride != 1 || g.padding >= g.kernel || g.kernel == 0) return false;
  if (g.in_channels == 0 || g.out_channels == 0 || g.out_height == 0 || g.out_width == 0) {
    return false;
  }
  // Offsets are int32: keep one padded sample well inside that range.
  const std::size_t plane = (g.height + 2 * g.kernel + 4) * (g.width + 2 * g.kernel + 4);
  if (plane * std::max(g.in_channels, g.out_channels) >= (std::size_t{1} << 30)) return false;
  if (algorithm == Algorithm::kDirect) return true;
  return (g.kernel == 3 || g.kernel == 5) && g.in_channels % 8 == 0 && g.out_channels % 8 == 0;
}

bool NhwcConv::supports(const ConvGeometry& g) { return can_run(g, Algorithm::kDirect); }

NhwcConv::Algorithm NhwcConv::choose(const ConvGeometry& g) {
  // Below ~16 channels the transforms (linear in channels) outweigh the saved multiplies
  // (quadratic), and 8-wide GEMM panels waste lanes.
  if (can_run(g, Algorithm::kWinograd) && g.in_channels >= 16 && g.out_channels >= 16) {
    return Algorithm::kWinograd;
  }
  return Algorithm::kDirect;
}

#if COHORT_NHWC_AVX2
namespace {

using micro::kMr;
using micro::reduce_kernel;
using micro::rows_kernel;
using micro::store_tile;
using micro::Tile;
using micro::transpose8x8;

constexpr std::size_t kAlpha = 6;  // Winograd tile side
constexpr std::size_t kXi = kAlpha * kAlpha;
// Tiles per Winograd block: its transformed input and products (36 x 96 x (Ci + Co) floats,
// 1.3 MiB for 32 -> 64 channels) sit in L2/L3, and the weight-gradient reduction over a block
// is long enough (96 steps) to amortise accumulating its tile into memory.
constexpr std::size_t kBlockTiles = 96;
// The 36 planes of a block buffer start 64 bytes apart modulo 4 KiB: at a whole multiple of
// 4 KiB (96 tiles x 32 or 64 channels) the 36 streams of a transform all map to one L1 set.
constexpr std::size_t kPlanePad = 16;
std::size_t plane_floats(std::size_t channels) { return kBlockTiles * channels + kPlanePad; }
constexpr std::size_t kSlack = 16;  // floats past a buffer's end that full-width loads may touch

// Winograd F(m, r) with alpha = 6 and points 0, +-1, +-2, infinity (Lavin & Gray, 2016): the
// same input transform Bt serves F(2, 5) and F(4, 3). Generated exactly with rational
// arithmetic (Toom-Cook); Bt, At and their transposes are written out in bt6/b6/at6/a6.
constexpr double kG5[6][5] = {{1.0 / 4, 0, 0, 0, 0},
                              {-1.0 / 6, -1.0 / 6, -1.0 / 6, -1.0 / 6, -1.0 / 6},
                              {-1.0 / 6, 1.0 / 6, -1.0 / 6, 1.0 / 6, -1.0 / 6},
                              {1.0 / 24, 1.0 / 12, 1.0 / 6, 1.0 / 3, 2.0 / 3},
                              {1.0 / 24, -1.0 / 12, 1.0 / 6, -1.0 / 3, 2.0 / 3},
                              {0, 0, 0, 0, 1}};
constexpr double kG3[6][3] = {{1.0 / 4, 0, 0},
                              {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                              {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                              {1.0 / 24, 1.0 / 12, 1.0 / 6},
                              {1.0 / 24, -1.0 / 12, 1.0 / 6},
                              {0, 0, 1}};

double g_entry(std::size_t kernel, std::size_t a, std::size_t k) {
  return kernel == 5 ? kG5[a][k] : kG3[a][k];
}

// One-dimensional transforms on vectors of 8 channels, written out to share the common
// subexpressions (14 operations for Bt, against 21 for a plain matrix product).
using V6 = __m256[kAlpha];

inline __m256 splat(float v) { return _mm256_set1_ps(v); }

// r = Bt d.
inline void bt6(const V6& d, V6& r) {
  const __m256 d4_d2 = _mm256_sub_ps(d[4], d[2]);
  const __m256 d3_d1 = _mm256_sub_ps(d[3], d[1]);
  r[0] = _mm256_fmadd_ps(splat(4), d[0], _mm256_fnmadd_ps(splat(5), d[2], d[4]));
  r[1] = _mm256_fnmadd_ps(splat(4), _mm256_add_ps(d[1], d[2]), _mm256_add_ps(d[3], d[4]));
  r[2] = _mm256_fmadd_ps(splat(4), _mm256_sub_ps(d[1], d[2]), _mm256_sub_ps(d[4], d[3]));
  r[3] = _mm256_fmadd_ps(splat(2), d3_d1, d4_d2);
  r[4] = _mm256_fnmadd_ps(splat(2), d3_d1, d4_d2);
  r[5] = _mm256_fmadd_ps(splat(4), d[1], _mm256_fnmadd_ps(splat(5), d[3], d[5]));
}

// o = B v (the adjoint of bt6).
inline void b6(const V6& v, V6& o) {
  const __m256 s12 = _mm256_add_ps(v[1], v[2]), d12 = _mm256_sub_ps(v[1], v[2]);
  const __m256 s34 = _mm256_add_ps(v[3], v[4]), d34 = _mm256_sub_ps(v[3], v[4]);
  o[0] = _mm256_mul_ps(splat(4), v[0]);
  o[1] = _mm256_fnmadd_ps(splat(2), d34, _mm256_mul_ps(splat(4), _mm256_sub_ps(v[5], d12)));
  o[2] = _mm256_fnmsub_ps(splat(5), v[0], _mm256_fmadd_ps(splat(4), s12, s34));
  o[3] = _mm256_fnmadd_ps(splat(5), v[5], _mm256_fmadd_ps(splat(2), d34, d12));
  o[4] = _mm256_add_ps(v[0], _mm256_add_ps(s12, s34));
  o[5] = v[5];
}

// y = At v for M = 2 (5x5 kernels) or 4 (3x3).
template <std::size_t M>
inline void at6(const V6& v, __m256 (&y)[M]) {
  const __m256 s12 = _mm256_add_ps(v[1], v[2]), d12 = _mm256_sub_ps(v[1], v[2]);
  const __m256 s34 = _mm256_add_ps(v[3], v[4]), d34 = _mm256_sub_ps(v[3], v[4]);
  y[0] = _mm256_add_ps(v[0], _mm256_add_ps(s12, s34));
  if constexpr (M == 2) {
    y[1] = _mm256_add_ps(_mm256_fmadd_ps(splat(2), d34, d12), v[5]);
  } else {
    y[1] = _mm256_fmadd_ps(splat(2), d34, d12);
    y[2] = _mm256_fmadd_ps(splat(4), s34, s12);
    y[3] = _mm256_add_ps(_mm256_fmadd_ps(splat(8), d34, d12), v[5]);
  }
}

// z6 = A z (the adjoint of at6).
template <std::size_t M>
inline void a6(const __m256 (&z)[M], V6& z6) {
  z6[0] = z[0];
  if constexpr (M == 2) {
    z6[1] = _mm256_add_ps(z[0], z[1]);
    z6[2] = _mm256_sub_ps(z[0], z[1]);
    z6[3] = _mm256_fmadd_ps(splat(2), z[1], z[0]);
    z6[4] = _mm256_fnmadd_ps(splat(2), z[1], z[0]);
    z6[5] = z[1];
  } else {
    const __m256 even = _mm256_add_ps(z[0], z[2]), odd = _mm256_add_ps(z[1], z[3]);
    const __m256 even4 = _mm256_fmadd_ps(splat(4), z[2], z[0]);
    const __m256 odd4 = _mm256_mul_ps(splat(2), _mm256_fmadd_ps(splat(4), z[3], z[1]));
    z6[1] = _mm256_add_ps(even, odd);
    z6[2] = _mm256_sub_ps(even, odd);
    z6[3] = _mm256_add_ps(even4, odd4);
    z6[4] = _mm256_sub_ps(even4, odd4);
    z6[5] = z[3];
  }
}

// v[xi * stride] = (Bt d B)[xi] for the 6x6 tile d[i][j] = in[i * row + j * col].
inline void input_transform(const float* in, std::size_t row, std::size_t col, float* v,
                            std::size_t stride) {
  V6 t[kAlpha];  // t[a][j] = (Bt d)[a][j]
  V6 d, r;
  for (std::size_t j = 0; j < kAlpha; ++j) {
    for (std::size_t i = 0; i < kAlpha; ++i) d[i] = _mm256_loadu_ps(in + i * row + j * col);
    bt6(d, r);
    for (std::size_t a = 0; a < kAlpha; ++a) t[a][j] = r[a];
  }
  for (std::size_t a = 0; a < kAlpha; ++a) {
    bt6(t[a], r);
    for (std::size_t b = 0; b < kAlpha; ++b) _mm256_storeu_ps(v + (a * kAlpha + b) * stride, r[b]);
  }
}

// out[i * row + j * col] += (B dv Bt)[i][j], dv[a][b] = dv_in[(a * 6 + b) * stride]: the
// adjoint of input_transform, accumulated onto the (overlapping) input tile.
inline void input_transform_adjoint(const float* dv_in, std::size_t stride, float* out,
                                    std::size_t row, std::size_t col) {
  V6 t[kAlpha];  // t[i][b] = (B dv)[i][b]
  V6 v, o;
  for (std::size_t b = 0; b < kAlpha; ++b) {
    for (std::size_t a = 0; a < kAlpha; ++a)
      v[a] = _mm256_loadu_ps(dv_in + (a * kAlpha + b) * stride);
    b6(v, o);
    for (std::size_t i = 0; i < kAlpha; ++i) t[i][b] = o[i];
  }
  for (std::size_t i = 0; i < kAlpha; ++i) {
    b6(t[i], o);
    for (std::size_t j = 0; j < kAlpha; ++j) {
      float* at = out + i * row + j * col;
      _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), o[j]));
    }
  }
}

// y[i][j] = (At M A)[i][j] for i < M, M[a][b] = in[(a * 6 + b) * stride].
template <std::size_t M>
inline void output_transform(const float* in, std::size_t stride, __m256 (&y)[M][M]) {
  __m256 t[M][kAlpha];  // t[i][b] = (At M)[i][b]
  V6 v;
  __m256 r[M];
  for (std::size_t b = 0; b < kAlpha; ++b) {
    for (std::size_t a = 0; a < kAlpha; ++a) v[a] = _mm256_loadu_ps(in + (a * kAlpha + b) * stride);
    at6<M>(v, r);
    for (std::size_t i = 0; i < M; ++i) t[i][b] = r[i];
  }
  for (std::size_t i = 0; i < M; ++i) at6<M>(t[i], y[i]);
}

// out[xi * stride] = (A z At)[xi]: the adjoint of output_transform.
template <std::size_t M>
inline void output_transform_adjoint(const __m256 (&z)[M][M], float* out, std::size_t stride) {
  V6 t[kAlpha];  // t[a][j] = (A z)[a][j]
  __m256 col[M];
  V6 r;
  for (std::size_t j = 0; j < M; ++j) {
    for (std::size_t i = 0; i < M; ++i) col[i] = z[i][j];
    a6<M>(col, r);
    for (std::size_t a = 0; a < kAlpha; ++a) t[a][j] = r[a];
  }
  for (std::size_t a = 0; a < kAlpha; ++a) {
    __m256 row[M];
    for (std::size_t j = 0; j < M; ++j) row[j] = t[a][j];
    a6<M>(row, r);
    for (std::size_t b = 0; b < kAlpha; ++b)
      _mm256_storeu_ps(out + (a * kAlpha + b) * stride, r[b]);
  }
}

// Tile index t (sample-major, then row, then column) into its coordinates.
struct TileAt {
  std::size_t sample, ty, tx;
};
inline TileAt tile_at(std::size_t t, std::size_t tiles_y, std::size_t tiles_x) {
  const std::size_t per_sample = tiles_y * tiles_x;
  const std::size_t r = t % per_sample;
  return {t / per_sample, r / tiles_x, r % tiles_x};
}

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

void grow(FloatBuffer& buffer, std::size_t count) {
  if (buffer.size() < count) buffer = FloatBuffer(count);
}

// Panel width for c GEMM columns: 16 (two vectors) unless 8 covers them.
int vectors_for(std::size_t c) { return c <= 8 ? 1 : 2; }

}  // namespace

NhwcConv::NhwcConv(const ConvGeometry& g, Algorithm algorithm) : g_(g), algorithm_(algorithm) {
  if (!can_run(g, algorithm)) throw KernelError("nhwc conv2d: unsupported geometry");
  const std::size_t k = g.kernel, p = g.padding, ci = g.in_channels, co = g.out_channels;
  if (algorithm == Algorithm::kWinograd) {
    m_ = kAlpha + 1 - k;
    tiles_y_ = (g.out_height + m_ - 1) / m_;
    tiles_x_ = (g.out_width + m_ - 1) / m_;
    pad_h_ = m_ * tiles_y_ + k - 1;  // >= height + 2p; the extra rows stay zero
    pad_w_ = m_ * tiles_x_ + k - 1;
    return;
  }
  pad_h_ = g.height + 2 * p;
  pad_w_ = g.width + 2 * p;
  const std::size_t q = k - 1 - p;  // dy padding for the input gradient
  const std::size_t dy_w = g.out_width + 2 * q;
  const std::size_t taps = k * k * ci;
  offsets_.assign(round_up(taps, kMr), 0);
  for (std::size_t ky = 0; ky < k; ++ky) {
    for (std::size_t kx = 0; kx < k; ++kx) {
      for (std::size_t c = 0; c < ci; ++c) {
        offsets_[(ky * k + kx) * ci + c] = static_cast<std::int32_t>((ky * pad_w_ + kx) * ci + c);
      }
    }
  }
  offsets_t_.assign(k * k * co, 0);
  for (std::size_t ky = 0; ky < k; ++ky) {
    for (std::size_t kx = 0; kx < k; ++kx) {
      for (std::size_t c = 0; c < co; ++c) {
        offsets_t_[(ky * k + kx) * co + c] = static_cast<std::int32_t>((ky * dy_w + kx) * co + c);
      }
    }
  }
  positions_.resize(g.positions());
  for (std::size_t oy = 0; oy < g.out_height; ++oy) {
    for (std::size_t ox = 0; ox < g.out_width; ++ox) {
      positions_[oy * g.out_width + ox] = static_cast<std::int32_t>((oy * pad_w_ + ox) * ci);
    }
  }
  positions_t_.resize(g.height * g.width);
  for (std::size_t iy = 0; iy < g.height; ++iy) {
    for (std::size_t ix = 0; ix < g.width; ++ix) {
      positions_t_[iy * g.width + ix] = static_cast<std::int32_t>((iy * dy_w + ix) * co);
    }
  }
}

void NhwcConv::reserve(std::size_t n, std::size_t parts) {
  const std::size_t ci = g_.in_channels, co = g_.out_channels;
  if (n > capacity_) {
    // Fresh (zeroed) buffers: only interiors are ever written, so the borders stay zero.
    xp_ = FloatBuffer(n * pad_h_ * pad_w_ * ci + kSlack);
    if (algorithm_ == Algorithm::kDirect) {
      const std::size_t q = g_.kernel - 1 - g_.padding;
      dyp_ = FloatBuffer(n * (g_.out_height + 2 * q) * (g_.out_width + 2 * q) * co + kSlack);
    } else {
      dxp_ = FloatBuffer(n * pad_h_ * pad_w_ * ci + kSlack);
    }
    capacity_ = n;
  }
  if (parts_.size() < parts) parts_.resize(parts);
}

void NhwcConv::pad_input(Exec& exec, const float* x, std::size_t n) {
  const std::size_t ci = g_.in_channels, p = g_.padding;
  const std::size_t row = g_.width * ci;
  detail::parallel_ranges(exec.pool, n * g_.height, 64, [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r) {
      const std::size_t s = r / g_.height, iy = r % g_.height;
      std::memcpy(xp_.data() + ((s * pad_h_ + iy + p) * pad_w_ + p) * ci, x + r * row,
                  row * sizeof(float));
    }
  });
}

void NhwcConv::forward(Exec& exec, const float* x, const float* w, const float* b, float* y,
                       std::size_t n, bool relu) {
  reserve(n, detail::part_count(exec.pool, n, 1));
  pad_input(exec, x, n);
  if (algorithm_ == Algorithm::kDirect) {
    forward_direct(exec, w, b, y, n, relu);
  } else {
    forward_winograd(exec, w, b, y, n, relu);
  }
}

void NhwcConv::backward(Exec& exec, const float* w, const float* dy, const float* relu_y, float* dw,
                        float* db, float* dx, std::size_t n) {
  COHORT_CHECK(n <= capacity_) << "nhwc conv2d backward before forward";
  reserve(n, detail::part_count(exec.pool, n, 1));
  if (algorithm_ == Algorithm::kDirect) {
    backward_direct(exec, w, dy, relu_y, dw, db, dx, n);
  } else {
    backward_winograd(exec, w, dy, relu_y, dw, db, dx, n);
  }
}

// ---- direct (implicit GEMM) ----------------------------------------------------------------

namespace {

// Row pointers of the 6 GEMM rows starting at (sample, q) over planes of `per_sample`
// positions; rows past `mr` repeat the last valid one (computed, never stored).
inline void position_rows(const float* base, std::size_t plane, const std::int32_t* positions,
                          std::size_t per_sample, std::size_t sample, std::size_t q, std::size_t mr,
                          const float* (&rows)[kMr]) {
  for (std::size_t i = 0; i < kMr; ++i) {
    rows[i] = base + sample * plane + static_cast<std::size_t>(positions[q]);
    if (i + 1 < mr && ++q == per_sample) {
      q = 0;
      ++sample;
    }
  }
}

// C[m][0..cols) for the GEMM rows m over samples [s0, s1): rows from position_rows, packed
// panels of 8 NV columns. Used by the direct forward pass and the input gradient.
template <int NV>
void direct_gemm(std::size_t s0, std::size_t s1, const float* base, std::size_t plane,
                 const std::int32_t* positions, std::size_t per_sample, const std::int32_t* off,
                 std::size_t taps, const float* packed, std::size_t cols, const float* bias,
                 bool relu, float* c) {
  constexpr std::size_t kWidth = 8 * NV;
  const std::size_t panels = (cols + kWidth - 1) / kWidth;
  const std::size_t total = (s1 - s0) * per_sample;
  std::size_t sample = s0, q = 0;
  Tile<NV> acc;
  const float* rows[kMr];
  for (std::size_t m = 0; m < total; m += kMr) {
    const std::size_t mr = std::min(kMr, total - m);
    position_rows(base, plane, positions, per_sample, sample, q, mr, rows);
    float* out = c + (s0 * per_sample + m) * cols;
    for (std::size_t j = 0; j < panels; ++j) {
      rows_kernel<NV, true>(taps, rows, off, packed + j * taps * kWidth, kWidth, acc);
      store_tile<NV>(acc, out + j * kWidth, cols, mr, std::min(kWidth, cols - j * kWidth),
                     bias != nullptr ? bias + j * kWidth : nullptr, relu, false);
    }
    q += mr;
    while (q >= per_sample) {
      q -= per_sample;
      ++sample;
    }
  }
}

// dst = src, zeroed where relu_y <= 0 (relu_y may be null: a plain copy).
void mask_copy(const float* __restrict src, const float* __restrict relu_y, float* __restrict dst,
               std::size_t count) {
  std::size_t i = 0;
  if (relu_y == nullptr) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  const __m256 zero = _mm256_setzero_ps();
  for (; i + 8 <= count; i += 8) {
    const __m256 keep = _mm256_cmp_ps(_mm256_loadu_ps(relu_y + i), zero, _CMP_GT_OQ);
    _mm256_storeu_ps(dst + i, _mm256_and_ps(_mm256_loadu_ps(src + i), keep));
  }
  for (; i < count; ++i) dst[i] = relu_y[i] > 0.0f ? src[i] : 0.0f;
}

// sum[c] += src[r][c] over rows r < rows (row length cols).
void add_rows(const float* __restrict src, std::size_t rows, std::size_t cols,
              float* __restrict sum) {
  std::size_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 acc = _mm256_loadu_ps(sum + c);
    for (std::size_t r = 0; r < rows; ++r)
      acc = _mm256_add_ps(acc, _mm256_loadu_ps(src + r * cols + c));
    _mm256_storeu_ps(sum + c, acc);
  }
  for (; c < cols; ++c) {
    float acc = sum[c];
    for (std::size_t r = 0; r < rows; ++r) acc += src[r * cols + c];
    sum[c] = acc;
  }
}

// packed[j][tap][lane] = value(tap, j * width + lane), zero past cols.
template <typename F>
void pack_panels(float* packed, std::size_t taps, std::size_t cols, std::size_t width, F value) {
  const std::size_t panels = (cols + width - 1) / width;
  for (std::size_t j = 0; j < panels; ++j) {
    for (std::size_t t = 0; t < taps; ++t) {
      float* dst = packed + (j * taps + t) * width;
      for (std::size_t l = 0; l < width; ++l) {
        const std::size_t col = j * width + l;
        dst[l] = col < cols ? value(t, col) : 0.0f;
      }
    }
  }
}

}  // namespace

void NhwcConv::forward_direct(Exec& exec, const float* w, const float* b, float* y, std::size_t n,
                              bool relu) {
  const std::size_t k = g_.kernel, ci = g_.in_channels, co = g_.out_channels;
  const std::size_t taps = k * k * ci;
  const int nv = vectors_for(co);
  const std::size_t width = 8 * static_cast<std::size_t>(nv);
  const std::size_t panels = (co + width - 1) / width;
  grow(wpack_, panels * taps * width);
  grow(bias_, panels * width);
  // Tap (ky, kx, c) of output channel o: w[o][c][ky][kx].
  pack_panels(wpack_.data(), taps, co, width, [&](std::size_t t, std::size_t o) {
    const std::size_t c = t % ci, kk = t / ci;
    return w[(o * ci + c) * k * k + kk];
  });
  std::fill(bias_.begin(), bias_.end(), 0.0f);
  std::copy(b, b + co, bias_.data());
  const std::size_t plane = pad_h_ * pad_w_ * ci;
  detail::parallel_parts(exec.pool, n, 1, [&](std::size_t, std::size_t s0, std::size_t s1) {
    if (nv == 1) {
      direct_gemm<1>(s0, s1, xp_.data(), plane, positions_.data(), g_.positions(), offsets_.data(),
                     taps, wpack_.data(), co, bias_.data(), relu, y);
    } else {
      direct_gemm<2>(s0, s1, xp_.data(), plane, positions_.data(), g_.positions(), offsets_.data(),
                     taps, wpack_.data(), co, bias_.data(), relu, y);
    }
  });
}

void NhwcConv::backward_direct(Exec& exec, const float* w, const float* dy, const float* relu_y,
                               float* dw, float* db, float* dx, std::size_t n) {
  const std::size_t k = g_.kernel, ci = g_.in_channels, co = g_.out_channels;
  const std::size_t oh = g_.out_height, ow = g_.out_width, p = g_.padding;
  const std::size_t q = k - 1 - p, dy_h = oh + 2 * q, dy_w = ow + 2 * q;
  const std::size_t taps = k * k * ci, taps_t = k * k * co;
  const std::size_t rows_w = round_up(taps, kMr);
  const int nv = vectors_for(co);
  const std::size_t width = 8 * static_cast<std::size_t>(nv);
  const std::size_t cols_w = round_up(co, width);
  const int nv_t = vectors_for(ci);
  const std::size_t width_t = 8 * static_cast<std::size_t>(nv_t);
  if (dx != nullptr) {
    // Input gradient = a stride-1 correlation of dy (padded by k-1-p) with the flipped kernel,
    // input and output channels swapped: tap (ky, kx, o) of input channel c is
    // w[o][c][k-1-ky][k-1-kx].
    grow(wpack_t_, ((ci + width_t - 1) / width_t) * taps_t * width_t);
    pack_panels(wpack_t_.data(), taps_t, ci, width_t, [&](std::size_t t, std::size_t c) {
      const std::size_t o = t % co, kk = t / co, ky = kk / k, kx = kk % k;
      return w[((o * ci + c) * k + (k - 1 - ky)) * k + (k - 1 - kx)];
    });
  }
  const std::size_t parts = detail::part_count(exec.pool, n, 1);
  const std::size_t x_plane = pad_h_ * pad_w_ * ci, dy_plane = dy_h * dy_w * co;
  // Without dx (a first layer) and without a mask, the weight gradient reads dy in place, as
  // long as its full-width column loads stay inside each position (co a multiple of width).
  const bool in_place = dx == nullptr && relu_y == nullptr && co % width == 0;
  detail::parallel_parts(exec.pool, n, 1, [&](std::size_t part, std::size_t s0, std::size_t s1) {
    Part& scratch = parts_[part];
    grow(scratch.dw, rows_w * cols_w);
    grow(scratch.db, co);
    float* pdw = scratch.dw.data();
    float* pdb = scratch.db.data();
    std::fill(pdw, pdw + rows_w * cols_w, 0.0f);
    std::fill(pdb, pdb + co, 0.0f);
    for (std::size_t s = s0; s < s1; ++s) {
      const float* ds;  // this sample's (masked) dy, rows ds_row apart
      std::size_t ds_row;
      if (in_place) {
        ds = dy + s * oh * ow * co;
        ds_row = ow * co;
        add_rows(ds, oh * ow, co, pdb);
      } else {
        // Masked dy into the padded buffer, summing the bias gradient on the way.
        for (std::size_t oy = 0; oy < oh; ++oy) {
          const std::size_t at = (s * oh + oy) * ow * co;
          float* dst = dyp_.data() + s * dy_plane + ((oy + q) * dy_w + q) * co;
          mask_copy(dy + at, relu_y != nullptr ? relu_y + at : nullptr, dst, ow * co);
          add_rows(dst, ow, co, pdb);
        }
        ds = dyp_.data() + s * dy_plane + (q * dy_w + q) * co;
        ds_row = dy_w * co;
      }
      // dW^T[tap][o] += sum over positions of x[pos + tap] * dy[pos][o].
      const float* xs = xp_.data() + s * x_plane;
      for (std::size_t t0 = 0; t0 < rows_w; t0 += kMr) {
        for (std::size_t j = 0; j < cols_w; j += width) {
          float* out = pdw + t0 * cols_w + j;
          if (nv == 1) {
            Tile<1> acc;
            reduce_kernel<1>(oh, ow, xs, pad_w_ * ci, ci, offsets_.data() + t0, ds + j, ds_row, co,
                             acc);
            store_tile<1>(acc, out, cols_w, kMr, width, nullptr, false, true);
          } else {
            Tile<2> acc;
            reduce_kernel<2>(oh, ow, xs, pad_w_ * ci, ci, offsets_.data() + t0, ds + j, ds_row, co,
                             acc);
            store_tile<2>(acc, out, cols_w, kMr, width, nullptr, false, true);
          }
        }
      }
    }
    if (dx != nullptr) {
      if (nv_t == 1) {
        direct_gemm<1>(s0, s1, dyp_.data(), dy_plane, positions_t_.data(), g_.height * g_.width,
                       offsets_t_.data(), taps_t, wpack_t_.data(), ci, nullptr, false, dx);
      } else {
        direct_gemm<2>(s0, s1, dyp_.data(), dy_plane, positions_t_.data(), g_.height * g_.width,
                       offsets_t_.data(), taps_t, wpack_t_.data(), ci, nullptr, false, dx);
      }
    }
  });
  // Sum the parts; dW^T[(ky, kx, c)][o] -> dw[o][c][ky][kx].
  for (std::size_t part = 1; part < parts; ++part) {
    const float* src = parts_[part].dw.data();
    float* dst = parts_[0].dw.data();
    for (std::size_t i = 0; i < rows_w * cols_w; ++i) dst[i] += src[i];
    for (std::size_t c = 0; c < co; ++c) parts_[0].db[c] += parts_[part].db[c];
  }
  const float* sum = parts_[0].dw.data();
  for (std::size_t o = 0; o < co; ++o) {
    for (std::size_t c = 0; c < ci; ++c) {
      for (std::size_t kk = 0; kk < k * k; ++kk) {
        dw[(o * ci + c) * k * k + kk] = sum[(kk * ci + c) * cols_w + o];
      }
    }
  }
  std::copy(parts_[0].db.data(), parts_[0].db.data() + co, db);
}

// ---- Winograd --------------------------------------------------------------------------------

namespace {

// Transformed input of tiles [t0, t0 + count) into v[xi][t - t0][c] (planes `plane` apart).
void transform_inputs(const float* xp, std::size_t pad_h, std::size_t pad_w, std::size_t ci,
                      std::size_t m, std::size_t tiles_y, std::size_t tiles_x, std::size_t t0,
                      std::size_t count, std::size_t plane, float* v) {
  for (std::size_t t = 0; t < count; ++t) {
    const TileAt at = tile_at(t0 + t, tiles_y, tiles_x);
    const float* base = xp + ((at.sample * pad_h + m * at.ty) * pad_w + m * at.tx) * ci;
    for (std::size_t c = 0; c < ci; c += 8) {
      input_transform(base + c, pad_w * ci, ci, v + t * ci + c, plane);
    }
  }
}

// out[xi][t][0..cols) = a[xi][t][:] * packed[xi] for t < count: 36 GEMMs of count x inner x cols.
// a's planes are plane_floats(inner) apart, out's plane_floats(cols).
template <int NV>
void transformed_gemm(const float* a, std::size_t inner, std::size_t count, const float* packed,
                      std::size_t cols, float* out) {
  constexpr std::size_t kWidth = 8 * NV;
  const std::size_t panels = cols / kWidth;
  Tile<NV> acc;
  const float* rows[kMr];
  for (std::size_t xi = 0; xi < kXi; ++xi) {
    const float* ax = a + xi * plane_floats(inner);
    for (std::size_t t = 0; t < count; t += kMr) {
      const std::size_t mr = std::min(kMr, count - t);
      for (std::size_t i = 0; i < kMr; ++i) rows[i] = ax + (t + std::min(i, mr - 1)) * inner;
      float* dst = out + xi * plane_floats(cols) + t * cols;
      for (std::size_t j = 0; j < panels; ++j) {
        rows_kernel<NV, false>(inner, rows, nullptr, packed + (xi * panels + j) * inner * kWidth,
                               kWidth, acc);
        store_tile<NV>(acc, dst + j * kWidth, cols, mr, kWidth, nullptr, false, false);
      }
    }
  }
}

// U = G g Gt for every (input c, output o) pair, 8 outputs per vector, packed as
// packed[xi][o / width][c][o % width]. REQUIRES co % 8 == 0.
void transform_weights(Exec& exec, const float* w, std::size_t k, std::size_t ci, std::size_t co,
                       std::size_t width, float* packed) {
  const std::size_t panels = co / width, taps = k * k;
  const __m256i stride = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                            _mm256_set1_epi32(static_cast<int>(ci * taps)));
  detail::parallel_ranges(exec.pool, co / 8, 2, [&](std::size_t b0, std::size_t b1) {
    __m256 g[25], t[kAlpha][5];
    for (std::size_t o = 8 * b0; o < 8 * b1; o += 8) {
      for (std::size_t c = 0; c < ci; ++c) {
        const float* base = w + (o * ci + c) * taps;
        for (std::size_t i = 0; i < taps; ++i) g[i] = _mm256_i32gather_ps(base + i, stride, 4);
        for (std::size_t a = 0; a < kAlpha; ++a) {
          for (std::size_t kx = 0; kx < k; ++kx) {
            __m256 sum = _mm256_setzero_ps();
            for (std::size_t ky = 0; ky < k; ++ky) {
              sum = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(g_entry(k, a, ky))),
                                    g[ky * k + kx], sum);
            }
            t[a][kx] = sum;
          }
        }
        float* dst = packed + ((o / width) * ci + c) * width + o % width;
        for (std::size_t a = 0; a < kAlpha; ++a) {
          for (std::size_t b = 0; b < kAlpha; ++b) {
            __m256 sum = _mm256_setzero_ps();
            for (std::size_t kx = 0; kx < k; ++kx) {
              sum = _mm256_fmadd_ps(t[a][kx], _mm256_set1_ps(static_cast<float>(g_entry(k, b, kx))),
                                    sum);
            }
            _mm256_storeu_ps(dst + (a * kAlpha + b) * panels * ci * width, sum);
          }
        }
      }
    }
  });
}

// dw[o][c] = Gt dU[.][o][c] G for dU laid out [xi][o][c], 8 input channels per vector.
// REQUIRES ci % 8 == 0.
void transform_weight_gradient(Exec& exec, const float* du, std::size_t k, std::size_t ci,
                               std::size_t co, float* dw) {
  const std::size_t taps = k * k;
  detail::parallel_ranges(exec.pool, co, 8, [&](std::size_t o0, std::size_t o1) {
    __m256 v[kXi], t[kAlpha][5];
    alignas(32) float out[25][8];
    for (std::size_t o = o0; o < o1; ++o) {
      for (std::size_t c = 0; c < ci; c += 8) {
        for (std::size_t xi = 0; xi < kXi; ++xi)
          v[xi] = _mm256_loadu_ps(du + (xi * co + o) * ci + c);
        for (std::size_t a = 0; a < kAlpha; ++a) {
          for (std::size_t kx = 0; kx < k; ++kx) {
            __m256 sum = _mm256_setzero_ps();
            for (std::size_t b = 0; b < kAlpha; ++b) {
              sum = _mm256_fmadd_ps(v[a * kAlpha + b],
                                    _mm256_set1_ps(static_cast<float>(g_entry(k, b, kx))), sum);
            }
            t[a][kx] = sum;
          }
        }
        for (std::size_t ky = 0; ky < k; ++ky) {
          for (std::size_t kx = 0; kx < k; ++kx) {
            __m256 sum = _mm256_setzero_ps();
            for (std::size_t a = 0; a < kAlpha; ++a) {
              sum = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(g_entry(k, a, ky))), t[a][kx],
                                    sum);
            }
            _mm256_store_ps(out[ky * k + kx], sum);
          }
        }
        for (std::size_t l = 0; l < 8; ++l) {
          float* dst = dw + (o * ci + c + l) * taps;
          for (std::size_t i = 0; i < taps; ++i) dst[i] = out[i][l];
        }
      }
    }
  });
}

// Output rows of tiles [t0, t0 + count): y = At M A + bias (then ReLU), M read from the block
// products mz; positions past the output's edge are dropped.
template <std::size_t M>
void output_tiles(const float* mz, std::size_t co, std::size_t t0, std::size_t count,
                  std::size_t tiles_y, std::size_t tiles_x, std::size_t oh, std::size_t ow,
                  const float* bias, bool relu, float* y) {
  const std::size_t plane = plane_floats(co);
  const __m256 zero = _mm256_setzero_ps();
  __m256 out[M][M];
  for (std::size_t t = 0; t < count; ++t) {
    const TileAt at = tile_at(t0 + t, tiles_y, tiles_x);
    const std::size_t rows = std::min(M, oh - M * at.ty), cols = std::min(M, ow - M * at.tx);
    float* origin = y + ((at.sample * oh + M * at.ty) * ow + M * at.tx) * co;
    for (std::size_t c = 0; c < co; c += 8) {
      output_transform<M>(mz + t * co + c, plane, out);
      const __m256 b = _mm256_loadu_ps(bias + c);
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < cols; ++j) {
          __m256 r = _mm256_add_ps(out[i][j], b);
          if (relu) r = _mm256_max_ps(r, zero);
          _mm256_storeu_ps(origin + (i * ow + j) * co + c, r);
        }
      }
    }
  }
}

// z[xi][t][o] = (A dy At)[xi] for tiles [t0, t0 + count), dy masked by relu_y > 0 (when not
// null) and zero past the output's edge; db accumulates the same masked values.
template <std::size_t M>
void output_gradient_tiles(const float* dy, const float* relu_y, std::size_t co, std::size_t t0,
                           std::size_t count, std::size_t tiles_y, std::size_t tiles_x,
                           std::size_t oh, std::size_t ow, float* db, float* z) {
  const std::size_t plane = plane_floats(co);
  const __m256 zero = _mm256_setzero_ps();
  __m256 tile[M][M];
  for (std::size_t t = 0; t < count; ++t) {
    const TileAt at = tile_at(t0 + t, tiles_y, tiles_x);
    const std::size_t rows = std::min(M, oh - M * at.ty), cols = std::min(M, ow - M * at.tx);
    const std::size_t origin = ((at.sample * oh + M * at.ty) * ow + M * at.tx) * co;
    for (std::size_t c = 0; c < co; c += 8) {
      __m256 bias_sum = _mm256_loadu_ps(db + c);
      for (std::size_t i = 0; i < M; ++i) {
        for (std::size_t j = 0; j < M; ++j) {
          __m256 v = zero;
          if (i < rows && j < cols) {
            const std::size_t at_y = origin + (i * ow + j) * co + c;
            v = _mm256_loadu_ps(dy + at_y);
            if (relu_y != nullptr) {
              v = _mm256_and_ps(v, _mm256_cmp_ps(_mm256_loadu_ps(relu_y + at_y), zero, _CMP_GT_OQ));
            }
          }
          tile[i][j] = v;
          bias_sum = _mm256_add_ps(bias_sum, v);
        }
      }
      _mm256_storeu_ps(db + c, bias_sum);
      output_transform_adjoint<M>(tile, z + t * co + c, plane);
    }
  }
}

}  // namespace

void NhwcConv::forward_winograd(Exec& exec, const float* w, const float* b, float* y, std::size_t n,
                                bool relu) {
  const std::size_t k = g_.kernel, ci = g_.in_channels, co = g_.out_channels, m = m_;
  const std::size_t oh = g_.out_height, ow = g_.out_width;
  const int nv = co % 16 == 0 ? 2 : 1;
  const std::size_t width = 8 * static_cast<std::size_t>(nv);
  // U = G g Gt per (c, o), packed as [xi][panel][c][lane].
  grow(wpack_, kXi * co * ci);
  transform_weights(exec, w, k, ci, co, width, wpack_.data());
  const std::size_t per_sample = tiles_y_ * tiles_x_;
  detail::parallel_parts(exec.pool, n, 1, [&](std::size_t part, std::size_t s0, std::size_t s1) {
    Part& scratch = parts_[part];
    grow(scratch.v, kXi * plane_floats(ci) + kSlack);
    grow(scratch.mz, kXi * plane_floats(co) + kSlack);
    for (std::size_t t0 = s0 * per_sample; t0 < s1 * per_sample; t0 += kBlockTiles) {
      const std::size_t count = std::min(kBlockTiles, s1 * per_sample - t0);
      transform_inputs(xp_.data(), pad_h_, pad_w_, ci, m, tiles_y_, tiles_x_, t0, count,
                       plane_floats(ci), scratch.v.data());
      if (nv == 1) {
        transformed_gemm<1>(scratch.v.data(), ci, count, wpack_.data(), co, scratch.mz.data());
      } else {
        transformed_gemm<2>(scratch.v.data(), ci, count, wpack_.data(), co, scratch.mz.data());
      }
      if (m == 2) {
        output_tiles<2>(scratch.mz.data(), co, t0, count, tiles_y_, tiles_x_, oh, ow, b, relu, y);
      } else {
        output_tiles<4>(scratch.mz.data(), co, t0, count, tiles_y_, tiles_x_, oh, ow, b, relu, y);
      }
    }
  });
}

void NhwcConv::backward_winograd(Exec& exec, const float* w, const float* dy, const float* relu_y,
                                 float* dw, float* db, float* dx, std::size_t n) {
  (void)w;  // the transformed weights of forward() (wpack_) are still current
  const std::size_t k = g_.kernel, ci = g_.in_channels, co = g_.out_channels, m = m_;
  const std::size_t oh = g_.out_height, ow = g_.out_width, p = g_.padding;
  const int nv = co % 16 == 0 ? 2 : 1;
  const std::size_t width = 8 * static_cast<std::size_t>(nv);
  const std::size_t panels = co / width;
  const int nv_t = ci % 16 == 0 ? 2 : 1;
  const std::size_t width_t = 8 * static_cast<std::size_t>(nv_t);
  const std::size_t panels_t = ci / width_t;
  if (dx != nullptr) {
    // Ut packed as [xi][panel over c][o][lane], from U packed as [xi][panel over o][c][lane]:
    // 8x8 transposes.
    grow(wpack_t_, kXi * co * ci);
    for (std::size_t xi = 0; xi < kXi; ++xi) {
      for (std::size_t o = 0; o < co; o += 8) {
        for (std::size_t c = 0; c < ci; c += 8) {
          transpose8x8(
              wpack_.data() + ((xi * panels + o / width) * ci + c) * width + o % width, width,
              wpack_t_.data() + ((xi * panels_t + c / width_t) * co + o) * width_t + c % width_t,
              width_t);
        }
      }
    }
  }
  const std::size_t parts = detail::part_count(exec.pool, n, 1);
  const std::size_t per_sample = tiles_y_ * tiles_x_;
  const std::size_t x_plane = pad_h_ * pad_w_ * ci;
  static constexpr std::int32_t kRowOffsets[kMr] = {0, 1, 2, 3, 4, 5};
  detail::parallel_parts(exec.pool, n, 1, [&](std::size_t part, std::size_t s0, std::size_t s1) {
    Part& scratch = parts_[part];
    grow(scratch.v, kXi * plane_floats(ci) + kSlack);
    grow(scratch.mz, kXi * plane_floats(co) + kSlack);
    grow(scratch.dw, kXi * co * ci);
    grow(scratch.db, co);
    float* pdu = scratch.dw.data();  // dUt[xi][o][c]
    float* pdb = scratch.db.data();
    std::fill(pdu, pdu + kXi * co * ci, 0.0f);
    std::fill(pdb, pdb + co, 0.0f);
    if (dx != nullptr) {
      grow(scratch.dv, kXi * plane_floats(ci) + kSlack);
      std::fill(dxp_.data() + s0 * x_plane, dxp_.data() + s1 * x_plane, 0.0f);
    }
    for (std::size_t t0 = s0 * per_sample; t0 < s1 * per_sample; t0 += kBlockTiles) {
      const std::size_t count = std::min(kBlockTiles, s1 * per_sample - t0);
      // Z = A dy At per tile, dy masked by the fused ReLU; db sums the same masked values.
      if (m == 2) {
        output_gradient_tiles<2>(dy, relu_y, co, t0, count, tiles_y_, tiles_x_, oh, ow, pdb,
                                 scratch.mz.data());
      } else {
        output_gradient_tiles<4>(dy, relu_y, co, t0, count, tiles_y_, tiles_x_, oh, ow, pdb,
                                 scratch.mz.data());
      }
      transform_inputs(xp_.data(), pad_h_, pad_w_, ci, m, tiles_y_, tiles_x_, t0, count,
                       plane_floats(ci), scratch.v.data());
      // dUt[xi][o][c] += sum_t Z[xi][t][o] V[xi][t][c].
      for (std::size_t xi = 0; xi < kXi; ++xi) {
        const float* zx = scratch.mz.data() + xi * plane_floats(co);
        const float* vx = scratch.v.data() + xi * plane_floats(ci);
        for (std::size_t o = 0; o < co; o += kMr) {
          const std::size_t mr = std::min(kMr, co - o);
          for (std::size_t c = 0; c < ci; c += width_t) {
            float* out = pdu + (xi * co + o) * ci + c;
            if (nv_t == 1) {
              Tile<1> acc;
              reduce_kernel<1>(1, count, zx + o, 0, co, kRowOffsets, vx + c, 0, ci, acc);
              store_tile<1>(acc, out, ci, mr, width_t, nullptr, false, true);
            } else {
              Tile<2> acc;
              reduce_kernel<2>(1, count, zx + o, 0, co, kRowOffsets, vx + c, 0, ci, acc);
              store_tile<2>(acc, out, ci, mr, width_t, nullptr, false, true);
            }
          }
        }
      }
      if (dx == nullptr) continue;
      // dV = Z Ut, then dx += B dV Bt scattered onto the overlapping input tiles.
      if (nv_t == 1) {
        transformed_gemm<1>(scratch.mz.data(), co, count, wpack_t_.data(), ci, scratch.dv.data());
      } else {
        transformed_gemm<2>(scratch.mz.data(), co, count, wpack_t_.data(), ci, scratch.dv.data());
      }
      for (std::size_t t = 0; t < count; ++t) {
        const TileAt at = tile_at(t0 + t, tiles_y_, tiles_x_);
        float* base = dxp_.data() + ((at.sample * pad_h_ + m * at.ty) * pad_w_ + m * at.tx) * ci;
        for (std::size_t c = 0; c < ci; c += 8) {
          input_transform_adjoint(scratch.dv.data() + t * ci + c, plane_floats(ci), base + c,
                                  pad_w_ * ci, ci);
        }
      }
    }
    if (dx != nullptr) {
      const std::size_t row = g_.width * ci;
      for (std::size_t s = s0; s < s1; ++s) {
        for (std::size_t iy = 0; iy < g_.height; ++iy) {
          std::memcpy(dx + (s * g_.height + iy) * row,
                      dxp_.data() + ((s * pad_h_ + iy + p) * pad_w_ + p) * ci, row * sizeof(float));
        }
      }
    }
  });
  for (std::size_t part = 1; part < parts; ++part) {
    const float* src = parts_[part].dw.data();
    float* dst = parts_[0].dw.data();
    for (std::size_t i = 0; i < kXi * co * ci; ++i) dst[i] += src[i];
    for (std::size_t c = 0; c < co; ++c) parts_[0].db[c] += parts_[part].db[c];
  }
  // dw = Gt dU G per (o, c).
  transform_weight_gradient(exec, parts_[0].dw.data(), k, ci, co, dw);
  std::copy(parts_[0].db.data(), parts_[0].db.data() + co, db);
}

#else  // no AVX2: can_run() is false, so no NhwcConv is ever constructed

NhwcConv::NhwcConv(const ConvGeometry& g, Algorithm algorithm) : g_(g), algorithm_(algorithm) {
  throw KernelError("nhwc conv2d needs AVX2 and FMA");
}
void NhwcConv::reserve(std::size_t, std::size_t) {}
void NhwcConv::pad_input(Exec&, const float*, std::size_t) {}
void NhwcConv::forward(Exec&, const float*, const float*, const float*, float*, std::size_t, bool) {
}
void NhwcConv::backward(Exec&, const float*, const float*, const float*, float*, float*, float*,
                        std::size_t) {}
void NhwcConv::forward_direct(Exec&, const float*, const float*, float*, std::size_t, bool) {}
void NhwcConv::backward_direct(Exec&, const float*, const float*, const float*, float*, float*,
                               float*, std::size_t) {}
void NhwcConv::forward_winograd(Exec&, const float*, const float*, float*, std::size_t, bool) {}
void NhwcConv::backward_winograd(Exec&, const float*, const float*, const float*, float*, float*,
                                 float*, std::size_t) {}

#endif

}  // namespace cohort::kernels::cpu
