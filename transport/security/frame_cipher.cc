#include "cohort/transport/security/frame_cipher.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include <climits>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#if COHORT_HAVE_IPSEC_MB
// Without this, the header #defines pre-0.53 names such as SHA1, which clash with OpenSSL's.
#define NO_COMPAT_IMB_API_053 1
#include <intel-ipsec-mb.h>
#endif

#include "cohort/core/error.h"
#include "openssl_util.h"

namespace cohort::transport::security {

namespace {

using CipherCtxPtr = std::unique_ptr<EVP_CIPHER_CTX, detail::OpenSslDeleter<EVP_CIPHER_CTX_free>>;

constexpr std::size_t kNonceBytes = 12;
// EVP_*Update takes an int length; feed larger inputs in 1 GiB pieces.
constexpr std::size_t kMaxUpdateBytes = std::size_t{1} << 30;

// One context per thread and direction, bound to AES-256-GCM once; each call only installs key
// and nonce (EVP_*Init_ex with a null cipher). Re-fetching the cipher per call costs an
// algorithm lookup in OpenSSL 3; the key schedule itself is noise against a 1 MiB chunk.
EVP_CIPHER_CTX* thread_context(bool encrypt) {
  thread_local CipherCtxPtr enc, dec;
  CipherCtxPtr& slot = encrypt ? enc : dec;
  if (!slot) {
    CipherCtxPtr ctx(EVP_CIPHER_CTX_new());
    if (!ctx) throw TransportError("EVP_CIPHER_CTX_new: " + detail::take_openssl_errors());
    const int rc =
        encrypt ? EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr)
                : EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr);
    if (rc != 1) throw TransportError("AES-256-GCM setup: " + detail::take_openssl_errors());
    slot = std::move(ctx);
  }
  return slot.get();
}

std::array<unsigned char, kNonceBytes> make_nonce(std::uint64_t counter,
                                                  std::uint32_t frame_index) {
  std::array<unsigned char, kNonceBytes> nonce;
  for (int i = 0; i < 4; ++i) nonce[i] = static_cast<unsigned char>(frame_index >> (24 - 8 * i));
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<unsigned char>(counter >> (56 - 8 * i));
  return nonce;
}

bool overlaps(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.empty() || b.empty()) return false;
  const std::less<const std::byte*> lt;
  return lt(a.data(), b.data() + b.size()) && lt(b.data(), a.data() + a.size());
}

const unsigned char* u8(const std::byte* p) { return reinterpret_cast<const unsigned char*>(p); }
unsigned char* u8(std::byte* p) { return reinterpret_cast<unsigned char*>(p); }

// Runs EVP_{Encrypt,Decrypt}Update over `in` (null `out` for AAD) in int-sized pieces.
template <typename Update>
bool update_all(Update update, EVP_CIPHER_CTX* ctx, std::byte* out, std::span<const std::byte> in) {
  for (std::size_t done = 0; done < in.size();) {
    const std::size_t n = std::min(in.size() - done, kMaxUpdateBytes);
    int written = 0;
    if (update(ctx, out == nullptr ? nullptr : u8(out + done), &written, u8(in.data() + done),
               static_cast<int>(n)) != 1) {
      return false;
    }
    // GCM is a stream mode: OpenSSL writes every byte it is given at once.
    if (out != nullptr && static_cast<std::size_t>(written) != n) return false;
    done += n;
  }
  return true;
}

struct Backend {
  bool ipsec_mb = false;
  std::string_view name = "openssl";
  bool vector_aes = false;
};

#if COHORT_HAVE_IPSEC_MB
// ipsec-mb's state for one thread: its function table, picked for this CPU, and its error slot.
// The GCM calls keep all their state in the caller's key and context structs, but the error slot
// is written on every call, so threads never share a manager.
IMB_MGR* thread_manager() {
  struct Owner {
    IMB_MGR* mgr = nullptr;
    ~Owner() {
      if (mgr != nullptr) free_mb_mgr(mgr);
    }
  };
  thread_local Owner owner;
  if (owner.mgr == nullptr) {
    IMB_MGR* mgr = alloc_mb_mgr(0);
    if (mgr == nullptr) throw TransportError("ipsec-mb: cannot allocate its state (out of memory)");
    IMB_ARCH arch = IMB_ARCH_NONE;
    init_mb_mgr_auto(mgr, &arch);
    if (const int err = imb_get_errno(mgr); err != 0) {
      free_mb_mgr(mgr);
      throw TransportError(std::string("ipsec-mb: ") + imb_get_strerror(err));
    }
    owner.mgr = mgr;
  }
  return owner.mgr;
}

