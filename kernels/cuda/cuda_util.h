// Error conversion and RAII wrappers for the CUDA runtime and cuBLAS. Included only by .cu files.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include "cohort/core/buffer.h"

#include <cstddef>
#include <string>
#include <utility>

#include "cohort/core/error.h"

namespace cohort::kernels::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file,
                                     int line);

}  // namespace cohort::kernels::cuda

// Converts a failed CUDA runtime call to KernelError naming the call, error and place. Use after
// every launch too: COHORT_CUDA_CHECK(cudaGetLastError()).
#define COHORT_CUDA_CHECK(expr)                                                                  \
  do {                                                                                           \
    const cudaError_t cohort_cuda_status_ = (expr);                                              \
    if (cohort_cuda_status_ != cudaSuccess) {                                                    \
      ::cohort::kernels::cuda::throw_cuda_error(cohort_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                            \
  } while (false)

#define COHORT_CUBLAS_CHECK(expr)                                                         \
  do {                                                                                    \
    const cublasStatus_t cohort_cublas_status_ = (expr);                                  \
    if (cohort_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                 \
      ::cohort::kernels::cuda::throw_cublas_error(cohort_cublas_status_, #expr, __FILE__, \
                                                  __LINE__);                              \
    }                                                                                     \
  } while (false)

namespace cohort::kernels::cuda {

// Owns count elements of T in device memory (uninitialised). Move-only; not thread-safe. With a
// tracker (set while empty), its bytes are counted there: an allocation the tracker's limit
// refuses throws std::bad_alloc before cudaMalloc is called.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) { reset(count); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        tracker_(other.tracker_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      tracker_ = other.tracker_;
    }
    return *this;
  }
  void set_tracker(MemoryTracker* tracker) {
    release();
    tracker_ = tracker;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  // Frees the old storage and allocates count elements; contents are undefined.
  void reset(std::size_t count) {
    release();
    if (count == 0) return;
    const std::size_t bytes = count * sizeof(T);
    if (tracker_ != nullptr) tracker_->allocated(bytes);  // may throw std::bad_alloc
    void* p = nullptr;
    try {
      COHORT_CUDA_CHECK(cudaMalloc(&p, bytes));
    } catch (...) {
      if (tracker_ != nullptr) tracker_->released(bytes);
      throw;
    }
    data_ = static_cast<T*>(p);
    size_ = count;
  }
  // Grows to at least count elements (contents lost when it grows).
  void reserve(std::size_t count) {
    if (count > size_) reset(count);
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  [[nodiscard]] std::size_t size() const { return size_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) {
      cudaFree(data_);  // errors here cannot be reported; the context is gone
      if (tracker_ != nullptr) tracker_->released(size_ * sizeof(T));
    }
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  MemoryTracker* tracker_ = nullptr;
};

// A non-blocking stream. Move-only.
class Stream {
 public:
  Stream() { COHORT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t get() const { return stream_; }
  void synchronize() const { COHORT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

// A cuBLAS handle bound to one stream. Move-only.
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    COHORT_CUBLAS_CHECK(cublasCreate(&handle_));
    COHORT_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    // Full fp32 GEMMs (no TF32 tensor-core rounding), so results track the CPU reference.
    COHORT_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle() {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Makes `ordinal` current on the calling thread for the guard's lifetime (the current device is
// per thread, and a Network may be driven from different threads over its life).
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    COHORT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != ordinal) COHORT_CUDA_CHECK(cudaSetDevice(ordinal));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace cohort::kernels::cuda
