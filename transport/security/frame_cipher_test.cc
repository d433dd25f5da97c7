#include "cohort/transport/security/frame_cipher.h"

#include <doctest/doctest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "cohort/core/error.h"

namespace sec = cohort::transport::security;
using sec::FrameCipher;

namespace {

std::array<std::byte, 32> key_of(unsigned char seed) {
  std::array<std::byte, 32> key;
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::byte>(seed + i * 7);
  return key;
}

std::vector<std::byte> pattern(std::size_t n, unsigned char seed = 1) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed * 31 + i * 13);
  return v;
}

// Each case runs once per backend choice (transport.aead): auto (ipsec-mb where built in) and
// OpenSSL, which auto never picks where ipsec-mb runs.
struct AutoBackend {
  static constexpr sec::AeadBackend kBackend = sec::AeadBackend::kAuto;
};
struct OpenSslBackend {
  static constexpr sec::AeadBackend kBackend = sec::AeadBackend::kOpenSsl;
};

}  // namespace

TEST_CASE_TEMPLATE("seal then open round-trips, for empty and odd sizes",
                   B, AutoBackend, OpenSslBackend) {
  const FrameCipher cipher(key_of(3), B::kBackend);
  const auto aad = pattern(24, 9);
  for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 4096u, 100001u}) {
    CAPTURE(n);
    const auto plain = pattern(n);
    std::vector<std::byte> sealed(n + FrameCipher::kTagBytes);
    cipher.seal(/*counter=*/42, /*frame_index=*/3, aad, plain, sealed);
    if (n >= 16) CHECK(std::memcmp(sealed.data(), plain.data(), 16) != 0);
    std::vector<std::byte> out(n);
    REQUIRE(cipher.open(42, 3, aad, sealed, out));
    CHECK(out == plain);
  }
}

// Either backend (frame_cipher.h) must produce exactly standard AES-256-GCM, so that peers using
// different ones interoperate: compare with OpenSSL's EVP interface called directly.
TEST_CASE_TEMPLATE("sealed frames are standard AES-256-GCM, byte for byte, whichever backend runs",
                   B, AutoBackend, OpenSslBackend) {
  MESSAGE("backend: " << FrameCipher::backend(B::kBackend));
  const auto key = key_of(13);
  const FrameCipher cipher(key, B::kBackend);
  const auto aad = pattern(40, 2);
  for (std::size_t n : {0u, 1u, 31u, 64u, 1000u, 65536u, 1048579u}) {
    CAPTURE(n);
    const auto plain = pattern(n, 6);
    std::vector<std::byte> sealed(n + FrameCipher::kTagBytes);
    cipher.seal(/*counter=*/0x0102030405060708u, /*frame_index=*/9, aad, plain, sealed);

    std::vector<unsigned char> want(n + FrameCipher::kTagBytes);
    unsigned char nonce[12] = {0, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8};
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    REQUIRE(ctx != nullptr);
    int len = 0;
    const auto* k = reinterpret_cast<const unsigned char*>(key.data());
    REQUIRE(EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, k, nonce) == 1);
    REQUIRE(EVP_EncryptUpdate(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(aad.data()),
                              static_cast<int>(aad.size())) == 1);
    REQUIRE(EVP_EncryptUpdate(ctx, want.data(), &len,
                              reinterpret_cast<const unsigned char*>(plain.data()),
                              static_cast<int>(n)) == 1);
    REQUIRE(EVP_EncryptFinal_ex(ctx, want.data() + n, &len) == 1);
    REQUIRE(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, want.data() + n) == 1);
    EVP_CIPHER_CTX_free(ctx);
    CHECK(std::memcmp(sealed.data(), want.data(), want.size()) == 0);

    std::vector<std::byte> out(n);
    REQUIRE(cipher.open(0x0102030405060708u, 9, aad, sealed, out));
    CHECK(out == plain);
  }
}

