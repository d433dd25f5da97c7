#include "cohort/aggregation/powersgd.h"
#include "cohort/core/random.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "builtins.h"
#include "wire.h"

namespace cohort::aggregation {
namespace {

constexpr std::uint8_t kFactors = 0;
constexpr std::uint8_t kDense = 1;

class PowerState final : public CompressorState {
 public:
  explicit PowerState(std::size_t size) : size(size) {}
  std::size_t size;
  std::vector<float> q;  // b x r, row-major; empty until the first encode()
};

bool factors_smaller(MatrixShape s, std::size_t rank, std::size_t d) {
  return rank * (s.rows + s.cols) < d;
}

}  // namespace

MatrixShape powersgd_shape(std::size_t d, std::size_t cols) {
  if (d == 0) return {};
  std::size_t b = cols;
  if (b == 0) {
    b = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(d))));
    while (b > 1 && (b - 1) * (b - 1) >= d) --b;  // guard sqrt rounding
    while (b * b < d) ++b;
  }
  b = std::min(b, d);
  return {(d + b - 1) / b, b};
}

void orthonormalize_columns(std::span<double> p, std::size_t rows, std::size_t cols) {
  COHORT_CHECK(p.size() == rows * cols)
      << "matrix of " << p.size() << " for " << rows << "x" << cols;
  auto col_dot = [&](std::size_t a, std::size_t b) {
    double s = 0;
    for (std::size_t i = 0; i < rows; ++i) s += p[i * cols + a] * p[i * cols + b];
    return s;
  };
  std::vector<bool> zero(cols, false);
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t c = 0; c < cols; ++c) {
      if (zero[c]) continue;
      const double before = std::sqrt(col_dot(c, c));
      for (std::size_t prev = 0; prev < c; ++prev) {
        if (zero[prev]) continue;
        const double proj = col_dot(c, prev);
        for (std::size_t i = 0; i < rows; ++i) p[i * cols + c] -= proj * p[i * cols + prev];
      }
      const double norm = std::sqrt(col_dot(c, c));
      if (!(norm > 1e-30 * before) || norm == 0) {
        zero[c] = true;
        for (std::size_t i = 0; i < rows; ++i) p[i * cols + c] = 0;
        continue;
      }
      for (std::size_t i = 0; i < rows; ++i) p[i * cols + c] /= norm;
    }
  }
}

PowerSgd::PowerSgd(std::size_t rank, std::size_t cols) : rank_(rank), cols_(cols) {
  if (rank == 0 || rank > 0xffff) throw ConfigError("compressor.rank must be in [1, 65535]");
  if (cols > 0xffffffffu) throw ConfigError("compressor.cols must be < 2^32");
}

std::unique_ptr<CompressorState> PowerSgd::make_state(std::size_t size) const {
  return std::make_unique<PowerState>(size);
}

void PowerSgd::encode(std::span<const float> x, CompressorState* state, std::uint64_t seed,
                      std::vector<std::byte>& out) const {
  auto* s = dynamic_cast<PowerState*>(state);
  COHORT_CHECK(s != nullptr) << "PowerSgd::encode needs the state from its make_state()";
  COHORT_CHECK(s->size == x.size()) << "state for " << s->size << " elements, input " << x.size();
  detail::require_finite(x, "powersgd");
  const std::size_t d = x.size(), r = rank_;
  const MatrixShape shape = powersgd_shape(d, cols_);
  const std::size_t a = shape.rows, b = shape.cols;
  detail::ByteWriter w(out);
  w.header(WireFormat::kLowRank, static_cast<std::uint16_t>(r), d);
  if (!factors_smaller(shape, r, d)) {
    w.put(kDense);
    w.put_array(x);
    return;
  }
  w.put(kFactors);
  w.put(static_cast<std::uint32_t>(a));
  w.put(static_cast<std::uint32_t>(b));
  if (s->q.size() != b * r) {  // first step: Q ~ N(0, 1), from the seed
    s->q.resize(b * r);
    SplitMixRng rng(derive_seed(seed, 0x9051));
    for (float& v : s->q) v = static_cast<float>(rng.normal());
  }
  auto m = [&](std::size_t i, std::size_t j) -> double {
    const std::size_t k = i * b + j;
    return k < d ? static_cast<double>(x[k]) : 0.0;
  };
  // (7.9) P = M Q, a x r.
  std::vector<double> p(a * r, 0.0);
  for (std::size_t i = 0; i < a; ++i) {
    for (std::size_t j = 0; j < b; ++j) {
      const double mij = m(i, j);
      if (mij == 0) continue;
      for (std::size_t c = 0; c < r; ++c) p[i * r + c] += mij * s->q[j * r + c];
    }
  }
  // (7.10) P^ = orthonormalise(P).
  orthonormalize_columns(p, a, r);
  // (7.11) Q' = M^T P^, b x r.
  std::vector<double> q(b * r, 0.0);
  for (std::size_t i = 0; i < a; ++i) {
    for (std::size_t j = 0; j < b; ++j) {
      const double mij = m(i, j);
      if (mij == 0) continue;
      for (std::size_t c = 0; c < r; ++c) q[j * r + c] += mij * p[i * r + c];
    }
  }
  std::vector<float> pf(p.begin(), p.end());
  for (std::size_t k = 0; k < q.size(); ++k) s->q[k] = static_cast<float>(q[k]);  // warm start
  w.put_array(std::span<const float>(pf));
  w.put_array(std::span<const float>(s->q));
}

void PowerSgd::decode(std::span<const std::byte> bytes, std::span<float> out) const {
  detail::decode_lowrank(bytes, out);
}

namespace detail {

void decode_lowrank(std::span<const std::byte> bytes, std::span<float> out) {
  ByteReader r(bytes);
  const Header h = r.header(WireFormat::kLowRank, out.size());
  const std::size_t d = h.count, rank = h.param;
  const auto mode = r.get<std::uint8_t>();
  if (mode == kDense) {
    r.get_array(out);
    r.finish();
    return;
  }
  if (mode != kFactors) throw ProtocolError("powersgd: unknown mode");
  const std::size_t a = r.get<std::uint32_t>();
  const std::size_t b = r.get<std::uint32_t>();
  // The view must be the canonical one for d: a x b covers d with less than one spare row.
  if (rank == 0 || a == 0 || b == 0 || a * b < d || (a - 1) * b >= d) {
    throw ProtocolError("powersgd: factor shape does not fit the element count");
  }
  r.expect(4 * rank * (a + b));
  std::vector<float> p(a * rank), q(b * rank);
  r.get_array(std::span(p));
  r.get_array(std::span(q));
  r.finish();
  for (std::size_t k = 0; k < d; ++k) {
    const std::size_t i = k / b, j = k % b;
    double sum = 0;
    for (std::size_t c = 0; c < rank; ++c) {
      sum += static_cast<double>(p[i * rank + c]) * static_cast<double>(q[j * rank + c]);
    }
    out[k] = static_cast<float>(sum);
  }
}

void add_powersgd_compressor(CompressorRegistry& registry) {
  registry.add("powersgd", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "rank", "cols", "error_feedback"};
    o.require_known(known);
    return with_error_feedback(
        o, std::make_unique<PowerSgd>(get_count(o, "rank", 2), get_count(o, "cols", 0)), true);
  });
}

}  // namespace detail
}  // namespace cohort::aggregation
