// Batch normalisation, average pooling and the residual sum (declared in layers.h).
#include <cmath>
#include <cstring>
#include <vector>

#include "cohort/core/error.h"
#include "layers.h"

namespace cohort::kernels::cpu {
namespace {

// Calls f(element index, channel) for every element of n samples of `channels` x `plane`, in
// memory order: [n][channels][plane] (NCHW) or [n][plane][channels] (NHWC).
template <class F>
void for_each_element(const BatchNormGeometry& g, std::size_t n, F&& f) {
  if (g.nhwc) {
    const std::size_t rows = n * g.plane;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t base = r * g.channels;
      for (std::size_t c = 0; c < g.channels; ++c) f(base + c, c);
    }
    return;
  }
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t c = 0; c < g.channels; ++c) {
      const std::size_t base = (s * g.channels + c) * g.plane;
      for (std::size_t p = 0; p < g.plane; ++p) f(base + p, c);
    }
  }
}

}  // namespace

void batchnorm_forward_train(const float* x, float* y, const float* weight, const float* bias,
                             float* mean_invstd, float* running, std::size_t n,
                             const BatchNormGeometry& g) {
  const std::size_t c = g.channels;
  const std::size_t m = n * g.plane;
  std::vector<double> sum(c, 0.0), squares(c, 0.0);
  for_each_element(g, n, [&](std::size_t i, std::size_t ch) { sum[ch] += x[i]; });
  for (std::size_t ch = 0; ch < c; ++ch) sum[ch] /= static_cast<double>(m);  // now the mean
  for_each_element(g, n, [&](std::size_t i, std::size_t ch) {
    const double d = x[i] - sum[ch];
    squares[ch] += d * d;
  });
  float* mean = mean_invstd;
  float* invstd = mean_invstd + c;
  for (std::size_t ch = 0; ch < c; ++ch) {
    const double var = squares[ch] / static_cast<double>(m);
    mean[ch] = static_cast<float>(sum[ch]);
    invstd[ch] = static_cast<float>(1.0 / std::sqrt(var + kBatchNormEpsilon));
    if (running != nullptr) {
      const double unbiased = m > 1 ? squares[ch] / static_cast<double>(m - 1) : var;
      running[ch] = (1.0f - kBatchNormMomentum) * running[ch] + kBatchNormMomentum * mean[ch];
      running[c + ch] = (1.0f - kBatchNormMomentum) * running[c + ch] +
                        kBatchNormMomentum * static_cast<float>(unbiased);
    }
  }
  for_each_element(g, n, [&](std::size_t i, std::size_t ch) {
    y[i] = (x[i] - mean[ch]) * invstd[ch] * weight[ch] + bias[ch];
  });
}

void batchnorm_forward_eval(const float* x, float* y, const float* weight, const float* bias,
                            const float* running, std::size_t n, const BatchNormGeometry& g) {
  const std::size_t c = g.channels;
  std::vector<float> scale(c), shift(c);
  for (std::size_t ch = 0; ch < c; ++ch) {
    scale[ch] = weight[ch] / std::sqrt(running[c + ch] + kBatchNormEpsilon);
    shift[ch] = bias[ch] - running[ch] * scale[ch];
  }
  for_each_element(g, n,
                   [&](std::size_t i, std::size_t ch) { y[i] = x[i] * scale[ch] + shift[ch]; });
}

