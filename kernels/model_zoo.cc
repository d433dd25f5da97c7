#include "cohort/kernels/model_zoo.h"

#include <charconv>
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

}  // namespace

std::string known_model_specs() {
  return "mlp:W0-W1-...-Wn (e.g. mlp:784-256-128-10), cnn:lenet5, cnn:2conv, cnn:2conv:HIDDEN "
         "(e.g. cnn:2conv:1024), cnn:cifar";
}

NetworkSpec make_network_spec(std::string_view spec, const ModelOptions& options) {
  const std::size_t classes = options.classes == 0 ? 10 : options.classes;
  try {
    if (spec.starts_with("mlp:")) return make_mlp(spec, spec.substr(4), options);
    if (spec == "cnn:lenet5") return make_lenet5(options.input.value_or(Shape{1, 28, 28}), classes);
    if (spec == "cnn:2conv") {
      return make_two_conv(options.input.value_or(Shape{1, 28, 28}), 32, 64, 512, classes);
    }
    if (spec.starts_with("cnn:2conv:")) {
      const std::size_t hidden = parse_width(spec, spec.substr(10));
      return make_two_conv(options.input.value_or(Shape{1, 28, 28}), 32, 64, hidden, classes);
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
