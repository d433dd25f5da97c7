// OpenSSL seams of secure aggregation (private header): randomness, AEAD sealing.
#pragma once

#include <cstdint>
#include <span>
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

}  // namespace cohort::aggregation::secagg::detail
