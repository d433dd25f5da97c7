// X25519, HKDF-SHA256, AES-256-CTR and AES-256-GCM through OpenSSL 3 (EVP only).
#include "secagg_crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>

#include "cohort/core/error.h"

namespace cohort::aggregation {
namespace {

[[noreturn]] void fail(const char* what) {
  char buf[256] = "no OpenSSL error queued";
  if (unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  throw Error(std::string("secure aggregation: ") + what + " failed: " + buf);
}

struct PkeyFree {
  void operator()(EVP_PKEY* p) const noexcept { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const noexcept { EVP_PKEY_CTX_free(p); }
};
struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* p) const noexcept { EVP_CIPHER_CTX_free(p); }
};
struct KdfFree {
  void operator()(EVP_KDF* p) const noexcept { EVP_KDF_free(p); }
};
struct KdfCtxFree {
  void operator()(EVP_KDF_CTX* p) const noexcept { EVP_KDF_CTX_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

Pkey private_pkey(const secagg::Key& k) {
  Pkey p(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, k.data(), k.size()));
  if (!p) fail("loading an X25519 private key");
  return p;
}

constexpr char kHkdfSalt[] = "cohort-secagg-v1";

// An AES-256-CTR context whose next output byte is keystream byte 4 first_word. OpenSSL's CTR
// increments the whole 16-byte IV as a big-endian number, so the keystream of IV 0 at block b is
// the keystream of IV b at block 0; the words before first_word inside that block are produced
// into a scratch block and dropped (the context keeps its place within the block).
CipherCtx ctr_at(const secagg::Key& key, std::size_t first_word) {
  std::uint8_t iv[16] = {};
  std::uint64_t block = first_word / 4;
  for (int i = 15; i >= 8; --i, block >>= 8) iv[i] = static_cast<std::uint8_t>(block & 0xff);
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_ctr(), nullptr, key.data(), iv) != 1) {
    fail("AES-256-CTR init");
  }
  if (const int skip = static_cast<int>(first_word % 4) * 4; skip > 0) {
    std::uint8_t scratch[16] = {};
    int len = 0;
    if (EVP_EncryptUpdate(ctx.get(), scratch, &len, scratch, skip) != 1) fail("AES-256-CTR");
  }
  return ctx;
}

// out = the next out.size() keystream bytes of ctx (int-sized pieces).
void next_keystream(EVP_CIPHER_CTX* ctx, std::span<std::uint8_t> out) {
  if (out.empty()) return;  // an empty span's data() may be null: no memset
  std::memset(out.data(), 0, out.size());
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  for (std::size_t at = 0; at < out.size(); at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, out.size() - at));
    int len = 0;
    if (EVP_EncryptUpdate(ctx, out.data() + at, &len, out.data() + at, n) != 1) {
      fail("AES-256-CTR");
    }
  }
}

}  // namespace

std::uint64_t secure_random_seed() {
  std::uint64_t v = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&v), sizeof(v)) != 1) fail("RAND_bytes");
  return v;
}

namespace secagg {

KeyPair generate_key_pair() {
  Pkey p(EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519"));
  if (!p) fail("X25519 key generation");
  KeyPair kp;
  std::size_t len = kp.private_key.size();
  if (EVP_PKEY_get_raw_private_key(p.get(), kp.private_key.data(), &len) != 1 || len != 32) {
    fail("exporting an X25519 private key");
  }
  len = kp.public_key.size();
  if (EVP_PKEY_get_raw_public_key(p.get(), kp.public_key.data(), &len) != 1 || len != 32) {
    fail("exporting an X25519 public key");
  }
  return kp;
}

Key public_key_of(const Key& private_key) {
  Pkey p = private_pkey(private_key);
  Key pub{};
  std::size_t len = pub.size();
  if (EVP_PKEY_get_raw_public_key(p.get(), pub.data(), &len) != 1 || len != 32) {
    fail("exporting an X25519 public key");
  }
  return pub;
}

Key agree(const Key& private_key, const Key& peer_public, std::string_view context) {
  Pkey mine = private_pkey(private_key);
  Pkey peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_public.data(),
                                        peer_public.size()));
  if (!peer) throw ProtocolError("secure aggregation: malformed X25519 public key");
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree> ctx(EVP_PKEY_CTX_new(mine.get(), nullptr));
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) != 1) fail("X25519 derive init");
  if (EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1) {
    ERR_clear_error();
    throw ProtocolError("secure aggregation: unusable X25519 public key");
  }
  std::array<std::uint8_t, 32> shared{};
  std::size_t len = shared.size();
  if (EVP_PKEY_derive(ctx.get(), shared.data(), &len) != 1 || len != 32) {
    ERR_clear_error();  // OpenSSL refuses the all-zero result of a low-order point
    throw ProtocolError("secure aggregation: X25519 agreement failed (low-order peer key?)");
  }
  std::unique_ptr<EVP_KDF, KdfFree> kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr));
  if (!kdf) fail("fetching HKDF");
  std::unique_ptr<EVP_KDF_CTX, KdfCtxFree> kctx(EVP_KDF_CTX_new(kdf.get()));
  if (!kctx) fail("HKDF context");
  std::string info(context);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, shared.data(), shared.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(kHkdfSalt),
                                        sizeof(kHkdfSalt) - 1),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info.data(), info.size()),
      OSSL_PARAM_construct_end()};
  Key out{};
  const int ok = EVP_KDF_derive(kctx.get(), out.data(), out.size(), params);
  OPENSSL_cleanse(shared.data(), shared.size());
  if (ok != 1) fail("HKDF");
  return out;
}

