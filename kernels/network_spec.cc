#include <algorithm>
#include <cmath>
#include <sstream>

#include "check.h"
#include "cohort/core/error.h"
#include "cohort/kernels/network.h"
#include "random.h"

namespace cohort::kernels {
namespace {

[[noreturn]] void bad_layer(std::size_t index, LayerKind kind, const Shape& input,
                            const std::string& why) {
  std::ostringstream out;
  out << "layer " << index << " (" << to_string(kind) << ") on input " << to_string(input) << ": "
      << why;
  throw KernelError(out.str());
}

std::size_t fan_in(const LayerSpec& layer) {
  return layer.kind == LayerKind::kConv2d ? layer.in * layer.kernel * layer.kernel : layer.in;
}

// The pooling output side, or a KernelError naming the layer.
Shape pooled(std::size_t index, LayerKind kind, const Shape& input, std::size_t kernel,
             std::size_t stride) {
  if (kernel == 0) bad_layer(index, kind, input, "kernel must be positive");
  if (input.height < kernel || input.width < kernel) {
    bad_layer(index, kind, input, "kernel " + std::to_string(kernel) + " larger than the input");
  }
  return {input.channels, (input.height - kernel) / stride + 1,
          (input.width - kernel) / stride + 1};
}

}  // namespace

std::string to_string(const Shape& shape) {
  std::ostringstream out;
  out << shape.channels << 'x' << shape.height << 'x' << shape.width;
  return out.str();
}

std::string_view to_string(LayerKind kind) {
  switch (kind) {
    case LayerKind::kLinear: return "linear";
    case LayerKind::kRelu: return "relu";
    case LayerKind::kConv2d: return "conv2d";
    case LayerKind::kMaxPool2d: return "maxpool2d";
    case LayerKind::kFlatten: return "flatten";
    case LayerKind::kDropout: return "dropout";
    case LayerKind::kTanh: return "tanh";
    case LayerKind::kSigmoid: return "sigmoid";
    case LayerKind::kGelu: return "gelu";
    case LayerKind::kBatchNorm: return "batchnorm";
    case LayerKind::kAvgPool2d: return "avgpool2d";
    case LayerKind::kGlobalAvgPool: return "globalavgpool";
    case LayerKind::kResidualBegin: return "residual_begin";
    case LayerKind::kResidualEnd: return "residual_end";
  }
  return "unknown";
}

NetworkSpec::NetworkSpec(Shape input) : input_(input) {
  if (input.size() == 0) throw KernelError("network input shape " + to_string(input) + " is empty");
}

Shape NetworkSpec::output_shape() const { return layers_.empty() ? input_ : layers_.back().output; }

NetworkSpec& NetworkSpec::push(LayerSpec layer) {
  if (layer.weight_count > 0) {
    layer.weight_offset = parameter_count_;
    layer.bias_offset = parameter_count_ + layer.weight_count;
  } else {
    layer.weight_offset = layer.bias_offset = parameter_count_;
  }
  layer.buffer_offset = layer.bias_offset + layer.bias_count;
  parameter_count_ += layer.weight_count + layer.bias_count + layer.buffer_count;
  layers_.push_back(layer);
  return *this;
}

NetworkSpec& NetworkSpec::linear(std::size_t in, std::size_t out) {
  const Shape input = output_shape();
  if (in == 0 || out == 0) bad_layer(layers_.size(), LayerKind::kLinear, input, "zero features");
  if (in != input.size()) {
    bad_layer(
        layers_.size(), LayerKind::kLinear, input,
        "in_features " + std::to_string(in) + " != input size " + std::to_string(input.size()));
  }
  return push({.kind = LayerKind::kLinear,
               .input = input,
               .output = {out, 1, 1},
               .in = in,
               .out = out,
               .weight_count = in * out,
               .bias_count = out});
}

NetworkSpec& NetworkSpec::relu() {
  const Shape input = output_shape();
  return push({.kind = LayerKind::kRelu, .input = input, .output = input});
}

NetworkSpec& NetworkSpec::tanh() {
  const Shape input = output_shape();
  return push({.kind = LayerKind::kTanh, .input = input, .output = input});
}

NetworkSpec& NetworkSpec::sigmoid() {
  const Shape input = output_shape();
  return push({.kind = LayerKind::kSigmoid, .input = input, .output = input});
}

NetworkSpec& NetworkSpec::gelu() {
  const Shape input = output_shape();
  return push({.kind = LayerKind::kGelu, .input = input, .output = input});
}

NetworkSpec& NetworkSpec::conv2d(std::size_t in_channels, std::size_t out_channels,
                                 std::size_t kernel, std::size_t stride, std::size_t padding) {
  const Shape input = output_shape();
  const auto bad = [&](const std::string& why) {
    bad_layer(layers_.size(), LayerKind::kConv2d, input, why);
  };
  if (in_channels == 0 || out_channels == 0 || kernel == 0 || stride == 0) {
    bad("channels, kernel and stride must be positive");
  }
  if (in_channels != input.channels) {
    bad("in_channels " + std::to_string(in_channels) + " != input channels " +
        std::to_string(input.channels));
  }
  if (input.height + 2 * padding < kernel || input.width + 2 * padding < kernel) {
    bad("kernel " + std::to_string(kernel) + " larger than the padded input");
  }
  if (padding >= kernel) bad("padding must be smaller than the kernel");
  const Shape output{out_channels, (input.height + 2 * padding - kernel) / stride + 1,
                     (input.width + 2 * padding - kernel) / stride + 1};
  return push({.kind = LayerKind::kConv2d,
               .input = input,
               .output = output,
               .in = in_channels,
               .out = out_channels,
               .kernel = kernel,
               .stride = stride,
               .padding = padding,
               .weight_count = out_channels * in_channels * kernel * kernel,
               .bias_count = out_channels});
}

NetworkSpec& NetworkSpec::maxpool2d(std::size_t kernel, std::size_t stride) {
  const Shape input = output_shape();
  if (stride == 0) stride = kernel;
  const Shape output = pooled(layers_.size(), LayerKind::kMaxPool2d, input, kernel, stride);
  return push({.kind = LayerKind::kMaxPool2d,
               .input = input,
               .output = output,
               .kernel = kernel,
               .stride = stride});
}

NetworkSpec& NetworkSpec::avgpool2d(std::size_t kernel, std::size_t stride) {
  const Shape input = output_shape();
  if (stride == 0) stride = kernel;
  const Shape output = pooled(layers_.size(), LayerKind::kAvgPool2d, input, kernel, stride);
  return push({.kind = LayerKind::kAvgPool2d,
               .input = input,
               .output = output,
               .kernel = kernel,
               .stride = stride});
}

NetworkSpec& NetworkSpec::global_avgpool() {
  const Shape input = output_shape();
  return push(
      {.kind = LayerKind::kGlobalAvgPool, .input = input, .output = {input.channels, 1, 1}});
}

NetworkSpec& NetworkSpec::batchnorm() {
  const Shape input = output_shape();
  const std::size_t c = input.channels;
  return push({.kind = LayerKind::kBatchNorm,
               .input = input,
               .output = input,
               .in = c,
               .out = c,
               .weight_count = c,
               .bias_count = c,
               .buffer_count = 2 * c});
}

NetworkSpec& NetworkSpec::residual_begin() {
  const Shape input = output_shape();
  open_.push_back(layers_.size());
  return push({.kind = LayerKind::kResidualBegin, .input = input, .output = input});
}

NetworkSpec& NetworkSpec::residual_end() {
  const Shape main = output_shape();
  if (open_.empty()) {
    bad_layer(layers_.size(), LayerKind::kResidualEnd, main, "no residual block is open");
  }
  const std::size_t begin = open_.back();
  const Shape skip = layers_[begin].input;
  LayerSpec end{.kind = LayerKind::kResidualEnd,
                .input = main,
                .output = main,
                .in = skip.channels,
                .out = main.channels,
                .partner = begin};
  if (!(skip == main)) {
    // ceil(H / H') is the only stride that can make (H - 1) / s + 1 == H'.
    const std::size_t stride = (skip.height + main.height - 1) / main.height;
    if ((skip.height - 1) / stride + 1 != main.height ||
        (skip.width - 1) / stride + 1 != main.width) {
      bad_layer(layers_.size(), LayerKind::kResidualEnd, main,
                "no 1x1 projection with a stride maps the block's input " + to_string(skip) +
                    " to its output " + to_string(main));
    }
    end.kernel = 1;
    end.stride = stride;
    end.weight_count = main.channels * skip.channels;
    end.bias_count = main.channels;
  }
  layers_[begin].partner = layers_.size();
  open_.pop_back();
  return push(end);
}

NetworkSpec& NetworkSpec::flatten() {
  const Shape input = output_shape();
  return push({.kind = LayerKind::kFlatten, .input = input, .output = {input.size(), 1, 1}});
}

NetworkSpec& NetworkSpec::dropout(float p) {
  const Shape input = output_shape();
  if (!(p >= 0.0f && p < 1.0f)) {
    bad_layer(layers_.size(), LayerKind::kDropout, input,
              "probability " + std::to_string(p) + " outside [0, 1)");
  }
  return push(
      {.kind = LayerKind::kDropout, .input = input, .output = input, .drop_probability = p});
}

std::vector<LayerView> NetworkSpec::layer_views() const {
  std::vector<LayerView> views;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const LayerSpec& l = layers_[i];
    const std::size_t size = l.weight_count + l.bias_count + l.buffer_count;
    if (size == 0) continue;
    views.push_back(
        {std::to_string(i) + "." + std::string(to_string(l.kind)), i, l.weight_offset, size});
  }
  return views;
}

