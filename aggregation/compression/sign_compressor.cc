// Scaled sign (docs/ALGORITHMS.md 7.3, EF-signSGD): C(p) = (||p||_1 / d) sign(p), sign(0) = +1.
// Wire: one fp32 scale and d bits (1 = negative). Biased; error feedback on by default.
#include <cmath>

#include "builtins.h"
#include "wire.h"

namespace cohort::aggregation {
namespace detail {
namespace {

class ScaledSign final : public Compressor {
 public:
  std::string_view encoding() const override { return "sign"; }
  bool is_unbiased() const override { return false; }
  void encode(std::span<const float> x, CompressorState* state, std::uint64_t /*seed*/,
              std::vector<std::byte>& out) const override {
    COHORT_CHECK(state == nullptr) << "sign is stateless (wrap it in ErrorFeedback for memory)";
    require_finite(x, "sign");
    const std::size_t d = x.size();
    double l1 = 0;
    for (float v : x) l1 += std::fabs(static_cast<double>(v));
    ByteWriter w(out);
    w.header(WireFormat::kSign, 0, d);
    w.put(d == 0 ? 0.0f : static_cast<float>(l1 / static_cast<double>(d)));
    auto bits = w.append((d + 7) / 8);
    for (std::size_t j = 0; j < d; ++j) {
      if (x[j] < 0) bits[j / 8] |= std::byte{1} << (j % 8);  // -0.0 counts as 0: sign +1
    }
  }
  void decode(std::span<const std::byte> bytes, std::span<float> out) const override {
    decode_sign(bytes, out);
  }
};

}  // namespace

void decode_sign(std::span<const std::byte> bytes, std::span<float> out) {
  ByteReader r(bytes);
  const Header h = r.header(WireFormat::kSign, out.size());
  const auto scale = r.get<float>();
  const auto bits = r.take((h.count + 7) / 8);
  r.finish();
  for (std::size_t j = 0; j < h.count; ++j) {
    const bool negative = (bits[j / 8] & (std::byte{1} << (j % 8))) != std::byte{0};
    out[j] = negative ? -scale : scale;
  }
}

void add_sign_compressor(CompressorRegistry& registry) {
  registry.add("sign", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "error_feedback"};
    o.require_known(known);
    return with_error_feedback(o, std::make_unique<ScaledSign>(), true);
  });
}

}  // namespace detail
}  // namespace cohort::aggregation
