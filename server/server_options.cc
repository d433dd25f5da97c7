#include "server_options.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "cohort/core/error.h"

#include "options.h"

namespace cohort::server {
namespace {

// A [train] value as TOML: strings quoted, numbers and bools bare.
std::string to_string_value(const ConfigSection& s, const std::string& name) {
  const std::string text = s.get_string(name, "");
  try {
    (void)s.get_bool(name, false);
    return text;
  } catch (const ConfigError&) {
  }
  try {
    (void)s.get_double(name, 0);
    return text;
  } catch (const ConfigError&) {
  }
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

TrainForward train_forward(const ConfigSection& train) {
  TrainForward t;
  std::ostringstream toml;
  for (const auto& name : train.names())
    toml << name << " = " << to_string_value(train, name) << '\n';
  t.toml = toml.str();
  t.epochs = static_cast<std::uint32_t>(train.get_int("epochs", 1));
  t.steps = static_cast<std::uint32_t>(train.get_int("steps", 0));
  t.batch_size = static_cast<std::uint32_t>(train.get_int("batch_size", 64));
  t.regression = train.get_string("loss", "cross_entropy") == "mse";  // validated: options.cc
  return t;
}

NodeOptions node_options(const Config& c) {
  NodeOptions n;
  n.index = static_cast<std::uint32_t>(c.get_int("server.shard"));
  n.shards = static_cast<std::uint32_t>(c.get_int("server.shards"));
  n.name = c.get_string("server.name");
  if (n.name.empty()) n.name = "shard-" + std::to_string(n.index);
  n.listen = c.get_string("server.listen");
  n.coordinator = c.get_string("server.coordinator");
  n.advertise = c.get_string("server.advertise");
  n.port_file = c.get_string("server.port_file");
  return n;
}

TlsOptions tls_options(const Config& c) {
  return {.insecure = c.get_bool("tls.insecure"),
          .ca_file = c.get_string("tls.ca_file"),
          .cert_file = c.get_string("tls.cert_file"),
          .key_file = c.get_string("tls.key_file"),
          .coordinator_name = c.get_string("tls.coordinator_name")};
}

TransportOptions transport_options(const Config& c, const std::string& name) {
  TransportOptions t;
  t.tls = tls_options(c);
  t.endpoint = shard_endpoint_options(c, name);
  t.chunk_bytes = static_cast<std::size_t>(c.get_int("transport.chunk_kib")) * 1024;
  t.receive_queue = c.get_int("transport.receive_queue");
  return t;
}

RoundOptions round_options(const Config& c) {
  RoundOptions r;
  r.rounds = static_cast<std::uint64_t>(c.get_int("server.rounds"));
  r.clients_per_round = static_cast<std::size_t>(c.get_int("server.clients_per_round"));
  r.overselect = c.get_double("server.overselect");
  const std::string selection = c.get_string("server.selection");
  r.selection = selection == "weighted"      ? Selection::kWeighted
                : selection == "speed_aware" ? Selection::kSpeedAware
                                             : Selection::kUniform;
  r.min_clients = static_cast<std::size_t>(c.get_int("server.min_clients"));
  r.min_updates =
      static_cast<std::size_t>(std::max<std::int64_t>(1, c.get_int("server.min_updates")));
  r.max_failed_rounds =
      static_cast<std::uint64_t>(std::max<std::int64_t>(0, c.get_int("server.max_failed_rounds")));
  r.deadline = std::chrono::milliseconds(c.get_int("server.round_deadline_ms"));
  r.eval_every =
      static_cast<std::uint64_t>(std::max<std::int64_t>(0, c.get_int("server.eval_every")));
  r.seed = static_cast<std::uint64_t>(c.get_int("server.seed"));
  r.heartbeat_ms = static_cast<std::uint32_t>(c.get_int("server.heartbeat_ms"));
  r.client_timeout = std::chrono::milliseconds(c.get_int("server.client_timeout_ms"));
  return r;
}

}  // namespace

Normalization parse_normalization(const Config& c) {
  const std::string value = c.get_string("server.normalization");
  if (value == "none") return Normalization::kNone;
  if (value == "fednova") return Normalization::kFedNova;
  throw ConfigError("server.normalization must be none or fednova, got '" + value + "'");
}

SecAggOptions parse_secure_aggregation(const Config& c) {
  SecAggOptions o;
  const std::string value = c.get_string("server.secure_aggregation");
  if (value == "none") {
    o.kind = SecAggKind::kNone;
  } else if (value == "secagg") {
    o.kind = SecAggKind::kSecAgg;
  } else if (value == "secagg+") {
    o.kind = SecAggKind::kSecAggPlus;
  } else {
    throw ConfigError("server.secure_aggregation must be none, secagg or secagg+, got '" + value +
                      "'");
  }
  const std::int64_t stage = c.get_int("secagg.stage_ms");
  if (stage < 1 || stage > 3'600'000)
    throw ConfigError("secagg.stage_ms must be from 1 to 3600000, got " + std::to_string(stage));
  o.stage = std::chrono::milliseconds(stage);
  o.clip = c.get_double("secagg.clip");
  if (!(o.clip > 0 && std::isfinite(o.clip)))
    throw ConfigError("secagg.clip must be > 0 and finite, got " + std::to_string(o.clip));
  const std::int64_t levels = c.get_int("secagg.levels");
  if (levels < 2 || levels > (std::int64_t{1} << 31)) {
    throw ConfigError("secagg.levels must be from 2 to 2^31, got " + std::to_string(levels));
  }
  o.levels = static_cast<std::uint32_t>(levels);
  o.threshold = c.get_double("secagg.threshold");
  if (!(o.threshold >= 0.5 && o.threshold < 1)) {
    throw ConfigError("secagg.threshold must be from 0.5 to below 1, got " +
                      std::to_string(o.threshold));
  }
  const std::int64_t degree = c.get_int("secagg.degree");
  if (degree != 0 && (degree < 3 || degree % 2 == 0 || degree > 65535)) {
    throw ConfigError("secagg.degree must be 0 (the default) or an odd number from 3, got " +
                      std::to_string(degree));
  }
  if (degree != 0 && o.kind != SecAggKind::kSecAggPlus) {
    throw ConfigError("secagg.degree applies to server.secure_aggregation = secagg+ only");
  }
  o.degree = static_cast<std::uint32_t>(degree);
  return o;
}

BatchPolicy parse_batch_policy(const Config& c) {
  const std::string value = c.get_string("server.batch_policy");
  if (value == "equal") return BatchPolicy::kEqual;
  if (value == "speed") return BatchPolicy::kSpeed;
  throw ConfigError("server.batch_policy must be equal or speed, got '" + value + "'");
}

ServerOptions server_options_from(const Config& c) {
  ServerOptions o;
  o.modes = parse_modes(c);
  o.node = node_options(c);
  o.transport = transport_options(c, o.node.name);
  o.model = {.spec = c.get_string("model.spec"),
             .seed = static_cast<std::uint64_t>(c.get_int("model.seed"))};
  o.round = round_options(c);
  o.work = {.policy = c.get_string("server.work") == "deadline" ? WorkPolicy::kDeadline
                                                                : WorkPolicy::kFixed,
            .min_steps = static_cast<std::uint32_t>(
                std::max<std::int64_t>(1, c.get_int("server.min_local_steps"))),
            .max_steps = static_cast<std::uint32_t>(
                std::max<std::int64_t>(0, c.get_int("server.max_local_steps"))),
            .margin = c.get_double("server.deadline_margin")};
  o.fedbuff = {
      .buffer_size =
          static_cast<std::size_t>(std::max<std::int64_t>(1, c.get_int("server.buffer_size"))),
      .max_staleness = c.get_int("server.max_staleness"),
      .concurrency =
          static_cast<std::size_t>(std::max<std::int64_t>(1, c.get_int("server.concurrency")))};
  o.dataparallel = {.staleness = static_cast<std::uint64_t>(
                        std::max<std::int64_t>(0, c.get_int("server.staleness"))),
                    .steps = static_cast<std::uint32_t>(c.get_int("server.steps")),
                    .workers = static_cast<std::size_t>(
                        std::max<std::int64_t>(1, c.get_int("server.clients_per_round")))};
  o.checkpoint = {.dir = c.get_string("server.checkpoint_dir"),
                  .every = static_cast<std::uint64_t>(
                      std::max<std::int64_t>(1, c.get_int("server.checkpoint_every")))};
  o.dp = {.clip = c.get_double("dp.clip"),
          .noise_multiplier = c.get_double("dp.noise_multiplier"),
          .delta = c.get_double("dp.delta"),
          .seed = static_cast<std::uint64_t>(c.get_int("dp.seed"))};
  o.normalization = parse_normalization(c);
  o.secagg = parse_secure_aggregation(c);
  o.train = train_forward(c.section("train"));
  o.dataparallel.batch_policy = parse_batch_policy(c);
  o.dataparallel.batch_size = std::max<std::uint32_t>(1, o.train.batch_size);
  o.dataparallel.max_worker_batch =
      static_cast<std::uint64_t>(std::max<std::int64_t>(0, c.get_int("server.max_worker_batch")));
  o.dataparallel.rebalance_every =
      static_cast<std::uint64_t>(std::max<std::int64_t>(1, c.get_int("server.rebalance_every")));
  o.metrics_file = c.get_string("server.metrics_file");
  o.tensorboard_dir = c.get_string("metrics.tensorboard_dir");
  o.http = parse_http_endpoint(c, o.node, o.transport.tls);
  o.aggregator = c.section("aggregator");
  o.aggregator_name = o.aggregator.get_string("name", "fedavg");
  o.optimizer = optimizer_options(c);
  o.optimizer_name = c.section("server_optimizer").get_string("name", "sgd");
  return o;
}

HttpEndpointOptions parse_http_endpoint(const Config& c, const NodeOptions& node,
                                        const TlsOptions& tls) {
  HttpEndpointOptions h;
  const std::string address = c.get_string("server.http");
  h.port_file = c.get_string("server.http_port_file");
  const auto linger = c.get_int("server.http_linger_ms");
  if (linger < 0) throw ConfigError("server.http_linger_ms must be >= 0");
  h.linger = std::chrono::milliseconds(linger);
  if (address == "off") return h;
  h.explicitly_set = !address.empty();
  if (!h.explicitly_set && node.index != 0) return h;
  h.enabled = true;
  h.http =
      observe::parse_http_address(h.explicitly_set ? address : "127.0.0.1:9100", "server.http");
  if (!observe::is_loopback(h.http.host)) {
    if (tls.insecure || tls.cert_file.empty() || tls.key_file.empty()) {
      throw ConfigError(
          "server.http = " + address +
          " is not a loopback address: it serves HTTPS with the shard's certificate, and this "
          "shard has none (tls.insecure, or no tls.cert_file/tls.key_file). Bind 127.0.0.1 and "
          "put a TLS reverse proxy in front (deploy/README.md)");
    }
    h.http.cert_file = tls.cert_file;
    h.http.key_file = tls.key_file;
  }
  return h;
}

RendezvousOptions rendezvous_options_from(const Config& c) {
  RendezvousOptions r;
  r.decentralized = c.section("decentralized");
  r.model_spec = c.get_string("model.spec");
  r.name = c.get_string("server.name").empty() ? "shard-0" : c.get_string("server.name");
  r.listen = c.get_string("server.listen");
  r.port_file = c.get_string("server.port_file");
  r.tls = tls_options(c);
  r.endpoint = shard_endpoint_options(c, r.name);
  r.heartbeat_ms = static_cast<std::uint32_t>(c.get_int("server.heartbeat_ms"));
  r.client_timeout = std::chrono::milliseconds(c.get_int("server.client_timeout_ms"));
  return r;
}

}  // namespace cohort::server
