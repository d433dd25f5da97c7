// QSGD (docs/ALGORITHMS.md 7.2): per bucket one fp32 scale, per element a sign bit and
// ceil(log2(s + 1)) bits of level. Quantisation itself is kernels::qsgd_quantize.
#include <bit>
#include <string>

#include "builtins.h"
#include "cohort/kernels/compression.h"
#include "wire.h"

namespace cohort::aggregation {
namespace detail {
namespace {

unsigned level_bits(std::uint32_t s) { return static_cast<unsigned>(std::bit_width(s)); }

std::size_t packed_bytes(std::size_t d, std::uint32_t s) {
  return (d * (1 + level_bits(s)) + 7) / 8;
}

class Qsgd final : public Compressor {
 public:
  explicit Qsgd(kernels::QsgdOptions options) : options_(options) {
    if (options.levels < 1 || options.levels > 32767) {
      throw ConfigError("compressor.s must be in [1, 32767], got " +
                        std::to_string(options.levels));
    }
    if (options.bucket_size > 0xffffffffu) throw ConfigError("compressor.bucket_size too large");
  }
  std::string_view encoding() const override { return "qsgd"; }
  bool is_unbiased() const override { return true; }
  void encode(std::span<const float> x, CompressorState* state, std::uint64_t seed,
              std::vector<std::byte>& out) const override {
    COHORT_CHECK(state == nullptr) << "qsgd is stateless";
    require_finite(x, "qsgd");
    const std::size_t d = x.size();
    std::vector<float> scales(kernels::qsgd_bucket_count(d, options_));
    std::vector<std::int16_t> levels(d);
    kernels::qsgd_quantize(x, options_, seed, scales, levels);
    ByteWriter w(out);
    w.header(WireFormat::kQsgd, static_cast<std::uint16_t>(options_.levels), d);
    w.put(static_cast<std::uint32_t>(options_.bucket_size));
    w.put_array(std::span<const float>(scales));
    const unsigned bits = level_bits(options_.levels);
    BitWriter bw(w.append(packed_bytes(d, options_.levels)).data());
    for (std::size_t j = 0; j < d; ++j) {
      const std::int32_t l = levels[j];
      bw.put(l < 0 ? 1u : 0u, 1);
      bw.put(static_cast<std::uint32_t>(l < 0 ? -l : l), bits);
    }
    bw.flush();
  }
  void decode(std::span<const std::byte> bytes, std::span<float> out) const override {
    decode_qsgd(bytes, out);
  }

 private:
  kernels::QsgdOptions options_;
};

}  // namespace

void decode_qsgd(std::span<const std::byte> bytes, std::span<float> out) {
  ByteReader r(bytes);
  const Header h = r.header(WireFormat::kQsgd, out.size());
  kernels::QsgdOptions options;
  options.levels = h.param;
  if (options.levels < 1 || options.levels > 32767) {
    throw ProtocolError("qsgd level count " + std::to_string(h.param) + " outside [1, 32767]");
  }
  options.bucket_size = r.get<std::uint32_t>();
  const std::size_t buckets = kernels::qsgd_bucket_count(h.count, options);
  r.expect(4 * buckets);
  std::vector<float> scales(buckets);
  r.get_array(std::span(scales));
  BitReader br(r.take(packed_bytes(h.count, options.levels)));
  r.finish();
  const unsigned bits = level_bits(options.levels);
  std::vector<std::int16_t> levels(h.count);
  for (std::size_t j = 0; j < h.count; ++j) {
    const bool negative = br.get(1) != 0;
    const std::uint32_t l = br.get(bits);
    if (l > options.levels) throw ProtocolError("qsgd level above s");
    levels[j] = static_cast<std::int16_t>(negative ? -static_cast<std::int32_t>(l)
                                                   : static_cast<std::int32_t>(l));
  }
  kernels::qsgd_dequantize(scales, levels, options, out);
}

void add_qsgd_compressor(CompressorRegistry& registry) {
  registry.add("qsgd", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "s", "bucket_size", "norm", "error_feedback"};
    o.require_known(known);
    kernels::QsgdOptions options;
    const std::size_t s = get_count(o, "s", 255);
    if (s < 1 || s > 32767) throw ConfigError("compressor.s must be in [1, 32767]");
    options.levels = static_cast<std::uint32_t>(s);
    options.bucket_size = get_count(o, "bucket_size", 512);
    const std::string norm = o.get_string("norm", "l2");
    if (norm == "l2") {
      options.norm = kernels::QsgdNorm::kL2;
    } else if (norm == "max") {
      options.norm = kernels::QsgdNorm::kMaxAbs;
    } else {
      throw ConfigError("compressor.norm must be \"l2\" or \"max\", got \"" + norm + "\"");
    }
    return with_error_feedback(o, std::make_unique<Qsgd>(options), false);
  });
}

}  // namespace detail
}  // namespace cohort::aggregation
