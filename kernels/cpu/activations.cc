// The elementwise activations of LayerKind kTanh, kSigmoid and kGelu (declared in layers.h).
#include <Eigen/Core>
#include <cmath>

#include "cohort/core/error.h"
#include "layers.h"

namespace cohort::kernels::cpu {
namespace {
using VectorMap = Eigen::Map<Eigen::VectorXf>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;
Eigen::Index ix(std::size_t n) { return static_cast<Eigen::Index>(n); }
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
}  // namespace

void activation_forward(LayerKind kind, const float* x, float* y, std::size_t count) {
  switch (kind) {
    case LayerKind::kTanh:
      VectorMap(y, ix(count)).array() = ConstVectorMap(x, ix(count)).array().tanh();
      break;
    case LayerKind::kSigmoid:
      VectorMap(y, ix(count)).array() = ConstVectorMap(x, ix(count)).array().logistic();
      break;
    case LayerKind::kGelu:
      for (std::size_t i = 0; i < count; ++i) {
        y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
      }
      break;
    default: throw KernelError("activation_forward: not an elementwise activation");
  }
}

void activation_backward(LayerKind kind, const float* x, const float* y, const float* dy, float* dx,
                         std::size_t count) {
  switch (kind) {
    case LayerKind::kTanh:
      for (std::size_t i = 0; i < count; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
      break;
    case LayerKind::kSigmoid:
      for (std::size_t i = 0; i < count; ++i) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
      break;
    case LayerKind::kGelu:
      for (std::size_t i = 0; i < count; ++i) {
        const float v = x[i];
        const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
        const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
      }
      break;
    default: throw KernelError("activation_backward: not an elementwise activation");
  }
}

}  // namespace cohort::kernels::cpu
