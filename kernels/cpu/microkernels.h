// AVX2 + FMA micro-kernels shared by the CPU layers: 6 x (8 NV) register tiles whose rows
// broadcast from arbitrary row pointers, so operands are read in place (implicit GEMM)
// rather than packed. Header-only; include only where __AVX2__ and __FMA__ are defined.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace cohort::kernels::cpu::micro {

constexpr std::size_t kMr = 6;  // rows of a register tile (the broadcast operand)

inline __m256i lane_mask(std::size_t valid) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<std::size_t>(valid, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Stores lanes [0, n) of v, n < 8. vmaskmovps stores are microcoded on AMD Zen (one per ~12
// cycles), far slower than these plain 128/64/32-bit stores.
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

template <int NV>
using Tile = __m256[kMr][NV];

// out[i][v] = sum_{k < kc} a[i][off(k)] * b[k * b_row + 8 v + lane] with off(k) = off[k]
// (kTable) or k: the implicit-GEMM micro-kernel. a holds 6 row pointers (any addresses); b is
// a packed panel (b_row = 8 NV) or a matrix read in place. 6 broadcasts and NV loads feed
// 6 NV FMAs per k.
template <int NV, bool kTable>
inline void rows_kernel(std::size_t kc, const float* const* a, const std::int32_t* off,
                        const float* __restrict b, std::size_t b_row, Tile<NV>& out) {
  // Local accumulators (copied out once): an array reached through a reference would be kept
  // in memory across the loop.
  Tile<NV> acc;
#pragma GCC unroll 6
  for (std::size_t i = 0; i < kMr; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();
  }
  const float* a0 = a[0];
  const float* a1 = a[1];
  const float* a2 = a[2];
  const float* a3 = a[3];
  const float* a4 = a[4];
  const float* a5 = a[5];
  std::size_t k = 0;
  if constexpr (NV == 1) {
    // 6 accumulators cannot hide the FMA latency (4 cycles, 2 per cycle): a second set takes
    // the odd k, summed at the end.
    __m256 odd[kMr];
#pragma GCC unroll 6
    for (std::size_t i = 0; i < kMr; ++i) odd[i] = _mm256_setzero_ps();
    for (; k + 2 <= kc; k += 2) {
      const std::size_t o = kTable ? static_cast<std::size_t>(off[k]) : k;
      const std::size_t p = kTable ? static_cast<std::size_t>(off[k + 1]) : k + 1;
      const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + b_row);
      acc[0][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + o), b0, acc[0][0]);
      odd[0] = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + p), b1, odd[0]);
      acc[1][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(a1 + o), b0, acc[1][0]);
      odd[1] = _mm256_fmadd_ps(_mm256_broadcast_ss(a1 + p), b1, odd[1]);
      acc[2][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(a2 + o), b0, acc[2][0]);
      odd[2] = _mm256_fmadd_ps(_mm256_broadcast_ss(a2 + p), b1, odd[2]);
      acc[3][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(a3 + o), b0, acc[3][0]);
      odd[3] = _mm256_fmadd_ps(_mm256_broadcast_ss(a3 + p), b1, odd[3]);
      acc[4][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(a4 + o), b0, acc[4][0]);
      odd[4] = _mm256_fmadd_ps(_mm256_broadcast_ss(a4 + p), b1, odd[4]);
      acc[5][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(a5 + o), b0, acc[5][0]);
      odd[5] = _mm256_fmadd_ps(_mm256_broadcast_ss(a5 + p), b1, odd[5]);
      b += 2 * b_row;
    }
