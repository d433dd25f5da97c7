// Where local training runs: the device-neutral entry point of cohort::kernels.
//
// The trainer names a device in its config ("cpu", "cuda", "cuda:0", ...), gets a Device from
// make_device() and asks it for Networks (network.h). Everything above kernels/ is written against
// these interfaces and never sees Eigen, CUDA or cuBLAS.
//
//   auto device = cohort::kernels::make_device(options.device, {.threads = options.threads});
//   auto net = device->make_network(spec);
//   net->init(seed);
//   net->set_optimizer({.kind = OptimizerKind::kSgd, .learning_rate = 0.05f, .momentum = 0.9f});
//   for (...) loss = net->train_step(x, y, batch);
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "cohort/kernels/network.h"

namespace cohort::kernels {

enum class DeviceKind { kCpu, kCuda };

struct DeviceOptions {
  // CPU: threads each Network's kernels use (the caller's thread included). 1 runs everything
  // on the calling thread; 0 means one per hardware thread. When many Networks train at once
  // (cohort-sim) keep 1 and parallelise across Networks instead. Ignored by CUDA.
  std::size_t threads = 1;
};

// A compute device. Immutable after construction and thread-safe: make_network() may be called
// from any thread. Must outlive every Network it made (they share its worker threads or its
// CUDA context).
class Device {
 public:
  virtual ~Device() = default;
  [[nodiscard]] virtual DeviceKind kind() const = 0;
  // The canonical name: "cpu" or "cuda:N".
  [[nodiscard]] virtual std::string name() const = 0;
  // For logs, e.g. "cpu (2 threads)" or "cuda:0 NVIDIA H200 (sm_90, 139 GiB)".
  [[nodiscard]] virtual std::string description() const = 0;
  // Allocates everything the network needs (parameters zero until init()). Throws KernelError
  // if the device runs out of memory or fails.
  [[nodiscard]] virtual std::unique_ptr<Network> make_network(const NetworkSpec& spec) const = 0;
};

// Names: "cpu"; "cuda" (= "cuda:0") and "cuda:N". Throws ConfigError for an unknown name (listing
// the valid ones) and for a CUDA name in a build without CUDA (COHORT_WITH_CUDA=OFF or no nvcc);
// throws KernelError for a CUDA name when the machine has no such CUDA device at run time.
std::unique_ptr<Device> make_device(std::string_view name, const DeviceOptions& options = {});

// True when this build contains the CUDA kernels.
bool built_with_cuda() noexcept;
// Number of usable CUDA devices; 0 when built without CUDA or when the driver reports none or
// fails. Never throws.
int cuda_device_count() noexcept;
// Device `ordinal`'s memory in use by anyone (total minus free, cudaMemGetInfo), in bytes; 0
// without CUDA or a device. Never throws. For checking the tracked counts against the driver's.
std::size_t cuda_used_bytes(int ordinal) noexcept;

}  // namespace cohort::kernels