std::vector<LayerView> NetworkSpec::tensor_views() const {
  std::vector<LayerView> views;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const LayerSpec& l = layers_[i];
    const std::string prefix = std::to_string(i) + "." + std::string(to_string(l.kind));
    if (l.weight_count > 0)
      views.push_back({prefix + ".weight", i, l.weight_offset, l.weight_count});
    if (l.bias_count > 0) views.push_back({prefix + ".bias", i, l.bias_offset, l.bias_count});
    if (l.buffer_count > 0) {
      const std::size_t half = l.buffer_count / 2;
      views.push_back({prefix + ".running_mean", i, l.buffer_offset, half});
      views.push_back({prefix + ".running_var", i, l.buffer_offset + half, half});
    }
  }
  return views;
}

std::vector<LayerView> NetworkSpec::buffer_views() const {
  std::vector<LayerView> views;
  for (LayerView& v : tensor_views()) {
    if (v.name.ends_with(".running_mean") || v.name.ends_with(".running_var")) {
      views.push_back(std::move(v));
    }
  }
  return views;
}

std::string NetworkSpec::summary() const {
  std::ostringstream out;
  out << "input " << to_string(input_) << '\n';
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const LayerSpec& l = layers_[i];
    out << i << ' ' << to_string(l.kind);
    if (l.kind == LayerKind::kConv2d) {
      out << '(' << l.in << "->" << l.out << ", k=" << l.kernel << ", s=" << l.stride
          << ", p=" << l.padding << ')';
    } else if (l.kind == LayerKind::kLinear) {
      out << '(' << l.in << "->" << l.out << ')';
    } else if (l.kind == LayerKind::kMaxPool2d || l.kind == LayerKind::kAvgPool2d) {
      out << "(k=" << l.kernel << ", s=" << l.stride << ')';
    } else if (l.kind == LayerKind::kResidualEnd) {
      out << "(of " << l.partner << ", ";
      if (l.weight_count > 0) {
        out << "projection " << l.in << "->" << l.out << " s=" << l.stride << ')';
      } else {
        out << "identity)";
      }
    } else if (l.kind == LayerKind::kDropout) {
      out << "(p=" << l.drop_probability << ')';
    }
    out << " -> " << to_string(l.output);
    if (l.weight_count + l.bias_count > 0) out << "  params=" << l.weight_count + l.bias_count;
    if (l.buffer_count > 0) out << " buffers=" << l.buffer_count;
    out << '\n';
  }
  out << "parameters " << parameter_count_;
  return out.str();
}

