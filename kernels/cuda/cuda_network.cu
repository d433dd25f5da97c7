// The CUDA implementation of Network: the same ops as cpu/cpu_network.cc, with cuBLAS GEMMs and
// the kernels of cuda_kernels.cu, all on one stream per network.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "../check.h"
#include "../memory_kinds.h"
#include "../random.h"
#include "cohort/core/buffer.h"
#include "cohort/kernels/loss.h"
#include "cohort/kernels/optimizer.h"
#include "cuda_backend.h"
#include "cuda_kernels.h"
#include "cuda_util.h"

namespace cohort::kernels::cuda {
namespace {

// im2col scratch per chunk of samples: 32 Mi floats (128 MiB) bounds memory for large images
// and batches while leaving every GEMM big enough to fill the GPU.
constexpr std::size_t kColsBudget = std::size_t{1} << 25;

int to_int(std::size_t v) {
  if (v > static_cast<std::size_t>(INT32_MAX)) throw KernelError("CUDA backend: size exceeds 2^31");
  return static_cast<int>(v);
}

Activation activation_of(LayerKind kind) {
  switch (kind) {
    case LayerKind::kTanh: return Activation::kTanh;
    case LayerKind::kSigmoid: return Activation::kSigmoid;
    case LayerKind::kGelu: return Activation::kGelu;
    default: throw KernelError("CUDA backend: not an elementwise activation");
  }
}

// Row-major C[m, n] = op(A)[m, k] * op(B)[k, n] + beta * C, where lda/ldb/ldc are the row strides
// of the stored matrices. cuBLAS is column-major, so compute C^T = op(B)^T op(A)^T.
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, const float* a,
          int lda, const float* b, int ldb, float* c, int ldc, float beta) {
  const float one = 1.0f;
  COHORT_CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, b, ldb, a,
                                  lda, &beta, c, ldc));
}

struct Op {
  const LayerSpec* layer = nullptr;
  std::size_t index = 0;
  bool relu = false;
  ConvShape conv{};  // conv2d; a projecting residual_end: its 1x1 convolution of the skip
  PoolShape pool{};  // maxpool2d, avgpool2d
  std::size_t in_size = 0;
  std::size_t out_size = 0;
  std::size_t partner = 0;    // residual_begin, residual_end: the op of the block's other end
  std::size_t skip_size = 0;  // residual_end: floats per sample of the block's input
};

ConvShape conv_shape(const LayerSpec& l) {
  return {to_int(l.input.channels), to_int(l.input.height),
          to_int(l.input.width),    to_int(l.out),
          to_int(l.kernel),         to_int(l.stride),
          to_int(l.padding),        to_int(l.output.height),
          to_int(l.output.width)};
}

// A projecting residual_end's shortcut: a 1x1 convolution of the block's input `skip`.
ConvShape projection_shape(const LayerSpec& l, const Shape& skip) {
  return {to_int(skip.channels),
          to_int(skip.height),
          to_int(skip.width),
          to_int(l.out),
          1,
          to_int(l.stride),
          0,
          to_int(l.output.height),
          to_int(l.output.width)};
}

PoolShape pool_shape(const LayerSpec& l) {
  return {to_int(l.input.channels), to_int(l.input.height), to_int(l.input.width),
          to_int(l.kernel),         to_int(l.stride),       to_int(l.output.height),
          to_int(l.output.width)};
}

