#include "cohort/aggregation/error_feedback.h"

#include "cohort/core/error.h"
#include "wire.h"

namespace cohort::aggregation {

ErrorFeedback::ErrorFeedback(std::unique_ptr<Compressor> inner) : inner_(std::move(inner)) {
  COHORT_CHECK(inner_ != nullptr) << "ErrorFeedback needs a compressor";
}

std::unique_ptr<CompressorState> ErrorFeedback::make_state(std::size_t size) const {
  auto state = std::make_unique<State>();
  state->residual_.assign(size, 0.0f);
  state->inner_ = inner_->make_state(size);
  return state;
}

void ErrorFeedback::encode(std::span<const float> x, CompressorState* state, std::uint64_t seed,
                           std::vector<std::byte>& out) const {
  auto* s = dynamic_cast<State*>(state);
  COHORT_CHECK(s != nullptr) << "ErrorFeedback::encode needs the state from its make_state()";
  COHORT_CHECK(s->residual_.size() == x.size())
      << "error-feedback state holds " << s->residual_.size() << " elements, input " << x.size();
  detail::require_finite(x, "error feedback");
  // (7.1) p = x + e;  (7.2) send C(p);  (7.4) e = p - C(p).
  std::vector<float>& p = s->scratch_;
  p.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) p[i] = x[i] + s->residual_[i];
  inner_->encode(p, s->inner_.get(), seed, out);
  inner_->decode(out, s->residual_);  // residual_ holds C(p) for a moment
  for (std::size_t i = 0; i < x.size(); ++i) s->residual_[i] = p[i] - s->residual_[i];
}

}  // namespace cohort::aggregation
