#include "cohort/kernels/model_zoo.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cohort/core/error.h"

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

}  // namespace
}  // namespace cohort::kernels
