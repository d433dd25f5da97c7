#include "cohort/kernels/model_zoo.h"

#include <charconv>
#include <cstdlib>
#include <string>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::kernels {
namespace {

[[noreturn]] void bad_spec(std::string_view spec, const std::string& why) {
  throw ConfigError("model spec '" + std::string(spec) + "': " + why +
                    " (known: " + known_model_specs() + ")");
}

std::size_t parse_width(std::string_view spec, std::string_view text) {
  std::size_t value = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || p != text.data() + text.size() || value == 0 || value > (1u << 26)) {
    bad_spec(spec, "width '" + std::string(text) + "' is not a positive integer");
  }
  return value;
}

NetworkSpec make_mlp(std::string_view spec, std::string_view widths_text,
                     const ModelOptions& options) {
  std::vector<std::size_t> widths;
  std::size_t start = 0;
  for (;;) {
    const std::size_t dash = widths_text.find('-', start);
    widths.push_back(parse_width(
        spec,
        widths_text.substr(start, dash == widths_text.npos ? widths_text.npos : dash - start)));
    if (dash == widths_text.npos) break;
    start = dash + 1;
  }
  if (widths.size() < 2) bad_spec(spec, "an mlp needs at least an input and an output width");
  if (options.classes != 0 && options.classes != widths.back()) {
    bad_spec(spec, "the last width is " + std::to_string(widths.back()) + " but the data has " +
                       std::to_string(options.classes) + " classes");
  }
  Shape input{widths.front(), 1, 1};
  if (options.input) {
    if (options.input->size() != widths.front()) {
      bad_spec(spec, "the first width is " + std::to_string(widths.front()) +
                         " but the input has " + std::to_string(options.input->size()) +
                         " features (" + kernels::to_string(*options.input) + ")");
    }
    input = *options.input;
  }
  NetworkSpec net(input);
  if (input.height != 1 || input.width != 1) net.flatten();
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i > 0) net.relu();
    net.linear(widths[i], widths[i + 1]);
  }
  return net;
}

// Two conv5x5 (pad 2) + max-pool blocks, then one hidden fully connected layer.
NetworkSpec make_two_conv(Shape input, std::size_t c1, std::size_t c2, std::size_t hidden,
                          std::size_t classes) {
  NetworkSpec net(input);
  net.conv2d(input.channels, c1, 5, 1, 2).relu().maxpool2d(2);
  net.conv2d(c1, c2, 5, 1, 2).relu().maxpool2d(2);
  net.flatten();
  const std::size_t flat = net.output_size();
  net.linear(flat, hidden).relu().linear(hidden, classes);
  return net;
}

NetworkSpec make_lenet5(Shape input, std::size_t classes) {
  NetworkSpec net(input);
  net.conv2d(input.channels, 6, 5, 1, 2).relu().maxpool2d(2);
  net.conv2d(6, 16, 5).relu().maxpool2d(2);
  net.flatten();
  const std::size_t flat = net.output_size();
  net.linear(flat, 120).relu().linear(120, 84).relu().linear(84, classes);
  return net;
}

// ResNet-20 for CIFAR-10 (He et al., 2016, section 4.2): conv3x3x16-bn-relu, three stages of
// three basic blocks (conv3x3-bn-relu-conv3x3-bn plus the shortcut, then relu) with 16, 32 and
// 64 channels, the first block of stages 2 and 3 with stride 2 and a 1x1 projection shortcut
// (the paper's option B), global average pooling, fc10. Convolutions keep their bias.
NetworkSpec make_resnet20(Shape input, std::size_t classes) {
  NetworkSpec net(input);
  net.conv2d(input.channels, 16, 3, 1, 1).batchnorm().relu();
  std::size_t channels = 16;
  for (const std::size_t width : {16, 32, 64}) {
    for (int block = 0; block < 3; ++block) {
      const std::size_t stride = block == 0 && width != 16 ? 2 : 1;
      net.residual_begin();
      net.conv2d(channels, width, 3, stride, 1).batchnorm().relu();
      net.conv2d(width, width, 3, 1, 1).batchnorm();
      net.residual_end().relu();
      channels = width;
    }
  }
  net.global_avgpool().linear(channels, classes);
  return net;
}

