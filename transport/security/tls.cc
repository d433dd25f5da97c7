#include "cohort/transport/security/tls.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <cstring>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "openssl_util.h"

namespace cohort::transport::security {

using detail::printable;
using detail::take_openssl_errors;

namespace {

constexpr char kKeyLabel[] = "EXPORTER-cohort-frame-keys";

// Reads every certificate of a PEM bundle into a new store. Throws ConfigError if there is none.
detail::X509StorePtr load_ca_store(const std::string& path) {
  detail::BioPtr bio = detail::open_pem_file(path, "CA file");
  detail::X509StorePtr store(X509_STORE_new());
  if (!store) throw TransportError("X509_STORE_new: " + take_openssl_errors());
  int count = 0;
  while (detail::X509Ptr cert{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)}) {
    if (X509_STORE_add_cert(store.get(), cert.get()) != 1) {
      throw ConfigError("CA file '" + path + "': " + take_openssl_errors());
    }
    ++count;
  }
  // The loop ends on "no start line" at end of file; anything else is a damaged entry.
  const unsigned long last = ERR_peek_last_error();
  const bool clean_end =
      ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE;
  if (count == 0 || (last != 0 && !clean_end)) {
    const std::string reason = take_openssl_errors();
    throw ConfigError("CA file '" + path + "' " +
                      (count == 0 ? "holds no PEM certificate" : "has a damaged certificate") +
                      " (" + reason + ")");
  }
  ERR_clear_error();
  return store;
}

// Logs (does not throw) when our own chain does not verify against our CA bundle.
void warn_if_unverifiable(X509_STORE* store, X509* cert, STACK_OF(X509) * chain,
                          const TlsFiles& files) {
  detail::X509StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store, cert, chain) != 1) {
    ERR_clear_error();
    return;
  }
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    COHORT_LOG(Warn) << "certificate '" << files.cert_file << "' does not verify against CA file '"
                     << files.ca_file << "': " << X509_verify_cert_error_string(err)
                     << "; peers trusting that CA will refuse this node";
  }
  ERR_clear_error();
}

}  // namespace

struct TlsContext::Impl {
  detail::SslCtxPtr client;
  detail::SslCtxPtr server;
  NodeId local_id;
};

TlsContext::TlsContext(const TlsFiles& files) : impl_(std::make_unique<Impl>()) {
  ERR_clear_error();
  detail::X509StorePtr store = load_ca_store(files.ca_file);
  // The leaf comes first in the certificate file; intermediates may follow it.
  detail::BioPtr cert_bio = detail::open_pem_file(files.cert_file, "certificate file");
  detail::X509Ptr cert{PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr)};
  if (!cert) {
    const std::string reason = take_openssl_errors();
    throw ConfigError("certificate file '" + files.cert_file + "' holds no PEM certificate (" +
                      reason + ")");
  }
  std::unique_ptr<STACK_OF(X509), void (*)(STACK_OF(X509)*)> chain(
      sk_X509_new_null(), [](STACK_OF(X509) * s) { sk_X509_pop_free(s, X509_free); });
  if (!chain) throw TransportError("sk_X509_new_null: " + take_openssl_errors());
  while (detail::X509Ptr extra{PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr)}) {
    if (sk_X509_push(chain.get(), extra.get()) <= 0) {
      throw TransportError("sk_X509_push: " + take_openssl_errors());
    }
    (void)extra.release();  // now owned by chain
  }
  ERR_clear_error();
  detail::EvpPkeyPtr key = detail::read_private_key(files.key_file, "key file");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    throw ConfigError("certificate '" + files.cert_file + "' and key '" + files.key_file +
                      "' do not match");
  }
  const std::optional<std::string> cn = detail::common_name(cert.get());
  if (!cn || !is_valid_node_id(*cn)) {
    throw ConfigError("certificate '" + files.cert_file + "' has no valid node id as subject CN" +
                      (cn ? " (found '" + printable(*cn) + "')" : std::string()));
  }
  impl_->local_id = *cn;
  warn_if_unverifiable(store.get(), cert.get(), chain.get(), files);

  auto make = [&](const SSL_METHOD* method) {
    detail::SslCtxPtr ctx(SSL_CTX_new(method));
    auto ok = [&](int rc) {
      if (rc != 1) throw TransportError("setting up TLS context: " + take_openssl_errors());
    };
    if (!ctx) throw TransportError("SSL_CTX_new: " + take_openssl_errors());
    ok(SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION));
    ok(SSL_CTX_set_max_proto_version(ctx.get(), TLS1_3_VERSION));
    // Sessions are never resumed: every connection is a full mutual handshake, and a server that
    // sends no NewSessionTicket has nothing left to say after the client's Finished.
    SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
    ok(SSL_CTX_set_num_tickets(ctx.get(), 0));
    SSL_CTX_set_security_level(ctx.get(), 2);
    ok(SSL_CTX_use_certificate(ctx.get(), cert.get()));
    for (int i = 0; i < sk_X509_num(chain.get()); ++i) {
      ok(static_cast<int>(SSL_CTX_add1_chain_cert(ctx.get(), sk_X509_value(chain.get(), i))));
    }
    ok(SSL_CTX_use_PrivateKey(ctx.get(), key.get()));
    ok(SSL_CTX_check_private_key(ctx.get()));
    ok(static_cast<int>(SSL_CTX_set1_verify_cert_store(ctx.get(), store.get())));
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    return ctx;
  };
  impl_->client = make(TLS_client_method());
  impl_->server = make(TLS_server_method());
}

