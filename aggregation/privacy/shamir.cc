// Shamir secret sharing over GF(2^61 - 1) (docs/ALGORITHMS.md 8.1; Shamir 1979).
#include <cstring>
#include <set>
#include <string>

#include "cohort/aggregation/secure_aggregation.h"
#include "cohort/core/error.h"
#include "secagg_crypto.h"

namespace cohort::aggregation::secagg {
namespace {

constexpr std::uint64_t kP = kShamirPrime;
__extension__ using Uint128 = unsigned __int128;

std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t s = a + b;  // < 2^62: no overflow
  return s >= kP ? s - kP : s;
}
std::uint64_t sub(std::uint64_t a, std::uint64_t b) { return a >= b ? a - b : a + kP - b; }
std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  const Uint128 m = static_cast<Uint128>(a) * b;
  // 2^61 = 1 (mod p): fold the high bits onto the low ones.
  std::uint64_t r = static_cast<std::uint64_t>(m & kP) + static_cast<std::uint64_t>(m >> 61);
  r = (r & kP) + (r >> 61);
  return r >= kP ? r - kP : r;
}
std::uint64_t power(std::uint64_t a, std::uint64_t e) {
  std::uint64_t r = 1;
  while (e > 0) {
    if (e & 1) r = mul(r, a);
    a = mul(a, a);
    e >>= 1;
  }
  return r;
}
std::uint64_t inverse(std::uint64_t a) { return power(a, kP - 2); }  // Fermat; a != 0

// Uniform field elements from a byte source (61 random bits, reject p itself).
class FieldSource {
 public:
  explicit FieldSource(const Key* seed) : seed_(seed) {}
  std::uint64_t next() {
    for (;;) {
      if (at_ == buffer_.size()) refill();
      std::uint64_t v;
      std::memcpy(&v, buffer_.data() + at_, 8);
      at_ += 8;
      v &= kP;
      if (v < kP) return v;
    }
  }

 private:
  void refill() {
    buffer_.assign(512, 0);
    if (seed_ != nullptr) {
      // A deterministic stream: the keystream continues where the previous refill ended.
      stream_.resize(stream_.size() + buffer_.size());
      detail::keystream(*seed_, stream_);
      std::memcpy(buffer_.data(), stream_.data() + stream_.size() - buffer_.size(), buffer_.size());
    } else {
      detail::random_bytes(buffer_);
    }
    at_ = 0;
  }
  const Key* seed_;
  std::vector<std::uint8_t> buffer_;
  std::vector<std::uint8_t> stream_;
  std::size_t at_ = 0;
};

}  // namespace

std::vector<Share> shamir_split(std::span<const std::uint8_t> secret, std::size_t threshold,
                                std::span<const std::uint64_t> xs, const Key* coefficient_seed) {
  if (secret.size() % 4 != 0) throw ConfigError("shamir: secret length must be a multiple of 4");
  if (threshold == 0 || threshold > xs.size()) {
    throw ConfigError("shamir: threshold " + std::to_string(threshold) + " with " +
                      std::to_string(xs.size()) + " shares");
  }
  std::set<std::uint64_t> seen;
  for (auto x : xs) {
    if (x == 0 || x >= kP || !seen.insert(x).second) {
      throw ConfigError("shamir: share points must be distinct and in [1, p)");
    }
  }
  const std::size_t limbs = secret.size() / 4;
  std::vector<Share> shares(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    shares[i].x = xs[i];
    shares[i].y.assign(limbs, 0);
  }
  FieldSource source(coefficient_seed);
  std::vector<std::uint64_t> coeff(threshold);
  for (std::size_t l = 0; l < limbs; ++l) {
    std::uint32_t limb;
    std::memcpy(&limb, secret.data() + 4 * l, 4);
    coeff[0] = limb;
    for (std::size_t c = 1; c < threshold; ++c) coeff[c] = source.next();
    for (auto& share : shares) {
      std::uint64_t acc = 0;  // Horner
      for (std::size_t c = threshold; c-- > 0;) acc = add(mul(acc, share.x), coeff[c]);
      share.y[l] = acc;
    }
  }
  for (auto& c : coeff) c = 0;
  return shares;
}

std::uint64_t lagrange_at_zero(std::span<const std::uint64_t> xs,
                               std::span<const std::uint64_t> ys) {
  if (xs.size() != ys.size() || xs.empty()) throw ProtocolError("shamir: no or uneven points");
  std::uint64_t result = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == 0 || xs[i] >= kP || ys[i] >= kP) throw ProtocolError("shamir: point out of range");
    std::uint64_t num = 1, den = 1;
    for (std::size_t j = 0; j < xs.size(); ++j) {
      if (j == i) continue;
      if (xs[j] == xs[i]) throw ProtocolError("shamir: repeated share point");
      num = mul(num, xs[j]);              // prod x_j
      den = mul(den, sub(xs[j], xs[i]));  // prod (x_j - x_i)
    }
    result = add(result, mul(ys[i], mul(num, inverse(den))));
  }
  return result;
}

std::vector<std::uint8_t> shamir_combine(std::span<const Share> shares, std::size_t secret_bytes) {
  if (secret_bytes % 4 != 0) throw ProtocolError("shamir: secret length must be a multiple of 4");
  const std::size_t limbs = secret_bytes / 4;
  if (shares.empty()) throw ProtocolError("shamir: no shares");
  std::vector<std::uint64_t> xs, ys(shares.size());
  for (const auto& s : shares) {
    if (s.y.size() != limbs) throw ProtocolError("shamir: share has the wrong length");
    xs.push_back(s.x);
  }
  std::vector<std::uint8_t> secret(secret_bytes);
  for (std::size_t l = 0; l < limbs; ++l) {
    for (std::size_t i = 0; i < shares.size(); ++i) ys[i] = shares[i].y[l];
    const std::uint64_t v = lagrange_at_zero(xs, ys);
    if (v > 0xffffffffu) throw ProtocolError("shamir: shares do not reconstruct a valid secret");
    const auto limb = static_cast<std::uint32_t>(v);
    std::memcpy(secret.data() + 4 * l, &limb, 4);
  }
  return secret;
}

}  // namespace cohort::aggregation::secagg