std::string_view trim_space(std::string_view s) {
  while (!s.empty() && std::string_view(" \t\r\n").find(s.front()) != std::string_view::npos) {
    s.remove_prefix(1);
  }
  while (!s.empty() && std::string_view(" \t\r\n").find(s.back()) != std::string_view::npos) {
    s.remove_suffix(1);
  }
  return s;
}

// The pieces between separators, without surrounding white space (a TOML multi-line string may
// put one layer per line).
std::vector<std::string_view> split_on(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t at = text.find(sep, start);
    out.push_back(trim_space(text.substr(start, at == text.npos ? text.npos : at - start)));
    if (at == text.npos) return out;
    start = at + 1;
  }
}

// One layer token of a net: spec (without "res[" or "]").
void add_layer(NetworkSpec& net, std::string_view spec, std::string_view token,
               const std::string& where) {
  {
    const auto parts = split_on(token, ':');
    const std::string_view kind = parts[0];
    const auto arg = [&](std::size_t k, std::size_t fallback) {
      return k < parts.size() ? parse_width(spec, parts[k]) : fallback;
    };
    const auto arity = [&](std::size_t least, std::size_t most) {
      if (parts.size() - 1 < least || parts.size() - 1 > most) {
        bad_spec(spec, where + ": " + std::string(kind) + " takes " + std::to_string(least) +
                           (most > least ? " to " + std::to_string(most) : std::string()) +
                           " argument(s)");
      }
    };
    try {
      const Shape now = net.output_shape();
      if (kind == "conv") {
        arity(2, 4);
        net.conv2d(now.channels, arg(1, 0), arg(2, 0), arg(3, 1),
                   parts.size() > 4 ? (parts[4] == "0" ? 0 : arg(4, 0)) : 0);
      } else if (kind == "maxpool") {
        arity(1, 2);
        net.maxpool2d(arg(1, 0), arg(2, 0));
      } else if (kind == "avgpool") {
        arity(1, 2);
        net.avgpool2d(arg(1, 0), arg(2, 0));
      } else if (kind == "gap") {
        arity(0, 0);
        net.global_avgpool();
      } else if (kind == "bn") {
        arity(0, 0);
        net.batchnorm();
      } else if (kind == "linear") {
        arity(1, 1);
        if (now.height != 1 || now.width != 1) net.flatten();
        net.linear(net.output_size(), arg(1, 0));
      } else if (kind == "relu") {
        arity(0, 0);
        net.relu();
      } else if (kind == "tanh") {
        arity(0, 0);
        net.tanh();
      } else if (kind == "sigmoid") {
        arity(0, 0);
        net.sigmoid();
      } else if (kind == "gelu") {
        arity(0, 0);
        net.gelu();
      } else if (kind == "flatten") {
        arity(0, 0);
        net.flatten();
      } else if (kind == "dropout") {
        arity(1, 1);
        const std::string text(parts[1]);
        char* end = nullptr;
        const double p = std::strtod(text.c_str(), &end);
        if (end != text.c_str() + text.size() || !(p >= 0 && p < 1)) {
          bad_spec(spec, where + ": the drop probability must be in [0, 1)");
        }
        net.dropout(static_cast<float>(p));
      } else {
        bad_spec(spec, where +
                           ": unknown layer (conv, maxpool, avgpool, gap, linear, bn, relu, tanh, "
                           "sigmoid, gelu, flatten, dropout; res[ and ] around a block)");
      }
    } catch (const KernelError& e) {
      bad_spec(spec, where + ": " + e.what());
    }
  }
}

