// Sequential neural networks whose parameters live in one contiguous float vector.
//
// A NetworkSpec describes a model (input shape and a list of layers) independently of any device:
// it is a cheap, copyable value that the server can use to learn the model size and initialise the
// global model, and that a client hands to a Device (device.h) to get a runnable Network.
//
// Parameter layout (the wire layout: the server's flat vector is exactly this): layers in order;
// per layer with parameters, the weight then the bias. Linear weights are [out][in] row-major and
// conv2d weights are [out_channels][in_channels][kernel][kernel], both as in PyTorch, so a
// PyTorch state_dict flattened in order is a valid parameter vector. The gradient vector has the
// same layout. Activations are NCHW float, batch-major, contiguous.
//
// Batch normalisation keeps its running statistics in the parameter vector, after its weight
// and bias (running_mean, then running_var, as in PyTorch's state_dict, which also holds an
// integer num_batches_tracked that Cohort does not keep: the running statistics use a fixed
// momentum). They are buffers, not parameters: a training forward updates them, their gradient
// is always zero and no optimizer step changes them; but they travel with the model, so the
// server's rules average them like any other entry (FedAvg: the sample-weighted mean of the
// clients' statistics) and the server evaluates the global model with them. buffer_views()
// lists them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/kernels/optimizer.h"

namespace cohort::kernels {

// The shape of one sample: channels x height x width. A vector of n features is {n, 1, 1}.
struct Shape {
  std::size_t channels = 1;
  std::size_t height = 1;
  std::size_t width = 1;

  [[nodiscard]] std::size_t size() const { return channels * height * width; }
  friend bool operator==(const Shape&, const Shape&) = default;
};

// "CxHxW", e.g. "1x28x28".
std::string to_string(const Shape& shape);

enum class LayerKind {
  kLinear,
  kRelu,
  kConv2d,
  kMaxPool2d,
  kFlatten,
  kDropout,
  kTanh,
  kSigmoid,
  kGelu,
  kBatchNorm,
  kAvgPool2d,
  kGlobalAvgPool,
  kResidualBegin,
  kResidualEnd
};

// "linear", "relu", "conv2d", "maxpool2d", "flatten", "dropout", "tanh", "sigmoid", "gelu",
// "batchnorm", "avgpool2d", "globalavgpool", "residual_begin", "residual_end".
std::string_view to_string(LayerKind kind);

// One layer of a NetworkSpec, with its shapes and its place in the parameter vector resolved.
struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  Shape input;
  Shape output;
  std::size_t in = 0;             // linear: in features; conv2d: in channels
  std::size_t out = 0;            // linear: out features; conv2d: out channels
  std::size_t kernel = 0;         // conv2d, maxpool2d: square kernel side
  std::size_t stride = 1;         // conv2d, maxpool2d
  std::size_t padding = 0;        // conv2d: zero padding on every side
  float drop_probability = 0.0f;  // dropout: probability of zeroing an element while training
  std::size_t weight_offset = 0;  // into the parameter vector; meaningful when weight_count > 0
  std::size_t weight_count = 0;
  std::size_t bias_offset = 0;
  std::size_t bias_count = 0;
  // batchnorm: running_mean then running_var, out floats each, right after the bias.
  std::size_t buffer_offset = 0;
  std::size_t buffer_count = 0;
  // residual_begin / residual_end: the index of the other end of the block.
  std::size_t partner = 0;
};

// Batch normalisation's constants, as PyTorch's defaults: y = (x - mean) / sqrt(var + eps) *
// weight + bias; running = (1 - momentum) * running + momentum * batch statistic, where the
// running variance takes the unbiased batch variance and normalisation the biased one.
inline constexpr float kBatchNormEpsilon = 1e-5f;
inline constexpr float kBatchNormMomentum = 0.1f;

// A named range of the parameter (and gradient) vector.
struct LayerView {
  std::string name;       // e.g. "0.conv2d" (layer_views) or "0.conv2d.weight" (tensor_views)
  std::size_t layer = 0;  // index into NetworkSpec::layers()
  std::size_t offset = 0;
  std::size_t size = 0;
};

// Describes a sequential model. Builder methods check shapes as layers are added and throw
// KernelError (naming the layer and both shapes) on a mismatch, leaving the spec unchanged.
// A value type; not thread-safe to mutate, safe to share once built.
class NetworkSpec {
 public:
  NetworkSpec() = default;
  explicit NetworkSpec(Shape input);

