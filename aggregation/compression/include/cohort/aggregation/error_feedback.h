// Error feedback (docs/ALGORITHMS.md 7.1, Karimireddy et al. 2019; Stich et al. 2018) around any
// compressor C, in the Cohort default form (7.1-7.4) with the update already scaled:
//   p = x + e;  send C(p);  e <- p - decode(C(p))        (e_0 = 0)
// so that what was sent plus the new residual equals the input plus the old residual: over T
// steps, sum of sent + e_T = sum of inputs, up to float rounding of p and of p - sent. The wire
// encoding is the inner compressor's (decode() forwards to it). Stateful: make_state() holds e
// (size floats, zero) and the inner compressor's state. Thread-safety as Compressor.
#pragma once

#include <memory>
#include <vector>

#include "cohort/aggregation/compressor.h"

namespace cohort::aggregation {

class ErrorFeedback final : public Compressor {
 public:
  // REQUIRES inner != nullptr.
  explicit ErrorFeedback(std::unique_ptr<Compressor> inner);

  class State final : public CompressorState {
   public:
    [[nodiscard]] std::span<const float> residual() const { return residual_; }

   private:
    friend class ErrorFeedback;
    std::vector<float> residual_;
    std::vector<float> scratch_;  // p, then decode(C(p)); reused between calls
    std::unique_ptr<CompressorState> inner_;
  };

  [[nodiscard]] std::string_view encoding() const override { return inner_->encoding(); }
  [[nodiscard]] bool is_unbiased() const override { return false; }
  [[nodiscard]] std::unique_ptr<CompressorState> make_state(std::size_t size) const override;
  // REQUIRES state from make_state(x.size()).
  void encode(std::span<const float> x, CompressorState* state, std::uint64_t seed,
              std::vector<std::byte>& out) const override;
  void decode(std::span<const std::byte> bytes, std::span<float> out) const override {
    inner_->decode(bytes, out);
  }
  [[nodiscard]] const Compressor& inner() const { return *inner_; }

 private:
  std::unique_ptr<Compressor> inner_;
};

}  // namespace cohort::aggregation
