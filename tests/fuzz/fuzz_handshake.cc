// Fuzzes the TLS handshake's input path (transport/security/tls.cc): the bytes a peer sends as its
// handshake frames, fed to Handshake::step() of a server (the input is the client's hello flight
// and what follows) or of a client that has sent its hello (the input is the server's flights).
// Also feeds the same bytes as sealed records to FrameCipher::open. Every failure must be a
// TransportError, and a handshake must never complete for a peer without a certificate from our
// CA (the fuzzer holds no key of a trusted node, so done() on the server is a finding).
//
// Input: byte 0 picks the role (even: server, odd: client); then frames, each a 16-bit
// little-endian length followed by that many bytes.
#include <stdlib.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/transport/security/frame_cipher.h"
#include "cohort/transport/security/keygen.h"
#include "cohort/transport/security/tls.h"

namespace {

namespace sec = cohort::transport::security;

struct Pki {
  std::filesystem::path dir;
  std::optional<sec::TlsContext> server, client;
};

Pki& pki() {
  static Pki p = [] {
    Pki k;
    std::string tmpl = (std::filesystem::temp_directory_path() / "cohort-fuzz-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    k.dir = tmpl;
    sec::generate_ca(k.dir / "ca");
    k.server.emplace(sec::generate_node(k.dir / "ca", "shard-0", k.dir / "nodes"));
    k.client.emplace(sec::generate_node(k.dir / "ca", "client-1", k.dir / "nodes"));
    std::error_code ec;
    std::filesystem::remove_all(k.dir, ec);  // the contexts hold what they read
    return k;
  }();
  return p;
}

std::vector<std::span<const std::byte>> frames_of(std::span<const std::byte> in) {
  std::vector<std::span<const std::byte>> out;
  while (in.size() >= 2 && out.size() < 8) {
    const std::size_t n = std::to_integer<std::size_t>(in[0]) | (std::to_integer<std::size_t>(in[1]) << 8);
    in = in.subspan(2);
    const std::size_t take = std::min(n, in.size());
    out.push_back(in.first(take));
    in = in.subspan(take);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cohort::set_log_level(cohort::LogLevel::Off);
  (void)pki();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool server_role = data[0] % 2 == 0;
  const auto frames = frames_of(std::as_bytes(std::span(data + 1, size - 1)));
  Pki& k = pki();
  try {
    sec::Handshake hs(server_role ? *k.server : *k.client,
                      server_role ? sec::Role::kServer : sec::Role::kClient,
                      server_role ? std::optional<cohort::NodeId>("client-1")
                                  : std::optional<cohort::NodeId>("shard-0"));
    if (!server_role) (void)hs.step({});
    for (const auto& f : frames) {
      (void)hs.step(f);
      if (hs.done()) {
        // No trusted key is in the fuzzer's hands: a completed handshake means forged auth.
        std::abort();
      }
    }
  } catch (const cohort::TransportError&) {
  }

  // The same bytes as a sealed record under a fixed key: open() must refuse, never crash.
  static const sec::FrameCipher cipher(std::array<std::byte, 32>{});
  for (const auto& f : frames) {
    std::vector<std::byte> out(f.size() >= sec::FrameCipher::kTagBytes
                                   ? f.size() - sec::FrameCipher::kTagBytes : 0);
    if (cipher.open(size, 0, {}, f, out)) std::abort();  // forged without the key
  }
  return 0;
}