TEST_CASE_TEMPLATE("open_in_place decrypts where the frame lies, and zeroes a forged one",
                   B, AutoBackend, OpenSslBackend) {
  const FrameCipher cipher(key_of(17), B::kBackend);
  const auto aad = pattern(24, 3);
  for (std::size_t n : {0u, 1u, 17u, 4096u, 65536u + 5u}) {
    CAPTURE(n);
    const auto plain = pattern(n, 8);
    std::vector<std::byte> sealed(n + FrameCipher::kTagBytes);
    cipher.seal(77, 1, aad, plain, sealed);
    auto frame = sealed;
    REQUIRE(cipher.open_in_place(77, 1, aad, frame));
    CHECK(std::equal(plain.begin(), plain.end(), frame.begin()));

    auto forged = sealed;
    forged[n / 2] ^= std::byte{0x40};
    CHECK_FALSE(cipher.open_in_place(77, 1, aad, forged));
    CHECK(std::all_of(forged.begin(), forged.end(), [](std::byte b) { return b == std::byte{0}; }));
    auto wrong_counter = sealed;
    CHECK_FALSE(cipher.open_in_place(78, 1, aad, wrong_counter));
  }
  std::vector<std::byte> short_frame(FrameCipher::kTagBytes - 1, std::byte{1});
  CHECK_FALSE(cipher.open_in_place(0, 0, {}, short_frame));
  std::vector<std::byte> buf(64);
  CHECK_THROWS_AS((void)cipher.open_in_place(0, 0, std::span(buf).first(8), buf),
                  cohort::InternalError);
}

TEST_CASE_TEMPLATE("the nonce is frame_index || counter: distinct pairs give distinct ciphertexts",
                   B, AutoBackend, OpenSslBackend) {
  const FrameCipher cipher(key_of(5), B::kBackend);
  const auto plain = pattern(64);
  std::vector<std::byte> a(80), b(80), c(80);
  cipher.seal(1, 0, {}, plain, a);
  cipher.seal(2, 0, {}, plain, b);
  cipher.seal(1, 1, {}, plain, c);
  CHECK(a != b);
  CHECK(a != c);
  std::vector<std::byte> again(80);
  cipher.seal(1, 0, {}, plain, again);
  CHECK(a == again);  // deterministic for the same key and nonce
}

TEST_CASE_TEMPLATE("any single flipped bit, wrong counter, frame_index, aad or key fails open()",
                   B, AutoBackend, OpenSslBackend) {
  const FrameCipher cipher(key_of(7), B::kBackend);
  const auto plain = pattern(300);
  const auto aad = pattern(20, 4);
  std::vector<std::byte> sealed(plain.size() + FrameCipher::kTagBytes);
  cipher.seal(1000, 7, aad, plain, sealed);
  std::vector<std::byte> out(plain.size());

  for (std::size_t bit = 0; bit < sealed.size() * 8; bit += 5) {  // ciphertext and tag
    auto bad = sealed;
    bad[bit / 8] ^= std::byte(1u << (bit % 8));
    CHECK_FALSE(cipher.open(1000, 7, aad, bad, out));
  }
  for (std::size_t bit = 0; bit < aad.size() * 8; ++bit) {
    auto bad_aad = aad;
    bad_aad[bit / 8] ^= std::byte(1u << (bit % 8));
    CHECK_FALSE(cipher.open(1000, 7, bad_aad, sealed, out));
  }
  CHECK_FALSE(cipher.open(1001, 7, aad, sealed, out));
  CHECK_FALSE(cipher.open(1000, 8, aad, sealed, out));
  CHECK_FALSE(cipher.open(1000, 7, {}, sealed, out));
  CHECK_FALSE(FrameCipher(key_of(8), B::kBackend).open(1000, 7, aad, sealed, out));
  // A failed open leaves no unauthenticated plaintext behind.
  CHECK(std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0}; }));
  REQUIRE(cipher.open(1000, 7, aad, sealed, out));
  CHECK(out == plain);
}

