// The plain C++ face of the CUDA kernels: device.cc reaches the .cu files only through this
// header, so nothing outside kernels/cuda/ includes cuda_runtime.h. Compiled only when
// COHORT_CUDA_ENABLED.
#pragma once

#include <memory>
#include <string>

#include "cohort/kernels/network.h"

namespace cohort::kernels::cuda {

// cudaGetDeviceCount, or 0 when it fails (no driver, no device). Never throws.
int device_count() noexcept;
// Total minus free memory of device `ordinal` (cudaMemGetInfo), or 0 when that fails.
std::size_t used_bytes(int ordinal) noexcept;
// "cuda:N <name> (sm_XY, G GiB)". Throws KernelError on a CUDA failure.
std::string describe(int ordinal);
// A Network whose parameters, gradients, activations and optimizer state live on device
// `ordinal`, with its own stream and cuBLAS handle. Throws KernelError on CUDA failures.
std::unique_ptr<Network> make_cuda_network(const NetworkSpec& spec, int ordinal);

}  // namespace cohort::kernels::cuda
