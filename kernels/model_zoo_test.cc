#include "cohort/kernels/model_zoo.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/kernels/device.h"

namespace cohort::kernels {
namespace {

TEST_CASE("model specs produce the published parameter counts") {
  CHECK(make_network_spec("mlp:784-256-128-10").parameter_count() == 235146);
  CHECK(make_network_spec("mlp:784-10").parameter_count() == 7850);
  CHECK(make_network_spec("cnn:lenet5").parameter_count() == 61706);
  // McMahan et al. (2017): "1,663,370 total parameters".
  CHECK(make_network_spec("cnn:2conv").parameter_count() == 1663370);
  // TensorFlow's Deep MNIST tutorial net (fc1024).
  CHECK(make_network_spec("cnn:2conv:1024").parameter_count() == 3274634);
  CHECK(make_network_spec("cnn:cifar").parameter_count() == 2156490);
}

TEST_CASE("model specs take the data's input shape and classes") {
  const auto mlp = make_network_spec("mlp:784-256-128-10", {.input = kernels::Shape{1, 28, 28}});
  CHECK(mlp.input_shape() == kernels::Shape{1, 28, 28});
  CHECK(mlp.parameter_count() == 235146);
  CHECK(mlp.output_size() == 10);
  const auto cifar =
      make_network_spec("cnn:2conv", {.input = kernels::Shape{3, 32, 32}, .classes = 100});
  CHECK(cifar.input_shape() == kernels::Shape{3, 32, 32});
  CHECK(cifar.output_size() == 100);
  CHECK(make_network_spec("cnn:cifar").input_shape() == kernels::Shape{3, 32, 32});
}

TEST_CASE("initialisation is deterministic for a seed") {
  const auto spec = make_network_spec("cnn:lenet5");
  std::vector<float> a(spec.parameter_count());
  std::vector<float> b(spec.parameter_count());
  std::vector<float> c(spec.parameter_count());
  spec.initialize(11, a);
  spec.initialize(11, b);
  spec.initialize(12, c);
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("bad model specs are ConfigErrors listing the known ones") {
  for (const std::string bad : {"", "mlp:", "mlp:784", "mlp:784--10", "mlp:784-x-10", "mlp:0-10",
                                "cnn:resnet50", "transformer", "cnn:2conv:0"}) {
    CAPTURE(bad);
    try {
      (void)make_network_spec(bad);
      FAIL("no throw");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find("cnn:lenet5") != std::string::npos);
    }
  }
  CHECK_THROWS_AS((void)make_network_spec("mlp:784-10", {.input = kernels::Shape{3, 32, 32}}),
                  ConfigError);
  CHECK_THROWS_AS((void)make_network_spec("mlp:784-10", {.classes = 100}), ConfigError);
  CHECK_THROWS_AS((void)make_network_spec("cnn:2conv", {.input = kernels::Shape{1, 3, 3}}),
                  ConfigError);
}

TEST_CASE("net: your own network from a layer list equals the zoo's, and trains") {
  // LeNet-5 and the FedAvg CNN written out layer by layer: the same layers, the same count.
  const auto lenet = make_network_spec(
      "net:1x28x28,conv:6:5:1:2,relu,maxpool:2,conv:16:5,relu,maxpool:2,linear:120,relu,"
      "linear:84,relu,linear:10");
  CHECK(lenet.parameter_count() == make_network_spec("cnn:lenet5").parameter_count());
  CHECK(lenet.layers().size() == make_network_spec("cnn:lenet5").layers().size());
  const auto two_conv = make_network_spec(
      "net:1x28x28,conv:32:5:1:2,relu,maxpool:2,conv:64:5:1:2,relu,maxpool:2,flatten,linear:512,"
      "relu,linear:10");
  CHECK(two_conv.parameter_count() == 1663370);
  const auto mlp = make_network_spec("net:784,linear:256,relu,dropout:0.2,linear:10");
  CHECK(mlp.input_shape() == Shape{784, 1, 1});
  CHECK(mlp.output_size() == 10);
  CHECK(make_network_spec("net:3x8x8,conv:4:3:2:1,relu,maxpool:2:1,linear:5").output_size() == 5);
  // The smooth activations, by name.
  const auto smooth = make_network_spec(
      "net:1x6x6,conv:3:3:1:1,gelu,maxpool:2,linear:8,tanh,linear:4,sigmoid,linear:2");
  std::vector<std::string> kinds;
  for (const auto& l : smooth.layers()) kinds.emplace_back(to_string(l.kind));
  CHECK(kinds == std::vector<std::string>{"conv2d", "gelu", "maxpool2d", "flatten", "linear",
                                          "tanh", "linear", "sigmoid", "linear"});
  CHECK_THROWS_AS(make_network_spec("net:4,tanh:2,linear:2"), ConfigError);
  // One layer per line, as a TOML multi-line string holds it.
  CHECK(make_network_spec("net:784,\n  linear:256, relu,\n  linear:10\n").parameter_count() ==
        make_network_spec("mlp:784-256-10").parameter_count());

  // It trains: the loss of a small CNN falls over a few steps on a fixed batch.
  const auto spec = make_network_spec("net:1x8x8,conv:4:3:1:1,relu,maxpool:2,linear:3");
  auto device = make_device("cpu");
  auto net = device->make_network(spec);
  net->init(1);
  net->set_optimizer({.learning_rate = 0.1f});
  std::vector<float> x(6 * 64);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7) % 13) / 13.0f;
  const std::vector<std::int32_t> y{0, 1, 2, 0, 1, 2};
  const float first = net->train_step(x, y, 6);
  float last = first;
  for (int step = 0; step < 30; ++step) last = net->train_step(x, y, 6);
  CHECK(last < first);
}

TEST_CASE("net: a bad layer list names the layer and why") {
  const auto error_of = [](const char* spec) {
    try {
      (void)make_network_spec(spec);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  CHECK(error_of("net:1x28x28,conv:8:3,softmax").find("layer 2 'softmax': unknown layer") !=
        std::string::npos);
  CHECK(error_of("net:1x4x4,conv:8:7").find("layer 1 'conv:8:7'") != std::string::npos);
  CHECK(error_of("net:784,linear").find("layer 1 'linear': linear takes 1 argument") !=
        std::string::npos);
  CHECK(error_of("net:784,dropout:1.5").find("the drop probability must be in [0, 1)") !=
        std::string::npos);
  CHECK(error_of("net:28x28,linear:10").find("is not CxHxW or a width") != std::string::npos);
  CHECK(error_of("net:784").find("at least one layer") != std::string::npos);
  CHECK_THROWS_AS(make_network_spec("net:784,linear:10", {.classes = 3}), ConfigError);
}

}  // namespace
}  // namespace cohort::kernels
