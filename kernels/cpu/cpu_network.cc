#include "cpu_network.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "../check.h"
#include "../memory_kinds.h"
#include "../parallel.h"
#include "../random.h"
#include "cohort/core/buffer.h"
#include "cohort/core/error.h"
#include "cohort/core/thread_pool.h"
#include "cohort/kernels/loss.h"
#include "cohort/kernels/optimizer.h"
#include "layers.h"
#include "nhwc_conv.h"
#include "segments.h"

namespace cohort::kernels::cpu {
namespace {

// Optimizer steps are memory-bound: split only vectors big enough to amortise a hand-off.
constexpr std::size_t kOptimizerGrain = 1 << 16;

// One executed step: a layer, or a change of activation layout. Flatten and a ReLU that follows
// a linear or conv2d layer (fused into it) produce no op.
//
// Layouts: stride-1 convolutions run channels-last (NhwcConv), and so do the max-pool, ReLU
// and dropout-free stretches between them; linear, dropout (its mask is indexed in NCHW order,
// shared with CUDA) and the logits need NCHW. A kToNhwc / kToNchw op converts where the layout
// changes and the two layouts differ (more than one channel and more than one position); its
// backward converts the gradient back. Each op's gradient has its output's layout.
enum class OpKind { kLayer, kToNhwc, kToNchw };

struct Op {
  OpKind kind = OpKind::kLayer;
  const LayerSpec* layer = nullptr;  // kLayer only
  std::size_t index = 0;             // into spec.layers(), for dropout keys
  bool relu = false;                 // fused ReLU on the output
  bool nhwc = false;                 // layout of the output (and of its gradient)
  bool needs_dx = true;              // some earlier op has parameters, so backward must produce dx
  // A fused ReLU directly followed by a max-pool: the pool's backward applies the ReLU mask
  // (by its own output, the ReLU output it picked), so this op's backward reads no mask.
  bool relu_in_pool = false;
  ConvGeometry conv{};  // conv2d; residual_end: the projection (when it has one)
  PoolGeometry pool{};
  BatchNormGeometry norm{};
  std::size_t partner = 0;              // residual_begin, residual_end: the other end's op
  Shape shape{};                        // kToNhwc, kToNchw: the activation converted
  std::unique_ptr<NhwcConv> fast_conv;  // conv2d on the channels-last path
  std::size_t in_size = 0;              // floats per sample
  std::size_t out_size = 0;
};

class CpuNetwork final : public Network {
 public:
  CpuNetwork(const NetworkSpec& spec, ThreadPool* pool)
      : Network(spec),
        pool_(pool),
        workspace_(pool != nullptr ? pool->size() : 1, &memory_.workspace),
        exec_{pool, &workspace_},
        params_(spec.parameter_count(), &memory_.parameters),
        grads_(spec.parameter_count(), &memory_.gradients),
        optimizer_state_(0, &memory_.optimizer) {
    if (spec.layers().empty()) throw KernelError("network has no layers");
    // The ops point into the network's own copy of the spec, not the caller's (which may be a
    // temporary).
    const auto layers = this->spec().layers();
    std::vector<std::size_t> op_of(layers.size(), 0);  // a residual_begin's op
    bool nhwc = false;                                 // layout of the current activation
    const auto to_layout = [&](bool want, const Shape& shape) {
      if (nhwc == want) return;
      nhwc = want;
      if (shape.channels <= 1 || shape.height * shape.width <= 1) return;  // same bytes
      Op op;
      op.kind = want ? OpKind::kToNhwc : OpKind::kToNchw;
      op.nhwc = want;
      op.shape = shape;
      op.in_size = op.out_size = shape.size();
      ops_.push_back(std::move(op));
    };
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const LayerSpec& l = layers[i];
      if (l.kind == LayerKind::kFlatten) {
        to_layout(false, l.input);
        continue;
      }
      if (l.kind == LayerKind::kRelu && !ops_.empty() && ops_.back().layer != nullptr &&
          !ops_.back().relu &&
          (ops_.back().layer->kind == LayerKind::kLinear ||
           ops_.back().layer->kind == LayerKind::kConv2d)) {
        ops_.back().relu = true;
        continue;
      }
      Op op;
      op.layer = &l;
      op.index = i;
      op.in_size = l.input.size();
      op.out_size = l.output.size();
      switch (l.kind) {
        case LayerKind::kConv2d:
          op.conv = conv_geometry(l);
          if (NhwcConv::supports(op.conv)) {
            op.fast_conv = std::make_unique<NhwcConv>(op.conv, NhwcConv::choose(op.conv));
            op.fast_conv->set_tracker(&memory_.workspace);
            // Convolutions run one at a time: one scratch for all, not one per layer.
            if (nhwc_scratch_ == nullptr) nhwc_scratch_ = make_nhwc_scratch(&memory_.workspace);
            op.fast_conv->share_scratch(nhwc_scratch_);
          }
          to_layout(op.fast_conv != nullptr, l.input);
          break;
        case LayerKind::kMaxPool2d: op.pool = pool_geometry(l); break;
        case LayerKind::kAvgPool2d:
          op.pool = pool_geometry(l);
          to_layout(false, l.input);
          break;
        case LayerKind::kBatchNorm:
          op.norm = {l.input.channels, l.input.height * l.input.width, nhwc};
          break;
        case LayerKind::kResidualBegin:  // a projection shortcut runs NCHW
          if (layers[l.partner].weight_count > 0) to_layout(false, l.input);
          op_of[i] = ops_.size();
          break;
        case LayerKind::kResidualEnd: {
          const Op& begin = ops_[op_of[l.partner]];
          to_layout(begin.nhwc, l.input);  // the sum adds like to like
          op.partner = op_of[l.partner];
          ops_[op.partner].partner = ops_.size();
          const Shape skip = layers[l.partner].input;
          op.conv = {skip.channels, skip.height, skip.width,      l.out,         1,
                     l.stride,      0,           l.output.height, l.output.width};
          break;
        }
        case LayerKind::kGlobalAvgPool:
        case LayerKind::kLinear:
        case LayerKind::kDropout: to_layout(false, l.input); break;
        case LayerKind::kRelu:
        case LayerKind::kTanh:
        case LayerKind::kSigmoid:
        case LayerKind::kGelu:
        case LayerKind::kFlatten: break;
      }
      op.nhwc = nhwc;
      ops_.push_back(std::move(op));
    }
    to_layout(false, layers.back().output);
    for (std::size_t i = 1; i < ops_.size(); ++i) {
      if (ops_[i].layer != nullptr && ops_[i].layer->kind == LayerKind::kMaxPool2d &&
          ops_[i - 1].layer != nullptr && ops_[i - 1].relu) {
        ops_[i - 1].relu_in_pool = true;
      }
    }
    bool has_parameters = false;
    for (Op& op : ops_) {
      op.needs_dx = has_parameters;
      if (op.layer != nullptr && op.layer->weight_count > 0) has_parameters = true;
    }
    outputs_.resize(ops_.size());
    stats_.resize(ops_.size());
    skip_grads_.resize(ops_.size());
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      if (ops_[i].layer != nullptr && ops_[i].layer->kind == LayerKind::kBatchNorm) {
        stats_[i] = FloatBuffer(2 * ops_[i].norm.channels, &memory_.activations);
      }
    }
    for (const LayerView& v : this->spec().buffer_views()) buffers_.push_back(v);
    masks_.resize(ops_.size());
    argmax_.resize(ops_.size());
    out_ptrs_.resize(ops_.size());
    widest_ = output_size();
    // The activation gradients: each op's output's, and its input's where an earlier op needs it.
    for (const Op& op : ops_) {
      widest_ = std::max({widest_, op.out_size, op.needs_dx ? op.in_size : std::size_t{0}});
    }
  }

