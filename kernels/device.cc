#include "cohort/kernels/device.h"

#include <charconv>
#include <string>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/core/thread_pool.h"
#include "cpu/cpu_network.h"
#if COHORT_KERNELS_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace cohort::kernels {
namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(std::size_t threads) : threads_(threads) {
    // The caller's thread runs one part of every split; the pool has `threads` workers so that
    // ThreadPool::parallel_for splits into `threads` parts (one stays idle while the caller works).
    if (threads_ > 1) pool_ = std::make_unique<ThreadPool>(threads_);
  }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "cpu (" + std::to_string(threads_) + (threads_ == 1 ? " thread)" : " threads)");
  }
  std::unique_ptr<Network> make_network(const NetworkSpec& spec) const override {
    return cpu::make_cpu_network(spec, pool_.get());
  }

 private:
  std::size_t threads_;
  std::unique_ptr<ThreadPool> pool_;  // null for one thread; thread-safe, shared by networks
};

#if COHORT_KERNELS_CUDA
class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal), description_(cuda::describe(ordinal)) {}
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  std::string description() const override { return description_; }
  std::unique_ptr<Network> make_network(const NetworkSpec& spec) const override {
    return cuda::make_cuda_network(spec, ordinal_);
  }

 private:
  int ordinal_;
  std::string description_;
};
#endif

[[noreturn]] void unknown_device(std::string_view name) {
  throw ConfigError("unknown device '" + std::string(name) +
                    "' (valid: cpu, cuda, cuda:N with N a device index)");
}

}  // namespace

bool built_with_cuda() noexcept { return COHORT_KERNELS_CUDA != 0; }

std::size_t cuda_used_bytes(int ordinal) noexcept {
#if COHORT_KERNELS_CUDA
  return cuda::used_bytes(ordinal);
#else
  (void)ordinal;
  return 0;
#endif
}

int cuda_device_count() noexcept {
#if COHORT_KERNELS_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::unique_ptr<Device> make_device(std::string_view name, const DeviceOptions& options) {
  if (name == "cpu") {
    std::size_t threads = options.threads;
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    return std::make_unique<CpuDevice>(threads);
  }
  if (!name.starts_with("cuda")) unknown_device(name);
  int ordinal = 0;
  if (name != "cuda") {
    const std::string_view digits = name.substr(4);
    if (digits.size() < 2 || digits[0] != ':') unknown_device(name);
    const auto [end, ec] =
        std::from_chars(digits.data() + 1, digits.data() + digits.size(), ordinal);
    if (ec != std::errc() || end != digits.data() + digits.size() || ordinal < 0) {
      unknown_device(name);
    }
  }
#if COHORT_KERNELS_CUDA
  const int count = cuda::device_count();
  if (ordinal >= count) {
    throw KernelError("device '" + std::string(name) + "' requested but this machine has " +
                      std::to_string(count) + " usable CUDA device(s); use device = cpu");
  }
  return std::make_unique<CudaDevice>(ordinal);
#else
  throw ConfigError("device '" + std::string(name) +
                    "' requested but this build has no CUDA support (rebuild with nvcc on PATH "
                    "and COHORT_WITH_CUDA=AUTO or ON), or use device = cpu");
#endif
}

}  // namespace cohort::kernels
