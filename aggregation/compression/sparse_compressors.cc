// top-k and random-k sparsification (docs/ALGORITHMS.md 7.1). Both are biased as sent (contractive,
// delta = k/d) and run under error feedback by default; random-k with scaled = true multiplies
// the kept values by d/k and is unbiased (omega = d/k - 1).
#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "builtins.h"
#include "cohort/core/random.h"
#include "cohort/kernels/compression.h"
#include "wire.h"

namespace cohort::aggregation {
namespace detail {
namespace {

// How many coordinates to keep of d: an explicit k (capped at d) or max(1, floor(d k_fraction)).
struct KeepRule {
  std::size_t k = 0;  // 0: use fraction
  double fraction = 0.01;
  std::size_t of(std::size_t d) const {
    if (d == 0) return 0;
    if (k > 0) return std::min(k, d);
    const auto n = static_cast<std::size_t>(std::floor(static_cast<double>(d) * fraction));
    return std::clamp<std::size_t>(n, 1, d);
  }
};

KeepRule keep_rule(const ConfigSection& o) {
  KeepRule rule;
  if (o.has("k") && o.has("k_fraction")) {
    throw ConfigError("compressor: give k or k_fraction, not both");
  }
  if (o.has("k")) {
    rule.k = get_count(o, "k", 0);
    if (rule.k == 0) throw ConfigError("compressor.k must be >= 1");
  }
  rule.fraction = o.get_double("k_fraction", 0.01);
  if (!(rule.fraction > 0 && rule.fraction <= 1)) {
    throw ConfigError("compressor.k_fraction must be in (0, 1]");
  }
  return rule;
}

// k distinct indices of [0, d), uniformly (Floyd's algorithm), in increasing order. Identical on
// every platform for the same (d, k, seed): the decoder regenerates them instead of receiving them.
std::vector<std::uint32_t> random_subset(std::size_t d, std::size_t k, std::uint64_t seed) {
  std::vector<bool> taken(d, false);
  SplitMixRng rng(seed);
  for (std::size_t j = d - k; j < d; ++j) {
    const auto t = static_cast<std::size_t>(rng.below(j + 1));
    taken[taken[t] ? j : t] = true;
  }
  std::vector<std::uint32_t> indices;
  indices.reserve(k);
  for (std::size_t j = 0; j < d; ++j) {
    if (taken[j]) indices.push_back(static_cast<std::uint32_t>(j));
  }
  return indices;
}

constexpr std::uint16_t kIndexList = 0;
constexpr std::uint16_t kBitmap = 1;

class TopK final : public Compressor {
 public:
  explicit TopK(KeepRule rule) : rule_(rule) {}
  std::string_view encoding() const override { return "topk"; }
  bool is_unbiased() const override { return false; }
  void encode(std::span<const float> x, CompressorState* state, std::uint64_t /*seed*/,
              std::vector<std::byte>& out) const override {
    COHORT_CHECK(state == nullptr) << "topk is stateless (wrap it in ErrorFeedback for memory)";
    require_finite(x, "topk");
    const std::size_t d = x.size(), k = rule_.of(d);
    std::vector<std::uint32_t> indices(k);
    std::vector<float> values(k);
    kernels::top_k(x, k, indices, values);
    // k 32-bit indices, or a d-bit bitmap when that is smaller (k > d/32).
    const std::size_t bitmap_bytes = (d + 7) / 8;
    const bool bitmap = bitmap_bytes < 4 * k;
    ByteWriter w(out);
    w.header(WireFormat::kTopK, bitmap ? kBitmap : kIndexList, d);
    w.put(static_cast<std::uint32_t>(k));
    if (bitmap) {
      auto bits = w.append(bitmap_bytes);
      for (std::uint32_t j : indices) bits[j / 8] |= std::byte{1} << (j % 8);
    } else {
      w.put_array(std::span<const std::uint32_t>(indices));
    }
    w.put_array(std::span<const float>(values));
  }
  void decode(std::span<const std::byte> bytes, std::span<float> out) const override {
    decode_topk(bytes, out);
  }

