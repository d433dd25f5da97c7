#include "cohort/kernels/model_zoo.h"

#include <doctest/doctest.h>

#include <algorithm>

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
  CHECK(error_of("net:1x8x8,conv:4:3:1:1,res[conv:4:3:1:1,relu").find("not closed with ']'") !=
        std::string::npos);
  CHECK(error_of("net:1x8x8,conv:4:3:1:1,bn]").find("layer 2 'bn]'") != std::string::npos);
  CHECK(error_of("net:1x8x8,conv:4:3:1:1,bn]").find("no residual block is open") !=
        std::string::npos);
  CHECK(error_of("net:1x5x5,res[conv:2:2]").find("no 1x1 projection") != std::string::npos);
  CHECK(error_of("net:1x4x4,avgpool:5").find("layer 1 'avgpool:5'") != std::string::npos);
  CHECK(error_of("net:1x4x4,gap:2").find("gap takes 0 argument") != std::string::npos);
}

TEST_CASE("net: batchnorm, pooling and residual blocks; resnet20 from the grammar") {
  // One block per line, as a TOML multi-line string would hold it; "res[" and "]" attached to
  // a layer or standing alone.
  const NetworkSpec a = make_network_spec(R"(net:3x32x32,
      conv:16:3:1:1, bn, relu,
      res[conv:16:3:1:1, bn, relu, conv:16:3:1:1, bn], relu,
      res[, conv:32:3:2:1, bn, relu, conv:32:3:1:1, bn, ], relu,
      avgpool:2, gap, linear:10)");
  std::vector<LayerKind> kinds;
  for (const LayerSpec& l : a.layers()) kinds.push_back(l.kind);
  CHECK(std::count(kinds.begin(), kinds.end(), LayerKind::kResidualBegin) == 2);
  CHECK(std::count(kinds.begin(), kinds.end(), LayerKind::kBatchNorm) == 5);
  CHECK(a.layers()[9].kind == LayerKind::kResidualEnd);
  CHECK(a.layers()[9].weight_count == 0);        // identity
  CHECK(a.layers()[17].weight_count == 16 * 32);  // the projection 16 -> 32, stride 2
  CHECK(a.layers()[17].stride == 2);
  CHECK(a.output_shape() == Shape{10, 1, 1});
  // resnet20 written in the grammar has the zoo's layers and parameter layout.
  std::string text = "net:3x32x32,conv:16:3:1:1,bn,relu";
  std::size_t channels = 16;
  for (const std::size_t width : {16, 32, 64}) {
    for (int block = 0; block < 3; ++block) {
      const std::size_t stride = block == 0 && width != 16 ? 2 : 1;
      text += ",res[conv:" + std::to_string(width) + ":3:" + std::to_string(stride) +
              ":1,bn,relu,conv:" + std::to_string(width) + ":3:1:1,bn],relu";
      channels = width;
    }
  }
  text += ",gap,linear:10";
  const NetworkSpec grammar = make_network_spec(text);
  const NetworkSpec zoo = make_network_spec("cnn:resnet20");
  CHECK(channels == 64);
  REQUIRE(grammar.layers().size() == zoo.layers().size());
  CHECK(grammar.parameter_count() == zoo.parameter_count());
  for (std::size_t i = 0; i < zoo.layers().size(); ++i) {
    CHECK(grammar.layers()[i].kind == zoo.layers()[i].kind);
    CHECK(grammar.layers()[i].weight_offset == zoo.layers()[i].weight_offset);
  }
  CHECK(make_network_spec("resnet20").parameter_count() == zoo.parameter_count());
  // On Fashion-MNIST's shape too: 28 -> 14 -> 7.
  CHECK(make_network_spec("cnn:resnet20", {.input = Shape{1, 28, 28}}).output_size() == 10);
}

}  // namespace
}  // namespace cohort::kernels
