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
// SecAgg+ (8.2, Bell et al. 2020): with a degree k set, "other clients" above means u's k - 1
// neighbours in a public random ring, and the threshold is relative to k; the server unmasks
// with reconstruct() once per round and remove_masks() per range of the vector (one range per
// parameter-server shard).
//
// Secrets (private keys, b_u) live in Client and are wiped on destruction. Client is not
// thread-safe; the free functions are, on distinct outputs.
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
// The same for the words [first_word, first_word + size) of PRG(seed), so that a slice of a long
// vector is masked or unmasked on its own: the keystream is entered at AES block first_word / 4
// through the CTR counter (the IV is the 128-bit big-endian block number) and the first
// first_word % 4 words of that block are skipped. O(size) time, O(1) extra memory, whatever
// first_word is; one cipher context per call.
void expand_mask(const Key& seed, std::size_t first_word, std::span<std::uint32_t> out);
void add_mask(const Key& seed, int sign, std::size_t first_word, std::span<std::uint32_t> y);

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

// ---- SecAgg+ neighbourhoods (docs/ALGORITHMS.md 8.2; Bell et al. 2020) -------------------------
// Each client agrees keys, masks and shares with its k - 1 neighbours only. The degree k counts
// the client itself, like Flower's num_shares: a client's secrets are split into k shares, one
// kept, one per neighbour. The graph is Flower's ring: U1's ids, sorted, are shuffled by
// Fisher-Yates with draws from PRG(seed) (AES-256-CTR, the mask generator; each draw is
// Lemire's multiply-and-reject on a 64-bit keystream word), and the client at ring position p
// neighbours positions p - (k-1)/2 .. p + (k-1)/2 (mod |U1|), itself excluded. The graph is
// symmetric and each client has exactly k - 1 neighbours when k < |U1|; when k >= |U1| every
// member neighbours every other (plain SecAgg). The seed is public; every party must use the
// same one (e.g. the coordinator draws it per round and sends it with U1).

// The default degree for n clients: 2 ceil(log2 n) + 1 (odd), or n when that is n or more (the
// complete graph). Logarithmic in n as in Bell et al. 2020 (k = O(log n)); their bound for a
// given dropout rate, corrupted fraction and security level is larger, so a deployment that
// needs their guarantee sets the degree itself. ConfigError for n = 0.
[[nodiscard]] std::size_t default_degree(std::size_t n);
// The threshold for degree k: t = floor(fraction k) + 1, capped at k, at least 2. With the default
// fraction 1/2, t = floor(k/2) + 1: a strict majority of the k share holders, so any two sets of
// t holders overlap, and a server that tells holders different dropout sets cannot collect t
// shares of both b_u and u's mask key (a holder reveals only one of them). ConfigError unless
// 1/2 <= fraction < 1 and k >= 2.
[[nodiscard]] std::size_t default_threshold(std::size_t degree, double fraction = 0.5);
// U1 in ring order (the shuffle above). `u1` in any order; ProtocolError if an id repeats.
[[nodiscard]] std::vector<ClientId> neighbour_ring(std::span<const ClientId> u1, const Key& seed);
// Every member's neighbours, each list sorted and without the member itself. ConfigError for
// degree 0 or an even degree below |U1|; ProtocolError if an id repeats.
[[nodiscard]] std::map<ClientId, std::vector<ClientId>> neighbourhoods(std::span<const ClientId> u1,
                                                                       std::size_t degree,
                                                                       const Key& seed);

struct Params {
  std::uint64_t round = 0;      // binds keys and seeds to this round
  std::size_t threshold = 2;    // t: shares needed to reconstruct; also the fewest survivors
  std::size_t vector_size = 0;  // d
  // SecAgg+ degree k (see above), e.g. default_degree(|U1|), with threshold <= k. 0, or any
  // k >= |U1|, is plain SecAgg: every other member is a neighbour.
  std::size_t degree = 0;
  Key graph_seed{};  // the public seed of the neighbour ring; unused by plain SecAgg
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

// One client's side of one round. With a SecAgg+ degree, "U1", "U2" and "U3" below are seen
// through the client's neighbourhood: it shares with, takes shares from and masks against its
// neighbours only.
class Client {
 public:
  // Draws the two key pairs and b_u. ConfigError for threshold < 2, or a nonzero degree below
  // the threshold.
  Client(ClientId id, const Params& params);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // What the server announced with U1 (the threshold and SecAgg+ graph chosen for |U1|, which
  // the client cannot know when it advertises), before share_keys(). ConfigError as the
  // constructor's.
  void configure(const Params& params);

  // R0.
  [[nodiscard]] Advertisement advertise() const;
  // R1: given U1 (every advertisement the server forwarded, this client's own included), the
  // sealed shares for every neighbour (every other member in plain SecAgg). ProtocolError if
  // fewer than threshold clients would hold shares (this one and its neighbours), ids repeat,
  // or this client's own advertisement is missing or altered; ConfigError for an even degree
  // below |U1|.
  [[nodiscard]] std::vector<SealedShares> share_keys(std::span<const Advertisement> u1);
  // R2: opens the shares the server forwarded from the other members of U2 (U2 = their senders
  // plus this client) and returns y_u. REQUIRES x.size() == vector_size. ProtocolError for a share
  // that fails authentication, is not addressed here, comes from outside U1 or from a client that
  // is not a neighbour, or |U2| < threshold. The same as open_shares() then mask_range(0, x).
  [[nodiscard]] std::vector<std::uint32_t> masked_input(std::span<const std::uint32_t> x,
                                                        std::span<const SealedShares> received);
  // R2 in two steps, for sending y range by range (e.g. one range per parameter-server shard)
  // without a whole-vector copy: open_shares() checks and keeps the shares as masked_input()
  // does and derives the pairwise seeds once; mask_range() then turns x_range, the words
  // [first_word, first_word + size) of x, into the same words of y, in place, as often as
  // needed. REQUIRES (mask_range) open_shares() done and the range within vector_size.
  void open_shares(std::span<const SealedShares> received);
  void mask_range(std::size_t first_word, std::span<std::uint32_t> x_range) const;
  // R4: given U3 (the clients whose y arrived), this client's shares. ProtocolError if a member
  // of U3 is outside U1 or is a neighbour outside U2, fewer than threshold of this client and
  // its neighbours survived, or this client is not in U3.
  [[nodiscard]] UnmaskingShares unmask(std::span<const ClientId> survivors) const;