Backend probe_ipsec_mb() {
  IMB_MGR* mgr = alloc_mb_mgr(0);
  if (mgr == nullptr) return {};
  IMB_ARCH arch = IMB_ARCH_NONE;
  init_mb_mgr_auto(mgr, &arch);
  const int err = imb_get_errno(mgr);
  const std::uint64_t features = mgr->features;
  free_mb_mgr(mgr);
  if (err != 0) return {};
  constexpr std::uint64_t kVectorAes = IMB_FEATURE_VAES | IMB_FEATURE_VPCLMULQDQ;
  const bool vector_aes = (features & kVectorAes) == kVectorAes;
  switch (arch) {  // IMB_ARCH_NOAESNI (no AES instructions): OpenSSL's constant-time code instead
    case IMB_ARCH_AVX512: return {true, "ipsec-mb/avx512", vector_aes};
    case IMB_ARCH_AVX2: return {true, "ipsec-mb/avx2", vector_aes};
    case IMB_ARCH_AVX: return {true, "ipsec-mb/avx", false};
    case IMB_ARCH_SSE: return {true, "ipsec-mb/sse", false};
    default: return {};
  }
}
#endif

// What this build and CPU offer: probed once per process (a constant for its lifetime), so every
// thread and every FrameCipher asking for the same backend agrees.
const Backend& best_available() {
  static const Backend best = [] {
#if COHORT_HAVE_IPSEC_MB
    return probe_ipsec_mb();
#else
    return Backend{};
#endif
  }();
  return best;
}

Backend backend_for(AeadBackend wanted) {
  switch (wanted) {
    case AeadBackend::kOpenSsl: return Backend{};
    case AeadBackend::kAuto: return best_available();
    case AeadBackend::kIpsecMb: break;
  }
  if (!best_available().ipsec_mb) {
#if COHORT_HAVE_IPSEC_MB
    throw ConfigError(
        "transport.aead = ipsec-mb, but this CPU has no AES-NI for ipsec-mb: "
        "use auto or openssl");
#else
    throw ConfigError(
        "transport.aead = ipsec-mb, but this build has no ipsec-mb (install "
        "libipsec-mb-dev on amd64 and rebuild): use auto or openssl");
#endif
  }
  return best_available();
}

}  // namespace

struct FrameCipher::Keys {
  std::array<unsigned char, kKeyBytes> raw{};
  bool ipsec_mb = false;
#if COHORT_HAVE_IPSEC_MB
  // Round keys and GHASH key powers for this CPU's code. The asm needs 64-byte alignment, which
  // the header asks for only when LINUX is defined.
  alignas(64) gcm_key_data expanded{};
#endif
  Keys() = default;
  Keys(const Keys&) = delete;
  Keys& operator=(const Keys&) = delete;
  ~Keys() {
    OPENSSL_cleanse(raw.data(), raw.size());
#if COHORT_HAVE_IPSEC_MB
    OPENSSL_cleanse(&expanded, sizeof expanded);
#endif
  }
};

std::string_view FrameCipher::backend(AeadBackend wanted) { return backend_for(wanted).name; }
bool FrameCipher::vector_aes(AeadBackend wanted) { return backend_for(wanted).vector_aes; }

FrameCipher::FrameCipher(const std::array<std::byte, kKeyBytes>& key, AeadBackend wanted) {
  [[maybe_unused]] const bool ipsec_mb = backend_for(wanted).ipsec_mb;
  auto keys = std::make_shared<Keys>();
  std::memcpy(keys->raw.data(), key.data(), kKeyBytes);
#if COHORT_HAVE_IPSEC_MB
  if (ipsec_mb) {
    IMB_AES256_GCM_PRE(thread_manager(), keys->raw.data(), &keys->expanded);
    keys->ipsec_mb = true;
  }
#endif
  keys_ = std::move(keys);
}

FrameCipher::~FrameCipher() = default;

void FrameCipher::seal(std::uint64_t counter, std::uint32_t frame_index,
                       std::span<const std::byte> aad, std::span<const std::byte> plaintext,
                       std::span<std::byte> out) const {
  COHORT_CHECK(out.size() == plaintext.size() + kTagBytes)
      << "seal: out has " << out.size() << " bytes, needs " << plaintext.size() + kTagBytes;
  COHORT_CHECK(!overlaps(out, plaintext) && !overlaps(out, aad)) << "seal: out overlaps input";
  const auto nonce = make_nonce(counter, frame_index);
#if COHORT_HAVE_IPSEC_MB
  if (keys_->ipsec_mb) {
    IMB_MGR* mgr = thread_manager();
    gcm_context_data ctx;
    IMB_AES256_GCM_ENC(mgr, &keys_->expanded, &ctx, u8(out.data()), u8(plaintext.data()),
                       plaintext.size(), nonce.data(), u8(aad.data()), aad.size(),
                       u8(out.data() + plaintext.size()), kTagBytes);
    OPENSSL_cleanse(&ctx, sizeof ctx);
    if (const int err = imb_get_errno(mgr); err != 0) {
      OPENSSL_cleanse(out.data(), out.size());
      throw TransportError(std::string("AES-256-GCM seal failed: ipsec-mb: ") +
                           imb_get_strerror(err));
    }
    return;
  }
#endif
  EVP_CIPHER_CTX* ctx = thread_context(/*encrypt=*/true);
  int final_bytes = 0;
  const bool ok = EVP_EncryptInit_ex(ctx, nullptr, nullptr, keys_->raw.data(), nonce.data()) == 1 &&
                  update_all(EVP_EncryptUpdate, ctx, nullptr, aad) &&
                  update_all(EVP_EncryptUpdate, ctx, out.data(), plaintext) &&
                  EVP_EncryptFinal_ex(ctx, u8(out.data() + plaintext.size()), &final_bytes) == 1 &&
                  final_bytes == 0 &&
                  EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kTagBytes),
                                      u8(out.data() + plaintext.size())) == 1;
  if (!ok) {
    OPENSSL_cleanse(out.data(), out.size());
    throw TransportError("AES-256-GCM seal failed: " + detail::take_openssl_errors());
  }
}

