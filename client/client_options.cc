#include "client_options.h"

#include <string>
#include <utility>

#include "cohort/core/error.h"
#include "cohort/transport/config.h"

namespace cohort::client {

std::int64_t int_in_range(const Config& config, std::string_view key, std::int64_t lo,
                          std::int64_t hi) {
  const std::int64_t v = config.get_int(key);
  if (v < lo || v > hi) {
    throw ConfigError(std::string(key) + " must be between " + std::to_string(lo) + " and " +
                      std::to_string(hi) + ", got " + std::to_string(v));
  }
  return v;
}

const std::string& non_empty(const Config& config, std::string_view key) {
  const std::string& v = config.get_string(key);
  if (v.empty()) throw ConfigError(std::string(key) + " must not be empty");
  return v;
}

transport::EndpointOptions client_endpoint_options(const Config& config,
                                                   std::string expected_peer) {
  auto o = transport::endpoint_options_from(config, non_empty(config, "client.name"));
  o.security.expected_peer = std::move(expected_peer);
  return o;
}

transport::EndpointOptions coordinator_options(const Config& config) {
  return client_endpoint_options(config, non_empty(config, "tls.coordinator_name"));
}

void coordinator_refused(const Config& config, const std::string& why) {
  throw TransportError("refused the coordinator at " + config.get_string("client.server") +
                       ": expected '" + config.get_string("tls.coordinator_name") +
                       "' (tls.coordinator_name): " + why);
}

}  // namespace cohort::client