  std::string device_name() const override { return "cpu"; }

  void init(std::uint64_t seed) override {
    spec().initialize(seed, params_.span());
    grads_.fill(0.0f);
    set_seed(seed);
    reset_optimizer_state();
  }

  void set_seed(std::uint64_t seed) override {
    seed_ = seed;
    dropout_calls_ = 0;
  }

  std::span<float> parameters() override { return params_.span(); }
  std::span<const float> parameters() const override { return params_.span(); }
  std::span<float> gradients() override { return grads_.span(); }
  std::span<const float> gradients() const override { return grads_.span(); }

  std::span<const float> forward(std::span<const float> input, std::size_t batch,
                                 bool training) override {
    if (batch == 0) throw KernelError("forward: empty batch");
    detail::check_size("forward input", input.size(), batch * spec().input_shape().size());
    const float* x = input.data();
    if (training) {  // backward reads the input after the caller's buffer may be gone: copy it
      if (input_.size() < input.size()) {
        input_ = FloatBuffer();
        input_ = FloatBuffer(input.size(), &memory_.activations);
      }
      std::memcpy(input_.data(), input.data(), input.size_bytes());
      x = input_.data();
    }
    const std::span<const float> logits = run_forward(x, batch, training, 0);
    if (training) ++dropout_calls_;
    return logits;
  }

