// cohort-server's options at the edge: the schema, the start-up check of every key and value
// (mode-specific keys refused in the other modes), and the server optimizer's options as a shard
// reads them. Internal to the server library.
#pragma once

#include <cstdint>

#include <string>

#include "cohort/aggregation/registries.h"
#include "cohort/core/config.h"
#include "cohort/transport/endpoint.h"

namespace cohort::server {

// Checks every key and value that run() and the clients will read, before anything starts, so a
// bad option fails at start-up with one line instead of after clients joined. Throws ConfigError.
void validate(const Config& config, const Registries& registries);

// [server_optimizer] as a shard's optimizer reads it (data-parallel: the gradient rate when
// server_optimizer.lr is not set).
ConfigSection optimizer_options(const Config& config);

// The options of shard `name`'s endpoints, listening and upstream: tls.* and transport.* through
// transport's builder (transport::endpoint_options_from), checked.
transport::EndpointOptions shard_endpoint_options(const Config& config, const std::string& name);

// The listening endpoint's receive queue: transport.receive_queue, or at 0 (automatic) 1 chunk per
// client, fixed for the listener's life (EndpointOptions::receive_queue).
// Throws ConfigError for a value outside 0..65536.
void set_listener_receive_queue(const Config& config, transport::EndpointOptions& options);
// The same from the value itself (ServerOptions::transport.receive_queue).
void set_listener_receive_queue(std::int64_t queue, transport::EndpointOptions& options);

}  // namespace cohort::server