#pragma GCC unroll 6
    for (std::size_t i = 0; i < kMr; ++i) acc[i][0] = _mm256_add_ps(acc[i][0], odd[i]);
  }
  for (; k < kc; ++k) {
    const std::size_t o = kTable ? static_cast<std::size_t>(off[k]) : k;
    __m256 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(b + 8 * v);
    __m256 x = _mm256_broadcast_ss(a0 + o);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[0][v] = _mm256_fmadd_ps(x, bv[v], acc[0][v]);
    x = _mm256_broadcast_ss(a1 + o);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[1][v] = _mm256_fmadd_ps(x, bv[v], acc[1][v]);
    x = _mm256_broadcast_ss(a2 + o);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[2][v] = _mm256_fmadd_ps(x, bv[v], acc[2][v]);
    x = _mm256_broadcast_ss(a3 + o);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[3][v] = _mm256_fmadd_ps(x, bv[v], acc[3][v]);
    x = _mm256_broadcast_ss(a4 + o);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[4][v] = _mm256_fmadd_ps(x, bv[v], acc[4][v]);
    x = _mm256_broadcast_ss(a5 + o);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[5][v] = _mm256_fmadd_ps(x, bv[v], acc[5][v]);
    b += b_row;
  }
#pragma GCC unroll 6
  for (std::size_t i = 0; i < kMr; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) out[i][v] = acc[i][v];
  }
}

// acc[i][v] = sum_{r < rows, t < cols} a_rt[aoff[i]] * b_rt[8 v + lane], where
// a_rt = a + r a_row + t a_col and b_rt = b + r b_row + t b_col: a GEMM whose reduction runs
// over (strided) positions, reading both operands in place. The weight-gradient micro-kernel.
template <int NV>
inline void reduce_kernel(std::size_t rows, std::size_t cols, const float* a, std::size_t a_row,
                          std::size_t a_col, const std::int32_t* aoff, const float* b,
                          std::size_t b_row, std::size_t b_col, Tile<NV>& out) {
  Tile<NV> acc;
#pragma GCC unroll 6
  for (std::size_t i = 0; i < kMr; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();
  }
  const std::size_t o0 = static_cast<std::size_t>(aoff[0]), o1 = static_cast<std::size_t>(aoff[1]),
                    o2 = static_cast<std::size_t>(aoff[2]), o3 = static_cast<std::size_t>(aoff[3]),
                    o4 = static_cast<std::size_t>(aoff[4]), o5 = static_cast<std::size_t>(aoff[5]);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* ap = a + r * a_row;
    const float* bp = b + r * b_row;
    std::size_t t = 0;
    if constexpr (NV == 1) {  // two accumulator sets, as in rows_kernel
      __m256 odd[kMr];
#pragma GCC unroll 6
      for (std::size_t i = 0; i < kMr; ++i) odd[i] = _mm256_setzero_ps();
      for (; t + 2 <= cols; t += 2) {
        const float* aq = ap + a_col;
        const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + b_col);
        acc[0][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + o0), b0, acc[0][0]);
        odd[0] = _mm256_fmadd_ps(_mm256_broadcast_ss(aq + o0), b1, odd[0]);
        acc[1][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + o1), b0, acc[1][0]);
        odd[1] = _mm256_fmadd_ps(_mm256_broadcast_ss(aq + o1), b1, odd[1]);
        acc[2][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + o2), b0, acc[2][0]);
        odd[2] = _mm256_fmadd_ps(_mm256_broadcast_ss(aq + o2), b1, odd[2]);
        acc[3][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + o3), b0, acc[3][0]);
        odd[3] = _mm256_fmadd_ps(_mm256_broadcast_ss(aq + o3), b1, odd[3]);
        acc[4][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + o4), b0, acc[4][0]);
        odd[4] = _mm256_fmadd_ps(_mm256_broadcast_ss(aq + o4), b1, odd[4]);
        acc[5][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(ap + o5), b0, acc[5][0]);
        odd[5] = _mm256_fmadd_ps(_mm256_broadcast_ss(aq + o5), b1, odd[5]);
        ap += 2 * a_col;
        bp += 2 * b_col;
      }
