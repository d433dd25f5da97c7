// Stride-1 convolution on channels-last (NHWC) activations: the fast CPU path of conv2d.
//
// Two algorithms share one interface:
//   - direct: implicit GEMM. The packed-weight micro-kernel broadcasts straight from the padded
//     input (no im2col matrix), so the forward pass, the input gradient (a forward pass over the
//     padded output gradient with flipped weights) and the weight gradient each cost one sweep.
//   - Winograd F(2x2, 5x5) and F(4x4, 3x3) (6x6 tiles): 36 small GEMMs over channels replace the
//     k*k-tap sums, 2.8x (5x5) and 2.25x (3x3) fewer multiplies than direct. All three passes
//     run in the transformed domain; the backward passes are the exact adjoints of the forward
//     transforms, so the gradients are those of the function the forward pass computes.
//
// Layout: x is [n][H][W][Ci], y and dy [n][OH][OW][Co], weights [Co][Ci][k][k] as in network.h.
// The object keeps the padded input of the last forward() for backward() (and, for Winograd,
// the weights' transform). Its scratch (per-thread blocks, the input-gradient accumulator, the
// backward pass's packed weights) lives in an NhwcScratch, its own or one that the convolutions
// of a network share (they run one at a time), and grows to the largest need seen, then is
// reused. Not thread-safe: one caller at a time (it splits work over exec.pool itself).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "cohort/core/buffer.h"
#include "layers.h"

namespace cohort::kernels::cpu {

// Scratch that NhwcConvs share: contents live for one forward() or backward() call only.
struct NhwcScratch;
std::shared_ptr<NhwcScratch> make_nhwc_scratch(MemoryTracker* tracker = nullptr);

class NhwcConv {
 public:
  enum class Algorithm { kDirect, kWinograd };

  // True when this build (AVX2 + FMA) and geometry (stride 1, padding < kernel) can use it.
  static bool supports(const ConvGeometry& g);
  // Winograd when it pays off (3x3 or 5x5, channel counts multiples of 8, wide enough), else
  // direct. REQUIRES supports(g).
  static Algorithm choose(const ConvGeometry& g);
  // True when `algorithm` can run g (Winograd needs 3x3 or 5x5 and channels multiples of 8).
  static bool can_run(const ConvGeometry& g, Algorithm algorithm);

  // REQUIRES can_run(g, algorithm), else KernelError.
  NhwcConv(const ConvGeometry& g, Algorithm algorithm);
  ~NhwcConv();
  NhwcConv(NhwcConv&&) noexcept;
  NhwcConv& operator=(NhwcConv&&) noexcept;

  [[nodiscard]] Algorithm algorithm() const { return algorithm_; }
  // Every buffer made from now on reports to tracker (call before the first forward()).
  void set_tracker(MemoryTracker* tracker);
  // Use `scratch` (made with the same tracker) instead of an own one (before the first forward()).
  void share_scratch(std::shared_ptr<NhwcScratch> scratch);

  // y = conv(x, w) + b, then max(0, .) when relu.
  void forward(Exec& exec, const float* x, const float* w, const float* b, float* y, std::size_t n,
               bool relu);
  // REQUIRES: the last forward() had the same n and weights w (its input is kept; Winograd
  // reuses the weights' transform). When relu_y is not null
  // (the fused ReLU's output), dy is masked by relu_y > 0 first; dy itself is not modified.
  // Overwrites dw, db and (unless null) dx; with accumulate, adds into dw and db.
  void backward(Exec& exec, const float* w, const float* dy, const float* relu_y, float* dw,
                float* db, float* dx, std::size_t n, bool accumulate = false);

 private:
  void reserve(std::size_t n, std::size_t parts);
  void pad_input(Exec& exec, const float* x, std::size_t n);
  void forward_direct(Exec& exec, const float* w, const float* b, float* y, std::size_t n,
                      bool relu);
  void backward_direct(Exec& exec, const float* w, const float* dy, const float* relu_y, float* dw,
                       float* db, float* dx, std::size_t n, bool accumulate);
  void forward_winograd(Exec& exec, const float* w, const float* b, float* y, std::size_t n,
                        bool relu);
  void backward_winograd(Exec& exec, const float* w, const float* dy, const float* relu_y,
                         float* dw, float* db, float* dx, std::size_t n, bool accumulate);

  ConvGeometry g_;
  Algorithm algorithm_;
  std::size_t m_ = 0;  // Winograd output tile side (2 for 5x5, 4 for 3x3)
  std::size_t tiles_y_ = 0, tiles_x_ = 0;
  std::size_t pad_h_ = 0, pad_w_ = 0;  // padded input plane
  std::size_t capacity_ = 0;           // samples the per-batch buffers hold
  FloatBuffer xp_;                     // padded input [n][pad_h][pad_w][Ci], borders zero
  FloatBuffer dyp_;    // direct: masked dy, padded by k-1-p [n][..][..][Co]; zero borders
  FloatBuffer wpack_;  // packed weights for the forward GEMM (Winograd: read by backward too)
  FloatBuffer bias_;   // bias padded to whole 16-column panels
  std::vector<std::int32_t> offsets_;      // direct: input offset of each (ky, kx, ci) tap
  std::vector<std::int32_t> offsets_t_;    // direct: dy offset of each (ky, kx, co) tap
  std::vector<std::int32_t> positions_;    // direct: input offset of each output position
  std::vector<std::int32_t> positions_t_;  // direct: dy offset of each input position
  std::shared_ptr<NhwcScratch> scratch_;
  MemoryTracker* tracker_ = nullptr;
};

}  // namespace cohort::kernels::cpu