  // Replaces the freshly drawn key pairs (before advertise()), so a test can show that the round,
  // not only fresh keys, binds seeds and sealed shares.
  void set_keys_for_testing(const KeyPair& channel, const KeyPair& mask);

  [[nodiscard]] ClientId id() const { return id_; }

 private:
  struct Held {
    Share mask_key;
    Share self_mask;
  };
  struct PairSeed {
    Key seed;  // s_uv
    int sign;  // +1 if this client's id is the smaller
  };
  ClientId id_;
  Params params_;
  KeyPair channel_, mask_;
  Key self_seed_{};  // b_u
  std::map<ClientId, Advertisement> u1_;
  std::vector<ClientId> neighbours_;  // sorted, this client excluded; all of U1 in plain SecAgg
  std::vector<ClientId> u2_;          // sorted: this client and the neighbours that sent shares
  std::map<ClientId, Held> held_;     // shares this client holds, own included
  std::vector<PairSeed> pair_seeds_;  // one per neighbour in U2, from open_shares()
};

// ---- server: R4 -------------------------------------------------------------------------------
// Unmasking in two steps, so that each parameter-server shard can unmask its own contiguous range
// of the vector with memory proportional to that range: reconstruct() turns the unmasking shares
// into the few seeds whose PRG output must be removed (once per round, independent of d), and
// remove_masks() removes their words over any range.

// What removing the masks needs: PRG(b_u) was added by each survivor u; PRG(s_uv) with sign
// sigma_uv by each survivor u for each neighbour v that shared keys and then dropped (the masks
// between two survivors cancel in the sum). Holds secrets of the round that the server may learn
// and nobody else; its keys are wiped on destruction. O(|U3| k) keys.
struct Reconstructed {
  struct PairSeed {
    ClientId survivor = 0;
    ClientId dropped = 0;
    int sign = 1;  // what the survivor added PRG(seed) with: +1 if survivor < dropped
    Key seed{};    // s_uv
  };
  ~Reconstructed();

  std::size_t vector_size = 0;
  std::vector<ClientId> survivors;                   // U3, sorted: whose y the sum must hold
  std::vector<std::pair<ClientId, Key>> self_seeds;  // (u, b_u) for each u in U3, sorted by u
  std::vector<PairSeed> pair_seeds;                  // sorted by (dropped, survivor)
};

// R4 on the server, step 1. `u1`: the ids of every client whose advertisement the server forwarded
// (the neighbour graph is drawn over them); `u2`: the advertisements of the clients that shared
// keys; `survivors`: U3, the clients whose y arrived; `responses`: the UnmaskingShares that came
// back (from survivors; the first response of each counts, others are ignored). Each survivor's
// b_u is rebuilt from the first threshold shares that it and its surviving neighbours revealed;
// each dropped client's mask key likewise from its surviving neighbours, when a survivor masked
// against it. ProtocolError if an id repeats, U2 is not within U1, U3 not within U2, |U3| <
// threshold, a reconstruction has fewer than threshold shares (naming the client and the
// secret), or a rebuilt key does not match its advertisement; ConfigError for an even degree
// below |U1|.
[[nodiscard]] Reconstructed reconstruct(const Params& params, std::span<const ClientId> u1,
                                        std::span<const Advertisement> u2,
                                        std::span<const ClientId> survivors,
                                        std::span<const UnmaskingShares> responses);

// R4 on the server, step 2, over the words [first_word, first_word + size) of the vector:
// sum_of_range, the sum over U3 of those words of y_u (mod 2^32), becomes the sum of those words
// of x_u. Ranges are independent: a shard removes the masks from its own range only, and ranges
// concatenated give the whole-vector result. One keystream pass per seed over the range, O(1)
// extra memory. REQUIRES the range within r.vector_size. Thread-safe for concurrent calls on one
// Reconstructed (it is only read).
void remove_masks(const Reconstructed& r, std::size_t first_word,
                  std::span<std::uint32_t> sum_of_range);

// Both steps over the whole vector: z = sum of the survivors' x (mod 2^32). `masked`: y_u of
// every survivor (U3); the other arguments as for reconstruct(). ProtocolError as there, or for
// an input of the wrong size or from outside U2.
[[nodiscard]] std::vector<std::uint32_t> unmask_sum(
    const Params& params, std::span<const ClientId> u1, std::span<const Advertisement> u2,
    const std::map<ClientId, std::vector<std::uint32_t>>& masked,
    std::span<const UnmaskingShares> responses);
// Plain SecAgg only (params.degree == 0, else ConfigError), where the graph does not depend on
// U1: the same with U2's members standing for U1.
[[nodiscard]] std::vector<std::uint32_t> unmask_sum(
    const Params& params, std::span<const Advertisement> u2,
    const std::map<ClientId, std::vector<std::uint32_t>>& masked,
    std::span<const UnmaskingShares> responses);

}  // namespace secagg
}  // namespace cohort::aggregation
