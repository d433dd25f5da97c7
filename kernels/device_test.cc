#include "cohort/kernels/device.h"

#include <doctest/doctest.h>

#include "cohort/core/error.h"

namespace cohort::kernels {
namespace {

TEST_CASE("make_device builds cpu devices and names them") {
  auto one = make_device("cpu");
  CHECK(one->kind() == DeviceKind::kCpu);
  CHECK(one->name() == "cpu");
  CHECK(one->description() == "cpu (1 thread)");
  auto two = make_device("cpu", {.threads = 2});
  CHECK(two->description() == "cpu (2 threads)");
  CHECK(make_device("cpu", {.threads = 0})->description().starts_with("cpu ("));
}

TEST_CASE("make_device rejects unknown names with ConfigError") {
  for (const char* name : {"", "gpu", "tpu:0", "cuda:", "cuda:x", "cuda0", "cuda:-1", "CPU"}) {
    CAPTURE(name);
    CHECK_THROWS_AS(make_device(name), ConfigError);
  }
}

TEST_CASE("cuda names fail clearly when there is no CUDA build or device") {
  if (!built_with_cuda()) {
    CHECK(cuda_device_count() == 0);
    CHECK_THROWS_AS(make_device("cuda:0"), ConfigError);
    return;
  }
  const int count = cuda_device_count();
  CHECK_THROWS_AS(make_device("cuda:" + std::to_string(count)), KernelError);
  if (count == 0) {
    MESSAGE("no CUDA device: cuda:0 must fail with KernelError");
    CHECK_THROWS_AS(make_device("cuda"), KernelError);
  } else {
    auto device = make_device("cuda");
    CHECK(device->kind() == DeviceKind::kCuda);
    CHECK(device->name() == "cuda:0");
  }
}

}  // namespace
}  // namespace cohort::kernels
