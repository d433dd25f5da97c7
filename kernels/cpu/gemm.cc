#include "gemm.h"

#include <algorithm>
#include <cstring>

#include "cohort/core/buffer.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define COHORT_GEMM_AVX2 1
#else
#include <Eigen/Core>
#define COHORT_GEMM_AVX2 0
#endif

namespace cohort::kernels::cpu {

#if COHORT_GEMM_AVX2
namespace {

// BLIS-style blocking (Goto & van de Geijn, 2008) with a 6x16 AVX2 micro-kernel: 12 ymm
// accumulators, 2 B loads and 6 broadcasts per 12 FMAs. It beats Eigen 3.4's GEMM on the MLP and
// conv shapes we train (docs/PERFORMANCE.md 4; cohort_kernels_bench measures it).
constexpr std::size_t kMr = 6;
constexpr std::size_t kNr = 16;
constexpr std::size_t kKc = 256;   // A micro-panel 6 KiB, B micro-panel 16 KiB: L1
constexpr std::size_t kMc = 96;    // packed A block 96 KiB: L2
constexpr std::size_t kNc = 2048;  // packed B block 2 MiB: L3

struct PackBuffers {
  FloatBuffer a;
  FloatBuffer b;
};

PackBuffers& pack_buffers() {
  thread_local PackBuffers buffers;  // per thread, grown once: no allocation per call
  return buffers;
}

// Packs rows [0, m) x cols [0, k) of A into kMr-row micro-panels, k-major, zero-padded.
void pack_a(const float* a, std::size_t rs, std::size_t cs, std::size_t m, std::size_t k,
            float* out) {
  for (std::size_t i0 = 0; i0 < m; i0 += kMr) {
    const std::size_t mr = std::min(kMr, m - i0);
    if (cs == 1) {  // rows contiguous: mr sequential streams
      for (std::size_t i = 0; i < kMr; ++i) {
        if (i < mr) {
          const float* src = a + (i0 + i) * rs;
          for (std::size_t p = 0; p < k; ++p) out[p * kMr + i] = src[p];
        } else {
          for (std::size_t p = 0; p < k; ++p) out[p * kMr + i] = 0.0f;
        }
      }
    } else {
      for (std::size_t p = 0; p < k; ++p) {
        const float* src = a + i0 * rs + p * cs;
        std::size_t i = 0;
        for (; i < mr; ++i) out[p * kMr + i] = src[i * rs];
        for (; i < kMr; ++i) out[p * kMr + i] = 0.0f;
      }
    }
    out += kMr * k;
  }
}

// dst[q * ld_dst + r] = src[r * ld_src + q] for an 8x8 block.
inline void transpose8x8(const float* src, std::size_t ld_src, float* dst, std::size_t ld_dst) {
  __m256 r0 = _mm256_loadu_ps(src + 0 * ld_src), r1 = _mm256_loadu_ps(src + 1 * ld_src);
  __m256 r2 = _mm256_loadu_ps(src + 2 * ld_src), r3 = _mm256_loadu_ps(src + 3 * ld_src);
  __m256 r4 = _mm256_loadu_ps(src + 4 * ld_src), r5 = _mm256_loadu_ps(src + 5 * ld_src);
  __m256 r6 = _mm256_loadu_ps(src + 6 * ld_src), r7 = _mm256_loadu_ps(src + 7 * ld_src);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  r0 = _mm256_shuffle_ps(t0, t2, 0x44);
  r1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  r2 = _mm256_shuffle_ps(t1, t3, 0x44);
  r3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  r4 = _mm256_shuffle_ps(t4, t6, 0x44);
  r5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  r6 = _mm256_shuffle_ps(t5, t7, 0x44);
  r7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_store_ps(dst + 0 * ld_dst, _mm256_permute2f128_ps(r0, r4, 0x20));
  _mm256_store_ps(dst + 1 * ld_dst, _mm256_permute2f128_ps(r1, r5, 0x20));
  _mm256_store_ps(dst + 2 * ld_dst, _mm256_permute2f128_ps(r2, r6, 0x20));
  _mm256_store_ps(dst + 3 * ld_dst, _mm256_permute2f128_ps(r3, r7, 0x20));
  _mm256_store_ps(dst + 4 * ld_dst, _mm256_permute2f128_ps(r0, r4, 0x31));
  _mm256_store_ps(dst + 5 * ld_dst, _mm256_permute2f128_ps(r1, r5, 0x31));
  _mm256_store_ps(dst + 6 * ld_dst, _mm256_permute2f128_ps(r2, r6, 0x31));
  _mm256_store_ps(dst + 7 * ld_dst, _mm256_permute2f128_ps(r3, r7, 0x31));
}

// Packs rows [0, k) x cols [0, n) of B into kNr-column micro-panels, k-major, zero-padded.
void pack_b(const float* b, std::size_t rs, std::size_t cs, std::size_t k, std::size_t n,
            float* out) {
  for (std::size_t j0 = 0; j0 < n; j0 += kNr) {
    const std::size_t nr = std::min(kNr, n - j0);
    if (cs == 1) {  // rows contiguous: copy 16 floats per k
      for (std::size_t p = 0; p < k; ++p) {
        const float* src = b + p * rs + j0;
        if (nr == kNr) {
          std::memcpy(out + p * kNr, src, kNr * sizeof(float));
        } else {
          std::size_t j = 0;
          for (; j < nr; ++j) out[p * kNr + j] = src[j];
          for (; j < kNr; ++j) out[p * kNr + j] = 0.0f;
        }
      }
    } else if (rs == 1 && nr == kNr) {  // columns contiguous: 8x8 register transposes
      for (std::size_t half = 0; half < kNr; half += 8) {
        const float* src = b + (j0 + half) * cs;
        std::size_t p = 0;
        for (; p + 8 <= k; p += 8) transpose8x8(src + p, cs, out + p * kNr + half, kNr);
        for (; p < k; ++p) {
          for (std::size_t j = 0; j < 8; ++j) out[p * kNr + half + j] = src[j * cs + p];
        }
      }
    } else {  // columns contiguous, partial panel: nr sequential streams
      for (std::size_t j = 0; j < kNr; ++j) {
        if (j < nr) {
          const float* src = b + (j0 + j) * cs;
          for (std::size_t p = 0; p < k; ++p) out[p * kNr + j] = src[p * rs];
        } else {
          for (std::size_t p = 0; p < k; ++p) out[p * kNr + j] = 0.0f;
        }
      }
    }
    out += kNr * k;
  }
}

// C[0..mr, 0..nr) (+)= packed A panel (6 x k) * packed B panel (k x 16).
void micro_kernel(std::size_t k, const float* __restrict a, const float* __restrict b, float* c,
                  std::size_t ldc, std::size_t mr, std::size_t nr, bool accumulate) {
  __m256 acc[kMr][2];
  for (auto& row : acc) row[0] = row[1] = _mm256_setzero_ps();
  for (std::size_t p = 0; p < k; ++p) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (std::size_t i = 0; i < kMr; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
    a += kMr;
    b += kNr;
  }
  if (mr == kMr && nr == kNr) {
    for (std::size_t i = 0; i < kMr; ++i) {
      float* row = c + i * ldc;
      if (accumulate) {
        _mm256_storeu_ps(row, _mm256_add_ps(_mm256_loadu_ps(row), acc[i][0]));
        _mm256_storeu_ps(row + 8, _mm256_add_ps(_mm256_loadu_ps(row + 8), acc[i][1]));
      } else {
        _mm256_storeu_ps(row, acc[i][0]);
        _mm256_storeu_ps(row + 8, acc[i][1]);
      }
    }
    return;
  }
  alignas(32) float tile[kMr * kNr];
  for (std::size_t i = 0; i < kMr; ++i) {
    _mm256_store_ps(tile + i * kNr, acc[i][0]);
    _mm256_store_ps(tile + i * kNr + 8, acc[i][1]);
  }
  for (std::size_t i = 0; i < mr; ++i) {
    float* row = c + i * ldc;
    for (std::size_t j = 0; j < nr; ++j) row[j] = (accumulate ? row[j] : 0.0f) + tile[i * kNr + j];
  }
}

}  // namespace

void gemm(std::size_t m, std::size_t n, std::size_t k, GemmOperand a, GemmOperand b, float* c,
          std::size_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      for (std::size_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    }
    return;
  }
  // Even k blocks: 784 = 4 x 196 rather than 3 x 256 + 16 (a thin last block wastes the C
  // loads and stores of every tile).
  const std::size_t k_blocks = (k + kKc - 1) / kKc;
  const std::size_t kc_step = (k + k_blocks - 1) / k_blocks;
  const std::size_t n_blocks = (n + kNc - 1) / kNc;
  const std::size_t nc_step = ((n + n_blocks - 1) / n_blocks + kNr - 1) / kNr * kNr;
  PackBuffers& buffers = pack_buffers();
  const std::size_t b_floats = kc_step * std::min(nc_step, (n + kNr - 1) / kNr * kNr);
  const std::size_t a_floats = kc_step * (kMc + kMr);
  if (buffers.b.size() < b_floats) buffers.b = FloatBuffer(b_floats);
  if (buffers.a.size() < a_floats) buffers.a = FloatBuffer(a_floats);
  float* packed_a = buffers.a.data();
  float* packed_b = buffers.b.data();
  for (std::size_t j0 = 0; j0 < n; j0 += nc_step) {
    const std::size_t nc = std::min(nc_step, n - j0);
    for (std::size_t p0 = 0; p0 < k; p0 += kc_step) {
      const std::size_t kc = std::min(kc_step, k - p0);
      const bool acc = accumulate || p0 > 0;
      pack_b(b.data + p0 * b.row_stride + j0 * b.col_stride, b.row_stride, b.col_stride, kc, nc,
             packed_b);
      for (std::size_t i0 = 0; i0 < m; i0 += kMc) {
        const std::size_t mc = std::min(kMc, m - i0);
        pack_a(a.data + i0 * a.row_stride + p0 * a.col_stride, a.row_stride, a.col_stride, mc, kc,
               packed_a);
        for (std::size_t jr = 0; jr < nc; jr += kNr) {
          for (std::size_t ir = 0; ir < mc; ir += kMr) {
            micro_kernel(kc, packed_a + ir * kc, packed_b + jr * kc, c + (i0 + ir) * ldc + j0 + jr,
                         ldc, std::min(kMr, mc - ir), std::min(kNr, nc - jr), acc);
          }
        }
      }
    }
  }
}

#else  // portable fallback: Eigen's GEMM on strided maps

void gemm(std::size_t m, std::size_t n, std::size_t k, GemmOperand a, GemmOperand b, float* c,
          std::size_t ldc, bool accumulate) {
  using Strided =
      Eigen::Map<const Eigen::MatrixXf, 0, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic> >;
  using Out = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                         Eigen::OuterStride<> >;
  const auto ix = [](std::size_t v) { return static_cast<Eigen::Index>(v); };
  const Strided am(a.data, ix(m), ix(k), {ix(a.col_stride), ix(a.row_stride)});
  const Strided bm(b.data, ix(k), ix(n), {ix(b.col_stride), ix(b.row_stride)});
  Out cm(c, ix(m), ix(n), Eigen::OuterStride<>(ix(ldc)));
  if (accumulate) {
    cm.noalias() += am * bm;
  } else {
    cm.noalias() = am * bm;
  }
}

#endif

}  // namespace cohort::kernels::cpu
