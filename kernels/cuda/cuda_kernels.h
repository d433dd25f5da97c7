// Launchers of the element-wise and data-movement kernels of the CUDA backend. Every launcher
// enqueues on the given stream, checks the launch with COHORT_CUDA_CHECK and never synchronises.
// Pointers are device pointers; layouts are those of the CPU layers (cpu/layers.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cohort::kernels::cuda {

struct ConvShape {
  int in_channels, height, width, out_channels, kernel, stride, padding, out_height, out_width;
  [[nodiscard]] __host__ __device__ int patch() const { return in_channels * kernel * kernel; }
  [[nodiscard]] __host__ __device__ int positions() const { return out_height * out_width; }
};

struct PoolShape {
  int channels, height, width, kernel, stride, out_height, out_width;
};

// y[r, j] = y[r, j] + b[j] (then max(0, .) when relu), for rows x cols row-major y.
void add_bias_rows(float* y, const float* b, int rows, int cols, bool relu, cudaStream_t s);
// db[j] = sum_r dy[r, j].
void column_sums(const float* dy, float* db, int rows, int cols, cudaStream_t s);
// db[c] = sum_q g[c, q] for a [rows][cols] matrix (added to db when accumulate).
void row_sums(const float* g, float* db, int rows, int cols, bool accumulate, cudaStream_t s);
void relu_forward(const float* x, float* y, std::size_t count, cudaStream_t s);
// dx = dy * (y > 0); dx may alias dy.
void relu_backward(const float* y, const float* dy, float* dx, std::size_t count, cudaStream_t s);
// The elementwise activations of LayerKind kTanh, kSigmoid and kGelu (exact, x * Phi(x)).
enum class Activation { kTanh, kSigmoid, kGelu };
void activation_forward(Activation a, const float* x, float* y, std::size_t count, cudaStream_t s);
// dx = dy * f'(x): tanh and sigmoid read their output y, GELU its input x. dx may alias dy.
void activation_backward(Activation a, const float* x, const float* y, const float* dy, float* dx,
                         std::size_t count, cudaStream_t s);

// cols[(c,ky,kx)][(n,oy,ox)] for samples [0, n) of x (NCHW).
void im2col(const float* x, float* cols, int n, const ConvShape& g, cudaStream_t s);
// dx (NCHW, overwritten) = col2im(dcols) for n samples.
void col2im(const float* dcols, float* dx, int n, const ConvShape& g, cudaStream_t s);
// y (NCHW) = result[c][(n, q)] + b[c], then max(0, .) when relu.
void scatter_nchw(const float* result, const float* b, float* y, int n, int channels, int positions,
                  bool relu, cudaStream_t s);
// g[c][(n, q)] = dy (NCHW), masked by relu_y > 0 when relu_y != nullptr.
void gather_nchw(const float* dy, const float* relu_y, float* g, int n, int channels, int positions,
                 cudaStream_t s);

void maxpool_forward(const float* x, float* y, std::int32_t* argmax, int n, const PoolShape& g,
                     cudaStream_t s);
// dx overwritten.
void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx, int n,
                      const PoolShape& g, cudaStream_t s);

// Batch normalisation of n NCHW samples of `channels` planes of `plane` values, per channel over
// its n * plane values. stats (4 * channels floats) starts with mean[channels] then
// invstd[channels] = 1 / sqrt(var + eps): training writes the batch's (biased variance, summed
// in double) and moves running (running_mean[channels] then running_var[channels], in the
// parameter vector) toward them by kBatchNormMomentum, the variance unbiased (biased when
// n * plane == 1); evaluation takes them from running, unchanged. Then
// y = (x - mean) * invstd * weight + bias.
void batchnorm_forward(const float* x, float* y, const float* weight, const float* bias,
                       float* running, float* stats, int n, int channels, int plane, bool training,
                       cudaStream_t s);
// With the stats of the training forward: dweight[c] = sum(dy * xhat), dbias[c] = sum(dy)
// (overwritten), their means over M = n * plane into stats[2 * channels, 4 * channels); when
// dx != nullptr, dx = weight * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)).
void batchnorm_backward(const float* x, const float* dy, const float* weight, float* stats,
                        float* dweight, float* dbias, float* dx, int n, int channels, int plane,
                        cudaStream_t s);

// Each output the mean of its kernel x kernel window (no padding, floor mode).
void avgpool_forward(const float* x, float* y, int n, const PoolShape& g, cudaStream_t s);
// dx overwritten: each element the sum of dy / kernel^2 over the windows containing it.
void avgpool_backward(const float* dy, float* dx, int n, const PoolShape& g, cudaStream_t s);
// y[p] = mean of plane p of x (planes of `plane` floats); backward: dx = dy[p] / plane.
void global_avgpool_forward(const float* x, float* y, std::size_t planes, int plane,
                            cudaStream_t s);
void global_avgpool_backward(const float* dy, float* dx, std::size_t planes, int plane,
                             cudaStream_t s);
// out = a + b; out may alias a or b.
void add(const float* a, const float* b, float* out, std::size_t count, cudaStream_t s);

// Same masks as the CPU (counter_uniform(key, first + i) < p drops; first: the offset of x[0]
// in the step's stream, for micro-batches).
void dropout_forward(const float* x, float* y, float* mask, std::size_t count, float p,
                     std::uint64_t key, std::size_t first, cudaStream_t s);
void dropout_backward(const float* dy, const float* mask, float* dx, std::size_t count,
                      cudaStream_t s);

// Per row: losses[r] = -log softmax(logits[r])[labels[r]] and, when dlogits != nullptr,
// dlogits[r] = (softmax - onehot) / rows. Labels were range-checked on the host.
void softmax_cross_entropy(const float* logits, const std::int32_t* labels, float* losses,
                           float* dlogits, int rows, int classes, cudaStream_t s);

struct SgdArgs {
  float learning_rate, momentum, weight_decay;
  bool nesterov;
};
void sgd_step(float* params, const float* grads, float* velocity, std::size_t count,
              const SgdArgs& args, cudaStream_t s);

struct AdamArgs {
  float step_size;     // lr / (1 - b1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - b2^t)
  float beta1, beta2, epsilon;
  float l2;      // Adam: weight decay added to the gradient; AdamW: 0
  float shrink;  // AdamW: 1 - lr * wd; Adam: 1
};
void adam_step(float* params, const float* grads, float* m, float* v, std::size_t count,
               const AdamArgs& args, cudaStream_t s);

}  // namespace cohort::kernels::cuda
