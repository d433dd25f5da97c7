// CPU layer kernels behind raw pointers, used by CpuNetwork and tested directly: GEMM-based
// (gemm.h, the AVX2 micro-kernels of microkernels.h for linear layers) with Eigen for the rest.
// Stride-1 convolutions have a faster channels-last path in nhwc_conv.h.
//
// Layout: NCHW (unless a name says _nhwc), batch-major, contiguous; weights as in network.h.
// Every function processes n samples. backward functions overwrite dw, db and dx (or, with
// accumulate, add into dw and db); dx == nullptr skips the input gradient (the first layer never
// needs it). Work is split over exec.pool when there is one; exec.workspace provides per-part
// scratch that grows once and is then reused.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cohort/core/buffer.h"
#include "cohort/kernels/network.h"

namespace cohort {
class ThreadPool;
}  // namespace cohort

namespace cohort::kernels::cpu {

// Per-part scratch buffers: part p (0 <= p < parts) may be used only by the thread running
// part p. Not thread-safe otherwise.
class Workspace {
 public:
  // Buffers report to tracker when it is not null.
  explicit Workspace(std::size_t parts = 1, MemoryTracker* tracker = nullptr);
  // A buffer of at least count floats, contents unspecified; stable until the next call with the
  // same (part, slot) and a larger count.
  float* floats(std::size_t part, std::size_t slot, std::size_t count);
  [[nodiscard]] std::size_t parts() const { return slots_.size(); }

  static constexpr std::size_t kSlots = 5;

