#include "cohort/transport/config.h"

#include <cstdint>
#include <string>
#include <utility>

#include "aead.h"
#include "cohort/core/error.h"

namespace cohort::transport {
namespace {

std::int64_t int_in_range(const Config& config, std::string_view key, std::int64_t lo,
                          std::int64_t hi) {
  const std::int64_t v = config.get_int(key);
  if (v < lo || v > hi) {
    throw ConfigError(std::string(key) + " must be from " + std::to_string(lo) + " to " +
                      std::to_string(hi) + ", got " + std::to_string(v));
  }
  return v;
}

}  // namespace

security::AeadBackend detail::aead_backend(Aead aead) {
  switch (aead) {
    case Aead::kIpsecMb: return security::AeadBackend::kIpsecMb;
    case Aead::kOpenSsl: return security::AeadBackend::kOpenSsl;
    case Aead::kAuto: break;
  }
  return security::AeadBackend::kAuto;
}

void add_transport_config(ConfigSchema& schema, bool listener) {
  schema.add("tls.insecure", false, "plaintext transport (logged as a warning)")
      .add("tls.ca_file", std::string(""), "CA certificate (PEM)")
      .add("tls.cert_file", std::string(""), "this node's certificate (PEM, CN = node id)")
      .add_secret("tls.key_file", std::string(""), "this node's private key (PEM)")
      .add("tls.coordinator_name", std::string("shard-0"),
           "the coordinator's certificate name (CN): clients and shards > 0 refuse any other "
           "certificate, even one from our CA; shard 0's server.name must equal it")
      .add("transport.chunk_kib", std::int64_t{1024},
           "chunk size of large messages in KiB (4 to 65536)")
      .add("transport.aead", std::string("auto"),
           "AES-256-GCM implementation of sealed records: auto (ipsec-mb where built in and the "
           "CPU has AES-NI, else OpenSSL) | ipsec-mb | openssl; peers may differ");
  if (listener) {
    schema.add("transport.receive_queue", std::int64_t{0},
               "chunks queued per peer before TCP pushes back (0: automatic, 1 per peer; "
               "under TLS the shard also reads one chunk ahead of the one it decrypts)");
  }
}

Aead parse_aead(std::string_view name) {
  if (name == "auto") return Aead::kAuto;
  if (name == "ipsec-mb") return Aead::kIpsecMb;
  if (name == "openssl") return Aead::kOpenSsl;
  throw ConfigError("transport.aead must be auto, ipsec-mb or openssl, got '" + std::string(name) +
                    "'");
}

EndpointOptions endpoint_options_from(const Config& config, NodeId node_id) {
  EndpointOptions o;
  o.node_id = std::move(node_id);
  o.security.insecure = config.get_bool("tls.insecure");
  o.security.ca_file = config.get_string("tls.ca_file");
  o.security.cert_file = config.get_string("tls.cert_file");
  o.security.key_file = config.get_string("tls.key_file");
  o.security.aead = parse_aead(config.get_string("transport.aead"));
  // Asked for ipsec-mb where it cannot run: refused now, not at the first handshake.
  (void)security::FrameCipher::backend(detail::aead_backend(o.security.aead));
  o.chunk_bytes =
      static_cast<std::size_t>(int_in_range(config, "transport.chunk_kib", 4, 65536)) * 1024;
  return o;
}

}  // namespace cohort::transport
