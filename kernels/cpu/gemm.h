// Single-threaded SGEMM for the CPU layers: C (+)= A * B with A and B given by element strides,
// so either operand may be read transposed without a copy. Callers split work across threads.
#pragma once

#include <cstddef>

namespace cohort::kernels::cpu {

// A(i, p) = a[i * a_row + p * a_col]   for i < m, p < k
// B(p, j) = b[p * b_row + j * b_col]   for p < k, j < n
// C(i, j) = c[i * ldc + j]             row-major
// C = A * B, or C += A * B when accumulate. Each operand should have a unit stride in one
// direction (row- or column-major); other strides work but pack slowly.
struct GemmOperand {
  const float* data;
  std::size_t row_stride;
  std::size_t col_stride;
};
void gemm(std::size_t m, std::size_t n, std::size_t k, GemmOperand a, GemmOperand b, float* c,
          std::size_t ldc, bool accumulate);

// Row-major conveniences: op(X) is X or its transpose.
inline GemmOperand row_major(const float* data, std::size_t cols) { return {data, cols, 1}; }
inline GemmOperand transposed(const float* data, std::size_t cols) { return {data, 1, cols}; }

}  // namespace cohort::kernels::cpu
