// PowerSGD (docs/ALGORITHMS.md 7.4, Vogels et al. 2019) as a per-client Compressor.
//
// Matrix view: a flat update of d elements is read row-major as an a x b matrix M with
// b = cols (option; 0 means ceil(sqrt(d))), capped at d, and a = ceil(d / b), the last row padded
// with zeros. To follow the paper (each weight tensor viewed as first dim x rest, 1-D tensors sent
// uncompressed), encode each tensor separately with cols = the product of its trailing dims and
// send biases with the "none" compressor. When r(a + b) >= d the factors would not be smaller and
// the encoding is dense fp32 instead (lossless).
//
// One step, per client (federated: there is no all-reduce between clients, so each client runs
// (7.9)-(7.12) on its own M and sends both factors, r(a + b) floats):
//   P = M Q;  P^ = orthonormalise(P);  Q' = M^T P^;  send (P^, Q');  decoded = P^ Q'^T
// Q is the client's previous Q' (warm start, in its CompressorState), or i.i.d. N(0, 1) from the
// encode() seed on the first call. Orthonormalisation runs two Gram-Schmidt passes in double: one
// pass turns rounding noise into non-orthogonal columns when rank(M) < r (docs/ALGORITHMS.md 7.4).
// decoded = P^ P^^T M, the projection of M on r directions: exact for rank(M) <= r, biased
// otherwise, hence the error-feedback default (the (7.8)/(7.12) residual).
#pragma once

#include "cohort/aggregation/compressor.h"

namespace cohort::aggregation {

struct MatrixShape {
  std::size_t rows = 0;
  std::size_t cols = 0;
};

// The a x b view of d elements (see above). d = 0 gives 0 x 0.
[[nodiscard]] MatrixShape powersgd_shape(std::size_t d, std::size_t cols);

// Orthonormalises in place the `cols` columns of the row-major rows x cols matrix p: two
// Gram-Schmidt passes; a column with nothing left after projection (norm below 1e-30 of the
// column's original norm, or zero) becomes zero.
void orthonormalize_columns(std::span<double> p, std::size_t rows, std::size_t cols);

class PowerSgd final : public Compressor {
 public:
  // Throws ConfigError for rank 0 or rank > 65535.
  explicit PowerSgd(std::size_t rank, std::size_t cols = 0);
  [[nodiscard]] std::string_view encoding() const override { return "powersgd"; }
  [[nodiscard]] bool is_unbiased() const override { return false; }
  // Holds the warm-start Q (b x r floats).
  [[nodiscard]] std::unique_ptr<CompressorState> make_state(std::size_t size) const override;
  void encode(std::span<const float> x, CompressorState* state, std::uint64_t seed,
              std::vector<std::byte>& out) const override;
  void decode(std::span<const std::byte> bytes, std::span<float> out) const override;
  [[nodiscard]] MatrixShape shape(std::size_t d) const { return powersgd_shape(d, cols_); }

 private:
  std::size_t rank_, cols_;
};

}  // namespace cohort::aggregation
