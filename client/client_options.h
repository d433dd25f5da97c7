// Start-up checks of the keys every client-side program reads (private to client/): each value is
// checked where it is first read, before any connection, so a bad option never registers a client
// that then fails. Throws ConfigError naming the key, the allowed range and the value.
// participant_options_from() and peer_options_from() (declared in participant.h / peer.h) are
// defined beside these helpers: the one place each where cohort-client's Config becomes options.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "cohort/core/config.h"
#include "cohort/transport/endpoint.h"

namespace cohort::client {

// config.get_int(key), ConfigError unless lo <= value <= hi.
std::int64_t int_in_range(const Config& config, std::string_view key, std::int64_t lo,
                          std::int64_t hi);
// config.get_string(key), ConfigError when it is empty.
const std::string& non_empty(const Config& config, std::string_view key);

// The endpoint options of client.name's connections: tls.* and transport.* through transport's
// builder (transport::endpoint_options_from), checked.
// `expected_peer` is the node id the server must prove; the coordinator's is
// tls.coordinator_name (coordinator_options()).
transport::EndpointOptions client_endpoint_options(const Config& config, std::string expected_peer);
// The same for the connection to the coordinator: its certificate must name tls.coordinator_name.
transport::EndpointOptions coordinator_options(const Config& config);

// Wraps a failed handshake with the coordinator at `server` into a one-line error that names the
// name we expected (`coordinator_name`, tls.coordinator_name) and the reason the TLS layer gave
// (the name it presented).
[[noreturn]] void coordinator_refused(const std::string& server,
                                      const std::string& coordinator_name, const std::string& why);

}  // namespace cohort::client