  // Fully connected: REQUIRES in == current output size (a CxHxW input is read flattened, as
  // after flatten()). Output {out, 1, 1}.
  NetworkSpec& linear(std::size_t in, std::size_t out);
  NetworkSpec& relu();
  // Elementwise activations, shape unchanged: tanh, the logistic sigmoid 1 / (1 + e^-x), and
  // GELU in its exact form x * Phi(x) (PyTorch's default, approximate='none').
  NetworkSpec& tanh();
  NetworkSpec& sigmoid();
  NetworkSpec& gelu();
  // REQUIRES in_channels == current channels and the (padded) input at least kernel wide.
  // Output side = (side + 2 * padding - kernel) / stride + 1.
  NetworkSpec& conv2d(std::size_t in_channels, std::size_t out_channels, std::size_t kernel,
                      std::size_t stride = 1, std::size_t padding = 0);
  // No padding, floor mode; stride 0 means stride = kernel (PyTorch's default).
  NetworkSpec& maxpool2d(std::size_t kernel, std::size_t stride = 0);
  // No padding, floor mode; stride 0 means stride = kernel. Each output is the mean of its
  // kernel x kernel window.
  NetworkSpec& avgpool2d(std::size_t kernel, std::size_t stride = 0);
  // The mean of each channel over its whole plane: output {C, 1, 1}.
  NetworkSpec& global_avgpool();
  // Batch normalisation over the current channels (BatchNorm2d on a CxHxW input, BatchNorm1d on
  // a vector of C features): training normalises with the batch's statistics per channel (over
  // the samples and positions of the batch, or of the micro-batch when training in
  // micro-batches) and updates the running statistics; evaluation normalises with the running
  // statistics. Parameters: weight (1) and bias (0), then the running_mean (0) and running_var
  // (1) buffers, C floats each.
  NetworkSpec& batchnorm();
  // A residual block: the layers between residual_begin() and its residual_end() form the main
  // branch F, and residual_end() outputs F(x) + S(x), where x is the block's input. S is the
  // identity when F keeps the shape, else a 1x1 convolution (with bias) with stride s mapping
  // x's channels to F's, where s = ceil(H / H') makes x's HxW come out as F's H'xW' (as
  // ResNet's projection shortcut); KernelError when no stride does. Blocks nest; each must be
  // closed before the network is run. A ReLU after the sum is a layer of its own.
  NetworkSpec& residual_begin();
  NetworkSpec& residual_end();
  // Output {C*H*W, 1, 1}; the data does not move (NCHW order).
  NetworkSpec& flatten();
  // Inverted dropout: while training, zeroes each element with probability p and scales the
  // rest by 1/(1-p); identity at evaluation. REQUIRES 0 <= p < 1.
  NetworkSpec& dropout(float p);

  [[nodiscard]] Shape input_shape() const { return input_; }
  // The shape of the last layer's output (input_shape() when there are no layers).
  [[nodiscard]] Shape output_shape() const;
  // Number of logits per sample: output_shape().size().
  [[nodiscard]] std::size_t output_size() const { return output_shape().size(); }
  [[nodiscard]] std::span<const LayerSpec> layers() const { return layers_; }
  [[nodiscard]] std::size_t parameter_count() const { return parameter_count_; }
  // One view per layer with parameters (weight and bias together, contiguous).
  [[nodiscard]] std::vector<LayerView> layer_views() const;
  // One view per tensor: "<layer>.<kind>.weight" and "<layer>.<kind>.bias" (and a batchnorm's
  // ".running_mean" and ".running_var"), in vector order.
  [[nodiscard]] std::vector<LayerView> tensor_views() const;
  // The buffers among them: batch normalisation's running statistics (no gradient, never
  // changed by an optimizer step).
  [[nodiscard]] std::vector<LayerView> buffer_views() const;
  // Residual blocks opened and not yet closed (a network runs only when this is 0).
  [[nodiscard]] std::size_t open_blocks() const { return open_.size(); }
  // Human-readable, one layer per line with shapes and parameter counts.
  [[nodiscard]] std::string summary() const;

  // Writes PyTorch's default initialisation into params: every weight and bias of a layer with
  // fan_in inputs per output (in, or in_channels * kernel^2; a residual projection: its input
  // channels) is drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with
  // a = sqrt(5)); batchnorm gets weight 1, bias 0, running_mean 0, running_var 1. Deterministic:
  // the same seed gives the same bits on every machine and device. REQUIRES params.size() ==
  // parameter_count(), else KernelError.
  void initialize(std::uint64_t seed, std::span<float> params) const;