void batchnorm_backward(const float* x, const float* dy, const float* weight,
                        const float* mean_invstd, float* dweight, float* dbias, float* dx,
                        std::size_t n, const BatchNormGeometry& g, bool accumulate) {
  const std::size_t c = g.channels;
  const float* mean = mean_invstd;
  const float* invstd = mean_invstd + c;
  std::vector<double> sum_dy(c, 0.0), sum_dy_xhat(c, 0.0);
  for_each_element(g, n, [&](std::size_t i, std::size_t ch) {
    sum_dy[ch] += dy[i];
    sum_dy_xhat[ch] += static_cast<double>(dy[i]) * ((x[i] - mean[ch]) * invstd[ch]);
  });
  for (std::size_t ch = 0; ch < c; ++ch) {
    const auto dw = static_cast<float>(sum_dy_xhat[ch]);
    const auto db = static_cast<float>(sum_dy[ch]);
    dweight[ch] = accumulate ? dweight[ch] + dw : dw;
    dbias[ch] = accumulate ? dbias[ch] + db : db;
  }
  if (dx == nullptr) return;
  const auto m = static_cast<double>(n * g.plane);
  std::vector<float> a(c), b(c), k(c);  // dx = k * (dy - a - xhat * b)
  for (std::size_t ch = 0; ch < c; ++ch) {
    a[ch] = static_cast<float>(sum_dy[ch] / m);
    b[ch] = static_cast<float>(sum_dy_xhat[ch] / m);
    k[ch] = weight[ch] * invstd[ch];
  }
  for_each_element(g, n, [&](std::size_t i, std::size_t ch) {
    const float xhat = (x[i] - mean[ch]) * invstd[ch];
    dx[i] = k[ch] * (dy[i] - a[ch] - xhat * b[ch]);
  });
}

void avgpool2d_forward(const float* x, float* y, std::size_t n, const PoolGeometry& g) {
  const float scale = 1.0f / static_cast<float>(g.kernel * g.kernel);
  const std::size_t planes = n * g.channels;
  for (std::size_t q = 0; q < planes; ++q) {
    const float* in = x + q * g.height * g.width;
    float* out = y + q * g.out_height * g.out_width;
    for (std::size_t i = 0; i < g.out_height; ++i) {
      for (std::size_t j = 0; j < g.out_width; ++j) {
        float s = 0.0f;
        for (std::size_t u = 0; u < g.kernel; ++u) {
          const float* row = in + (i * g.stride + u) * g.width + j * g.stride;
          for (std::size_t v = 0; v < g.kernel; ++v) s += row[v];
        }
        out[i * g.out_width + j] = s * scale;
      }
    }
  }
}

void avgpool2d_backward(const float* dy, float* dx, std::size_t n, const PoolGeometry& g) {
  const float scale = 1.0f / static_cast<float>(g.kernel * g.kernel);
  const std::size_t planes = n * g.channels;
  std::memset(dx, 0, planes * g.height * g.width * sizeof(float));
  for (std::size_t q = 0; q < planes; ++q) {
    float* in = dx + q * g.height * g.width;
    const float* out = dy + q * g.out_height * g.out_width;
    for (std::size_t i = 0; i < g.out_height; ++i) {
      for (std::size_t j = 0; j < g.out_width; ++j) {
        const float d = out[i * g.out_width + j] * scale;
        for (std::size_t u = 0; u < g.kernel; ++u) {
          float* row = in + (i * g.stride + u) * g.width + j * g.stride;
          for (std::size_t v = 0; v < g.kernel; ++v) row[v] += d;
        }
      }
    }
  }
}

void global_avgpool_forward(const float* x, float* y, std::size_t n, std::size_t channels,
                            std::size_t plane) {
  const double scale = 1.0 / static_cast<double>(plane);
  for (std::size_t q = 0; q < n * channels; ++q) {
    const float* in = x + q * plane;
    double s = 0.0;
    for (std::size_t p = 0; p < plane; ++p) s += in[p];
    y[q] = static_cast<float>(s * scale);
  }
}

void global_avgpool_backward(const float* dy, float* dx, std::size_t n, std::size_t channels,
                             std::size_t plane) {
  const float scale = 1.0f / static_cast<float>(plane);
  for (std::size_t q = 0; q < n * channels; ++q) {
    const float d = dy[q] * scale;
    float* out = dx + q * plane;
    for (std::size_t p = 0; p < plane; ++p) out[p] = d;
  }
}

void add_into(float* y, const float* x, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) y[i] += x[i];
}

}  // namespace cohort::kernels::cpu