bool FrameCipher::open(std::uint64_t counter, std::uint32_t frame_index,
                       std::span<const std::byte> aad, std::span<const std::byte> sealed,
                       std::span<std::byte> out) const {
  if (sealed.size() < kTagBytes) {  // peer input: a short frame is a forgery, not a bug
    if (!out.empty()) OPENSSL_cleanse(out.data(), out.size());
    return false;
  }
  COHORT_CHECK(out.size() + kTagBytes == sealed.size())
      << "open: out has " << out.size() << " bytes, needs " << sealed.size() - kTagBytes;
  COHORT_CHECK(!overlaps(out, sealed) && !overlaps(out, aad)) << "open: out overlaps input";
  return open_into(counter, frame_index, aad, sealed, out);
}

bool FrameCipher::open_in_place(std::uint64_t counter, std::uint32_t frame_index,
                                std::span<const std::byte> aad, std::span<std::byte> sealed) const {
  if (sealed.size() < kTagBytes) {
    if (!sealed.empty()) OPENSSL_cleanse(sealed.data(), sealed.size());
    return false;
  }
  COHORT_CHECK(!overlaps(sealed, aad)) << "open_in_place: aad overlaps the frame";
  // Both backends decrypt exactly in place (output pointer == input pointer).
  const bool ok =
      open_into(counter, frame_index, aad, sealed, sealed.first(sealed.size() - kTagBytes));
  if (!ok) OPENSSL_cleanse(sealed.data(), sealed.size());
  return ok;
}

// `out` is either disjoint from `sealed` or its exact prefix (in place).
bool FrameCipher::open_into(std::uint64_t counter, std::uint32_t frame_index,
                            std::span<const std::byte> aad, std::span<const std::byte> sealed,
                            std::span<std::byte> out) const {
  const std::size_t text_bytes = sealed.size() - kTagBytes;
  unsigned char tag[kTagBytes];
  std::memcpy(tag, sealed.data() + text_bytes, kTagBytes);
  const auto nonce = make_nonce(counter, frame_index);
  bool ok = false;
  try {
#if COHORT_HAVE_IPSEC_MB
    if (keys_->ipsec_mb) {
      IMB_MGR* mgr = thread_manager();
      gcm_context_data ctx;
      unsigned char computed[kTagBytes];
      IMB_AES256_GCM_DEC(mgr, &keys_->expanded, &ctx, u8(out.data()), u8(sealed.data()), text_bytes,
                         nonce.data(), u8(aad.data()), aad.size(), computed, kTagBytes);
      OPENSSL_cleanse(&ctx, sizeof ctx);
      ok = imb_get_errno(mgr) == 0 && CRYPTO_memcmp(computed, tag, kTagBytes) == 0;
    } else
#endif
    {
      EVP_CIPHER_CTX* ctx = thread_context(/*encrypt=*/false);
      unsigned char final_block[16];
      int final_bytes = 0;
      ok = EVP_DecryptInit_ex(ctx, nullptr, nullptr, keys_->raw.data(), nonce.data()) == 1 &&
           update_all(EVP_DecryptUpdate, ctx, nullptr, aad) &&
           update_all(EVP_DecryptUpdate, ctx, out.data(), sealed.first(text_bytes)) &&
           EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, static_cast<int>(kTagBytes), tag) == 1 &&
           EVP_DecryptFinal_ex(ctx, final_block, &final_bytes) == 1 && final_bytes == 0;
    }
  } catch (const Error&) {  // state allocation failed: report as "not authentic", per contract
    ok = false;
  }
  if (!ok) {
    // Never hand out unauthenticated plaintext.
    if (!out.empty()) OPENSSL_cleanse(out.data(), out.size());
    ERR_clear_error();
  }
  return ok;
}

}  // namespace cohort::transport::security