  float compute_gradients(std::span<const float> input, std::span<const std::int32_t> labels,
                          std::size_t batch) override {
    detail::check_size("compute_gradients labels", labels.size(), batch);
    const std::size_t c = output_size();
    return gradients_of(input, batch, [&](auto logits, std::size_t first, std::size_t b, auto d) {
      return softmax_cross_entropy(logits, labels.subspan(first, b), c, d);
    });
  }

  std::optional<float> compute_gradients_mse(std::span<const float> input,
                                             std::span<const float> targets,
                                             std::size_t batch) override {
    const std::size_t c = output_size();
    detail::check_size("compute_gradients_mse targets", targets.size(), batch * c);
    return gradients_of(input, batch, [&](auto outputs, std::size_t first, std::size_t b, auto d) {
      return mean_squared_error(outputs, targets.subspan(first * c, b * c), d);
    });
  }

  // A training step's micro-batch loop: forward, loss(outputs, first, count, dloss) -> its mean,
  // backward, parameter gradients added in place. Returns the batch's mean loss.
  template <class Loss>
  float gradients_of(std::span<const float> input, std::size_t batch, Loss&& loss) {
    if (batch == 0) throw KernelError("compute_gradients: empty batch");
    const std::size_t d = spec().input_shape().size(), c = output_size();
    detail::check_size("compute_gradients input", input.size(), batch * d);
    const std::size_t m = micro_batch_ == 0 ? batch : std::min(micro_batch_, batch);
    double loss_sum = 0.0;
    for (std::size_t first = 0; first < batch; first += m) {
      const std::size_t b = std::min(m, batch - first);
      // The input outlives backward (it is the caller's, for this call): no copy.
      const auto logits = run_forward(input.data() + first * d, b, /*training=*/true, first);
      const std::span<float> dlogits = dlogits_.span().subspan(0, b * c);
      loss_sum += static_cast<double>(loss(logits, first, b, dlogits)) * static_cast<double>(b);
      if (m < batch) {  // d(mean over the batch) = (b / batch) d(mean over the micro-batch)
        const float scale = static_cast<float>(b) / static_cast<float>(batch);
        for (float& g : dlogits) g *= scale;
      }
      run_backward(dlogits, /*accumulate=*/first > 0);  // later micro-batches add in place
    }
    ++dropout_calls_;  // one step: the micro-batches shared its dropout stream
    return static_cast<float>(loss_sum / static_cast<double>(batch));
  }

  void set_micro_batch(std::size_t m) override { micro_batch_ = m; }
  std::size_t micro_batch() const override { return micro_batch_; }