TlsContext::~TlsContext() = default;
TlsContext::TlsContext(TlsContext&&) noexcept = default;
TlsContext& TlsContext::operator=(TlsContext&&) noexcept = default;

const NodeId& TlsContext::local_id() const { return impl_->local_id; }

struct Handshake::Impl {
  Role role;
  std::optional<NodeId> expected_peer;
  detail::SslPtr ssl;
  BIO* rbio = nullptr;  // owned by ssl: bytes from the peer
  BIO* wbio = nullptr;  // owned by ssl: bytes for the peer
  bool complete = false;
  bool failed = false;
  NodeId peer_id;

  [[noreturn]] void fail(const std::string& reason) {
    failed = true;
    ERR_clear_error();
    throw TransportError(reason);
  }
  [[noreturn]] void fail_handshake(const std::string& reason) {
    fail(std::string("TLS handshake failed (we are ") +
         (role == Role::kClient ? "client" : "server") + "): " + reason);
  }

  // Why SSL_do_handshake returned `rc`; drains the error queue.
  std::string describe_failure(int rc) {
    const int err = SSL_get_error(ssl.get(), rc);
    const long verify = SSL_get_verify_result(ssl.get());
    std::string queue = take_openssl_errors("");
    if (verify != X509_V_OK) {
      return std::string("peer certificate rejected: ") + X509_verify_cert_error_string(verify) +
             (queue.empty() ? "" : " (" + queue + ")");
    }
    switch (err) {
      case SSL_ERROR_SSL: return queue.empty() ? "protocol error" : queue;
      case SSL_ERROR_ZERO_RETURN: return "peer closed the TLS session";
      case SSL_ERROR_SYSCALL: return queue.empty() ? "unexpected end of handshake data" : queue;
      default:
        return "unexpected OpenSSL state " + std::to_string(err) +
               (queue.empty() ? "" : ": " + queue);
    }
  }

  void check_peer() {
    const X509* cert = SSL_get0_peer_certificate(ssl.get());
    if (cert == nullptr) fail_handshake("peer sent no certificate");
    const long verify = SSL_get_verify_result(ssl.get());
    if (verify != X509_V_OK) {  // unreachable with SSL_VERIFY_PEER; kept as a second lock
      fail_handshake(std::string("peer certificate rejected: ") +
                     X509_verify_cert_error_string(verify));
    }
    const std::optional<std::string> cn = detail::common_name(cert);
    if (!cn || !is_valid_node_id(*cn)) {
      fail_handshake("peer certificate has no valid node id as subject CN" +
                     (cn ? " (found '" + printable(*cn) + "')" : std::string()));
    }
    if (expected_peer && *expected_peer != *cn) {
      fail("peer certificate names '" + printable(*cn) + "' but the peer claims '" +
           printable(*expected_peer) + "'");
    }
    peer_id = *cn;
  }

  std::vector<std::byte> drain_output() {
    std::vector<std::byte> out(BIO_ctrl_pending(wbio));
    if (!out.empty()) {
      const int n = BIO_read(wbio, out.data(), static_cast<int>(out.size()));
      if (n != static_cast<int>(out.size())) fail_handshake("memory BIO read failed");
    }
    return out;
  }
};

