// Casts (docs/ALGORITHMS.md 7.6): none (fp32), fp16, bf16, int8 with a scale per chunk.
#include <algorithm>
#include <cmath>

#include "builtins.h"
#include "cohort/core/random.h"
#include "cohort/kernels/compression.h"
#include "wire.h"

namespace cohort::aggregation {
namespace detail {
namespace {

class NoCompression final : public Compressor {
 public:
  std::string_view encoding() const override { return "none"; }
  bool is_unbiased() const override { return true; }
  void encode(std::span<const float> x, CompressorState* state, std::uint64_t /*seed*/,
              std::vector<std::byte>& out) const override {
    COHORT_CHECK(state == nullptr) << "none is stateless";
    require_finite(x, "none");
    ByteWriter w(out);
    w.header(WireFormat::kDenseF32, 0, x.size());
    w.put_array(x);
  }
  void decode(std::span<const std::byte> bytes, std::span<float> out) const override {
    decode_dense(bytes, out);
  }
};

// fp16 and bf16: 2 bytes per element, round to nearest even (kernels/compression.h).
class HalfCast final : public Compressor {
 public:
  explicit HalfCast(bool bf16) : bf16_(bf16) {}
  std::string_view encoding() const override { return bf16_ ? "bf16" : "fp16"; }
  bool is_unbiased() const override { return false; }
  void encode(std::span<const float> x, CompressorState* state, std::uint64_t /*seed*/,
              std::vector<std::byte>& out) const override {
    COHORT_CHECK(state == nullptr) << encoding() << " is stateless";
    require_finite(x, bf16_ ? "bf16" : "fp16");
    ByteWriter w(out);
    w.header(bf16_ ? WireFormat::kBf16 : WireFormat::kFp16, 0, x.size());
    std::vector<std::uint16_t> halves(x.size());
    if (bf16_) {
      kernels::to_bf16(x, halves);
    } else {
      kernels::to_fp16(x, halves);
    }
    w.put_array(std::span<const std::uint16_t>(halves));
  }
  void decode(std::span<const std::byte> bytes, std::span<float> out) const override {
    if (bf16_) {
      decode_bf16(bytes, out);
    } else {
      decode_fp16(bytes, out);
    }
  }

 private:
  bool bf16_;
};

std::size_t chunk_count(std::size_t d, std::size_t chunk) {
  if (d == 0) return 0;
  return chunk == 0 ? 1 : (d + chunk - 1) / chunk;
}

// int8, symmetric: s = max|x| / 127 per chunk, q = clamp(round(x / s), -127, 127), or with
// stochastic rounding q = floor(x / s + U[0, 1)) (unbiased). A zero chunk sends s = 0, q = 0.
class Int8Cast final : public Compressor {
 public:
  Int8Cast(std::size_t chunk, bool stochastic) : chunk_(chunk), stochastic_(stochastic) {
    if (chunk > 0xffffffffu) throw ConfigError("compressor.chunk must be < 2^32");
  }
  std::string_view encoding() const override { return "int8"; }
  bool is_unbiased() const override { return stochastic_; }
  void encode(std::span<const float> x, CompressorState* state, std::uint64_t seed,
              std::vector<std::byte>& out) const override {
    COHORT_CHECK(state == nullptr) << "int8 is stateless";
    require_finite(x, "int8");
    const std::size_t d = x.size();
    const std::size_t len = chunk_ == 0 ? d : chunk_;
    const std::size_t chunks = chunk_count(d, chunk_);
    ByteWriter w(out);
    w.header(WireFormat::kInt8, stochastic_ ? 1 : 0, d);
    w.put(static_cast<std::uint32_t>(chunk_));
    std::vector<float> scales(chunks);
    std::vector<std::int8_t> q(d);
    SplitMixRng rng(seed);
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t begin = c * len, end = std::min(d, begin + len);
      float top = 0;
      for (std::size_t j = begin; j < end; ++j) top = std::max(top, std::fabs(x[j]));
      const float s = top / 127.0f;
      scales[c] = s;
      if (!(s > 0)) {
        std::fill(q.begin() + static_cast<std::ptrdiff_t>(begin),
                  q.begin() + static_cast<std::ptrdiff_t>(end), std::int8_t{0});
        continue;
      }
      for (std::size_t j = begin; j < end; ++j) {
        const double r = static_cast<double>(x[j]) / s;
        double level = stochastic_ ? std::floor(r + rng.uniform()) : std::nearbyint(r);
        level = std::clamp(level, -127.0, 127.0);
        q[j] = static_cast<std::int8_t>(level);
      }
    }
    w.put_array(std::span<const float>(scales));
    w.put_array(std::span<const std::int8_t>(q));
  }
  void decode(std::span<const std::byte> bytes, std::span<float> out) const override {
    decode_int8(bytes, out);
  }

 private:
  std::size_t chunk_;
  bool stochastic_;
};

}  // namespace

void decode_dense(std::span<const std::byte> bytes, std::span<float> out) {
  ByteReader r(bytes);
  r.header(WireFormat::kDenseF32, out.size());
  r.get_array(out);
  r.finish();
}

void decode_fp16(std::span<const std::byte> bytes, std::span<float> out) {
  ByteReader r(bytes);
  r.header(WireFormat::kFp16, out.size());
  std::vector<std::uint16_t> halves(out.size());
  r.get_array(std::span(halves));
  r.finish();
  kernels::from_fp16(halves, out);
}

void decode_bf16(std::span<const std::byte> bytes, std::span<float> out) {
  ByteReader r(bytes);
  r.header(WireFormat::kBf16, out.size());
  std::vector<std::uint16_t> halves(out.size());
  r.get_array(std::span(halves));
  r.finish();
  kernels::from_bf16(halves, out);
}

void decode_int8(std::span<const std::byte> bytes, std::span<float> out) {
  ByteReader r(bytes);
  const Header h = r.header(WireFormat::kInt8, out.size());
  const std::size_t chunk = r.get<std::uint32_t>();
  const std::size_t chunks = chunk_count(h.count, chunk);
  r.expect(4 * chunks);
  std::vector<float> scales(chunks);
  r.get_array(std::span(scales));
  const auto q = r.take(h.count);
  r.finish();
  const std::size_t len = chunk == 0 ? h.count : chunk;
  for (std::size_t j = 0; j < h.count; ++j) {
    const auto level = static_cast<std::int8_t>(std::to_integer<std::uint8_t>(q[j]));
    if (level < -127) throw ProtocolError("int8 level -128 is not used by the encoding");
    out[j] = scales[j / len] * static_cast<float>(level);
  }
}

void add_cast_compressors(CompressorRegistry& registry) {
  registry.add("none", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "error_feedback"};
    o.require_known(known);
    return with_error_feedback(o, std::make_unique<NoCompression>(), false);
  });
  registry.add("fp16", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "error_feedback"};
    o.require_known(known);
    return with_error_feedback(o, std::make_unique<HalfCast>(false), false);
  });
  registry.add("bf16", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "error_feedback"};
    o.require_known(known);
    return with_error_feedback(o, std::make_unique<HalfCast>(true), false);
  });
  registry.add("int8", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "chunk", "stochastic", "error_feedback"};
    o.require_known(known);
    return with_error_feedback(
        o, std::make_unique<Int8Cast>(get_count(o, "chunk", 0), o.get_bool("stochastic", false)),
        false);
  });
}

}  // namespace detail
}  // namespace cohort::aggregation
