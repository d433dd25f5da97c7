// Secure aggregation with pairwise masks (docs/ALGORITHMS.md 8.1; Bonawitz et al. 2017), minus the
// transport: the four rounds are methods that take and return plain structs, and the lead's
// server and client carry them as messages. The server learns the sum of the survivors' inputs
// and nothing else, as long as fewer than `threshold` parties collude with it; clients may drop at
// any point after sharing their keys, and the sum is still recovered if at least `threshold`
// remain.
//
// Arithmetic: inputs are vectors over Z_R with R = 2^32 (uint32 that wrap), so masks cancel
// exactly; float updates go through FixedPoint first (Flower's SecAgg+ encoding, 8.2), and the
// server decodes the unmasked sum. Masks: PRG(seed) = AES-256-CTR keystream (IV 0) under the
// 32-byte seed, read as little-endian uint32 words. Pairwise seeds s_uv come from X25519 key
// agreement (OpenSSL EVP_PKEY_X25519) hashed with HKDF-SHA256 over a context that names the
// round, so a seed is never reused across rounds. Client u sends
//   y_u = x_u + PRG(b_u) + sum_{v in U2, u < v} PRG(s_uv) - sum_{v in U2, u > v} PRG(s_uv)  (mod R)
// and t-of-n Shamir shares (over GF(2^61 - 1), each 32-byte secret as eight 32-bit limbs) of its
// mask private key and of its self-mask seed b_u go to the other clients, sealed with AES-256-GCM
// under a key agreed from a second, "channel" X25519 pair: the server routes shares it cannot read.
// A survivor reveals, for each other client, a share of b_v (v survived) or of its mask private
// key (v dropped after sharing), never both. Semi-honest server model: no consistency round (R3).
//
// Secrets (private keys, b_u) live in Client and are wiped on destruction. Not thread-safe.
// Bad peer input (wrong lengths, failed authentication, inconsistent sets) throws ProtocolError;
// an OpenSSL failure throws cohort::Error.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/core/ids.h"

namespace cohort::aggregation {

// 64 bits from the operating system's CSPRNG (OpenSSL RAND_bytes), e.g. for DP noise seeds.
[[nodiscard]] std::uint64_t secure_random_seed();

namespace secagg {

using Key = std::array<std::uint8_t, 32>;

struct KeyPair {
  Key public_key{};
  Key private_key{};
};

// A fresh X25519 key pair.
[[nodiscard]] KeyPair generate_key_pair();
// The X25519 public key of a private key.
[[nodiscard]] Key public_key_of(const Key& private_key);
// HKDF-SHA256 of the X25519 shared secret, bound to `context`. Symmetric:
// agree(a.private, b.public, c) == agree(b.private, a.public, c). ProtocolError for a peer key
// that yields the all-zero secret (a low-order point).
[[nodiscard]] Key agree(const Key& private_key, const Key& peer_public, std::string_view context);

// out = PRG(seed): AES-256-CTR keystream, as little-endian uint32 words.
void expand_mask(const Key& seed, std::span<std::uint32_t> out);
// y = y + sign * PRG(seed) mod 2^32; sign is +1 or -1.
void add_mask(const Key& seed, int sign, std::span<std::uint32_t> y);

// Shamir secret sharing over GF(p), p = 2^61 - 1.
inline constexpr std::uint64_t kShamirPrime = (std::uint64_t{1} << 61) - 1;
struct Share {
  std::uint64_t x = 0;           // evaluation point, 1 <= x < p
  std::vector<std::uint64_t> y;  // one field element per 32-bit limb of the secret
  friend bool operator==(const Share&, const Share&) = default;
};
// Shares of `secret` (its length a multiple of 4) at the points xs (distinct, in [1, p)), any
// `threshold` of which reconstruct it. The polynomial's coefficients come from the CSPRNG, or
// from AES-CTR under *coefficient_seed when given (for reproducible tests only). Throws
// ConfigError for threshold 0, threshold > xs.size(), or bad points.
[[nodiscard]] std::vector<Share> shamir_split(std::span<const std::uint8_t> secret,
                                              std::size_t threshold,
                                              std::span<const std::uint64_t> xs,
                                              const Key* coefficient_seed = nullptr);
// f(0) by Lagrange interpolation through all the given points (distinct xs; ProtocolError else).
[[nodiscard]] std::uint64_t lagrange_at_zero(std::span<const std::uint64_t> xs,
                                             std::span<const std::uint64_t> ys);
// The secret of `secret_bytes` bytes from the shares given (use exactly `threshold` of them).
// ProtocolError on inconsistent shares or when a limb is not a 32-bit value (too few shares, or
// wrong ones: with fewer than threshold shares the result is uniformly random in the field).
[[nodiscard]] std::vector<std::uint8_t> shamir_combine(std::span<const Share> shares,
                                                       std::size_t secret_bytes);

// Fixed-point encoding of floats into Z_{2^32} (Flower SecAgg+, docs/ALGORITHMS.md 8.2):
//   q = round((clip(x, -c, c) + c) Q / (2c)) in [0, Q]
// and a sum of n encodings decodes as (2c/Q) sum - n c. n Q < 2^32 must hold so that the sum
// does not wrap: with the defaults c = 8, Q = 2^22 at most 1023 inputs. Deterministic rounding
// errs by at most c/Q per input and coordinate, stochastic rounding (unbiased) by less than 2c/Q.
class FixedPoint {
 public:
  // Throws ConfigError unless clip > 0 and 1 <= levels < 2^32.
  explicit FixedPoint(double clip = 8.0, std::uint32_t levels = std::uint32_t{1} << 22);
  // KernelError on a non-finite x.
  void encode(std::span<const float> x, std::span<std::uint32_t> out) const;
  void encode_stochastic(std::span<const float> x, std::uint64_t seed,
                         std::span<std::uint32_t> out) const;
  // out = the float sum of the n inputs behind `sum`. ConfigError if n > max_summands().
  void decode_sum(std::span<const std::uint32_t> sum, std::size_t n, std::span<float> out) const;
  [[nodiscard]] std::size_t max_summands() const;
  [[nodiscard]] double step() const { return 2 * clip_ / levels_; }