TEST_CASE_TEMPLATE("a frame shorter than the tag is refused; wrong buffer sizes are caller bugs",
                   B, AutoBackend, OpenSslBackend) {
  const FrameCipher cipher(key_of(1), B::kBackend);
  const std::vector<std::byte> short_frame(FrameCipher::kTagBytes - 1);
  std::vector<std::byte> none;
  CHECK_FALSE(cipher.open(0, 0, {}, short_frame, none));
  std::vector<std::byte> plain(10), out(10);
  CHECK_THROWS_AS(cipher.seal(0, 0, {}, plain, out), cohort::InternalError);
  std::vector<std::byte> sealed(26);
  cipher.seal(0, 0, {}, plain, sealed);
  std::vector<std::byte> too_big(11);
  CHECK_THROWS_AS((void)cipher.open(0, 0, {}, sealed, too_big), cohort::InternalError);
  // In-place sealing is refused rather than silently corrupting.
  std::vector<std::byte> buf(26);
  CHECK_THROWS_AS(cipher.seal(0, 0, {}, std::span(buf).first(10), buf), cohort::InternalError);
}

TEST_CASE_TEMPLATE("seal and open are safe from many threads at once",
                   B, AutoBackend, OpenSslBackend) {
  const FrameCipher cipher(key_of(11), B::kBackend);
  constexpr int kThreads = 4;
  constexpr std::size_t kChunk = 64 * 1024;
  std::vector<int> failures(kThreads, 0);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (std::uint32_t i = 0; i < 50; ++i) {
          const auto plain = pattern(kChunk, static_cast<unsigned char>(t + i));
          std::vector<std::byte> sealed(kChunk + FrameCipher::kTagBytes), out(kChunk);
          cipher.seal(static_cast<std::uint64_t>(t), i, {}, plain, sealed);
          if (!cipher.open(static_cast<std::uint64_t>(t), i, {}, sealed, out) || out != plain) {
            ++failures[t];
          }
        }
      });
    }
  }
  CHECK(std::accumulate(failures.begin(), failures.end(), 0) == 0);
}

TEST_CASE_TEMPLATE("seal throughput for 1 MiB frames (printed, not asserted)",
                   B, AutoBackend, OpenSslBackend) {
  const FrameCipher cipher(key_of(2), B::kBackend);
  constexpr std::size_t kChunk = 1 << 20;
  constexpr int kFrames = 96;
  const auto plain = pattern(kChunk);
  std::vector<std::byte> sealed(kChunk + FrameCipher::kTagBytes), out(kChunk);
  for (int i = 0; i < 4; ++i) cipher.seal(0, static_cast<std::uint32_t>(i), {}, plain, sealed);
  auto gbps = [&](auto&& fn) {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kFrames; ++i) fn(static_cast<std::uint64_t>(i));
      const std::chrono::duration<double> s = std::chrono::steady_clock::now() - start;
      best = std::max(best, kFrames * static_cast<double>(kChunk) / s.count() / 1e9);
    }
    return best;
  };
  const double seal = gbps([&](std::uint64_t c) { cipher.seal(c, 0, {}, plain, sealed); });
  cipher.seal(0, 0, {}, plain, sealed);
  const double open = gbps([&](std::uint64_t) { CHECK(cipher.open(0, 0, {}, sealed, out)); });
  MESSAGE("AES-256-GCM 1 MiB frames, one thread: seal " << seal << " GB/s, open " << open
                                                        << " GB/s");
}

TEST_CASE("a backend that cannot run here is refused with a ConfigError naming transport.aead") {
  CHECK(FrameCipher::backend(sec::AeadBackend::kOpenSsl) == "openssl");
  const std::string_view best = FrameCipher::backend(sec::AeadBackend::kAuto);
  if (best.starts_with("ipsec-mb")) {
    CHECK(FrameCipher::backend(sec::AeadBackend::kIpsecMb) == best);
    CHECK_NOTHROW((void)FrameCipher(key_of(4), sec::AeadBackend::kIpsecMb));
  } else {
    CHECK(best == "openssl");
    CHECK_THROWS_WITH_AS((void)FrameCipher::backend(sec::AeadBackend::kIpsecMb),
                         doctest::Contains("transport.aead = ipsec-mb"), cohort::ConfigError);
    CHECK_THROWS_AS((void)FrameCipher(key_of(4), sec::AeadBackend::kIpsecMb), cohort::ConfigError);
  }
}
