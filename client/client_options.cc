#include "client_options.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "cohort/client/participant.h"
#include "cohort/client/partition.h"
#include "cohort/client/peer.h"
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

void coordinator_refused(const std::string& server, const std::string& coordinator_name,
                         const std::string& why) {
  throw TransportError("refused the coordinator at " + server + ": expected '" + coordinator_name +
                       "' (tls.coordinator_name): " + why);
}

namespace {

constexpr std::int64_t kMaxMs = std::int64_t{1} << 40;

// "I/N" -> (I, N).
std::pair<std::size_t, std::size_t> parse_part(const std::string& text) {
  const auto slash = text.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    const auto i = std::stoul(text.substr(0, slash));
    const auto n = std::stoul(text.substr(slash + 1));
    if (n == 0 || i >= n) throw std::invalid_argument("out of range");
    return {i, n};
  } catch (const std::exception&) {
    throw ConfigError("data.part must look like I/N with 0 <= I < N, got '" + text + "'");
  }
}

std::chrono::milliseconds ms_in_range(const Config& config, std::string_view key, std::int64_t lo) {
  return std::chrono::milliseconds(int_in_range(config, key, lo, kMaxMs));
}

}  // namespace

// The checks run in the order the participant ran them when it read the Config itself; only the
// device and the compressor, which the participant makes (and so checks) in its constructor,
// now come after client.dp_clip and client.attack*.
ParticipantOptions participant_options_from(const Config& config) {
  ParticipantOptions o;
  o.server = non_empty(config, "client.server");
  o.endpoint =
      coordinator_options(config);  // client.name, tls.coordinator_name, tls.*, transport.*
  o.name = config.get_string("client.name");
  o.coordinator_name = config.get_string("tls.coordinator_name");
  o.connect_timeout = ms_in_range(config, "client.connect_timeout_ms", 1);
  o.backoff_max = ms_in_range(config, "client.backoff_max_ms", 1);
  o.step_delay = ms_in_range(config, "client.step_delay_ms", 0);
  o.data_seed = static_cast<std::uint64_t>(
      int_in_range(config, "data.seed", 0, std::numeric_limits<std::int64_t>::max()));
  std::tie(o.part_index, o.part_count) = parse_part(config.get_string("data.part"));
  // cohort-client's decentralized-only keys do nothing here: refused, not ignored.
  for (const char* key : {"peer.listen", "peer.advertise", "peer.handshake_timeout_ms"}) {
    if (config.is_set(key)) {
      throw ConfigError(std::string(key) + " applies to client.mode = decentralized only");
    }
  }
  o.partition = parse_partition_spec(config.get_string("data.partition"));
  o.data = data_options_from(config);
  o.device = config.get_string("client.device");
  o.threads = static_cast<std::size_t>(int_in_range(config, "client.threads", 0, 1024));
  o.memory_budget = static_cast<std::size_t>(
      int_in_range(config, "client.memory_budget", 0, std::numeric_limits<std::int64_t>::max()));
  o.compressor = config.section("compressor");
  o.dp_clip = config.get_double("client.dp_clip");
  if (!(o.dp_clip >= 0) || !std::isfinite(o.dp_clip))
    throw ConfigError("client.dp_clip must be >= 0");
  const std::string& attack = config.get_string("client.attack");
  o.attack_scale = config.get_double("client.attack_scale");
  if (attack != "none" && attack != "sign_flip") {
    throw ConfigError("client.attack must be none or sign_flip, got '" + attack + "'");
  }
  o.sign_flip = attack == "sign_flip";
  if (!(o.attack_scale > 0) || !std::isfinite(o.attack_scale)) {
    throw ConfigError("client.attack_scale must be > 0");
  }
  return o;
}

PeerOptions peer_options_from(const Config& config) {
  PeerOptions o;
  if (config.get_int("client.memory_budget") != 0) {
    throw ConfigError("client.memory_budget applies to client.mode = federated only");
  }
  o.name = non_empty(config, "client.name");
  o.server = non_empty(config, "client.server");
  o.listen = non_empty(config, "peer.listen");
  o.advertise = config.get_string("peer.advertise");
  o.neighbours = client_endpoint_options(config, "");  // ZmqComm pins each neighbour's name
  o.neighbours.handshake_timeout = ms_in_range(config, "peer.handshake_timeout_ms", 1);
  o.coordinator = coordinator_options(config);
  o.coordinator.handshake_timeout = o.neighbours.handshake_timeout;
  o.coordinator_name = config.get_string("tls.coordinator_name");
  // cohort-client's federated-only keys do nothing here: refused, not ignored.
  for (const char* key : {"data.part", "client.dp_clip", "client.attack", "client.attack_scale",
                          "client.backoff_max_ms"}) {
    if (config.is_set(key)) {
      throw ConfigError(std::string(key) + " does not apply to client.mode = decentralized");
    }
  }
  if (!config.section("compressor").names().empty()) {
    throw ConfigError(
        "compressor.* does not apply to client.mode = decentralized (the run's compressor is "
        "the coordinator's decentralized.compressor, for choco)");
  }
  o.connect_timeout = ms_in_range(config, "client.connect_timeout_ms", 1);
  o.step_delay = ms_in_range(config, "client.step_delay_ms", 0);
  o.data_seed = static_cast<std::uint64_t>(
      int_in_range(config, "data.seed", 0, std::numeric_limits<std::int64_t>::max()));
  o.partition = config.get_string("data.partition");
  (void)parse_partition_spec(o.partition);
  o.data = data_options_from(config);
  o.device = config.get_string("client.device");
  o.threads = static_cast<std::size_t>(int_in_range(config, "client.threads", 0, 1024));
  return o;
}

}  // namespace cohort::client