void expand_mask(const Key& seed, std::span<std::uint32_t> out) { expand_mask(seed, 0, out); }

void add_mask(const Key& seed, int sign, std::span<std::uint32_t> y) { add_mask(seed, sign, 0, y); }

void expand_mask(const Key& seed, std::size_t first_word, std::span<std::uint32_t> out) {
  CipherCtx ctx = ctr_at(seed, first_word);
  next_keystream(ctx.get(), {reinterpret_cast<std::uint8_t*>(out.data()), out.size_bytes()});
}

void add_mask(const Key& seed, int sign, std::size_t first_word, std::span<std::uint32_t> y) {
  COHORT_CHECK(sign == 1 || sign == -1) << "mask sign " << sign;
  // 4096 words (16 KiB) per keystream piece: stays in L1 between the AES and the add.
  constexpr std::size_t kPiece = 4096;
  std::array<std::uint32_t, kPiece> mask;
  CipherCtx ctx = ctr_at(seed, first_word);
  for (std::size_t at = 0; at < y.size(); at += kPiece) {
    const std::size_t n = std::min(kPiece, y.size() - at);
    next_keystream(ctx.get(), {reinterpret_cast<std::uint8_t*>(mask.data()), n * 4});
    if (sign > 0) {
      for (std::size_t i = 0; i < n; ++i) y[at + i] += mask[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) y[at + i] -= mask[i];
    }
  }
  OPENSSL_cleanse(mask.data(), sizeof(mask));
}

namespace detail {

void random_bytes(std::span<std::uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) fail("RAND_bytes");
}

void wipe(void* p, std::size_t n) { OPENSSL_cleanse(p, n); }

void keystream(const Key& key, std::span<std::uint8_t> out) {
  CipherCtx ctx = ctr_at(key, 0);
  next_keystream(ctx.get(), out);
}

std::vector<std::uint8_t> seal(const Key& key, std::span<const std::uint8_t, 12> nonce,
                               std::span<const std::uint8_t> aad,
                               std::span<const std::uint8_t> plaintext) {
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  if (!ctx ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), nonce.data()) != 1) {
    fail("AES-256-GCM init");
  }
  std::vector<std::uint8_t> out(plaintext.size() + 16);
  int len = 0;
  if (EVP_EncryptUpdate(ctx.get(), nullptr, &len, aad.data(), static_cast<int>(aad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), out.data(), &len, plaintext.data(),
                        static_cast<int>(plaintext.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), out.data() + len, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, 16, out.data() + plaintext.size()) !=
          1) {
    fail("AES-256-GCM seal");
  }
  return out;
}

std::vector<std::uint8_t> open(const Key& key, std::span<const std::uint8_t, 12> nonce,
                               std::span<const std::uint8_t> aad,
                               std::span<const std::uint8_t> sealed) {
  if (sealed.size() < 16) throw ProtocolError("secure aggregation: sealed shares too short");
  const std::size_t n = sealed.size() - 16;
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  if (!ctx ||
      EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), nonce.data()) != 1) {
    fail("AES-256-GCM init");
  }
  std::vector<std::uint8_t> out(n);
  std::array<std::uint8_t, 16> tag{};
  std::memcpy(tag.data(), sealed.data() + n, 16);
  int len = 0;
  if (EVP_DecryptUpdate(ctx.get(), nullptr, &len, aad.data(), static_cast<int>(aad.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), out.data(), &len, sealed.data(), static_cast<int>(n)) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, 16, tag.data()) != 1) {
    fail("AES-256-GCM open");
  }
  if (EVP_DecryptFinal_ex(ctx.get(), out.data() + len, &len) != 1) {
    ERR_clear_error();
    OPENSSL_cleanse(out.data(), out.size());
    throw ProtocolError("secure aggregation: sealed shares failed authentication");
  }
  return out;
}

}  // namespace detail
}  // namespace secagg
}  // namespace cohort::aggregation
