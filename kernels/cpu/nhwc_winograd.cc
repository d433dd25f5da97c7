// NhwcConv's Winograd algorithm (F(2, 5) and F(4, 3) with alpha = 6): forward and backward over
// blocks of tiles; the set-up and the direct algorithm are in nhwc_conv.cc.
#include "nhwc_conv_internal.h"

namespace cohort::kernels::cpu {

#if COHORT_NHWC_AVX2
using namespace nhwc;  // NOLINT(google-build-using-namespace): this file's own helpers

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

// dw[o][c] = Gt dU[.][o][c] G (accumulate: +=) for dU laid out [xi][o][c], 8 input channels per
// vector. REQUIRES ci % 8 == 0.
void transform_weight_gradient(Exec& exec, const float* du, std::size_t k, std::size_t ci,
                               std::size_t co, float* dw, bool accumulate) {
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
          if (accumulate) {
            for (std::size_t i = 0; i < taps; ++i) dst[i] += out[i][l];
          } else {
            for (std::size_t i = 0; i < taps; ++i) dst[i] = out[i][l];
          }
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
    NhwcPart& scratch = scratch_->parts[part];
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
                                 float* dw, float* db, float* dx, std::size_t n, bool accumulate) {
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
    grow(scratch_->wpack_t, kXi * co * ci);
    for (std::size_t xi = 0; xi < kXi; ++xi) {
      for (std::size_t o = 0; o < co; o += 8) {
        for (std::size_t c = 0; c < ci; c += 8) {
          transpose8x8(wpack_.data() + ((xi * panels + o / width) * ci + c) * width + o % width,
                       width,
                       scratch_->wpack_t.data() +
                           ((xi * panels_t + c / width_t) * co + o) * width_t + c % width_t,
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
    NhwcPart& scratch = scratch_->parts[part];
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
      std::fill(scratch_->dxp.data() + s0 * x_plane, scratch_->dxp.data() + s1 * x_plane, 0.0f);
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
        transformed_gemm<1>(scratch.mz.data(), co, count, scratch_->wpack_t.data(), ci,
                            scratch.dv.data());
      } else {
        transformed_gemm<2>(scratch.mz.data(), co, count, scratch_->wpack_t.data(), ci,
                            scratch.dv.data());
      }
      for (std::size_t t = 0; t < count; ++t) {
        const TileAt at = tile_at(t0 + t, tiles_y_, tiles_x_);
        float* base =
            scratch_->dxp.data() + ((at.sample * pad_h_ + m * at.ty) * pad_w_ + m * at.tx) * ci;
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
                      scratch_->dxp.data() + ((s * pad_h_ + iy + p) * pad_w_ + p) * ci,
                      row * sizeof(float));
        }
      }
    }
  });
  for (std::size_t part = 1; part < parts; ++part) {
    const float* src = scratch_->parts[part].dw.data();
    float* dst = scratch_->parts[0].dw.data();
    for (std::size_t i = 0; i < kXi * co * ci; ++i) dst[i] += src[i];
    for (std::size_t c = 0; c < co; ++c) scratch_->parts[0].db[c] += scratch_->parts[part].db[c];
  }
  // dw = Gt dU G per (o, c).
  transform_weight_gradient(exec, scratch_->parts[0].dw.data(), k, ci, co, dw, accumulate);
  for (std::size_t c = 0; c < co; ++c)
    db[c] = accumulate ? db[c] + scratch_->parts[0].db[c] : scratch_->parts[0].db[c];
}

#endif  // COHORT_NHWC_AVX2

}  // namespace cohort::kernels::cpu
