// AES-256-GCM sealing of transport frames with keys from a TLS handshake (tls.h).
//
// Nonce (96 bit) = 32-bit big-endian frame_index || 64-bit big-endian counter, so one key never
// sees a repeated nonce as long as the sender never reuses a (counter, frame_index) pair; each
// direction has its own key (SessionKeys), so the two sides' counters never collide.
// Sealed layout: ciphertext (same length as the plaintext) || 16-byte tag.
//
// Two implementations of the same standard AES-256-GCM, byte for byte interchangeable on the wire:
// Intel's ipsec-mb (Debian's libipsec-mb, amd64; its VAES/AVX-512 code seals faster than OpenSSL
// 3.0's AES-NI code on CPUs that have it, docs/PERFORMANCE.md 3.2) when the build found it and the
// CPU has AES-NI,
// else OpenSSL. The caller may insist on one (AeadBackend; transport.aead in a program's config).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace cohort::transport::security {

// Which implementation seals and opens. kAuto: ipsec-mb where the build has it and the CPU has
// AES-NI, else OpenSSL. kIpsecMb: ipsec-mb or a ConfigError. kOpenSsl: always OpenSSL.
enum class AeadBackend { kAuto, kIpsecMb, kOpenSsl };

// Holds one 256-bit key and its expanded forms (wiped on destruction). Thread-safe: seal() and
// open() are const and use per-thread library state, so a thread pool may seal or open many
// chunks of one message at once. Copies share the immutable key material.
class FrameCipher {
 public:
  static constexpr std::size_t kTagBytes = 16;
  static constexpr std::size_t kKeyBytes = 32;

  // Throws ConfigError when `wanted` is kIpsecMb and ipsec-mb cannot run here (see backend()).
  explicit FrameCipher(const std::array<std::byte, kKeyBytes>& key,
                       AeadBackend wanted = AeadBackend::kAuto);
  ~FrameCipher();
  FrameCipher(const FrameCipher&) = default;
  FrameCipher& operator=(const FrameCipher&) = default;

  // The implementation that `wanted` gives on this build and CPU: "ipsec-mb/avx512" (or /avx2,
  // /avx, /sse) or "openssl". Throws ConfigError, naming transport.aead, for kIpsecMb where this
  // build has no ipsec-mb or the CPU no AES-NI: a start-up check for a program's options.
  static std::string_view backend(AeadBackend wanted = AeadBackend::kAuto);
  // True when that implementation runs on vector AES units (VAES and VPCLMULQDQ: faster than the
  // socket), where a caller gains nothing by spreading the chunks of one message over threads.
  static bool vector_aes(AeadBackend wanted = AeadBackend::kAuto);

  // Encrypts `plaintext` and authenticates it together with `aad` (not encrypted, not sent).
  // REQUIRES: out.size() == plaintext.size() + kTagBytes; out does not overlap plaintext or aad
  // (else InternalError). Throws TransportError only if OpenSSL itself fails.
  void seal(std::uint64_t counter, std::uint32_t frame_index, std::span<const std::byte> aad,
            std::span<const std::byte> plaintext, std::span<std::byte> out) const;

  // Verifies and decrypts. Returns false, never throws, when authentication fails (tampered
  // ciphertext, tag or aad, wrong key, counter or frame_index) or when `sealed` is shorter than a
  // tag; `out` is then zeroed. REQUIRES: out.size() + kTagBytes == sealed.size() when
  // sealed.size() >= kTagBytes, and no overlap (else InternalError: a caller bug, not bad input).
  [[nodiscard]] bool open(std::uint64_t counter, std::uint32_t frame_index,
                          std::span<const std::byte> aad, std::span<const std::byte> sealed,
                          std::span<std::byte> out) const;

  // open(), decrypting in place: on success the plaintext is sealed.first(sealed.size() -
  // kTagBytes); on failure all of `sealed` is zeroed. REQUIRES: aad does not overlap sealed.
  [[nodiscard]] bool open_in_place(std::uint64_t counter, std::uint32_t frame_index,
                                   std::span<const std::byte> aad,
                                   std::span<std::byte> sealed) const;

 private:
  bool open_into(std::uint64_t counter, std::uint32_t frame_index, std::span<const std::byte> aad,
                 std::span<const std::byte> sealed, std::span<std::byte> out) const;

  struct Keys;  // defined in frame_cipher.cc
  std::shared_ptr<const Keys> keys_;
};

}  // namespace cohort::transport::security