// "net:INPUT,LAYER,LAYER,...": INPUT is CxHxW or a width D (D x 1 x 1); each LAYER is one of
// conv:OUT:K[:STRIDE[:PAD]], maxpool:K[:STRIDE], avgpool:K[:STRIDE], gap, linear:OUT, bn,
// relu, tanh, sigmoid, gelu, flatten, dropout:P. "res[" before a layer opens a residual block
// and "]" after one closes it (each may also stand alone between commas). Input channels and
// widths follow from the layer before; a linear layer after a CxHxW output reads it flattened.
NetworkSpec make_net(std::string_view spec, std::string_view body, const ModelOptions& options) {
  const auto tokens = split_on(body, ',');
  if (tokens.size() < 2) bad_spec(spec, "a net needs an input shape and at least one layer");
  Shape input{};
  {
    const auto dims = split_on(tokens[0], 'x');
    if (dims.size() == 1) {
      input = {parse_width(spec, dims[0]), 1, 1};
    } else if (dims.size() == 3) {
      input = {parse_width(spec, dims[0]), parse_width(spec, dims[1]), parse_width(spec, dims[2])};
    } else {
      bad_spec(spec, "the input '" + std::string(tokens[0]) + "' is not CxHxW or a width");
    }
  }
  if (options.input && options.input->size() != input.size()) {
    bad_spec(spec, "it takes " + kernels::to_string(input) + " but the input is " +
                       kernels::to_string(*options.input));
  }
  NetworkSpec net(input);
  for (std::size_t i = 1; i < tokens.size(); ++i) {
    std::string_view token = tokens[i];
    const std::string where = "layer " + std::to_string(i) + " '" + std::string(tokens[i]) + "'";
    std::size_t opens = 0, closes = 0;
    while (token.starts_with("res[")) {
      token = trim_space(token.substr(4));
      ++opens;
    }
    while (token.ends_with(']')) {
      token = trim_space(token.substr(0, token.size() - 1));
      ++closes;
    }
    try {
      for (std::size_t k = 0; k < opens; ++k) net.residual_begin();
    } catch (const KernelError& e) {
      bad_spec(spec, where + ": " + e.what());
    }
    if (!token.empty()) add_layer(net, spec, token, where);
    try {
      for (std::size_t k = 0; k < closes; ++k) net.residual_end();
    } catch (const KernelError& e) {
      bad_spec(spec, where + ": " + e.what());
    }
  }
  if (net.open_blocks() > 0) {
    bad_spec(spec, std::to_string(net.open_blocks()) + " residual block(s) opened with 'res[' " +
                       "are not closed with ']'");
  }
  if (net.layers().empty()) bad_spec(spec, "a net needs at least one layer");
  if (options.classes != 0 && net.output_size() != options.classes) {
    bad_spec(spec, "it ends in " + std::to_string(net.output_size()) +
                       " outputs but the data has " + std::to_string(options.classes) + " classes");
  }
  return net;
}

}  // namespace

std::string known_model_specs() {
  return "mlp:W0-W1-...-Wn (e.g. mlp:784-256-128-10), cnn:lenet5, cnn:2conv, cnn:2conv:HIDDEN "
         "(e.g. cnn:2conv:1024), cnn:cifar, cnn:resnet20, net:INPUT,LAYER,... (e.g. "
         "net:1x28x28,conv:16:3:1:1,relu,maxpool:2,linear:64,relu,linear:10)";
}

NetworkSpec make_network_spec(std::string_view spec, const ModelOptions& options) {
  const std::size_t classes = options.classes == 0 ? 10 : options.classes;
  try {
    if (spec.starts_with("mlp:")) return make_mlp(spec, spec.substr(4), options);
    if (spec.starts_with("net:")) return make_net(spec, spec.substr(4), options);
    if (spec == "cnn:lenet5") return make_lenet5(options.input.value_or(Shape{1, 28, 28}), classes);
    if (spec == "cnn:2conv") {
      return make_two_conv(options.input.value_or(Shape{1, 28, 28}), 32, 64, 512, classes);
    }
    if (spec.starts_with("cnn:2conv:")) {
      const std::size_t hidden = parse_width(spec, spec.substr(10));
      return make_two_conv(options.input.value_or(Shape{1, 28, 28}), 32, 64, hidden, classes);
    }
    if (spec == "cnn:resnet20" || spec == "resnet20") {
      return make_resnet20(options.input.value_or(Shape{3, 32, 32}), classes);
    }
    if (spec == "cnn:cifar") {
      return make_two_conv(options.input.value_or(Shape{3, 32, 32}), 32, 64, 512, classes);
    }
  } catch (const KernelError& e) {
    // The kernels reject impossible shapes (e.g. an input too small for two pooling stages).
    bad_spec(spec, std::string("cannot build it for this input: ") + e.what());
  }
  bad_spec(spec, "unknown model");
}

}  // namespace cohort::kernels