 private:
  NetworkSpec& push(LayerSpec layer);

  Shape input_;
  std::vector<LayerSpec> layers_;
  std::size_t parameter_count_ = 0;
  std::vector<std::size_t> open_;  // residual_begin layers not yet closed, innermost last
};

// The result of evaluate(): summed (not averaged) loss and the number of correct predictions.
struct Evaluation {
  double loss_sum = 0.0;
  std::size_t correct = 0;
  std::size_t count = 0;
};

// Bytes a Network holds, by kind. In a peak, each kind is its own high-water mark and total is
// the high-water mark of the sum (at most the sum of the kinds' peaks).
struct MemoryUse {
  std::size_t parameters = 0;   // the parameter vector
  std::size_t gradients = 0;    // the gradient vector (micro-batches add into it in place)
  std::size_t optimizer = 0;    // momentum, Adam moments
  std::size_t activations = 0;  // per-batch buffers: layer outputs kept for backward, dropout
                                // masks, max-pool argmax, activation gradients, logit gradients
  std::size_t workspace = 0;    // kernel scratch: GEMM panels, padded conv inputs, transforms
  std::size_t total = 0;
};

// What a Network measured of its own allocations: every buffer it and its kernels allocate goes
// through a tracking allocator (cohort::MemoryTracker). tracked is false on devices that do not
// count (then the figures are zero).
struct MemoryReport {
  bool tracked = false;
  MemoryUse current;
  MemoryUse peak;  // since construction or the last reset_memory_peak()
};

// A NetworkSpec instantiated on a Device, with its parameters, gradients, activations and
// optimizer state. Made by Device::make_network(); the Device must outlive it.
//
// Host views: parameters() and gradients() are host spans of parameter_count() floats. On the
// CPU device they are the live buffers. On CUDA they are host mirrors kept coherent
// automatically: a call downloads the current device values, and a mutable span handed out is
// uploaded again before the next device operation (forward, backward, step, train_step,
// evaluate, init). So replacing a model wholesale is always
//   std::ranges::copy(server_vector, net.parameters().begin());
// Spans stay valid for the Network's lifetime; their contents are current until the next call
// that changes them. Prefer whole-round access on CUDA: every call there costs a transfer.
//
// Batches: input is batch * spec().input_shape().size() floats (NCHW); labels are class
// indices in [0, output_size()). Any batch size >= 1 works; buffers grow to the largest batch
// seen and are reused, so a steady training loop allocates nothing.
//
// Not thread-safe: drive one Network from one thread at a time. Distinct Networks may run
// concurrently (e.g. simulated clients on a thread pool), even when made by the same Device.
// Throws KernelError for wrong sizes, out-of-range labels and device failures; ConfigError for
// bad optimizer options.
class Network {
 public:
  virtual ~Network() = default;
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  [[nodiscard]] const NetworkSpec& spec() const { return spec_; }
  [[nodiscard]] std::size_t parameter_count() const { return spec_.parameter_count(); }
  [[nodiscard]] std::size_t output_size() const { return spec_.output_size(); }
  [[nodiscard]] std::vector<LayerView> layer_views() const { return spec_.layer_views(); }
  [[nodiscard]] std::vector<LayerView> tensor_views() const { return spec_.tensor_views(); }
  // The device this network runs on, e.g. "cpu" or "cuda:0".
  [[nodiscard]] virtual std::string device_name() const = 0;

  // Parameters per NetworkSpec::initialize(seed); also reseeds dropout with seed, zeroes the
  // gradients and resets the optimizer state.
  virtual void init(std::uint64_t seed) = 0;
  // Seeds the dropout masks. The mask of the k-th training forward after set_seed(s) depends
  // only on (s, k, element index): CPU and CUDA draw the same masks.
  virtual void set_seed(std::uint64_t seed) = 0;

  virtual std::span<float> parameters() = 0;
  [[nodiscard]] virtual std::span<const float> parameters() const = 0;
  // Copies a whole parameter vector in (e.g. the model the server sent): the same as copying
  // into parameters(), with a size check (KernelError unless values.size() == parameter_count()).
  void set_parameters(std::span<const float> values);
  // Mutable so that a trainer may edit gradients between backward() and step() (clipping,
  // FedProx's proximal term, SCAFFOLD's correction).
  virtual std::span<float> gradients() = 0;
  [[nodiscard]] virtual std::span<const float> gradients() const = 0;

