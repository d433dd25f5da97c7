// OpenSSL seams of secure aggregation (private header): randomness, AEAD sealing; and the few
// conventions the client and the server sides must share.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cohort/aggregation/secure_aggregation.h"

namespace cohort::aggregation::secagg::detail {

// Fills out from the CSPRNG (RAND_bytes).
void random_bytes(std::span<std::uint8_t> out);
// Raw AES-256-CTR keystream under key (IV 0).
void keystream(const Key& key, std::span<std::uint8_t> out);
// AES-256-GCM with a 12-byte nonce; output ciphertext || 16-byte tag.
std::vector<std::uint8_t> seal(const Key& key, std::span<const std::uint8_t, 12> nonce,
                               std::span<const std::uint8_t> aad,
                               std::span<const std::uint8_t> plaintext);
// ProtocolError if authentication fails.
std::vector<std::uint8_t> open(const Key& key, std::span<const std::uint8_t, 12> nonce,
                               std::span<const std::uint8_t> aad,
                               std::span<const std::uint8_t> sealed);
// OPENSSL_cleanse: a wipe the compiler does not drop.
void wipe(void* p, std::size_t n);

// The HKDF context of the keys agreed for `what` ("mask", "shares") in a round: seeds never
// repeat across rounds.
inline std::string round_context(const char* what, std::uint64_t round) {
  return std::string("cohort-secagg ") + what + " round=" + std::to_string(round);
}
// A client's Shamir evaluation point (0 holds the secret).
inline std::uint64_t share_point(ClientId id) { return static_cast<std::uint64_t>(id) + 1; }

}  // namespace cohort::aggregation::secagg::detail
