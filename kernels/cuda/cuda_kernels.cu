#include <algorithm>
#include <cmath>
#include <cstdio>

#include "../random.h"
#include "cohort/kernels/network.h"
#include "cuda_kernels.h"
#include "cuda_util.h"

namespace cohort::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops: enough blocks to fill an H200 (132 SMs x 16 blocks), no more.
constexpr std::size_t kMaxBlocks = 4096;

unsigned blocks_for(std::size_t count) {
  return static_cast<unsigned>(
      std::clamp<std::size_t>((count + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

#define COHORT_GRID_STRIDE(i, count)                                                    \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; \
       i < (count); i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

__global__ void add_bias_rows_kernel(float* y, const float* b, int rows, int cols, bool relu) {
  const std::size_t count = static_cast<std::size_t>(rows) * cols;
  COHORT_GRID_STRIDE(i, count) {
    const float v = y[i] + b[i % cols];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void column_sums_kernel(const float* dy, float* db, int rows, int cols) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += dy[static_cast<std::size_t>(r) * cols + j];
  db[j] = sum;
}

__global__ void row_sums_kernel(const float* g, float* db, int cols, bool accumulate) {
  __shared__ float partial[kThreads];
  const float* row = g + static_cast<std::size_t>(blockIdx.x) * cols;
  float sum = 0.0f;
  for (int q = threadIdx.x; q < cols; q += blockDim.x) sum += row[q];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[blockIdx.x] = (accumulate ? db[blockIdx.x] : 0.0f) + partial[0];
}

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t count) {
  COHORT_GRID_STRIDE(i, count) { y[i] = fmaxf(x[i], 0.0f); }
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx,
                                     std::size_t count) {
  COHORT_GRID_STRIDE(i, count) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

__global__ void activation_forward_kernel(Activation a, const float* x, float* y,
                                          std::size_t count) {
  COHORT_GRID_STRIDE(i, count) {
    const float v = x[i];
    switch (a) {
      case Activation::kTanh: y[i] = tanhf(v); break;
      case Activation::kSigmoid: y[i] = 1.0f / (1.0f + expf(-v)); break;
      case Activation::kGelu: y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;
    }
  }
}

__global__ void activation_backward_kernel(Activation a, const float* x, const float* y,
                                           const float* dy, float* dx, std::size_t count) {
  COHORT_GRID_STRIDE(i, count) {
    float d = 0.0f;
    switch (a) {
      case Activation::kTanh: d = 1.0f - y[i] * y[i]; break;
      case Activation::kSigmoid: d = y[i] * (1.0f - y[i]); break;
      case Activation::kGelu: {
        const float v = x[i];
        d = 0.5f * (1.0f + erff(v * 0.70710678118654752f)) +
            v * 0.39894228040143268f * expf(-0.5f * v * v);
        break;
      }
    }
    dx[i] = dy[i] * d;
  }
}

__global__ void im2col_kernel(const float* x, float* cols, int n, ConvShape g) {
  const std::size_t ld = static_cast<std::size_t>(n) * g.positions();
  const std::size_t count = static_cast<std::size_t>(g.patch()) * ld;
  COHORT_GRID_STRIDE(i, count) {
    const int row = static_cast<int>(i / ld);
    const std::size_t col = i % ld;
    const int sample = static_cast<int>(col / g.positions());
    const int q = static_cast<int>(col % g.positions());
    const int c = row / (g.kernel * g.kernel);
    const int ky = (row / g.kernel) % g.kernel;
    const int kx = row % g.kernel;
    const int iy = (q / g.out_width) * g.stride + ky - g.padding;
    const int ix = (q % g.out_width) * g.stride + kx - g.padding;
    float v = 0.0f;
    if (iy >= 0 && iy < g.height && ix >= 0 && ix < g.width) {
      v = x[((static_cast<std::size_t>(sample) * g.in_channels + c) * g.height + iy) * g.width +
            ix];
    }
    cols[i] = v;
  }
}

__global__ void col2im_kernel(const float* dcols, float* dx, int n, ConvShape g) {
  const std::size_t ld = static_cast<std::size_t>(n) * g.positions();
  const std::size_t count = static_cast<std::size_t>(n) * g.in_channels * g.height * g.width;
  COHORT_GRID_STRIDE(i, count) {
    const int ix = static_cast<int>(i % g.width);
    const int iy = static_cast<int>((i / g.width) % g.height);
    const int c =
        static_cast<int>((i / (static_cast<std::size_t>(g.width) * g.height)) % g.in_channels);
    const int sample =
        static_cast<int>(i / (static_cast<std::size_t>(g.width) * g.height * g.in_channels));
    float sum = 0.0f;
    for (int ky = 0; ky < g.kernel; ++ky) {
      const int ty = iy + g.padding - ky;
      if (ty < 0 || ty % g.stride != 0) continue;
      const int oy = ty / g.stride;
      if (oy >= g.out_height) continue;
      for (int kx = 0; kx < g.kernel; ++kx) {
        const int tx = ix + g.padding - kx;
        if (tx < 0 || tx % g.stride != 0) continue;
        const int ox = tx / g.stride;
        if (ox >= g.out_width) continue;
        const int row = (c * g.kernel + ky) * g.kernel + kx;
        sum += dcols[static_cast<std::size_t>(row) * ld +
                     static_cast<std::size_t>(sample) * g.positions() + oy * g.out_width + ox];
      }
    }
    dx[i] = sum;
  }
}

__global__ void scatter_nchw_kernel(const float* result, const float* b, float* y, int n,
                                    int channels, int positions, bool relu) {
  const std::size_t count = static_cast<std::size_t>(n) * channels * positions;
  const std::size_t ld = static_cast<std::size_t>(n) * positions;
  COHORT_GRID_STRIDE(i, count) {  // i indexes y (NCHW)
    const int q = static_cast<int>(i % positions);
    const int c = static_cast<int>((i / positions) % channels);
    const std::size_t sample = i / (static_cast<std::size_t>(positions) * channels);
    const float v = result[c * ld + sample * positions + q] + b[c];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void gather_nchw_kernel(const float* dy, const float* relu_y, float* g, int n,
                                   int channels, int positions) {
  const std::size_t count = static_cast<std::size_t>(n) * channels * positions;
  const std::size_t ld = static_cast<std::size_t>(n) * positions;
  COHORT_GRID_STRIDE(i, count) {  // i indexes dy (NCHW)
    const int q = static_cast<int>(i % positions);
    const int c = static_cast<int>((i / positions) % channels);
    const std::size_t sample = i / (static_cast<std::size_t>(positions) * channels);
    const float v = relu_y == nullptr || relu_y[i] > 0.0f ? dy[i] : 0.0f;
    g[c * ld + sample * positions + q] = v;
  }
}

__global__ void maxpool_forward_kernel(const float* x, float* y, std::int32_t* argmax, int n,
                                       PoolShape g) {
  const int out_plane = g.out_height * g.out_width;
  const std::size_t count = static_cast<std::size_t>(n) * g.channels * out_plane;
  COHORT_GRID_STRIDE(i, count) {
    const std::size_t plane = i / out_plane;
    const int q = static_cast<int>(i % out_plane);
    const int oy = q / g.out_width, ox = q % g.out_width;
    const float* in = x + plane * g.height * g.width;
    int best = oy * g.stride * g.width + ox * g.stride;
    float best_value = in[best];
    for (int ky = 0; ky < g.kernel; ++ky) {
      for (int kx = 0; kx < g.kernel; ++kx) {
        const int at = (oy * g.stride + ky) * g.width + ox * g.stride + kx;
        const float v = in[at];
        if (v > best_value || (isnan(v) && !isnan(best_value))) {
          best_value = v;
          best = at;
        }
      }
    }
    y[i] = best_value;
    argmax[i] = best;
  }
}

__global__ void maxpool_backward_kernel(const float* dy, const std::int32_t* argmax, float* dx,
                                        int n, PoolShape g) {
  const int out_plane = g.out_height * g.out_width;
  const std::size_t count = static_cast<std::size_t>(n) * g.channels * out_plane;
  COHORT_GRID_STRIDE(i, count) {
    const std::size_t plane = i / out_plane;
    atomicAdd(dx + plane * g.height * g.width + argmax[i], dy[i]);
  }
}

__global__ void dropout_forward_kernel(const float* x, float* y, float* mask, std::size_t count,
                                       float p, float keep_scale, std::uint64_t key,
                                       std::size_t first) {
  COHORT_GRID_STRIDE(i, count) {
    const float m = detail::counter_uniform(key, first + i) < p ? 0.0f : keep_scale;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void multiply_kernel(const float* a, const float* b, float* out, std::size_t count) {
  COHORT_GRID_STRIDE(i, count) { out[i] = a[i] * b[i]; }
}

// Batch normalisation reductions: one block per channel, kReduceThreads threads striding over
// the channel's n * plane values (consecutive threads read consecutive positions of a plane).
// Sums in double (as the CPU does), so the statistics hardly depend on the summation order.
constexpr int kReduceThreads = 512;

// Sums one double per thread over the block; every thread gets the total.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // shared is reused by the next call
  return total;
}

__device__ std::size_t channel_at(std::size_t m, int c, int channels, int plane) {
  const std::size_t sample = m / plane;
  return (sample * channels + c) * plane + m % plane;
}

__global__ void batchnorm_stats_kernel(const float* x, float* running, float* stats, int n,
                                       int channels, int plane, float momentum, float epsilon) {
  __shared__ double shared[kReduceThreads];
  const int c = blockIdx.x;
  const std::size_t count = static_cast<std::size_t>(n) * plane;
  double sum = 0.0;
  for (std::size_t m = threadIdx.x; m < count; m += blockDim.x) {
    sum += x[channel_at(m, c, channels, plane)];
  }
  const double mean = block_sum(sum, shared) / static_cast<double>(count);
  double squares = 0.0;
  for (std::size_t m = threadIdx.x; m < count; m += blockDim.x) {
    const double d = x[channel_at(m, c, channels, plane)] - mean;
    squares += d * d;
  }
  squares = block_sum(squares, shared);
  if (threadIdx.x != 0) return;
  const double var = squares / static_cast<double>(count);
  const double unbiased = count > 1 ? squares / static_cast<double>(count - 1) : var;
  stats[c] = static_cast<float>(mean);
  stats[channels + c] = static_cast<float>(1.0 / sqrt(var + epsilon));
  running[c] = (1.0f - momentum) * running[c] + momentum * stats[c];
  running[channels + c] =
      (1.0f - momentum) * running[channels + c] + momentum * static_cast<float>(unbiased);
}

__global__ void batchnorm_running_stats_kernel(const float* running, float* stats, int channels,
                                               float epsilon) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  stats[c] = running[c];
  stats[channels + c] = 1.0f / sqrtf(running[channels + c] + epsilon);
}

__global__ void batchnorm_apply_kernel(const float* x, float* y, const float* weight,
                                       const float* bias, const float* stats, int channels,
                                       int plane, std::size_t count) {
  COHORT_GRID_STRIDE(i, count) {
    const int c = static_cast<int>((i / plane) % channels);
    y[i] = (x[i] - stats[c]) * stats[channels + c] * weight[c] + bias[c];
  }
}

__global__ void batchnorm_sums_kernel(const float* x, const float* dy, float* stats, float* dweight,
                                      float* dbias, int n, int channels, int plane) {
  __shared__ double shared[kReduceThreads];
  const int c = blockIdx.x;
  const std::size_t count = static_cast<std::size_t>(n) * plane;
  const float mean = stats[c], invstd = stats[channels + c];
  double sum_dy = 0.0, sum_dy_xhat = 0.0;
  for (std::size_t m = threadIdx.x; m < count; m += blockDim.x) {
    const std::size_t at = channel_at(m, c, channels, plane);
    const double g = dy[at];
    sum_dy += g;
    sum_dy_xhat += g * static_cast<double>((x[at] - mean) * invstd);
  }
  const double total_dy = block_sum(sum_dy, shared);
  const double total_dy_xhat = block_sum(sum_dy_xhat, shared);
  if (threadIdx.x != 0) return;
  dweight[c] = static_cast<float>(total_dy_xhat);
  dbias[c] = static_cast<float>(total_dy);
  stats[2 * channels + c] = static_cast<float>(total_dy / static_cast<double>(count));
  stats[3 * channels + c] = static_cast<float>(total_dy_xhat / static_cast<double>(count));
}

// dx = weight * invstd / M * (M * dy - sum(dy) - xhat * sum(dy * xhat))
//    = weight * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), the means in stats.
__global__ void batchnorm_dx_kernel(const float* x, const float* dy, const float* weight,
                                    const float* stats, float* dx, int channels, int plane,
                                    std::size_t count) {
  COHORT_GRID_STRIDE(i, count) {
    const int c = static_cast<int>((i / plane) % channels);
    const float invstd = stats[channels + c];
    const float xhat = (x[i] - stats[c]) * invstd;
    dx[i] = weight[c] * invstd * (dy[i] - stats[2 * channels + c] - xhat * stats[3 * channels + c]);
  }
}

__global__ void avgpool_forward_kernel(const float* x, float* y, int n, PoolShape g) {
  const int out_plane = g.out_height * g.out_width;
  const std::size_t count = static_cast<std::size_t>(n) * g.channels * out_plane;
  const float scale = 1.0f / static_cast<float>(g.kernel * g.kernel);
  COHORT_GRID_STRIDE(i, count) {
    const std::size_t plane = i / out_plane;
    const int q = static_cast<int>(i % out_plane);
    const int y0 = (q / g.out_width) * g.stride, x0 = (q % g.out_width) * g.stride;
    const float* in = x + plane * g.height * g.width;
    float sum = 0.0f;
    for (int ky = 0; ky < g.kernel; ++ky) {
      for (int kx = 0; kx < g.kernel; ++kx) sum += in[(y0 + ky) * g.width + x0 + kx];
    }
    y[i] = sum * scale;
  }
}

// Per input element: the sum of dy / kernel^2 over the windows that contain it (none past the
// floor-mode edge), in window order. Gathers, so overlapping windows need no atomics.
__global__ void avgpool_backward_kernel(const float* dy, float* dx, int n, PoolShape g) {
  const int in_plane = g.height * g.width, out_plane = g.out_height * g.out_width;
  const std::size_t count = static_cast<std::size_t>(n) * g.channels * in_plane;
  const float scale = 1.0f / static_cast<float>(g.kernel * g.kernel);
  COHORT_GRID_STRIDE(i, count) {
    const std::size_t plane = i / in_plane;
    const int iy = static_cast<int>(i % in_plane) / g.width;
    const int ix = static_cast<int>(i % in_plane) % g.width;
    // Windows oy with oy * stride <= iy < oy * stride + kernel.
    const int oy_first = iy < g.kernel ? 0 : (iy - g.kernel) / g.stride + 1;
    const int ox_first = ix < g.kernel ? 0 : (ix - g.kernel) / g.stride + 1;
    const int oy_last = min(iy / g.stride, g.out_height - 1);
    const int ox_last = min(ix / g.stride, g.out_width - 1);
    const float* grad = dy + plane * out_plane;
    float sum = 0.0f;
    for (int oy = oy_first; oy <= oy_last; ++oy) {
      for (int ox = ox_first; ox <= ox_last; ++ox) sum += grad[oy * g.out_width + ox] * scale;
    }
    dx[i] = sum;
  }
}

// One warp per plane, summing in double.
__global__ void global_avgpool_forward_kernel(const float* x, float* y, std::size_t planes,
                                              int plane) {
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (std::size_t p = (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) / 32;
       p < planes; p += warps) {
    const float* in = x + p * plane;
    double sum = 0.0;
    for (int q = lane; q < plane; q += 32) sum += in[q];
    for (int offset = 16; offset > 0; offset /= 2) {
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) y[p] = static_cast<float>(sum * (1.0 / plane));
  }
}

__global__ void global_avgpool_backward_kernel(const float* dy, float* dx, int plane,
                                               std::size_t count) {
  const float scale = 1.0f / static_cast<float>(plane);
  COHORT_GRID_STRIDE(i, count) { dx[i] = dy[i / plane] * scale; }
}

__global__ void add_kernel(const float* a, const float* b, float* out, std::size_t count) {
  COHORT_GRID_STRIDE(i, count) { out[i] = a[i] + b[i]; }
}

__global__ void softmax_cross_entropy_kernel(const float* logits, const std::int32_t* labels,
                                             float* losses, float* dlogits, int rows, int classes) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* row = logits + static_cast<std::size_t>(r) * classes;
  float top = row[0];
  for (int c = 1; c < classes; ++c) top = fmaxf(top, row[c]);
  double sum = 0.0;
  for (int c = 0; c < classes; ++c) sum += exp(static_cast<double>(row[c] - top));
  const int label = labels[r];
  losses[r] = static_cast<float>(log(sum) - static_cast<double>(row[label] - top));
  if (dlogits == nullptr) return;
  const double inv_sum = 1.0 / sum, inv_rows = 1.0 / rows;
  float* grad = dlogits + static_cast<std::size_t>(r) * classes;
  for (int c = 0; c < classes; ++c) {
    const double p = exp(static_cast<double>(row[c] - top)) * inv_sum;
    grad[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) * inv_rows);
  }
}

__global__ void sgd_kernel(float* p, const float* g, float* v, std::size_t count, SgdArgs a) {
  COHORT_GRID_STRIDE(i, count) {
    const float d = g[i] + a.weight_decay * p[i];
    if (v == nullptr) {
      p[i] -= a.learning_rate * d;
    } else {
      const float vel = a.momentum * v[i] + d;
      v[i] = vel;
      p[i] -= a.learning_rate * (a.nesterov ? d + a.momentum * vel : vel);
    }
  }
}

__global__ void adam_kernel(float* p, const float* g, float* m, float* v, std::size_t count,
                            AdamArgs a) {
  COHORT_GRID_STRIDE(i, count) {
    const float pi = p[i] * a.shrink;
    const float gi = g[i] + a.l2 * p[i];
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - a.step_size * mi / (sqrtf(vi) * a.inv_sqrt_bc2 + a.epsilon);
  }
}

}  // namespace

void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line) {
  throw KernelError(std::string("CUDA error ") + cudaGetErrorName(error) + " (" +
                    cudaGetErrorString(error) + ") in " + expr + " at " + file + ":" +
                    std::to_string(line));
}

void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  throw KernelError(std::string("cuBLAS error ") + cublasGetStatusName(status) + " (" +
                    cublasGetStatusString(status) + ") in " + expr + " at " + file + ":" +
                    std::to_string(line));
}

void add_bias_rows(float* y, const float* b, int rows, int cols, bool relu, cudaStream_t s) {
  const std::size_t count = static_cast<std::size_t>(rows) * cols;
  add_bias_rows_kernel<<<blocks_for(count), kThreads, 0, s>>>(y, b, rows, cols, relu);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void column_sums(const float* dy, float* db, int rows, int cols, cudaStream_t s) {
  column_sums_kernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, s>>>(dy, db, rows, cols);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void row_sums(const float* g, float* db, int rows, int cols, bool accumulate, cudaStream_t s) {
  row_sums_kernel<<<rows, kThreads, 0, s>>>(g, db, cols, accumulate);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void relu_forward(const float* x, float* y, std::size_t count, cudaStream_t s) {
  relu_forward_kernel<<<blocks_for(count), kThreads, 0, s>>>(x, y, count);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void relu_backward(const float* y, const float* dy, float* dx, std::size_t count, cudaStream_t s) {
  relu_backward_kernel<<<blocks_for(count), kThreads, 0, s>>>(y, dy, dx, count);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void activation_forward(Activation a, const float* x, float* y, std::size_t count, cudaStream_t s) {
  activation_forward_kernel<<<blocks_for(count), kThreads, 0, s>>>(a, x, y, count);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void activation_backward(Activation a, const float* x, const float* y, const float* dy, float* dx,
                         std::size_t count, cudaStream_t s) {
  activation_backward_kernel<<<blocks_for(count), kThreads, 0, s>>>(a, x, y, dy, dx, count);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void im2col(const float* x, float* cols, int n, const ConvShape& g, cudaStream_t s) {
  const std::size_t count = static_cast<std::size_t>(g.patch()) * n * g.positions();
  im2col_kernel<<<blocks_for(count), kThreads, 0, s>>>(x, cols, n, g);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void col2im(const float* dcols, float* dx, int n, const ConvShape& g, cudaStream_t s) {
  const std::size_t count = static_cast<std::size_t>(n) * g.in_channels * g.height * g.width;
  col2im_kernel<<<blocks_for(count), kThreads, 0, s>>>(dcols, dx, n, g);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void scatter_nchw(const float* result, const float* b, float* y, int n, int channels, int positions,
                  bool relu, cudaStream_t s) {
  const std::size_t count = static_cast<std::size_t>(n) * channels * positions;
  scatter_nchw_kernel<<<blocks_for(count), kThreads, 0, s>>>(result, b, y, n, channels, positions,
                                                             relu);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void gather_nchw(const float* dy, const float* relu_y, float* g, int n, int channels, int positions,
                 cudaStream_t s) {
  const std::size_t count = static_cast<std::size_t>(n) * channels * positions;
  gather_nchw_kernel<<<blocks_for(count), kThreads, 0, s>>>(dy, relu_y, g, n, channels, positions);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void maxpool_forward(const float* x, float* y, std::int32_t* argmax, int n, const PoolShape& g,
                     cudaStream_t s) {
  const std::size_t count = static_cast<std::size_t>(n) * g.channels * g.out_height * g.out_width;
  maxpool_forward_kernel<<<blocks_for(count), kThreads, 0, s>>>(x, y, argmax, n, g);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx, int n,
                      const PoolShape& g, cudaStream_t s) {
  const std::size_t in_count = static_cast<std::size_t>(n) * g.channels * g.height * g.width;
  COHORT_CUDA_CHECK(cudaMemsetAsync(dx, 0, in_count * sizeof(float), s));
  const std::size_t count = static_cast<std::size_t>(n) * g.channels * g.out_height * g.out_width;
  maxpool_backward_kernel<<<blocks_for(count), kThreads, 0, s>>>(dy, argmax, dx, n, g);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void dropout_forward(const float* x, float* y, float* mask, std::size_t count, float p,
                     std::uint64_t key, std::size_t first, cudaStream_t s) {
  const float keep_scale = 1.0f / (1.0f - p);  // computed on the host, as on the CPU path
  dropout_forward_kernel<<<blocks_for(count), kThreads, 0, s>>>(x, y, mask, count, p, keep_scale,
                                                                key, first);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void dropout_backward(const float* dy, const float* mask, float* dx, std::size_t count,
                      cudaStream_t s) {
  multiply_kernel<<<blocks_for(count), kThreads, 0, s>>>(dy, mask, dx, count);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void batchnorm_forward(const float* x, float* y, const float* weight, const float* bias,
                       float* running, float* stats, int n, int channels, int plane, bool training,
                       cudaStream_t s) {
  if (training) {
    batchnorm_stats_kernel<<<channels, kReduceThreads, 0, s>>>(
        x, running, stats, n, channels, plane, kBatchNormMomentum, kBatchNormEpsilon);
  } else {
    batchnorm_running_stats_kernel<<<(channels + kThreads - 1) / kThreads, kThreads, 0, s>>>(
        running, stats, channels, kBatchNormEpsilon);
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
  const std::size_t count = static_cast<std::size_t>(n) * channels * plane;
  batchnorm_apply_kernel<<<blocks_for(count), kThreads, 0, s>>>(x, y, weight, bias, stats, channels,
                                                                plane, count);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void batchnorm_backward(const float* x, const float* dy, const float* weight, float* stats,
                        float* dweight, float* dbias, float* dx, int n, int channels, int plane,
                        cudaStream_t s) {
  batchnorm_sums_kernel<<<channels, kReduceThreads, 0, s>>>(x, dy, stats, dweight, dbias, n,
                                                            channels, plane);
  COHORT_CUDA_CHECK(cudaGetLastError());
  if (dx == nullptr) return;
  const std::size_t count = static_cast<std::size_t>(n) * channels * plane;
  batchnorm_dx_kernel<<<blocks_for(count), kThreads, 0, s>>>(x, dy, weight, stats, dx, channels,
                                                             plane, count);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void avgpool_forward(const float* x, float* y, int n, const PoolShape& g, cudaStream_t s) {
  const std::size_t count = static_cast<std::size_t>(n) * g.channels * g.out_height * g.out_width;
  avgpool_forward_kernel<<<blocks_for(count), kThreads, 0, s>>>(x, y, n, g);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void avgpool_backward(const float* dy, float* dx, int n, const PoolShape& g, cudaStream_t s) {
  const std::size_t count = static_cast<std::size_t>(n) * g.channels * g.height * g.width;
  avgpool_backward_kernel<<<blocks_for(count), kThreads, 0, s>>>(dy, dx, n, g);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void global_avgpool_forward(const float* x, float* y, std::size_t planes, int plane,
                            cudaStream_t s) {
  global_avgpool_forward_kernel<<<blocks_for(planes * 32), kThreads, 0, s>>>(x, y, planes, plane);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void global_avgpool_backward(const float* dy, float* dx, std::size_t planes, int plane,
                             cudaStream_t s) {
  const std::size_t count = planes * plane;
  global_avgpool_backward_kernel<<<blocks_for(count), kThreads, 0, s>>>(dy, dx, plane, count);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void add(const float* a, const float* b, float* out, std::size_t count, cudaStream_t s) {
  add_kernel<<<blocks_for(count), kThreads, 0, s>>>(a, b, out, count);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void softmax_cross_entropy(const float* logits, const std::int32_t* labels, float* losses,
                           float* dlogits, int rows, int classes, cudaStream_t s) {
  softmax_cross_entropy_kernel<<<(rows + kThreads - 1) / kThreads, kThreads, 0, s>>>(
      logits, labels, losses, dlogits, rows, classes);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void sgd_step(float* params, const float* grads, float* velocity, std::size_t count,
              const SgdArgs& args, cudaStream_t s) {
  sgd_kernel<<<blocks_for(count), kThreads, 0, s>>>(params, grads, velocity, count, args);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void adam_step(float* params, const float* grads, float* m, float* v, std::size_t count,
               const AdamArgs& args, cudaStream_t s) {
  adam_kernel<<<blocks_for(count), kThreads, 0, s>>>(params, grads, m, v, count, args);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::kernels::cuda