 private:
  KeepRule rule_;
};

class RandomK final : public Compressor {
 public:
  RandomK(KeepRule rule, bool scaled) : rule_(rule), scaled_(scaled) {}
  std::string_view encoding() const override { return "randomk"; }
  bool is_unbiased() const override { return scaled_; }
  void encode(std::span<const float> x, CompressorState* state, std::uint64_t seed,
              std::vector<std::byte>& out) const override {
    COHORT_CHECK(state == nullptr) << "randomk is stateless (wrap it in ErrorFeedback for memory)";
    require_finite(x, "randomk");
    const std::size_t d = x.size(), k = rule_.of(d);
    const auto indices = random_subset(d, k, seed);
    const double factor = scaled_ && k > 0 ? static_cast<double>(d) / static_cast<double>(k) : 1.0;
    std::vector<float> values(k);
    for (std::size_t i = 0; i < k; ++i) values[i] = static_cast<float>(x[indices[i]] * factor);
    ByteWriter w(out);
    w.header(WireFormat::kRandomK, scaled_ ? 1 : 0, d);
    w.put(static_cast<std::uint32_t>(k));
    w.put(seed);
    w.put_array(std::span<const float>(values));
  }
  void decode(std::span<const std::byte> bytes, std::span<float> out) const override {
    decode_randomk(bytes, out);
  }

 private:
  KeepRule rule_;
  bool scaled_;
};

}  // namespace

void decode_topk(std::span<const std::byte> bytes, std::span<float> out) {
  ByteReader r(bytes);
  const Header h = r.header(WireFormat::kTopK, out.size());
  const std::size_t k = r.get<std::uint32_t>();
  if (k > h.count) throw ProtocolError("topk keeps more elements than the vector has");
  std::vector<std::uint32_t> indices;
  if (h.param == kBitmap) {
    const auto bits = r.take((h.count + 7) / 8);
    indices.reserve(k);
    for (std::size_t j = 0; j < h.count; ++j) {
      if ((bits[j / 8] & (std::byte{1} << (j % 8))) != std::byte{0}) {
        indices.push_back(static_cast<std::uint32_t>(j));
      }
    }
    const std::size_t tail = h.count % 8;
    if (tail != 0 && (std::to_integer<unsigned>(bits.back()) >> tail) != 0) {
      throw ProtocolError("topk bitmap has bits past the end");
    }
    if (indices.size() != k) throw ProtocolError("topk bitmap does not hold k elements");
  } else if (h.param == kIndexList) {
    r.expect(4 * k);
    indices.resize(k);
    r.get_array(std::span(indices));
    for (std::size_t i = 0; i < k; ++i) {
      if (indices[i] >= h.count || (i > 0 && indices[i] <= indices[i - 1])) {
        throw ProtocolError("topk indices out of range or not increasing");
      }
    }
  } else {
    throw ProtocolError("topk: unknown index mode");
  }
  r.expect(4 * k);
  std::vector<float> values(k);
  r.get_array(std::span(values));
  r.finish();
  std::fill(out.begin(), out.end(), 0.0f);
  for (std::size_t i = 0; i < k; ++i) out[indices[i]] = values[i];
}

void decode_randomk(std::span<const std::byte> bytes, std::span<float> out) {
  ByteReader r(bytes);
  const Header h = r.header(WireFormat::kRandomK, out.size());
  const std::size_t k = r.get<std::uint32_t>();
  const auto seed = r.get<std::uint64_t>();
  if (k > h.count) throw ProtocolError("randomk keeps more elements than the vector has");
  r.expect(4 * k);
  std::vector<float> values(k);
  r.get_array(std::span(values));
  r.finish();
  const auto indices = random_subset(h.count, k, seed);
  std::fill(out.begin(), out.end(), 0.0f);
  for (std::size_t i = 0; i < k; ++i) out[indices[i]] = values[i];
}

void add_sparse_compressors(CompressorRegistry& registry) {
  registry.add("topk", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "k", "k_fraction", "error_feedback"};
    o.require_known(known);
    return with_error_feedback(o, std::make_unique<TopK>(keep_rule(o)), true);
  });
  registry.add("randomk", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "k", "k_fraction", "scaled", "error_feedback"};
    o.require_known(known);
    const bool scaled = o.get_bool("scaled", false);
    return with_error_feedback(o, std::make_unique<RandomK>(keep_rule(o), scaled), !scaled);
  });
}

}  // namespace detail
}  // namespace cohort::aggregation
