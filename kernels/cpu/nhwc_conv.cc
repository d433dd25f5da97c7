#include "nhwc_conv_internal.h"

namespace cohort::kernels::cpu {

std::shared_ptr<NhwcScratch> make_nhwc_scratch(MemoryTracker* tracker) {
  auto scratch = std::make_shared<NhwcScratch>();
  scratch->tracker = tracker;
  scratch->dxp = FloatBuffer(0, tracker);
  scratch->wpack_t = FloatBuffer(0, tracker);
  return scratch;
}

void NhwcConv::share_scratch(std::shared_ptr<NhwcScratch> scratch) {
  scratch_ = std::move(scratch);
}

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
using namespace nhwc;  // NOLINT(google-build-using-namespace): this file's own helpers

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

void NhwcConv::set_tracker(MemoryTracker* tracker) {
  tracker_ = tracker;
  for (FloatBuffer* b : {&wpack_, &bias_}) {
    if (b->empty()) *b = FloatBuffer(0, tracker);
  }
}

void NhwcConv::reserve(std::size_t n, std::size_t parts) {
  const std::size_t ci = g_.in_channels, co = g_.out_channels;
  if (n > capacity_) {
    // Fresh (zeroed) buffers: only interiors are ever written, so the borders stay zero. The old
    // ones go first, so that growing never holds both.
    xp_ = FloatBuffer();
    dyp_ = FloatBuffer();
    xp_ = FloatBuffer(n * pad_h_ * pad_w_ * ci + kSlack, tracker_);
    if (algorithm_ == Algorithm::kDirect) {
      const std::size_t q = g_.kernel - 1 - g_.padding;
      dyp_ =
          FloatBuffer(n * (g_.out_height + 2 * q) * (g_.out_width + 2 * q) * co + kSlack, tracker_);
    }
    capacity_ = n;
  }
  if (scratch_ == nullptr) scratch_ = make_nhwc_scratch(tracker_);
  if (algorithm_ == Algorithm::kWinograd) grow(scratch_->dxp, n * pad_h_ * pad_w_ * ci + kSlack);
  while (scratch_->parts.size() < parts) {
    NhwcPart& p = scratch_->parts.emplace_back();
    for (FloatBuffer* b : {&p.v, &p.mz, &p.dv, &p.dw, &p.db}) {
      *b = FloatBuffer(0, scratch_->tracker);
    }
  }
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
                        float* db, float* dx, std::size_t n, bool accumulate) {
  COHORT_CHECK(n <= capacity_) << "nhwc conv2d backward before forward";
  reserve(n, detail::part_count(exec.pool, n, 1));
  if (algorithm_ == Algorithm::kDirect) {
    backward_direct(exec, w, dy, relu_y, dw, db, dx, n, accumulate);
  } else {
    backward_winograd(exec, w, dy, relu_y, dw, db, dx, n, accumulate);
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
                               float* dw, float* db, float* dx, std::size_t n, bool accumulate) {
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
    grow(scratch_->wpack_t, ((ci + width_t - 1) / width_t) * taps_t * width_t);
    pack_panels(scratch_->wpack_t.data(), taps_t, ci, width_t, [&](std::size_t t, std::size_t c) {
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
    NhwcPart& scratch = scratch_->parts[part];
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
                       offsets_t_.data(), taps_t, scratch_->wpack_t.data(), ci, nullptr, false, dx);
      } else {
        direct_gemm<2>(s0, s1, dyp_.data(), dy_plane, positions_t_.data(), g_.height * g_.width,
                       offsets_t_.data(), taps_t, scratch_->wpack_t.data(), ci, nullptr, false, dx);
      }
    }
  });
  // Sum the parts; dW^T[(ky, kx, c)][o] -> dw[o][c][ky][kx].
  for (std::size_t part = 1; part < parts; ++part) {
    const float* src = scratch_->parts[part].dw.data();
    float* dst = scratch_->parts[0].dw.data();
    for (std::size_t i = 0; i < rows_w * cols_w; ++i) dst[i] += src[i];
    for (std::size_t c = 0; c < co; ++c) scratch_->parts[0].db[c] += scratch_->parts[part].db[c];
  }
  const float* sum = scratch_->parts[0].dw.data();
  for (std::size_t o = 0; o < co; ++o) {
    for (std::size_t c = 0; c < ci; ++c) {
      for (std::size_t kk = 0; kk < k * k; ++kk) {
        const float v = sum[(kk * ci + c) * cols_w + o];
        float& d = dw[(o * ci + c) * k * k + kk];
        d = accumulate ? d + v : v;
      }
    }
  }
  for (std::size_t c = 0; c < co; ++c)
    db[c] = accumulate ? db[c] + scratch_->parts[0].db[c] : scratch_->parts[0].db[c];
}

#else  // no AVX2: can_run() is false, so no NhwcConv is ever constructed

NhwcConv::NhwcConv(const ConvGeometry& g, Algorithm algorithm) : g_(g), algorithm_(algorithm) {
  throw KernelError("nhwc conv2d needs AVX2 and FMA");
}
void NhwcConv::set_tracker(MemoryTracker*) {}
void NhwcConv::reserve(std::size_t, std::size_t) {}
void NhwcConv::pad_input(Exec&, const float*, std::size_t) {}
void NhwcConv::forward(Exec&, const float*, const float*, const float*, float*, std::size_t, bool) {
}
void NhwcConv::backward(Exec&, const float*, const float*, const float*, float*, float*, float*,
                        std::size_t, bool) {}
void NhwcConv::forward_direct(Exec&, const float*, const float*, float*, std::size_t, bool) {}
void NhwcConv::backward_direct(Exec&, const float*, const float*, const float*, float*, float*,
                               float*, std::size_t, bool) {}
void NhwcConv::forward_winograd(Exec&, const float*, const float*, float*, std::size_t, bool) {}
void NhwcConv::backward_winograd(Exec&, const float*, const float*, const float*, float*, float*,
                                 float*, std::size_t, bool) {}

#endif

}  // namespace cohort::kernels::cpu