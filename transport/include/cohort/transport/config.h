// The transport's configuration keys, declared once for every program: tls.* (certificates, the
// coordinator's name, plaintext) and transport.* (chunk size, receive queue, AES-GCM backend).
// Programs add them to their schema and build their EndpointOptions from the loaded Config here,
// at start-up, so a bad value stops the program before it binds or connects.
#pragma once

#include <string_view>

#include "cohort/core/config.h"
#include "cohort/transport/endpoint.h"

namespace cohort::transport {

// Declares every tls.* and transport.* key with its default and help text; transport.receive_queue
// only for a program whose endpoint listens for many peers (`listener`: cohort-server), since
// nothing else applies it. Throws InternalError if the schema already declares one of them.
void add_transport_config(ConfigSchema& schema, bool listener);

// The options of an endpoint of node `node_id` (under TLS it must be our certificate's CN) from
// the keys above: tls.insecure, tls.ca_file, tls.cert_file, tls.key_file, transport.chunk_kib and
// transport.aead. Every one of these values is checked: ConfigError naming the key, the values
// allowed and the value given; transport.aead = ipsec-mb where ipsec-mb cannot run is refused
// too. Left to the caller: tls.coordinator_name (which peer must prove it depends on the
// connection: security.expected_peer) and transport.receive_queue (a listening shard's, checked
// and applied there, automatic at 0).
EndpointOptions endpoint_options_from(const Config& config, NodeId node_id);

// "auto", "ipsec-mb" or "openssl" (transport.aead); ConfigError otherwise.
Aead parse_aead(std::string_view name);

}  // namespace cohort::transport