#pragma GCC unroll 6
      for (std::size_t i = 0; i < kMr; ++i) acc[i][0] = _mm256_add_ps(acc[i][0], odd[i]);
    }
    for (; t < cols; ++t) {
      __m256 bv[NV];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(bp + 8 * v);
      __m256 x = _mm256_broadcast_ss(ap + o0);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[0][v] = _mm256_fmadd_ps(x, bv[v], acc[0][v]);
      x = _mm256_broadcast_ss(ap + o1);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[1][v] = _mm256_fmadd_ps(x, bv[v], acc[1][v]);
      x = _mm256_broadcast_ss(ap + o2);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[2][v] = _mm256_fmadd_ps(x, bv[v], acc[2][v]);
      x = _mm256_broadcast_ss(ap + o3);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[3][v] = _mm256_fmadd_ps(x, bv[v], acc[3][v]);
      x = _mm256_broadcast_ss(ap + o4);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[4][v] = _mm256_fmadd_ps(x, bv[v], acc[4][v]);
      x = _mm256_broadcast_ss(ap + o5);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[5][v] = _mm256_fmadd_ps(x, bv[v], acc[5][v]);
      ap += a_col;
      bp += b_col;
    }
  }
#pragma GCC unroll 6
  for (std::size_t i = 0; i < kMr; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) out[i][v] = acc[i][v];
  }
}

// Writes rows [0, mr) and columns [0, nr) of acc to c (row stride ldc): + bias (8 NV floats,
// may be null), then max(0, .) when relu; added to c's contents when accumulate.
template <int NV>
inline void store_tile(const Tile<NV>& acc, float* c, std::size_t ldc, std::size_t mr,
                       std::size_t nr, const float* bias, bool relu, bool accumulate) {
  __m256 bv[NV];
  __m256i mask[NV];
  const bool full = nr == 8 * NV;
  for (int v = 0; v < NV; ++v) {
    bv[v] = bias != nullptr ? _mm256_loadu_ps(bias + 8 * v) : _mm256_setzero_ps();
    mask[v] = lane_mask(nr > 8 * static_cast<std::size_t>(v) ? nr - 8 * v : 0);
  }
  const __m256 zero = _mm256_setzero_ps();
  for (std::size_t i = 0; i < mr; ++i) {
    float* row = c + i * ldc;
    for (int v = 0; v < NV; ++v) {
      __m256 r = acc[i][v];
      if (bias != nullptr) r = _mm256_add_ps(r, bv[v]);
      if (relu) r = _mm256_max_ps(r, zero);
      if (full) {
        if (accumulate) r = _mm256_add_ps(_mm256_loadu_ps(row + 8 * v), r);
        _mm256_storeu_ps(row + 8 * v, r);
      } else {
        if (accumulate) r = _mm256_add_ps(_mm256_maskload_ps(row + 8 * v, mask[v]), r);
        const std::size_t lanes = nr > 8 * static_cast<std::size_t>(v) ? nr - 8 * v : 0;
        if (lanes >= 8) {
          _mm256_storeu_ps(row + 8 * v, r);
        } else {
          store_partial(row + 8 * v, r, lanes);
        }
      }
    }
  }
}

// dst[j * ld_dst + i] = src[i * ld_src + j] for an 8x8 block.
inline void transpose8x8(const float* src, std::size_t ld_src, float* dst, std::size_t ld_dst) {
  __m256 r[8];
  for (std::size_t i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld_src);
  __m256 t[8];
  for (std::size_t i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (std::size_t i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (std::size_t i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ld_dst, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ld_dst, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// dst[j * ld_dst + i] = src[i * ld_src + j] for i < rows, j < cols: 8x8 register transposes,
// scalar edges.
inline void transpose(const float* src, std::size_t rows, std::size_t cols, std::size_t ld_src,
                      float* dst, std::size_t ld_dst) {
  const std::size_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (std::size_t i = 0; i < rows8; i += 8) {
    for (std::size_t j = 0; j < cols8; j += 8) {
      transpose8x8(src + i * ld_src + j, ld_src, dst + j * ld_dst + i, ld_dst);
    }
  }
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = i < rows8 ? cols8 : 0; j < cols; ++j)
      dst[j * ld_dst + i] = src[i * ld_src + j];
  }
}

}  // namespace cohort::kernels::cpu::micro
