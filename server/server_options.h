// The server's options as typed structs, filled from the Config once at the edge (run() in
// node.cc, or a unit test's fixture) by server_options_from(); the shard, its modes and the
// coordinator take these, never the Config. Filling checks nothing: validate() (options.cc) and
// run()'s own checks keep every start-up error where it was, and each value here is the one the
// key held, converted as its single reader did. Internal to the server library.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/core/config.h"
#include "cohort/observe/http_server.h"
#include "cohort/transport/endpoint.h"

#include "mode.h"

namespace cohort::server {

// server.selection: how the coordinator samples a federated round's cohort.
enum class Selection : std::uint8_t { kUniform, kWeighted, kSpeedAware };

// server.normalization: how a federated shard weighs updates of unequal local work.
// kNone: FedAvg's sample-weighted mean. kFedNova: FedNova's normalised averaging
// (docs/ALGORITHMS.md 1.7), each update divided by its Push.local_work a_i.
enum class Normalization : std::uint8_t { kNone, kFedNova };

// Who this process is in the federation, and where it listens and reports.
struct NodeOptions {
  std::uint32_t index = 0;                      // server.shard (0 also coordinates)
  std::uint32_t shards = 1;                     // server.shards
  std::string name;                             // server.name, or "shard-<index>" when empty
  std::string listen = "tcp://127.0.0.1:7000";  // server.listen
  std::string coordinator;                      // server.coordinator (shards > 0: shard 0's url)
  std::string advertise;                        // server.advertise (empty: the bound url)
  std::string port_file;                        // server.port_file (empty: none)
};

// tls.*: the endpoints' security.
struct TlsOptions {
  bool insecure = false;                     // tls.insecure
  std::string ca_file, cert_file, key_file;  // tls.ca_file, tls.cert_file, tls.key_file
  std::string coordinator_name = "shard-0";  // tls.coordinator_name
};

// The endpoints' security and framing.
struct TransportOptions {
  TlsOptions tls;
  std::size_t chunk_bytes = 1024 * 1024;  // transport.chunk_kib * 1024
  std::int64_t receive_queue = 0;         // transport.receive_queue (checked by run())
  // This node's endpoints start from these: transport's builder over tls.* and transport.*
  // (shard_endpoint_options in options.h: transport.aead included), node id = the node's name.
  transport::EndpointOptions endpoint;
};

struct ModelOptions {
  std::string spec = "mlp:784-256-128-10";  // model.spec
  std::uint64_t seed = 1;                   // model.seed: of the initial parameters
};

// The coordinator's rounds (FedBuff: steps), membership and selection.
struct RoundOptions {
  std::uint64_t rounds = 20;  // server.rounds (data-parallel: unused, one long task)
  // server.clients_per_round: K, the complete updates that close a federated round; in
  // data-parallel training the number of workers started.
  std::size_t clients_per_round = 10;
  double overselect = 1.0;                          // server.overselect
  Selection selection = Selection::kUniform;        // server.selection
  std::size_t min_clients = 1;                      // server.min_clients
  std::size_t min_updates = 1;                      // server.min_updates, at least 1
  std::uint64_t max_failed_rounds = 10;             // server.max_failed_rounds, at least 0
  std::chrono::milliseconds deadline{60000};        // server.round_deadline_ms
  std::uint64_t eval_every = 1;                     // server.eval_every, at least 0 (0: never)
  std::uint64_t seed = 1;                           // server.seed: of client selection
  std::uint32_t heartbeat_ms = 2000;                // server.heartbeat_ms (sent in the Welcome)
  std::chrono::milliseconds client_timeout{60000};  // server.client_timeout_ms
};

// server.work: how much local training a federated round asks of each selected client.
enum class WorkPolicy : std::uint8_t {
  kFixed,     // every client: train.epochs / train.steps (RoundStart.local_steps = train.steps)
  kDeadline,  // each client: the steps its measured profile fits into the deadline (profiles.h)
};

struct WorkOptions {
  WorkPolicy policy = WorkPolicy::kFixed;  // server.work
  std::uint32_t min_steps = 1;             // server.min_local_steps, at least 1
  std::uint32_t max_steps = 0;  // server.max_local_steps (0: profiles.h derived_max_steps)
  double margin = 0.2;          // server.deadline_margin, in [0, 1)
  // The deadline work is planned against, in seconds; 0: server.round_deadline_ms. cohort-sim
  // plans against its simulated deadline while its coordinator closes rounds on host time
  // (InProcessOverrides in server.h).
  double plan_deadline_s = 0;
};

struct FedBuffOptions {
  std::size_t buffer_size = 10;     // server.buffer_size (K), at least 1
  std::int64_t max_staleness = -1;  // server.max_staleness (< 0: no bound)
  std::size_t concurrency = 10;     // server.concurrency, at least 1
};

// server.batch_policy: how a BSP data-parallel step's global batch is split over the workers.
// kEqual: train.batch_size each, mean gradients summed. kSpeed: in proportion to each worker's
// measured speed, gradient sums weighed by batch (docs/ALGORITHMS.md 3.4).
enum class BatchPolicy : std::uint8_t { kEqual, kSpeed };

// Data-parallel training (the consistency model is Modes::consistency).
struct DataParallelOptions {
  std::uint64_t staleness = 2;  // server.staleness (SSP's bound), at least 0
  std::uint32_t steps = 100;    // server.steps each worker takes
  std::size_t workers = 10;     // server.clients_per_round, at least 1: a BSP step's pushes
  BatchPolicy batch_policy = BatchPolicy::kEqual;  // server.batch_policy (kSpeed: BSP only)
  std::uint64_t batch_size = 64;       // train.batch_size: B = workers x batch_size under kSpeed
  std::uint64_t max_worker_batch = 0;  // server.max_worker_batch (0: no cap)
  std::uint64_t rebalance_every = 50;  // server.rebalance_every, at least 1
};

struct CheckpointOptions {
  std::string dir;          // server.checkpoint_dir (empty: no checkpoints)
  std::uint64_t every = 1;  // server.checkpoint_every, at least 1
};

// Client-level differential privacy (dp.*).
struct DpOptions {
  double clip = 0;              // dp.clip (0: off)
  double noise_multiplier = 0;  // dp.noise_multiplier
  double delta = 1e-5;          // dp.delta
  std::uint64_t seed = 0;       // dp.seed (0: random)
};

// server.secure_aggregation and [secagg] (docs/ALGORITHMS.md 8.1, 8.2).
enum class SecAggKind : std::uint8_t { kNone, kSecAgg, kSecAggPlus };
struct SecAggOptions {
  SecAggKind kind = SecAggKind::kNone;
  std::chrono::milliseconds stage{30000};  // secagg.stage_ms
  double clip = 8.0;                       // secagg.clip: the fixed-point range c
  std::uint32_t levels = 1u << 22;         // secagg.levels: Q
  double threshold = 0.5;                  // secagg.threshold: the fraction of k
  std::uint32_t degree = 0;                // secagg.degree (0: the default rule)
};

// [train]: the clients' training options, forwarded to them as TOML, and the three the
// coordinator puts into each RoundStart.
struct TrainForward {
  std::string toml;  // the section as "name = value" lines (the Welcome's training_toml)
  std::uint32_t epochs = 1, steps = 0, batch_size = 64;
  // train.loss = mse: the clients' evaluations report the test MSE as their loss and no accuracy.
  bool regression = false;
};

// server.http*: the read-only HTTP endpoint (observe/).
struct HttpEndpointOptions {
  bool enabled = false;
  bool explicitly_set = false;  // server.http named an address: failing to bind it is an error
  observe::HttpOptions http;    // with the certificate and key for a non-loopback address
  std::string port_file;        // server.http_port_file
  std::chrono::milliseconds linger{0};   // server.http_linger_ms
  std::string source = "cohort-server";  // /api/v1/status's "source" (cohort-sim sets its own)
};

// server.http for shard `node.index`, checked. Throws ConfigError naming the key for a bad
// address, or for a non-loopback one without TLS.
HttpEndpointOptions parse_http_endpoint(const Config& config, const NodeOptions& node,
                                        const TlsOptions& tls);

struct ServerOptions {
  Modes modes;  // server.mode, server.consistency
  NodeOptions node;
  TransportOptions transport;
  ModelOptions model;
  RoundOptions round;
  WorkOptions work;
  FedBuffOptions fedbuff;
  DataParallelOptions dataparallel;
  CheckpointOptions checkpoint;
  DpOptions dp;
  SecAggOptions secagg;
  Normalization normalization = Normalization::kNone;  // server.normalization (federated only)
  TrainForward train;
  std::string metrics_file = "metrics.jsonl";  // server.metrics_file (shard 0)
  std::string tensorboard_dir;                 // metrics.tensorboard_dir (shard 0; empty: none)
  HttpEndpointOptions http;                    // server.http, server.http_port_file
  // The plug-in API: the registries' factories read these sections themselves.
  std::string aggregator_name = "fedavg";  // aggregator.name
  ConfigSection aggregator;                // [aggregator]
  std::string optimizer_name = "sgd";      // server_optimizer.name
  ConfigSection optimizer;                 // [server_optimizer] as optimizer_options() gives it
};

// The options of a federated, FedBuff or data-parallel server. Throws ConfigError only as
// parse_modes() and parse_normalization() do (server.mode = decentralized, an unknown
// server.consistency or server.normalization).
ServerOptions server_options_from(const Config& config);

// server.normalization as an enum. Throws ConfigError naming the key for a value it does not know.
Normalization parse_normalization(const Config& config);

// server.secure_aggregation and [secagg], checked. Throws ConfigError naming the key for a bad
// value.
SecAggOptions parse_secure_aggregation(const Config& config);

// server.batch_policy as an enum. Throws ConfigError naming the key for a value it does not know.
BatchPolicy parse_batch_policy(const Config& config);

// server.mode = decentralized: the rendezvous's options (rendezvous.h).
struct RendezvousOptions {
  // [decentralized]: parsed by aggregation::decentralized_settings_from() and sent to every
  // peer as TOML, so it stays a section.
  ConfigSection decentralized;
  std::string model_spec = "mlp:784-256-128-10";  // model.spec
  std::string name;                               // server.name, or "shard-0" when empty
  std::string listen = "tcp://127.0.0.1:7000";    // server.listen
  std::string port_file;                          // server.port_file (empty: none)
  TlsOptions tls;                                 // tls.* (coordinator_name unused)
  transport::EndpointOptions endpoint;            // its endpoint: transport's builder, as a shard's
  std::uint32_t heartbeat_ms = 2000;              // server.heartbeat_ms
  std::chrono::milliseconds client_timeout{60000};  // server.client_timeout_ms
};

// Fills RendezvousOptions; checks nothing (validate() and run_rendezvous() do).
RendezvousOptions rendezvous_options_from(const Config& config);

}  // namespace cohort::server