class CudaNetwork final : public Network {
 public:
  CudaNetwork(const NetworkSpec& spec, int ordinal) : Network(spec), ordinal_(ordinal) {
    if (spec.layers().empty()) throw KernelError("network has no layers");
    if (spec.open_blocks() > 0) {
      throw KernelError(std::to_string(spec.open_blocks()) + " residual block(s) not closed");
    }
    DeviceGuard guard(ordinal_);
    stream_ = std::make_unique<Stream>();
    blas_ = std::make_unique<CublasHandle>(stream_->get());
    build_ops();
    outputs_.resize(ops_.size());
    masks_.resize(ops_.size());
    argmax_.resize(ops_.size());
    stats_.resize(ops_.size());
    skip_grads_.resize(ops_.size());
    out_ptrs_.resize(ops_.size());
    // Every device buffer counts into a kind (cuBLAS's own workspace is not counted).
    params_.set_tracker(&memory_.parameters);
    grads_.set_tracker(&memory_.gradients);
    grad_sum_.set_tracker(&memory_.gradients);
    optimizer_state_.set_tracker(&memory_.optimizer);
    for (auto* b : {&input_, &grad_a_, &grad_b_, &losses_}) b->set_tracker(&memory_.activations);
    labels_.set_tracker(&memory_.activations);
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      outputs_[i].set_tracker(&memory_.activations);
      masks_[i].set_tracker(&memory_.activations);
      argmax_[i].set_tracker(&memory_.activations);
      stats_[i].set_tracker(&memory_.activations);
      skip_grads_[i].set_tracker(&memory_.activations);
      // A batchnorm's batch statistics for its backward, and the backward's (batchnorm_forward).
      if (ops_[i].layer->kind == LayerKind::kBatchNorm) stats_[i].reset(4 * ops_[i].layer->out);
    }
    for (auto* b : {&cols_, &dcols_, &result_, &buffer_save_}) b->set_tracker(&memory_.workspace);
    std::size_t buffer_floats = 0;
    for (const LayerSpec& l : this->spec().layers()) buffer_floats += l.buffer_count;
    buffer_save_.reset(buffer_floats);
    const std::size_t count = parameter_count();
    params_.reset(count);
    grads_.reset(count);
    params_host_ = FloatBuffer(count);
    grads_host_ = FloatBuffer(count);
    if (count > 0) {
      COHORT_CUDA_CHECK(cudaMemsetAsync(params_.data(), 0, count * sizeof(float), stream()));
      COHORT_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, count * sizeof(float), stream()));
    }
    stream_->synchronize();
  }

  ~CudaNetwork() override {
    // Buffers free on destruction; make sure no queued kernel still uses them.
    if (stream_) cudaStreamSynchronize(stream_->get());
  }

  std::string device_name() const override { return "cuda:" + std::to_string(ordinal_); }

  void init(std::uint64_t seed) override {
    DeviceGuard guard(ordinal_);
    spec().initialize(seed, params_host_.span());
    copy_to_device(params_.data(), params_host_.data(), parameter_count());
    grads_host_.fill(0.0f);
    copy_to_device(grads_.data(), grads_host_.data(), parameter_count());
    stream_->synchronize();
    params_host_valid_ = grads_host_valid_ = true;
    params_host_dirty_ = grads_host_dirty_ = false;
    set_seed(seed);
    reset_optimizer_state();
  }

  void set_seed(std::uint64_t seed) override {
    seed_ = seed;
    dropout_calls_ = 0;
  }

  std::span<float> parameters() override {
    download_params();
    params_host_dirty_ = true;
    return params_host_.span();
  }
  std::span<const float> parameters() const override {
    const_cast<CudaNetwork*>(this)->download_params();
    return params_host_.span();
  }
  std::span<float> gradients() override {
    download_grads();
    grads_host_dirty_ = true;
    return grads_host_.span();
  }
  std::span<const float> gradients() const override {
    const_cast<CudaNetwork*>(this)->download_grads();
    return grads_host_.span();
  }

  std::span<const float> forward(std::span<const float> input, std::size_t batch,
                                 bool training) override {
    DeviceGuard guard(ordinal_);
    const float* logits = forward_device(input, batch, training);
    const std::size_t count = batch * output_size();
    COHORT_CUDA_CHECK(cudaMemcpyAsync(logits_host_.data(), logits, count * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream()));
    stream_->synchronize();
    return logits_host_.span().subspan(0, count);
  }

  void backward(std::span<const float> dlogits) override {
    DeviceGuard guard(ordinal_);
    if (!trained_forward_) throw KernelError("backward: needs a preceding training forward");
    detail::check_size("backward dlogits", dlogits.size(), batch_ * output_size());
    copy_to_device(grad_a_.data(), dlogits.data(), dlogits.size());
    backward_device();
    stream_->synchronize();
  }

  void set_optimizer(const OptimizerOptions& options) override {
    validate(options);
    DeviceGuard guard(ordinal_);
    optimizer_ = options;
    optimizer_state_.reset(parameter_count() * state_floats_per_parameter(options));
    reset_optimizer_state();
  }

  void set_learning_rate(float learning_rate) override {
    if (!optimizer_) throw KernelError("set_learning_rate: no optimizer set");
    OptimizerOptions next = *optimizer_;
    next.learning_rate = learning_rate;
    validate(next);
    optimizer_ = next;
  }

  void reset_optimizer_state() override {
    DeviceGuard guard(ordinal_);
    if (optimizer_state_.size() > 0) {
      COHORT_CUDA_CHECK(cudaMemsetAsync(optimizer_state_.data(), 0,
                                        optimizer_state_.size() * sizeof(float), stream()));
      stream_->synchronize();
    }
    optimizer_steps_ = 0;
  }

  void step() override {
    if (!optimizer_) throw KernelError("step: no optimizer set (call set_optimizer first)");
    DeviceGuard guard(ordinal_);
    upload_dirty();
    step_device();
    stream_->synchronize();
  }

  float train_step(std::span<const float> input, std::span<const std::int32_t> labels,
                   std::size_t batch) override {
    if (!optimizer_) throw KernelError("train_step: no optimizer set (call set_optimizer first)");
    return loss_and_gradients(input, labels, batch, /*step=*/true);
  }

  float compute_gradients(std::span<const float> input, std::span<const std::int32_t> labels,
                          std::size_t batch) override {
    return loss_and_gradients(input, labels, batch, /*step=*/false);
  }

  void set_micro_batch(std::size_t m) override { micro_batch_ = m; }
  std::size_t micro_batch() const override { return micro_batch_; }

  MemoryReport memory() const override { return memory_.report(); }
  void set_memory_limit(std::size_t bytes) override { memory_.set_limit(bytes); }
  void reset_memory_peak() override { memory_.reset_peak(); }

  Evaluation evaluate(std::span<const float> input, std::span<const std::int32_t> labels,
                      std::size_t batch) override {
    detail::check_size("evaluate labels", labels.size(), batch);
    if (batch == 0) throw KernelError("evaluate: empty batch");
    const std::size_t d = spec().input_shape().size();
    detail::check_size("evaluate input", input.size(), batch * d);
    const std::size_t m = micro_batch_ == 0 ? batch : std::min(micro_batch_, batch);
    Evaluation e{.count = batch};
    for (std::size_t first = 0; first < batch; first += m) {
      const std::size_t b = std::min(m, batch - first);
      const auto y = labels.subspan(first, b);
      const std::span<const float> logits =
          forward(input.subspan(first * d, b * d), b, /*training=*/false);
      const float loss = kernels::softmax_cross_entropy(logits, y, output_size());
      e.loss_sum += static_cast<double>(loss) * static_cast<double>(b);
      e.correct += kernels::count_correct(logits, y, output_size());
    }
    return e;
  }

 private:
  // One op per layer but flatten (which moves no data) and a ReLU directly after a linear or
  // conv2d layer (fused into it). The ops point into the network's own copy of the spec, not the
  // caller's (which may be a temporary).
  void build_ops() {
    const auto layers = spec().layers();
    std::vector<std::size_t> op_of_layer(layers.size(), 0);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const LayerSpec& l = layers[i];
      if (l.kind == LayerKind::kFlatten) continue;
      if (l.kind == LayerKind::kRelu && !ops_.empty() && !ops_.back().relu &&
          (ops_.back().layer->kind == LayerKind::kLinear ||
           ops_.back().layer->kind == LayerKind::kConv2d)) {
        ops_.back().relu = true;
        continue;
      }
      Op op{.layer = &l, .index = i, .in_size = l.input.size(), .out_size = l.output.size()};
      switch (l.kind) {
        case LayerKind::kConv2d: op.conv = conv_shape(l); break;
        case LayerKind::kMaxPool2d:
        case LayerKind::kAvgPool2d: op.pool = pool_shape(l); break;
        case LayerKind::kResidualEnd: {
          // Blocks are closed in order, so the begin's op exists; it learns its end here.
          const Shape& skip = layers[l.partner].input;
          op.partner = op_of_layer[l.partner];
          op.skip_size = skip.size();
          if (l.weight_count > 0) op.conv = projection_shape(l, skip);
          ops_[op.partner].partner = ops_.size();
          break;
        }
        default: break;
      }
      op_of_layer[i] = ops_.size();
      ops_.push_back(op);
    }
  }

  // forward(training) + mean softmax cross-entropy + backward (+ step); returns the mean loss.
  // With a micro-batch m set, the batch runs as micro-batches of at most m samples: each one's
  // logit gradients are scaled by b / batch, its parameter gradients summed into grad_sum_ (one
  // more gradient-sized buffer, unlike the CPU's in-place accumulation), and every micro-batch
  // draws its dropout masks from the step's stream at its samples' offsets. A batchnorm
  // normalises each micro-batch with its own statistics and moves the running ones once per
  // micro-batch, as the CPU does.
  float loss_and_gradients(std::span<const float> input, std::span<const std::int32_t> labels,
                           std::size_t batch, bool step) {
    detail::check_size("train_step labels", labels.size(), batch);
    if (batch == 0) throw KernelError("train_step: empty batch");
    check_labels(labels);
    DeviceGuard guard(ordinal_);
    const std::size_t d = spec().input_shape().size(), count = parameter_count();
    detail::check_size("train_step input", input.size(), batch * d);
    const std::size_t m = micro_batch_ == 0 ? batch : std::min(micro_batch_, batch);
    if (m < batch) grad_sum_.reserve(count);
    const std::uint64_t stream_index = dropout_calls_;
    double total = 0.0;
    for (std::size_t first = 0; first < batch; first += m) {
      const std::size_t b = std::min(m, batch - first);
      dropout_calls_ = stream_index;  // every micro-batch of the step draws from its stream
      first_sample_ = first;
      const float* logits = forward_device(input.subspan(first * d, b * d), b, /*training=*/true);
      copy_to_device(labels_.data(), labels.data() + first, b);
      softmax_cross_entropy(logits, labels_.data(), losses_.data(), grad_a_.data(), to_int(b),
                            to_int(output_size()), stream());
      if (m < batch) {  // d(mean over the batch) = (b / batch) d(mean over the micro-batch)
        const float scale = static_cast<float>(b) / static_cast<float>(batch);
        COHORT_CUBLAS_CHECK(
            cublasSscal(blas_->get(), to_int(b * output_size()), &scale, grad_a_.data(), 1));
      }
      backward_device();
      if (m < batch && count > 0) {
        if (first == 0) {
          COHORT_CUDA_CHECK(cudaMemcpyAsync(grad_sum_.data(), grads_.data(), count * sizeof(float),
                                            cudaMemcpyDeviceToDevice, stream()));
        } else {
          const float one = 1.0f;
          COHORT_CUBLAS_CHECK(cublasSaxpy(blas_->get(), to_int(count), &one, grads_.data(), 1,
                                          grad_sum_.data(), 1));
        }
      }
      COHORT_CUDA_CHECK(cudaMemcpyAsync(losses_host_.data(), losses_.data(), b * sizeof(float),
                                        cudaMemcpyDeviceToHost, stream()));
      stream_->synchronize();
      for (std::size_t i = 0; i < b; ++i) total += losses_host_[i];
    }
    first_sample_ = 0;
    dropout_calls_ = stream_index + 1;
    if (m < batch && count > 0) {
      COHORT_CUDA_CHECK(cudaMemcpyAsync(grads_.data(), grad_sum_.data(), count * sizeof(float),
                                        cudaMemcpyDeviceToDevice, stream()));
    }
    if (step) step_device();
    stream_->synchronize();
    return static_cast<float>(total / static_cast<double>(batch));
  }

  cudaStream_t stream() const { return stream_->get(); }

  void copy_to_device(void* dst, const void* src, std::size_t count_floats) {
    if (count_floats == 0) return;
    COHORT_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, count_floats * sizeof(float), cudaMemcpyHostToDevice, stream()));
  }

  void check_labels(std::span<const std::int32_t> labels) const {
    for (const std::int32_t label : labels) {
      if (label < 0 || static_cast<std::size_t>(label) >= output_size()) {
        throw KernelError("label " + std::to_string(label) + " outside [0, " +
                          std::to_string(output_size()) + ")");
      }
    }
  }

  void download_params() {
    if (params_host_valid_) return;
    DeviceGuard guard(ordinal_);
    COHORT_CUDA_CHECK(cudaMemcpyAsync(params_host_.data(), params_.data(),
                                      parameter_count() * sizeof(float), cudaMemcpyDeviceToHost,
                                      stream()));
    stream_->synchronize();
    params_host_valid_ = true;
  }

  void download_grads() {
    if (grads_host_valid_) return;
    DeviceGuard guard(ordinal_);
    COHORT_CUDA_CHECK(cudaMemcpyAsync(grads_host_.data(), grads_.data(),
                                      parameter_count() * sizeof(float), cudaMemcpyDeviceToHost,
                                      stream()));
    stream_->synchronize();
    grads_host_valid_ = true;
  }

  // Pushes host edits made through mutable spans before the device reads the buffers.
  void upload_dirty() {
    if (params_host_dirty_) {
      copy_to_device(params_.data(), params_host_.data(), parameter_count());
      params_host_dirty_ = false;
    }
    if (grads_host_dirty_) {
      copy_to_device(grads_.data(), grads_host_.data(), parameter_count());
      grads_host_dirty_ = false;
    }
  }

  void reserve(std::size_t batch) {
    if (batch <= capacity_) return;
    std::size_t widest = output_size();
    std::size_t cols = 0, result = 0;
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      const Op& op = ops_[i];
      const LayerKind kind = op.layer->kind;
      widest = std::max({widest, op.in_size, op.out_size});
      // A residual_begin passes its input through: no output of its own.
      if (kind != LayerKind::kResidualBegin) outputs_[i].reset(batch * op.out_size);
      if (kind == LayerKind::kDropout) masks_[i].reset(batch * op.out_size);
      if (kind == LayerKind::kMaxPool2d) argmax_[i].reset(batch * op.out_size);
      // The skip's gradient, from the block's end until its begin adds it in.
      if (kind == LayerKind::kResidualEnd) skip_grads_[i].reset(batch * op.skip_size);
      if (kind == LayerKind::kConv2d || (kind == LayerKind::kResidualEnd && op.conv.kernel > 0)) {
        const std::size_t chunk = chunk_samples(op.conv, batch);
        cols = std::max(cols, chunk * op.conv.patch() * op.conv.positions());
        result = std::max(result, chunk * op.conv.out_channels * op.conv.positions());
      }
    }
    input_.reset(batch * spec().input_shape().size());
    grad_a_.reset(batch * widest);
    grad_b_.reset(batch * widest);
    cols_.reset(cols);
    dcols_.reset(cols);
    result_.reset(result);
    labels_.reset(batch);
    losses_.reset(batch);
    logits_host_ = FloatBuffer(batch * output_size());
    losses_host_ = FloatBuffer(batch);
    capacity_ = batch;
  }

  static std::size_t chunk_samples(const ConvShape& g, std::size_t batch) {
    const std::size_t per_sample = static_cast<std::size_t>(g.patch()) * g.positions();
    return std::clamp<std::size_t>(kColsBudget / std::max<std::size_t>(per_sample, 1), 1, batch);
  }

  const float* forward_device(std::span<const float> input, std::size_t batch, bool training) {
    if (batch == 0) throw KernelError("forward: empty batch");
    detail::check_size("forward input", input.size(), batch * spec().input_shape().size());
    reserve(batch);
    upload_dirty();
    copy_to_device(input_.data(), input.data(), input.size());
    const float* x = input_.data();
    for (std::size_t i = 0; i < ops_.size(); ++i) x = forward_op(i, x, batch, training);
    if (training) ++dropout_calls_;
    // A training forward moved the batchnorm running statistics in the parameter vector.
    if (training && buffer_save_.size() > 0) params_host_valid_ = false;
    batch_ = batch;
    trained_forward_ = training;
    return x;
  }

  // Op i on x (its input); returns its output, also left in out_ptrs_[i].
  const float* forward_op(std::size_t i, const float* x, std::size_t batch, bool training) {
    const Op& op = ops_[i];
    const LayerSpec& l = *op.layer;
    float* y = outputs_[i].data();
    const float* w = params_.data() + l.weight_offset;
    const float* b = params_.data() + l.bias_offset;
    const int n = to_int(batch);
    const std::size_t count = batch * op.out_size;
    const int plane = to_int(l.input.height * l.input.width);
    cudaStream_t s = stream();
    switch (l.kind) {
      case LayerKind::kLinear:
        gemm(blas_->get(), false, true, n, to_int(l.out), to_int(l.in), x, to_int(l.in), w,
             to_int(l.in), y, to_int(l.out), 0.0f);
        add_bias_rows(y, b, n, to_int(l.out), op.relu, s);
        break;
      case LayerKind::kConv2d: conv_forward(op.conv, x, w, b, y, batch, op.relu); break;
      case LayerKind::kRelu: relu_forward(x, y, count, s); break;
      case LayerKind::kTanh:
      case LayerKind::kSigmoid:
      case LayerKind::kGelu: activation_forward(activation_of(l.kind), x, y, count, s); break;
      case LayerKind::kMaxPool2d: maxpool_forward(x, y, argmax_[i].data(), n, op.pool, s); break;
      case LayerKind::kAvgPool2d: avgpool_forward(x, y, n, op.pool, s); break;
      case LayerKind::kGlobalAvgPool:
        global_avgpool_forward(x, y, batch * l.input.channels, plane, s);
        break;
      case LayerKind::kBatchNorm:
        batchnorm_forward(x, y, w, b, params_.data() + l.buffer_offset, stats_[i].data(), n,
                          to_int(l.out), plane, training, s);
        break;
      case LayerKind::kDropout:
        if (training && l.drop_probability > 0.0f) {
          dropout_forward(x, y, masks_[i].data(), count, l.drop_probability,
                          detail::dropout_key(seed_, dropout_calls_, op.index),
                          first_sample_ * op.out_size, s);
        } else {
          y = const_cast<float*>(x);  // identity
        }
        break;
      case LayerKind::kResidualBegin: y = const_cast<float*>(x); break;  // identity
      case LayerKind::kResidualEnd: {
        const float* skip = out_ptrs_[op.partner];  // the begin's output: the block's input
        if (l.weight_count > 0) {
          conv_forward(op.conv, skip, w, b, y, batch, /*relu=*/false);
          add(y, x, y, count, s);
        } else {
          add(x, skip, y, count, s);
        }
        break;
      }
      case LayerKind::kFlatten: break;
    }
    out_ptrs_[i] = y;
    return y;
  }

  void conv_forward(const ConvShape& g, const float* x, const float* w, const float* b, float* y,
                    std::size_t batch, bool relu) {
    const std::size_t chunk = chunk_samples(g, batch);
    const std::size_t in_size = static_cast<std::size_t>(g.in_channels) * g.height * g.width;
    const std::size_t out_size = static_cast<std::size_t>(g.out_channels) * g.positions();
    for (std::size_t c0 = 0; c0 < batch; c0 += chunk) {
      const int m = to_int(std::min(chunk, batch - c0));
      const int ld = m * g.positions();
      im2col(x + c0 * in_size, cols_.data(), m, g, stream());
      gemm(blas_->get(), false, false, g.out_channels, ld, g.patch(), w, g.patch(), cols_.data(),
           ld, result_.data(), ld, 0.0f);
      scatter_nchw(result_.data(), b, y + c0 * out_size, m, g.out_channels, g.positions(), relu,
                   stream());
    }
  }

  void conv_backward(const ConvShape& g, const float* x, const float* w, const float* dy,
                     const float* relu_y, float* dw, float* db, float* dx, std::size_t batch) {
    const std::size_t chunk = chunk_samples(g, batch);
    const std::size_t in_size = static_cast<std::size_t>(g.in_channels) * g.height * g.width;
    const std::size_t out_size = static_cast<std::size_t>(g.out_channels) * g.positions();
    for (std::size_t c0 = 0; c0 < batch; c0 += chunk) {
      const int m = to_int(std::min(chunk, batch - c0));
      const int ld = m * g.positions();
      const bool first = c0 == 0;
      gather_nchw(dy + c0 * out_size, relu_y != nullptr ? relu_y + c0 * out_size : nullptr,
                  result_.data(), m, g.out_channels, g.positions(), stream());
      im2col(x + c0 * in_size, cols_.data(), m, g, stream());
      gemm(blas_->get(), false, true, g.out_channels, g.patch(), ld, result_.data(), ld,
           cols_.data(), ld, dw, g.patch(), first ? 0.0f : 1.0f);
      row_sums(result_.data(), db, g.out_channels, ld, !first, stream());
      if (dx != nullptr) {
        gemm(blas_->get(), true, false, g.patch(), ld, g.out_channels, w, g.patch(), result_.data(),
             ld, dcols_.data(), ld, 0.0f);
        col2im(dcols_.data(), dx + c0 * in_size, m, g, stream());
      }
    }
  }

  // Gradient of the logits is in grad_a_.
  void backward_device() {
    upload_dirty();
    float* dy = grad_a_.data();
    float* dx = grad_b_.data();
    for (std::size_t i = ops_.size(); i-- > 0;) backward_op(i, dy, dx);
    grads_host_valid_ = false;
  }

  // Op i's backward from dy (its output's gradient): leaves its input's gradient in dy, swapping
  // dy and dx where it wrote dx. Op 0 writes no input gradient.
  void backward_op(std::size_t i, float*& dy, float*& dx) {
    const Op& op = ops_[i];
    const LayerSpec& l = *op.layer;
    const float* x = i == 0 ? input_.data() : out_ptrs_[i - 1];
    const float* y = out_ptrs_[i];
    float* want_dx = i == 0 ? nullptr : dx;
    const float* w = params_.data() + l.weight_offset;
    float* dw = grads_.data() + l.weight_offset;
    float* db = grads_.data() + l.bias_offset;
    const int n = to_int(batch_);
    const int plane = to_int(l.input.height * l.input.width);
    const std::size_t count = batch_ * op.out_size;
    cudaStream_t s = stream();
    switch (l.kind) {
      case LayerKind::kLinear:
        if (op.relu) relu_backward(y, dy, dy, count, s);
        gemm(blas_->get(), true, false, to_int(l.out), to_int(l.in), n, dy, to_int(l.out), x,
             to_int(l.in), dw, to_int(l.in), 0.0f);
        column_sums(dy, db, n, to_int(l.out), s);
        if (want_dx != nullptr) {
          gemm(blas_->get(), false, false, n, to_int(l.in), to_int(l.out), dy, to_int(l.out), w,
               to_int(l.in), want_dx, to_int(l.in), 0.0f);
        }
        break;
      case LayerKind::kConv2d:
        conv_backward(op.conv, x, w, dy, op.relu ? y : nullptr, dw, db, want_dx, batch_);
        break;
      case LayerKind::kRelu:
        if (want_dx != nullptr) relu_backward(y, dy, want_dx, count, s);
        break;
      case LayerKind::kTanh:
      case LayerKind::kSigmoid:
      case LayerKind::kGelu:
        if (want_dx != nullptr)
          activation_backward(activation_of(l.kind), x, y, dy, want_dx, count, s);
        break;
      case LayerKind::kMaxPool2d:
        if (want_dx != nullptr) maxpool_backward(dy, argmax_[i].data(), want_dx, n, op.pool, s);
        break;
      case LayerKind::kAvgPool2d:
        if (want_dx != nullptr) avgpool_backward(dy, want_dx, n, op.pool, s);
        break;
      case LayerKind::kGlobalAvgPool:
        if (want_dx != nullptr)
          global_avgpool_backward(dy, want_dx, batch_ * l.input.channels, plane, s);
        break;
      case LayerKind::kBatchNorm:
        batchnorm_backward(x, dy, w, stats_[i].data(), dw, db, want_dx, n, to_int(l.out), plane, s);
        // The running statistics are buffers: their gradient is zero.
        COHORT_CUDA_CHECK(
            cudaMemsetAsync(grads_.data() + l.buffer_offset, 0, l.buffer_count * sizeof(float), s));
        break;
      case LayerKind::kDropout:
        if (want_dx == nullptr) break;
        if (l.drop_probability > 0.0f) {
          dropout_backward(dy, masks_[i].data(), want_dx, count, s);
        } else {
          COHORT_CUDA_CHECK(
              cudaMemcpyAsync(want_dx, dy, count * sizeof(float), cudaMemcpyDeviceToDevice, s));
        }
        break;
      case LayerKind::kResidualEnd: residual_end_backward(op, i, dy); return;
      case LayerKind::kResidualBegin:
        // The main branch's gradient (in dy) plus the skip's, which the block's end kept.
        if (want_dx != nullptr) add(dy, skip_grads_[op.partner].data(), dy, count, s);
        return;
      case LayerKind::kFlatten: break;
    }
    std::swap(dx, dy);
  }

  // The main branch's gradient is dy itself (left in place); the skip's goes to skip_grads_[i],
  // through the projection's backward (which writes its dw and db) when there is one.
  void residual_end_backward(const Op& op, std::size_t i, const float* dy) {
    const LayerSpec& l = *op.layer;
    float* dskip = skip_grads_[i].data();
    if (l.weight_count > 0) {
      conv_backward(op.conv, out_ptrs_[op.partner], params_.data() + l.weight_offset, dy, nullptr,
                    grads_.data() + l.weight_offset, grads_.data() + l.bias_offset, dskip, batch_);
    } else {
      COHORT_CUDA_CHECK(cudaMemcpyAsync(dskip, dy, batch_ * op.skip_size * sizeof(float),
                                        cudaMemcpyDeviceToDevice, stream()));
    }
  }

  void step_device() {
    const OptimizerOptions& o = *optimizer_;
    const std::size_t count = parameter_count();
    if (count == 0) return;
    const std::uint64_t t = ++optimizer_steps_;
    copy_buffers(/*to_save=*/true);
    if (o.kind == OptimizerKind::kSgd) {
      sgd_step(params_.data(), grads_.data(), o.momentum > 0.0f ? optimizer_state_.data() : nullptr,
               count, {o.learning_rate, o.momentum, o.weight_decay, o.nesterov}, stream());
    } else {
      // Host-side scalars exactly as adam_step() in optimizer.cc computes them.
      const double td = static_cast<double>(t);
      const bool decoupled = o.kind == OptimizerKind::kAdamW;
      const AdamArgs args{.step_size = static_cast<float>(
                              o.learning_rate / (1.0 - std::pow(static_cast<double>(o.beta1), td))),
                          .inv_sqrt_bc2 = static_cast<float>(
                              1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), td))),
                          .beta1 = o.beta1,
                          .beta2 = o.beta2,
                          .epsilon = o.epsilon,
                          .l2 = decoupled ? 0.0f : o.weight_decay,
                          .shrink = decoupled ? 1.0f - o.learning_rate * o.weight_decay : 1.0f};
      adam_step(params_.data(), grads_.data(), optimizer_state_.data(),
                optimizer_state_.data() + count, count, args, stream());
    }
    copy_buffers(/*to_save=*/false);
    params_host_valid_ = false;
  }

  // Copies the batchnorm running statistics from the parameters into buffer_save_ (to_save), or
  // back: around an optimizer step, which would otherwise move them (weight decay, Adam's
  // moments), so that a step leaves them as they were. They are small (2 floats per channel).
  void copy_buffers(bool to_save) {
    std::size_t at = 0;
    for (const LayerSpec& l : spec().layers()) {
      if (l.buffer_count == 0) continue;
      float* live = params_.data() + l.buffer_offset;
      float* saved = buffer_save_.data() + at;
      COHORT_CUDA_CHECK(cudaMemcpyAsync(to_save ? saved : live, to_save ? live : saved,
                                        l.buffer_count * sizeof(float), cudaMemcpyDeviceToDevice,
                                        stream()));
      at += l.buffer_count;
    }
  }

  // First: the trackers outlive every buffer below.
  detail::MemoryKinds memory_;

  int ordinal_;
  std::unique_ptr<Stream> stream_;      // created after selecting the device
  std::unique_ptr<CublasHandle> blas_;  // bound to stream_
  std::vector<Op> ops_;

  DeviceBuffer<float> params_, grads_, optimizer_state_;
  DeviceBuffer<float> grad_sum_;  // micro-batches: the step's gradient, summed
  // Host mirrors (see the coherence contract in network.h).
  FloatBuffer params_host_, grads_host_;
  bool params_host_valid_ = true, params_host_dirty_ = false;
  bool grads_host_valid_ = true, grads_host_dirty_ = false;

  std::size_t capacity_ = 0;
  DeviceBuffer<float> input_;
  std::vector<DeviceBuffer<float>> outputs_, masks_;
  std::vector<DeviceBuffer<float>> stats_;       // batchnorm ops: see batchnorm_forward()
  std::vector<DeviceBuffer<float>> skip_grads_;  // residual_end ops: the skip's gradient
  DeviceBuffer<float> buffer_save_;              // the running statistics, across an optimizer step
  std::vector<DeviceBuffer<std::int32_t>> argmax_;
  DeviceBuffer<float> grad_a_, grad_b_, cols_, dcols_, result_, losses_;
  DeviceBuffer<std::int32_t> labels_;
  FloatBuffer logits_host_, losses_host_;

  std::vector<const float*> out_ptrs_;
  std::size_t batch_ = 0;
  bool trained_forward_ = false;
  std::uint64_t seed_ = 0;
  std::uint64_t dropout_calls_ = 0;
  std::size_t first_sample_ = 0;  // of the current micro-batch in the step's dropout stream
  std::size_t micro_batch_ = 0;   // 0: whole batches

  std::optional<OptimizerOptions> optimizer_;
  std::uint64_t optimizer_steps_ = 0;
};

}  // namespace

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls are not poisoned
    return 0;
  }
  return count;
}

std::size_t used_bytes(int ordinal) noexcept {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(ordinal) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  std::size_t free = 0, total = 0;
  const bool ok = cudaMemGetInfo(&free, &total) == cudaSuccess;
  cudaSetDevice(previous);
  if (!ok) {
    cudaGetLastError();
    return 0;
  }
  return total - free;
}

std::string describe(int ordinal) {
  cudaDeviceProp prop{};
  COHORT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  const double gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  return "cuda:" + std::to_string(ordinal) + " " + prop.name + " (sm_" +
         std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(static_cast<int>(std::lround(gib))) + " GiB)";
}

std::unique_ptr<Network> make_cuda_network(const NetworkSpec& spec, int ordinal) {
  return std::make_unique<CudaNetwork>(spec, ordinal);
}

}  // namespace cohort::kernels::cuda