  void set_recompute(bool on) override {
    if (on == recompute_) return;
    if (on && segment_end_.empty()) plan_segments();
    recompute_ = on;
    // Every activation buffer is laid out anew at the next forward.
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      outputs_[i] = FloatBuffer();
      masks_[i] = FloatBuffer();
      argmax_[i] = FloatBuffer();
    }
    arena_ = FloatBuffer();
    output_capacity_ = training_capacity_ = 0;
    trained_forward_ = false;
  }
  bool recompute() const override { return recompute_; }

  MemoryReport memory() const override { return memory_.report(); }
  void set_memory_limit(std::size_t bytes) override { memory_.set_limit(bytes); }
  void reset_memory_peak() override { memory_.reset_peak(); }

  void backward(std::span<const float> dlogits) override {
    if (!trained_forward_) throw KernelError("backward: needs a preceding training forward");
    detail::check_size("backward dlogits", dlogits.size(), batch_ * output_size());
    run_backward(dlogits, /*accumulate=*/false);
  }

  // accumulate: parameter gradients are added into gradients() (a micro-batch after the first).
  // With recompute on, each segment but the last (whose activations the forward left in place)
  // is run forward again from its boundary before going back through it.
  void run_backward(std::span<const float> dlogits, bool accumulate) {
    float* dy = grad_a_.data();
    float* dx = grad_b_.data();
    std::memcpy(dy, dlogits.data(), dlogits.size_bytes());  // kernels may mask it in place
    const std::size_t segments = recompute_ ? segment_end_.size() : 1;
    std::size_t end = ops_.size();
    for (std::size_t s = segments; s-- > 0;) {
      const std::size_t begin = s == 0 ? 0 : segment_end_[s - 1];
      if (s + 1 < segments) {
        const float* x = begin == 0 ? input_ptr_ : out_ptrs_[begin - 1];
        recomputing_ = true;
        for (std::size_t i = begin; i < end; ++i) x = forward_op(i, x, batch_, true);
        recomputing_ = false;
      }
      for (std::size_t i = end; i-- > begin;) {
        if (!backward_op(i, dy, dx, accumulate)) return;  // nothing earlier has parameters
      }
      end = begin;
    }
  }

  // Op i's backward from dy (its output's gradient) into dx, then swaps the two so that dy holds
  // its input's gradient. False when no earlier op needs a gradient.
  bool backward_op(std::size_t i, float*& dy, float*& dx, bool accumulate) {
    Op& op = ops_[i];
    float* want_dx = op.needs_dx ? dx : nullptr;
    if (op.kind != OpKind::kLayer) {
      if (want_dx == nullptr) return false;
      const std::size_t plane = op.shape.height * op.shape.width;
      if (op.kind == OpKind::kToNhwc) {
        nhwc_to_nchw(exec_, dy, want_dx, batch_, op.shape.channels, plane);
      } else {
        nchw_to_nhwc(exec_, dy, want_dx, batch_, op.shape.channels, plane);
      }
      std::swap(dx, dy);
      return true;
    }
    const LayerSpec& l = *op.layer;
    const float* x = i == 0 ? input_ptr_ : out_ptrs_[i - 1];
    const float* y = out_ptrs_[i];
    const float* relu_y = op.relu && !op.relu_in_pool ? y : nullptr;
    const float* pool_y = i > 0 && ops_[i - 1].relu_in_pool ? y : nullptr;
    const float* w = params_.data() + l.weight_offset;
    float* dw = grads_.data() + l.weight_offset;
    float* db = grads_.data() + l.bias_offset;
    const std::size_t n = batch_;
    switch (l.kind) {
      case LayerKind::kLinear:
        linear_backward(exec_, x, w, dy, relu_y, dw, db, want_dx, n, l.in, l.out, accumulate);
        break;
      case LayerKind::kConv2d:
        if (op.fast_conv != nullptr) {
          op.fast_conv->backward(exec_, w, dy, relu_y, dw, db, want_dx, n, accumulate);
        } else {
          conv2d_backward(exec_, x, w, dy, relu_y, dw, db, want_dx, n, op.conv, accumulate);
        }
        break;
      case LayerKind::kRelu:
        if (want_dx != nullptr) relu_backward(y, dy, want_dx, n * op.out_size);
        break;
      case LayerKind::kTanh:
      case LayerKind::kSigmoid:
      case LayerKind::kGelu:
        if (want_dx != nullptr) activation_backward(l.kind, x, y, dy, want_dx, n * op.out_size);
        break;
      case LayerKind::kMaxPool2d:
        if (want_dx == nullptr) break;
        if (op.nhwc) {
          maxpool2d_backward_nhwc(exec_, dy, argmax(i), want_dx, n, op.pool, pool_y);
        } else {
          maxpool2d_backward(exec_, dy, argmax(i), want_dx, n, op.pool, pool_y);
        }
        break;
      case LayerKind::kDropout:
        if (want_dx == nullptr) break;
        if (l.drop_probability > 0.0f) {
          dropout_backward(dy, mask(i), want_dx, n * op.out_size);
        } else {
          std::memcpy(want_dx, dy, n * op.out_size * sizeof(float));
        }
        break;
      case LayerKind::kFlatten: break;
      default: block_backward(i, x, dy, want_dx, accumulate); break;
    }
    std::swap(dx, dy);
    return op.needs_dx;
  }

  // The backward of batchnorm, the pools and the residual ends (see backward_op).
  void block_backward(std::size_t i, const float* x, float* dy, float* want_dx, bool accumulate) {
    const Op& op = ops_[i];
    const LayerSpec& l = *op.layer;
    const std::size_t n = batch_;
    float* grads = grads_.data();
    switch (l.kind) {
      case LayerKind::kBatchNorm:
        batchnorm_backward(x, dy, params_.data() + l.weight_offset, stats_[i].data(),
                           grads + l.weight_offset, grads + l.bias_offset, want_dx, n, op.norm,
                           accumulate);
        if (!accumulate) std::fill_n(grads + l.buffer_offset, l.buffer_count, 0.0f);
        break;
      case LayerKind::kAvgPool2d:
        if (want_dx != nullptr) avgpool2d_backward(dy, want_dx, n, op.pool);
        break;
      case LayerKind::kGlobalAvgPool:
        if (want_dx != nullptr) {
          global_avgpool_backward(dy, want_dx, n, l.input.channels, l.input.height * l.input.width);
        }
        break;
      case LayerKind::kResidualEnd: {
        // The main branch gets dy; the shortcut's waits in skip_grads_[i] for residual_begin.
        float* skip_dx = ops_[op.partner].needs_dx ? skip_grads_[i].data() : nullptr;
        if (l.weight_count > 0) {
          const float* skip = out_ptrs_[op.partner];
          conv2d_backward(exec_, skip, params_.data() + l.weight_offset, dy, nullptr,
                          grads + l.weight_offset, grads + l.bias_offset, skip_dx, n, op.conv,
                          accumulate);
        } else if (skip_dx != nullptr) {
          std::memcpy(skip_dx, dy, n * op.out_size * sizeof(float));
        }
        if (want_dx != nullptr) std::memcpy(want_dx, dy, n * op.out_size * sizeof(float));
        break;
      }
      case LayerKind::kResidualBegin:
        if (want_dx != nullptr) {
          std::memcpy(want_dx, dy, n * op.out_size * sizeof(float));
          add_into(want_dx, skip_grads_[op.partner].data(), n * op.out_size);
        }
        break;
      default: throw KernelError("backward: unexpected layer kind");
    }
  }

  void set_optimizer(const OptimizerOptions& options) override {
    validate(options);
    optimizer_ = options;
    optimizer_state_ = FloatBuffer(0, &memory_.optimizer);
    optimizer_state_ =
        FloatBuffer(parameter_count() * state_floats_per_parameter(options), &memory_.optimizer);
    optimizer_steps_ = 0;
  }

  void set_learning_rate(float learning_rate) override {
    if (!optimizer_) throw KernelError("set_learning_rate: no optimizer set");
    OptimizerOptions next = *optimizer_;
    next.learning_rate = learning_rate;
    validate(next);
    optimizer_ = next;
  }

  void reset_optimizer_state() override {
    optimizer_state_.fill(0.0f);
    optimizer_steps_ = 0;
  }

  void step() override {
    if (!optimizer_) throw KernelError("step: no optimizer set (call set_optimizer first)");
    const OptimizerOptions& o = *optimizer_;
    const std::size_t count = parameter_count();
    const std::uint64_t t = ++optimizer_steps_;
    float* state = optimizer_state_.data();
    // Running statistics are not parameters: no optimizer (nor a trainer's edit) moves them.
    saved_buffers_.clear();
    for (const LayerView& v : buffers_) {
      saved_buffers_.insert(saved_buffers_.end(), params_.data() + v.offset,
                            params_.data() + v.offset + v.size);
    }
    detail::parallel_ranges(pool_, count, kOptimizerGrain, [&](std::size_t b, std::size_t e) {
      const std::span<float> p = params_.span().subspan(b, e - b);
      const std::span<const float> g = grads_.span().subspan(b, e - b);
      if (o.kind == OptimizerKind::kSgd) {
        std::span<float> v;
        if (o.momentum > 0.0f) v = {state + b, e - b};
        sgd_step(o, p, g, v);
      } else {
        adam_step(o, t, p, g, {state + b, e - b}, {state + count + b, e - b});
      }
    });
    const float* saved = saved_buffers_.data();
    for (const LayerView& v : buffers_) {
      std::memcpy(params_.data() + v.offset, saved, v.size * sizeof(float));
      saved += v.size;
    }
  }

  float train_step(std::span<const float> input, std::span<const std::int32_t> labels,
                   std::size_t batch) override {
    detail::check_size("train_step labels", labels.size(), batch);
    if (!optimizer_) throw KernelError("train_step: no optimizer set (call set_optimizer first)");
    const float loss = compute_gradients(input, labels, batch);
    step();
    return loss;
  }

  Evaluation evaluate(std::span<const float> input, std::span<const std::int32_t> labels,
                      std::size_t batch) override {
    detail::check_size("evaluate labels", labels.size(), batch);
    if (batch == 0) throw KernelError("evaluate: empty batch");
    detail::check_size("evaluate input", input.size(), batch * spec().input_shape().size());
    const std::size_t d = spec().input_shape().size();
    const std::size_t m = micro_batch_ == 0 ? batch : std::min(micro_batch_, batch);
    Evaluation e{.count = batch};
    for (std::size_t first = 0; first < batch; first += m) {
      const std::size_t b = std::min(m, batch - first);
      const auto logits = run_forward(input.data() + first * d, b, /*training=*/false, 0);
      const auto y = labels.subspan(first, b);
      const float loss = softmax_cross_entropy(logits, y, output_size());
      e.loss_sum += static_cast<double>(loss) * static_cast<double>(b);
      e.correct += count_correct(logits, y, output_size());
    }
    return e;
  }

 private:
  // The forward pass of `batch` samples starting at x. training: keep what backward needs and
  // apply dropout, drawing masks for samples first_sample.. of the current step's stream.
  std::span<const float> run_forward(const float* x, std::size_t batch, bool training,
                                     std::size_t first_sample) {
    reserve_outputs(batch);
    if (training) reserve_training(batch);
    input_ptr_ = x;
    first_sample_ = first_sample;
    stream_ = dropout_calls_;
    for (std::size_t i = 0; i < ops_.size(); ++i) x = forward_op(i, x, batch, training);
    batch_ = batch;
    trained_forward_ = training;
    return {x, batch * output_size()};
  }

  // Op i on x (its input); returns its output, also left in out_ptrs_[i].
  const float* forward_op(std::size_t i, const float* x, std::size_t batch, bool training) {
    Op& op = ops_[i];
    float* y = output(i);
    if (op.kind != OpKind::kLayer) {
      const std::size_t plane = op.shape.height * op.shape.width;
      if (op.kind == OpKind::kToNhwc) {
        nchw_to_nhwc(exec_, x, y, batch, op.shape.channels, plane);
      } else {
        nhwc_to_nchw(exec_, x, y, batch, op.shape.channels, plane);
      }
      out_ptrs_[i] = y;
      return y;
    }
    const LayerSpec& l = *op.layer;
    const float* w = params_.data() + l.weight_offset;
    const float* b = params_.data() + l.bias_offset;
    switch (l.kind) {
      case LayerKind::kLinear:
        linear_forward(exec_, x, w, b, y, batch, l.in, l.out, op.relu);
        break;
      case LayerKind::kConv2d:
        if (op.fast_conv != nullptr) {
          op.fast_conv->forward(exec_, x, w, b, y, batch, op.relu);
        } else {
          conv2d_forward(exec_, x, w, b, y, batch, op.conv, op.relu);
        }
        break;
      case LayerKind::kRelu: relu_forward(x, y, batch * op.out_size); break;
      case LayerKind::kTanh:
      case LayerKind::kSigmoid:
      case LayerKind::kGelu: activation_forward(l.kind, x, y, batch * op.out_size); break;
      case LayerKind::kMaxPool2d:
        if (op.nhwc) {
          maxpool2d_forward_nhwc(exec_, x, y, argmax(i), batch, op.pool);
        } else {
          maxpool2d_forward(exec_, x, y, argmax(i), batch, op.pool);
        }
        break;
      case LayerKind::kDropout:
        if (training && l.drop_probability > 0.0f) {
          dropout_forward(x, y, mask(i), batch * op.out_size, l.drop_probability,
                          detail::dropout_key(seed_, stream_, op.index),
                          first_sample_ * op.out_size);
        } else if (recompute_ && kept_[i]) {
          // A kept output must outlive the segment whose scratch x may be in: copy it.
          std::memcpy(y, x, batch * op.out_size * sizeof(float));
        } else {
          y = const_cast<float*>(x);  // identity: pass the input through, never written
        }
        break;
      case LayerKind::kResidualBegin:
        if (recompute_ && kept_[i]) {
          std::memcpy(y, x, batch * op.out_size * sizeof(float));
        } else {
          y = const_cast<float*>(x);  // identity: the block's input is its shortcut's
        }
        break;
      case LayerKind::kFlatten: break;
      default: block_forward(i, x, y, batch, training); break;
    }
    out_ptrs_[i] = y;
    return y;
  }

  // The forward of batchnorm, the pools and residual_end (see forward_op).
  void block_forward(std::size_t i, const float* x, float* y, std::size_t batch, bool training) {
    const Op& op = ops_[i];
    const LayerSpec& l = *op.layer;
    const float* w = params_.data() + l.weight_offset;
    const float* b = params_.data() + l.bias_offset;
    switch (l.kind) {
      case LayerKind::kBatchNorm:
        if (training) {
          // A recomputing forward repeats one already counted in the running statistics.
          float* running = recomputing_ ? nullptr : params_.data() + l.buffer_offset;
          batchnorm_forward_train(x, y, w, b, stats_[i].data(), running, batch, op.norm);
        } else {
          batchnorm_forward_eval(x, y, w, b, params_.data() + l.buffer_offset, batch, op.norm);
        }
        break;
      case LayerKind::kAvgPool2d: avgpool2d_forward(x, y, batch, op.pool); break;
      case LayerKind::kGlobalAvgPool:
        global_avgpool_forward(x, y, batch, l.input.channels, l.input.height * l.input.width);
        break;
      case LayerKind::kResidualEnd: {
        const float* skip = out_ptrs_[op.partner];
        if (l.weight_count > 0) {
          conv2d_forward(exec_, skip, w, b, y, batch, op.conv, false);
          add_into(y, x, batch * op.out_size);
        } else {
          std::memcpy(y, x, batch * op.out_size * sizeof(float));
          add_into(y, skip, batch * op.out_size);
        }
        break;
      }
      default: throw KernelError("forward: unexpected layer kind");
    }
  }

  // Where op i's output, max-pool indices and dropout mask live: buffers of their own, or with
  // recompute on, a kept output's own buffer and everything else in the segment scratch arena_
  // (per op: the output unless kept, then the indices, then the mask).
  float* output(std::size_t i) {
    if (!recompute_ || kept_[i]) return outputs_[i].data();
    return arena_.data() + arena_at_[i] * output_capacity_;
  }
  float* mask(std::size_t i) {
    if (!recompute_) return masks_[i].data();
    const Op& op = ops_[i];
    const std::size_t skip =
        (kept_[i] ? 0 : op.out_size) + (op.layer->kind == LayerKind::kMaxPool2d ? op.out_size : 0);
    return arena_.data() + (arena_at_[i] + skip) * output_capacity_;
  }

  std::int32_t* argmax(std::size_t i) {
    static_assert(sizeof(std::int32_t) == sizeof(float));
    float* p = argmax_[i].data();
    if (recompute_)
      p = arena_.data() + (arena_at_[i] + (kept_[i] ? 0 : ops_[i].out_size)) * output_capacity_;
    return reinterpret_cast<std::int32_t*>(p);  // storage only, never a float
  }

  // Per op, the floats per sample of its output and of what else its backward keeps (max-pool
  // indices, a dropout mask).
  std::size_t extra_floats(const Op& op) const {
    if (op.layer == nullptr) return 0;
    if (op.layer->kind == LayerKind::kMaxPool2d) return op.out_size;
    if (op.layer->kind == LayerKind::kDropout && op.layer->drop_probability > 0.0f)
      return op.out_size;
    return 0;
  }

  // Chooses the checkpoint segments (segments.h) and lays out the arena.
  void plan_segments() {
    const std::size_t n = ops_.size();
    std::vector<std::size_t> outs(n), extras(n);
    std::vector<bool> may_end(n + 1, true);
    for (std::size_t i = 0; i < n; ++i) {
      outs[i] = ops_[i].out_size;
      extras[i] = extra_floats(ops_[i]);
      // No segment ends inside a residual block: its sum reads the block's input, which must
      // be recomputed with it (or kept).
      const LayerSpec* l = ops_[i].layer;
      if (l != nullptr && l->kind == LayerKind::kResidualBegin) {
        for (std::size_t b = i + 1; b <= ops_[i].partner; ++b) may_end[b] = false;
      }
    }
    segment_end_ = plan_segment_ends(outs, extras, may_end);
    kept_.assign(n, false);
    arena_at_.assign(n, 0);
    arena_per_sample_ = 0;
    std::size_t begin = 0;
    for (const std::size_t end : segment_end_) {
      kept_[end - 1] = true;
      std::size_t at = 0;
      for (std::size_t i = begin; i < end; ++i) {
        arena_at_[i] = at;
        at += (kept_[i] ? 0 : ops_[i].out_size) + extra_floats(ops_[i]);
      }
      arena_per_sample_ = std::max(arena_per_sample_, at);
      begin = end;
    }
  }

  // Grows the buffers a forward pass writes (layer outputs, argmax) to `batch` samples. An old
  // buffer is freed before its successor is made, so growing never holds both.
  void reserve_outputs(std::size_t batch) {
    if (batch <= output_capacity_) return;
    if (recompute_) {  // kept outputs, and one arena for the rest (indices and masks included)
      for (std::size_t i = 0; i < ops_.size(); ++i) {
        if (!kept_[i]) continue;
        outputs_[i] = FloatBuffer();
        outputs_[i] = FloatBuffer(batch * ops_[i].out_size, &memory_.activations);
      }
      arena_ = FloatBuffer();
      arena_ = FloatBuffer(batch * arena_per_sample_, &memory_.activations);
      output_capacity_ = batch;
      return;
    }
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      const Op& op = ops_[i];
      outputs_[i] = FloatBuffer();
      outputs_[i] = FloatBuffer(batch * op.out_size, &memory_.activations);
      if (op.layer != nullptr && op.layer->kind == LayerKind::kMaxPool2d) {
        argmax_[i] = FloatBuffer();
        argmax_[i] = FloatBuffer(batch * op.out_size, &memory_.activations);
      }
    }
    output_capacity_ = batch;
  }

  // Grows what only training needs: dropout masks, activation gradients, logit gradients.
  void reserve_training(std::size_t batch) {
    if (batch <= training_capacity_) return;
    for (std::size_t i = 0; i < ops_.size() && !recompute_; ++i) {  // recompute: in arena_
      const Op& op = ops_[i];
      if (op.layer != nullptr && op.layer->kind == LayerKind::kDropout) {
        masks_[i] = FloatBuffer();
        masks_[i] = FloatBuffer(batch * op.out_size, &memory_.activations);
      }
    }
    for (std::size_t i = 0; i < ops_.size(); ++i) {  // residual_end: its shortcut's gradient
      const Op& op = ops_[i];
      if (op.layer == nullptr || op.layer->kind != LayerKind::kResidualEnd) continue;
      skip_grads_[i] = FloatBuffer();
      skip_grads_[i] = FloatBuffer(batch * ops_[op.partner].out_size, &memory_.activations);
    }
    grad_a_ = FloatBuffer();
    grad_a_ = FloatBuffer(batch * widest_, &memory_.activations);
    grad_b_ = FloatBuffer();
    grad_b_ = FloatBuffer(batch * widest_, &memory_.activations);
    dlogits_ = FloatBuffer();
    dlogits_ = FloatBuffer(batch * output_size(), &memory_.activations);
    training_capacity_ = batch;
  }

  // First: the trackers outlive every buffer below.
  detail::MemoryKinds memory_;

  ThreadPool* pool_;
  Workspace workspace_;
  std::shared_ptr<NhwcScratch> nhwc_scratch_;  // shared by the channels-last convolutions
  Exec exec_;
  FloatBuffer params_;
  FloatBuffer grads_;
  std::vector<Op> ops_;

  std::size_t widest_ = 0;  // floats per sample of the widest activation

  // Per-batch buffers: outputs for output_capacity_ samples, the rest for training_capacity_.
  std::size_t output_capacity_ = 0;
  std::size_t training_capacity_ = 0;
  FloatBuffer input_;                    // copy of a public training forward's input
  std::vector<FloatBuffer> outputs_;     // per op
  std::vector<FloatBuffer> masks_;       // dropout ops
  std::vector<FloatBuffer> argmax_;      // maxpool ops: int32 indices (see argmax())
  std::vector<FloatBuffer> stats_;       // batchnorm ops: the batch's mean and 1 / stddev
  std::vector<FloatBuffer> skip_grads_;  // residual_end ops: the shortcut's input gradient
  std::vector<LayerView> buffers_;       // running statistics, kept out of optimizer steps
  std::vector<float> saved_buffers_;
  FloatBuffer grad_a_, grad_b_;  // activation gradients, ping-pong
  FloatBuffer dlogits_;

  std::size_t micro_batch_ = 0;  // 0: whole batches

  // Recomputation (set_recompute): segment ends (exclusive, ascending, the last ops_.size()),
  // which ops' outputs are kept, and each op's offset in the arena in floats per sample.
  bool recompute_ = false;
  bool recomputing_ = false;  // a backward's forward again: running statistics stay
  std::vector<std::size_t> segment_end_;
  std::vector<bool> kept_;
  std::vector<std::size_t> arena_at_;
  std::size_t arena_per_sample_ = 0;
  FloatBuffer arena_;  // output_capacity_ samples

  // State of the last forward.
  const float* input_ptr_ = nullptr;
  std::vector<const float*> out_ptrs_;
  std::size_t batch_ = 0;
  bool trained_forward_ = false;
  std::size_t first_sample_ = 0;  // of the step's dropout stream
  std::uint64_t stream_ = 0;      // the dropout stream (dropout_calls_ when it ran)

  std::uint64_t seed_ = 0;
  std::uint64_t dropout_calls_ = 0;

  std::optional<OptimizerOptions> optimizer_;
  FloatBuffer optimizer_state_;  // SGD: velocity; Adam: m then v
  std::uint64_t optimizer_steps_ = 0;
};

}  // namespace

std::unique_ptr<Network> make_cpu_network(const NetworkSpec& spec, ThreadPool* pool) {
  return std::make_unique<CpuNetwork>(spec, pool);
}

}  // namespace cohort::kernels::cpu
