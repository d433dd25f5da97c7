// Mutual TLS 1.3 authentication of two Cohort nodes, run over ZeroMQ frames.
//
// OpenSSL drives the handshake through memory BIOs: the transport moves the bytes step() returns to
// the peer inside its own frames and feeds the peer's bytes back into step(). Nothing here touches
// a socket. When both sides are done, each exports the same per-direction AES-256-GCM keys
// (SSL_export_keying_material, as DTLS-SRTP does) and the TLS session is no longer needed: frames
// are sealed with FrameCipher (frame_cipher.h).
//
// Identity: a node id (core/ids.h) is the subject CN of its certificate. A peer is accepted only if
// its certificate chains to our CA file and names the node the peer claims to be.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/ids.h"

namespace cohort::transport::security {

// PEM files of one node: the CA bundle it trusts, its certificate (optionally followed by
// intermediates) and its unencrypted private key.
struct TlsFiles {
  std::string ca_file, cert_file, key_file;
};

// Loads the CA, our certificate and our key once and holds one SSL_CTX per role (TLS 1.3 only,
// mutual authentication, peers verified against the CA file, no session tickets or resumption).
// Immutable and thread-safe after construction: many Handshakes may be created from it at once.
// A Handshake keeps its own reference to the OpenSSL context, so it may outlive this object.
// Throws ConfigError naming the file when one is missing, unreadable or not PEM, when the key is
// encrypted, when certificate and key do not match, or when the certificate's CN is not a valid
// node id. A certificate that does not verify against the CA file is only logged (Warn): peers
// trusting another bundle may still accept it.
class TlsContext {
 public:
  explicit TlsContext(const TlsFiles& files);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  // A moved-from TlsContext may only be destroyed or assigned to.
  TlsContext(TlsContext&&) noexcept;
  TlsContext& operator=(TlsContext&&) noexcept;

  // The CN of our own certificate.
  const NodeId& local_id() const;

 private:
  friend class Handshake;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

enum class Role { kClient, kServer };

// Per-direction AES-256-GCM keys. Secret: never log them; wipe copies when done.
struct SessionKeys {
  std::array<std::byte, 32> tx, rx;
};

// One TLS 1.3 handshake driven over memory BIOs. Not thread-safe. Movable; a moved-from Handshake
// may only be destroyed or assigned to.
//
// Message contract: each non-empty vector step() returns is one complete handshake flight and must
// reach the peer's step() as one unit (one ZeroMQ frame), in order. A non-empty input that leaves
// the handshake neither complete nor able to answer is therefore a truncated message and fails.
//
// Flow (TLS 1.3 with client certificates):
//   client.step({})          -> ClientHello
//   server.step(hello)       -> ServerHello .. server Finished (incl. CertificateRequest)
//   client.step(flight)      -> client Certificate, CertificateVerify, Finished; client done()
//   server.step(flight)      -> {}; server done()
// The client is done before the server has checked the client's certificate; it must not treat
// the session as accepted until the server answers (e.g. with the first sealed frame).
//
// Any failure throws TransportError with the reason (certificate from another CA, expired, name
// mismatch, no certificate, not TLS, garbage, truncated, oversized); the object is then dead and
// further step() calls throw too. step() never crashes on hostile input.
class Handshake {
 public:
  // Largest input step() accepts; a real flight with a short chain is ~2 KiB.
  static constexpr std::size_t kMaxMessageBytes = 64 * 1024;

  // expected_peer: the node id the peer claims (server side: the id in the client's hello; client
  // side: the shard id it dialled, or nullopt to accept any CA-signed peer with a valid node id as
  // CN). If the verified certificate's CN differs, step() throws
  // TransportError("peer certificate names 'X' but the peer claims 'Y'").
  Handshake(const TlsContext& ctx, Role role, std::optional<NodeId> expected_peer);
  ~Handshake();
  Handshake(const Handshake&) = delete;
  Handshake& operator=(const Handshake&) = delete;
  Handshake(Handshake&&) noexcept;
  Handshake& operator=(Handshake&&) noexcept;

  // Feeds bytes received from the peer (empty for the client's first call) and returns the bytes
  // to send to the peer (possibly empty). Throws TransportError on any failure (see above), and
  // if called with non-empty input after done().
  std::vector<std::byte> step(std::span<const std::byte> incoming);

  // Handshake complete on our side and nothing left to send (step() always returns everything).
  bool done() const;
  // CN of the verified peer certificate. REQUIRES: done() (else InternalError).
  const NodeId& peer_id() const;
  // Derives the frame keys: 64 bytes of SSL_export_keying_material with label
  // "EXPORTER-cohort-frame-keys" and no context; bytes 0-31 protect client->server frames, bytes
  // 32-63 server->client, assigned to tx/rx by role. REQUIRES: done() (else InternalError).
  SessionKeys keys() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::transport::security