Handshake::Handshake(const TlsContext& ctx, Role role, std::optional<NodeId> expected_peer)
    : impl_(std::make_unique<Impl>()) {
  impl_->role = role;
  impl_->expected_peer = std::move(expected_peer);
  SSL_CTX* ssl_ctx = role == Role::kClient ? ctx.impl_->client.get() : ctx.impl_->server.get();
  impl_->ssl.reset(SSL_new(ssl_ctx));  // takes a reference on ssl_ctx
  if (!impl_->ssl) throw TransportError("SSL_new: " + take_openssl_errors());
  impl_->rbio = BIO_new(BIO_s_mem());
  impl_->wbio = BIO_new(BIO_s_mem());
  if (impl_->rbio == nullptr || impl_->wbio == nullptr) {
    BIO_free(impl_->rbio);
    BIO_free(impl_->wbio);
    throw TransportError("BIO_new: " + take_openssl_errors());
  }
  // An empty memory BIO reports "retry" instead of EOF, so OpenSSL asks for more input.
  BIO_set_mem_eof_return(impl_->rbio, -1);
  SSL_set_bio(impl_->ssl.get(), impl_->rbio, impl_->wbio);
  if (role == Role::kClient) {
    SSL_set_connect_state(impl_->ssl.get());
  } else {
    SSL_set_accept_state(impl_->ssl.get());
  }
}

Handshake::~Handshake() = default;
Handshake::Handshake(Handshake&&) noexcept = default;
Handshake& Handshake::operator=(Handshake&&) noexcept = default;

std::vector<std::byte> Handshake::step(std::span<const std::byte> incoming) {
  Impl& s = *impl_;
  if (s.failed) throw TransportError("TLS handshake already failed; start a new one");
  if (s.complete) {
    if (incoming.empty()) return {};
    s.fail_handshake("unexpected " + std::to_string(incoming.size()) +
                     " bytes after the handshake completed");
  }
  if (incoming.size() > kMaxMessageBytes) {
    s.fail_handshake("handshake message of " + std::to_string(incoming.size()) +
                     " bytes exceeds the limit of " + std::to_string(kMaxMessageBytes));
  }
  ERR_clear_error();
  if (!incoming.empty()) {
    const int n = BIO_write(s.rbio, incoming.data(), static_cast<int>(incoming.size()));
    if (n != static_cast<int>(incoming.size())) s.fail_handshake("memory BIO write failed");
  }
  const int rc = SSL_do_handshake(s.ssl.get());
  if (rc == 1) {
    s.complete = true;
    s.check_peer();
    if (BIO_ctrl_pending(s.rbio) != 0) {
      s.fail_handshake("unexpected bytes after the peer's last handshake message");
    }
  } else if (SSL_get_error(s.ssl.get(), rc) != SSL_ERROR_WANT_READ) {
    s.fail_handshake(s.describe_failure(rc));
  }
  std::vector<std::byte> out = s.drain_output();
  // Each peer message is a whole flight (see the header): one that neither completes the
  // handshake nor draws an answer was cut short.
  if (!s.complete && !incoming.empty() && out.empty()) {
    s.fail_handshake("truncated or incomplete handshake message (" +
                     std::to_string(incoming.size()) + " bytes)");
  }
  return out;
}

bool Handshake::done() const { return impl_->complete && !impl_->failed; }

const NodeId& Handshake::peer_id() const {
  COHORT_CHECK(done()) << "Handshake::peer_id() before the handshake is done";
  return impl_->peer_id;
}

SessionKeys Handshake::keys() const {
  COHORT_CHECK(done()) << "Handshake::keys() before the handshake is done";
  unsigned char material[64];
  if (SSL_export_keying_material(impl_->ssl.get(), material, sizeof material, kKeyLabel,
                                 std::strlen(kKeyLabel), nullptr, 0, 0) != 1) {
    OPENSSL_cleanse(material, sizeof material);
    throw TransportError("exporting frame keys failed: " + take_openssl_errors());
  }
  SessionKeys keys;
  const bool client = impl_->role == Role::kClient;
  std::memcpy(keys.tx.data(), material + (client ? 0 : 32), 32);
  std::memcpy(keys.rx.data(), material + (client ? 32 : 0), 32);
  OPENSSL_cleanse(material, sizeof material);
  return keys;
}

}  // namespace cohort::transport::security
