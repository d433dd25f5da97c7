// Private to kernels/cpu: what the NHWC convolution's two algorithms share (nhwc_conv.cc: set-up
// and the direct implicit GEMM; nhwc_winograd.cc: Winograd F(2, 5) / F(4, 3)): the per-part
// scratch, the Winograd transforms on 8-channel vectors, tile indexing and buffer helpers.
#pragma once

#include <algorithm>
#include <cstring>

#include "../parallel.h"
#include "cohort/core/error.h"
#include "nhwc_conv.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "microkernels.h"
#define COHORT_NHWC_AVX2 1
#else
#define COHORT_NHWC_AVX2 0
#endif

namespace cohort::kernels::cpu {

// One thread's scratch.
struct NhwcPart {
  FloatBuffer v;   // Winograd: transformed input block [36][block][Ci]
  FloatBuffer mz;  // Winograd: products (forward) or transformed dy (backward) [36][block][Co]
  FloatBuffer dv;  // Winograd: transformed input gradient block [36][block][Ci]
  FloatBuffer dw;  // partial weight gradient (direct: [taps][Co]; Winograd: [36][Co][Ci])
  FloatBuffer db;  // partial bias gradient
};

struct NhwcScratch {
  MemoryTracker* tracker = nullptr;
  std::vector<NhwcPart> parts;
  FloatBuffer dxp;      // Winograd: padded dx accumulator (zeroed by each backward before use)
  FloatBuffer wpack_t;  // packed (flipped / transposed) weights for the dx GEMM
};

#if COHORT_NHWC_AVX2
namespace nhwc {

using micro::kMr;
using micro::reduce_kernel;
using micro::rows_kernel;
using micro::store_tile;
using micro::Tile;
using micro::transpose8x8;

inline constexpr std::size_t kAlpha = 6;  // Winograd tile side
inline constexpr std::size_t kXi = kAlpha * kAlpha;
// Tiles per Winograd block: its transformed input and products (36 x 96 x (Ci + Co) floats,
// 1.3 MiB for 32 -> 64 channels) sit in L2/L3, and the weight-gradient reduction over a block
// is long enough (96 steps) to amortise accumulating its tile into memory.
inline constexpr std::size_t kBlockTiles = 96;
// The 36 planes of a block buffer start 64 bytes apart modulo 4 KiB: at a whole multiple of
// 4 KiB (96 tiles x 32 or 64 channels) the 36 streams of a transform all map to one L1 set.
inline constexpr std::size_t kPlanePad = 16;
inline std::size_t plane_floats(std::size_t channels) { return kBlockTiles * channels + kPlanePad; }
inline constexpr std::size_t kSlack =
    16;  // floats past a buffer's end that full-width loads may touch

// Winograd F(m, r) with alpha = 6 and points 0, +-1, +-2, infinity (Lavin & Gray, 2016): the
// same input transform Bt serves F(2, 5) and F(4, 3). Generated exactly with rational
// arithmetic (Toom-Cook); Bt, At and their transposes are written out in bt6/b6/at6/a6.
inline constexpr double kG5[6][5] = {{1.0 / 4, 0, 0, 0, 0},
                                     {-1.0 / 6, -1.0 / 6, -1.0 / 6, -1.0 / 6, -1.0 / 6},
                                     {-1.0 / 6, 1.0 / 6, -1.0 / 6, 1.0 / 6, -1.0 / 6},
                                     {1.0 / 24, 1.0 / 12, 1.0 / 6, 1.0 / 3, 2.0 / 3},
                                     {1.0 / 24, -1.0 / 12, 1.0 / 6, -1.0 / 3, 2.0 / 3},
                                     {0, 0, 0, 0, 1}};
inline constexpr double kG3[6][3] = {{1.0 / 4, 0, 0},
                                     {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                     {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                     {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                     {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                     {0, 0, 1}};

inline double g_entry(std::size_t kernel, std::size_t a, std::size_t k) {
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

inline std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

// Keeps the buffer's MemoryTracker.
inline void grow(FloatBuffer& buffer, std::size_t count) {
  if (buffer.size() >= count) return;
  MemoryTracker* tracker = buffer.tracker();
  buffer = FloatBuffer();
  buffer = FloatBuffer(count, tracker);
}

// Panel width for c GEMM columns: 16 (two vectors) unless 8 covers them.
inline int vectors_for(std::size_t c) { return c <= 8 ? 1 : 2; }

}  // namespace nhwc
#endif

}  // namespace cohort::kernels::cpu