void NetworkSpec::initialize(std::uint64_t seed, std::span<float> params) const {
  detail::check_size("NetworkSpec::initialize params", params.size(), parameter_count_);
  const std::uint64_t key = detail::derive_key(seed, detail::kInitStream);
  for (const LayerSpec& l : layers_) {
    if (l.kind == LayerKind::kBatchNorm) {
      std::fill_n(params.begin() + static_cast<std::ptrdiff_t>(l.weight_offset), l.out, 1.0f);
      std::fill_n(params.begin() + static_cast<std::ptrdiff_t>(l.bias_offset), l.out, 0.0f);
      std::fill_n(params.begin() + static_cast<std::ptrdiff_t>(l.buffer_offset), l.out, 0.0f);
      std::fill_n(params.begin() + static_cast<std::ptrdiff_t>(l.buffer_offset + l.out), l.out,
                  1.0f);
      continue;
    }
    if (l.weight_count + l.bias_count == 0) continue;
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in(l)));
    const std::size_t end = l.weight_offset + l.weight_count + l.bias_count;
    for (std::size_t j = l.weight_offset; j < end; ++j) {
      params[j] = (2.0f * detail::counter_uniform(key, j) - 1.0f) * bound;
    }
  }
}

Network::Network(NetworkSpec spec) : spec_(std::move(spec)) {
  if (spec_.open_blocks() > 0) {
    throw KernelError("network: " + std::to_string(spec_.open_blocks()) +
                      " residual block(s) opened and not closed");
  }
}

void Network::set_micro_batch(std::size_t m) {
  if (m != 0) {
    throw KernelError("the " + device_name() +
                      " device does not train in micro-batches (train.memory_budget needs cpu)");
  }
}

void Network::set_recompute(bool on) {
  if (on) {
    throw KernelError("the " + device_name() + " device does not recompute activations");
  }
}

void Network::set_parameters(std::span<const float> values) {
  detail::check_size("Network::set_parameters", values.size(), parameter_count());
  std::ranges::copy(values, parameters().begin());
}

}  // namespace cohort::kernels