 private:
  double clip_;
  double levels_;
};

struct Params {
  std::uint64_t round = 0;      // binds keys and seeds to this round
  std::size_t threshold = 2;    // t: shares needed to reconstruct; also the fewest survivors
  std::size_t vector_size = 0;  // d
};

// R0: what a client publishes.
struct Advertisement {
  ClientId client = 0;
  Key channel_public{};
  Key mask_public{};
};
// R1: one client's shares for another, sealed (AES-256-GCM) so that only the addressee reads them.
struct SealedShares {
  ClientId from = 0;
  ClientId to = 0;
  std::vector<std::uint8_t> ciphertext;
};
// R4: what a survivor reveals: shares of b_v for survivors v, of mask private keys for dropped v.
struct UnmaskingShares {
  ClientId from = 0;
  std::vector<std::pair<ClientId, Share>> self_mask;
  std::vector<std::pair<ClientId, Share>> mask_key;
};

// One client's side of one round.
class Client {
 public:
  // Draws the two key pairs and b_u. ConfigError for threshold < 2.
  Client(ClientId id, const Params& params);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // R0.
  [[nodiscard]] Advertisement advertise() const;
  // R1: given U1 (every advertisement the server forwarded, this client's own included), the
  // sealed shares for every other member. ProtocolError if |U1| < threshold, ids repeat, or this
  // client's own advertisement is missing or altered.
  [[nodiscard]] std::vector<SealedShares> share_keys(std::span<const Advertisement> u1);
  // R2: opens the shares the server forwarded from the other members of U2 (U2 = their senders
  // plus this client) and returns y_u. REQUIRES x.size() == vector_size. ProtocolError for a share
  // that fails authentication, is not addressed here, comes from outside U1, or |U2| < threshold.
  [[nodiscard]] std::vector<std::uint32_t> masked_input(std::span<const std::uint32_t> x,
                                                        std::span<const SealedShares> received);
  // R4: given U3 (the clients whose y arrived), this client's shares. ProtocolError if U3 is not
  // within U2, |U3| < threshold, or this client is not in U3.
  [[nodiscard]] UnmaskingShares unmask(std::span<const ClientId> survivors) const;

  [[nodiscard]] ClientId id() const { return id_; }

 private:
  struct Held {
    Share mask_key;
    Share self_mask;
  };
  ClientId id_;
  Params params_;
  KeyPair channel_, mask_;
  Key self_seed_{};  // b_u
  std::map<ClientId, Advertisement> u1_;
  std::vector<ClientId> u2_;       // sorted
  std::map<ClientId, Held> held_;  // shares this client holds, own included
};

// R4 on the server: z = sum of the survivors' x (mod 2^32). `u2`: the advertisements of every
// client that shared keys; `masked`: y_u of every survivor (U3); `responses`: UnmaskingShares
// from at least `threshold` survivors. ProtocolError if shares are missing or reconstruct a key
// that does not match its advertised public key.
[[nodiscard]] std::vector<std::uint32_t> unmask_sum(
    const Params& params, std::span<const Advertisement> u2,
    const std::map<ClientId, std::vector<std::uint32_t>>& masked,
    std::span<const UnmaskingShares> responses);

}  // namespace secagg
}  // namespace cohort::aggregation