  // Returns the logits, batch * output_size() floats, valid until the next forward/train_step/
  // evaluate. training = true applies dropout and keeps what backward() needs.
  virtual std::span<const float> forward(std::span<const float> input, std::size_t batch,
                                         bool training) = 0;
  // REQUIRES: the previous call was forward(..., training = true) and dlogits has
  // batch * output_size() floats. Overwrites (does not accumulate into) gradients().
  virtual void backward(std::span<const float> dlogits) = 0;

  // Chooses the optimizer used by step() and train_step(), with fresh (zero) state.
  virtual void set_optimizer(const OptimizerOptions& options) = 0;
  // Changes the learning rate, keeping the optimizer state (for schedules).
  virtual void set_learning_rate(float learning_rate) = 0;
  // Zeroes momentum / Adam moments and the step count (e.g. at the start of a round).
  virtual void reset_optimizer_state() = 0;
  // One optimizer step with the current gradients. REQUIRES set_optimizer() was called.
  virtual void step() = 0;

  // forward(training) + mean softmax cross-entropy + backward + step(); returns the mean loss.
  // The fast path: on CUDA nothing but the input, labels and the loss crosses the bus.
  // With a micro-batch set, the same as compute_gradients() + step().
  virtual float train_step(std::span<const float> input, std::span<const std::int32_t> labels,
                           std::size_t batch) = 0;
  // forward(training) + mean softmax cross-entropy + backward over the whole batch, leaving the
  // gradient of the batch's mean loss in gradients() (for a trainer that edits it before step());
  // returns the mean loss. With a micro-batch m set (set_micro_batch), the batch runs as
  // ceil(batch / m) micro-batches of at most m samples whose gradients are accumulated: the
  // result equals the full batch's up to float rounding, dropout included (every micro-batch of
  // a step draws its samples' masks from the step's stream, as the full batch would), and the
  // activation memory is that of m samples. input must stay valid for the call only.
  virtual float compute_gradients(std::span<const float> input,
                                  std::span<const std::int32_t> labels, std::size_t batch) = 0;
  // compute_gradients with the mean squared error (loss.h; PyTorch's MSELoss) against float
  // targets (batch * output_size(), row-major) in place of cross-entropy, in the same micro-batch
  // loop with the same in-place accumulation. nullopt (the default) where a device has no such
  // path: regression_gradients (regression.h) then runs the loss on the host.
  virtual std::optional<float> compute_gradients_mse(std::span<const float> /*input*/,
                                                     std::span<const float> /*targets*/,
                                                     std::size_t /*batch*/) {
    return std::nullopt;
  }
  // 0 (the default): whole batches. m > 0: compute_gradients, train_step and evaluate run at most
  // m samples at a time (on CUDA with one more gradient-sized buffer: the sum of the
  // micro-batches' gradients). KernelError on devices that cannot.
  virtual void set_micro_batch(std::size_t m);
  [[nodiscard]] virtual std::size_t micro_batch() const { return 0; }
  // Activation checkpointing (ALGORITHMS.md 3.5.3). On: a training forward keeps only the
  // outputs at segment boundaries (and the logits), and backward recomputes each earlier
  // segment's forward from its boundary just before going back through it. The segments are
  // chosen once per network to minimise the kept activations plus the largest segment; the
  // gradients are the same as without (dropout masks are redrawn from the same stream), at the
  // cost of one more forward of all but the last segment. KernelError where the device cannot
  // (CUDA today: its buffers are counted and micro-batched, not segmented).
  virtual void set_recompute(bool on);
  [[nodiscard]] virtual bool recompute() const { return false; }

  [[nodiscard]] virtual MemoryReport memory() const { return {}; }
  virtual void reset_memory_peak() {}
  // A hard cap on the tracked total (0: none): an allocation that would pass it throws
  // std::bad_alloc instead (the network is then unusable). No-op where memory is not tracked.
  virtual void set_memory_limit(std::size_t /*bytes*/) {}
  // forward(training = false) + loss and argmax accuracy; touches no gradient or state.
  virtual Evaluation evaluate(std::span<const float> input, std::span<const std::int32_t> labels,
                              std::size_t batch) = 0;

 protected:
  // KernelError when the spec has a residual block that is not closed.
  explicit Network(NetworkSpec spec);

 private:
  NetworkSpec spec_;
};

}  // namespace cohort::kernels