 private:
  std::vector<std::array<FloatBuffer, kSlots>> slots_;
  MemoryTracker* tracker_;
};

struct Exec {
  ThreadPool* pool = nullptr;  // nullptr: everything on the calling thread
  Workspace* workspace = nullptr;
};

struct ConvGeometry {
  std::size_t in_channels, height, width, out_channels, kernel, stride, padding, out_height,
      out_width;
  [[nodiscard]] std::size_t patch() const { return in_channels * kernel * kernel; }  // K
  [[nodiscard]] std::size_t positions() const { return out_height * out_width; }     // P
  [[nodiscard]] std::size_t in_size() const { return in_channels * height * width; }
  [[nodiscard]] std::size_t out_size() const { return out_channels * positions(); }
};
ConvGeometry conv_geometry(const LayerSpec& layer);

struct PoolGeometry {
  std::size_t channels, height, width, kernel, stride, out_height, out_width;
  [[nodiscard]] std::size_t in_size() const { return channels * height * width; }
  [[nodiscard]] std::size_t out_size() const { return channels * out_height * out_width; }
};
PoolGeometry pool_geometry(const LayerSpec& layer);

// y[n, out] = x[n, in] * w[out, in]^T + b, then max(0, .) when relu.
void linear_forward(Exec& exec, const float* x, const float* w, const float* b, float* y,
                    std::size_t n, std::size_t in, std::size_t out, bool relu);
// When relu_y != nullptr (the fused ReLU's output) dy is first masked in place by relu_y > 0.
// accumulate: dw and db receive += (micro-batches summing into one gradient); dx is overwritten.
void linear_backward(Exec& exec, const float* x, const float* w, float* dy, const float* relu_y,
                     float* dw, float* db, float* dx, std::size_t n, std::size_t in,
                     std::size_t out, bool accumulate = false);

void relu_forward(const float* x, float* y, std::size_t count);
// dx = dy * (y > 0); dx may alias dy.
void relu_backward(const float* y, const float* dy, float* dx, std::size_t count);

// kind: kTanh, kSigmoid or kGelu (LayerKind); y = f(x), elementwise.
void activation_forward(LayerKind kind, const float* x, float* y, std::size_t count);
// dx = dy * f'(x): tanh and sigmoid read their output y, GELU its input x. dx may alias dy.
void activation_backward(LayerKind kind, const float* x, const float* y, const float* dy, float* dx,
                         std::size_t count);

// im2col + GEMM over chunks of samples.
void conv2d_forward(Exec& exec, const float* x, const float* w, const float* b, float* y,
                    std::size_t n, const ConvGeometry& g, bool relu);
void conv2d_backward(Exec& exec, const float* x, const float* w, const float* dy,
                     const float* relu_y, float* dw, float* db, float* dx, std::size_t n,
                     const ConvGeometry& g, bool accumulate = false);

// argmax receives, per output element, the index of the chosen input within its channel plane.
void maxpool2d_forward(Exec& exec, const float* x, float* y, std::int32_t* argmax, std::size_t n,
                       const PoolGeometry& g);
// When pool_y is not null (the pool's output, after a ReLU that precedes the pool), dy is dropped
// where pool_y <= 0: the ReLU's backward, fused (the pool passes on the ReLU output at argmax).
void maxpool2d_backward(Exec& exec, const float* dy, const std::int32_t* argmax, float* dx,
                        std::size_t n, const PoolGeometry& g, const float* pool_y = nullptr);

// Channels-last (NHWC, [n][H][W][C]) max pooling, for activations on the NhwcConv path: the
// same values, gradients and argmax convention (index within the channel plane; the first
// maximum wins; a NaN wins and stays) as the NCHW functions above.
void maxpool2d_forward_nhwc(Exec& exec, const float* x, float* y, std::int32_t* argmax,
                            std::size_t n, const PoolGeometry& g);
void maxpool2d_backward_nhwc(Exec& exec, const float* dy, const std::int32_t* argmax, float* dx,
                             std::size_t n, const PoolGeometry& g, const float* pool_y = nullptr);

// Layout changes of n samples of `channels` planes of `plane` (= H * W) floats:
// [n][channels][plane] <-> [n][plane][channels]. x and y must not overlap.
void nchw_to_nhwc(Exec& exec, const float* x, float* y, std::size_t n, std::size_t channels,
                  std::size_t plane);
void nhwc_to_nchw(Exec& exec, const float* x, float* y, std::size_t n, std::size_t channels,
                  std::size_t plane);

// mask[i] = 0 with probability p (drawn from counter_uniform(key, first + i)), else
// 1 / (1 - p); y = x * mask. first > 0: these elements continue a longer draw (a micro-batch).
void dropout_forward(const float* x, float* y, float* mask, std::size_t count, float p,
                     std::uint64_t key, std::uint64_t first = 0);
// dx = dy * mask; dx may alias dy.
void dropout_backward(const float* dy, const float* mask, float* dx, std::size_t count);

// Batch normalisation over `channels` channels of `plane` positions, in either layout.
struct BatchNormGeometry {
  std::size_t channels = 0;
  std::size_t plane = 1;  // H * W
  bool nhwc = false;
};
// Training: normalises with the batch's statistics (over n * plane values per channel),
// y = xhat * weight + bias. mean_invstd receives the batch mean then 1 / sqrt(var + eps)
// (2 * channels floats, for backward). running (running_mean then running_var, 2 * channels
// floats, see network.h) is updated unless null.
void batchnorm_forward_train(const float* x, float* y, const float* weight, const float* bias,
                             float* mean_invstd, float* running, std::size_t n,
                             const BatchNormGeometry& g);
// Evaluation: normalises with the running statistics.
void batchnorm_forward_eval(const float* x, float* y, const float* weight, const float* bias,
                            const float* running, std::size_t n, const BatchNormGeometry& g);
// The gradients of a training forward: dweight, dbias (overwritten, or added into with
// accumulate) and dx (skipped when null). x is the forward's input.
void batchnorm_backward(const float* x, const float* dy, const float* weight,
                        const float* mean_invstd, float* dweight, float* dbias, float* dx,
                        std::size_t n, const BatchNormGeometry& g, bool accumulate);

// Average pooling (NCHW, no padding, floor mode): each output the mean of its window; backward
// spreads dy / kernel^2 over the window (overwriting dx, adding where windows overlap).
void avgpool2d_forward(const float* x, float* y, std::size_t n, const PoolGeometry& g);
void avgpool2d_backward(const float* dy, float* dx, std::size_t n, const PoolGeometry& g);
// Global average pooling (NCHW): y[n][c] = the mean of channel c's plane.
void global_avgpool_forward(const float* x, float* y, std::size_t n, std::size_t channels,
                            std::size_t plane);
void global_avgpool_backward(const float* dy, float* dx, std::size_t n, std::size_t channels,
                             std::size_t plane);

// y[i] += x[i] (a residual block's sum).
void add_into(float* y, const float* x, std::size_t count);

}  // namespace cohort::kernels::cpu
