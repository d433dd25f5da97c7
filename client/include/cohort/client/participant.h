// A federated client: registers with the coordinator, and for every round it is selected for
// pulls the model from all shards, trains locally, pushes its delta to every shard and reports.
//
// The delta is clipped for client-level DP (client.dp_clip), optionally turned into an attack for
// experiments (client.attack), and encoded per shard range by the configured compressor
// (compressor.name and its options, from cohort::builtin_registries(); aggregation/push_codec.h
// for the wire form), with one encoder per shard range kept across rounds so that error feedback
// carries over. compressor.name = "none" pushes plain fp32.
//
// Reconnects on its own: the transport re-handshakes with a restarted peer, and requests that
// time out (a shard restarting) are retried with exponential backoff until the round's deadline.
// Not thread-safe: run() drives everything from the calling thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cohort/client/client_work.h"
#include "cohort/client/data_source.h"
#include "cohort/client/local_training.h"
#include "cohort/client/partition.h"
#include "cohort/core/config.h"
#include "cohort/transport/endpoint.h"

namespace cohort::client {

// Every key cohort-client accepts, with defaults and help.
ConfigSchema participant_config_schema();

// What a federated participant runs with: filled from the Config (and checked) only by
// participant_options_from(); the participant never reads the Config.
struct ParticipantOptions {
  std::string server;            // client.server: the coordinator's url (shard 0)
  std::string name;              // client.name: our node id
  std::string coordinator_name;  // tls.coordinator_name (named when its handshake fails)
  // The coordinator's connection (tls.*, transport.*; expected_peer = coordinator_name). A
  // shard's connection is a copy whose expected_peer is that shard's node id.
  transport::EndpointOptions endpoint;
  std::string device = "cpu";  // client.device; made (and so checked) by the participant
  std::size_t threads = 1;     // client.threads
  // client.memory_budget: this device's training memory budget in bytes (0: none). The tighter
  // of it and the coordinator's train.memory_budget applies.
  std::size_t memory_budget = 0;
  std::chrono::milliseconds connect_timeout{120000};
  std::chrono::milliseconds backoff_max{5000};
  std::chrono::milliseconds step_delay{0};  // data-parallel straggler emulation
  DataOptions data;  // data.format, data.dir, data.train, ... (data_source.h)
  PartitionSpec partition;
  std::size_t part_index = 0;  // data.part = part_index/part_count
  std::size_t part_count = 1;
  std::uint64_t data_seed = 1;
  // [compressor]: handed as is to the compressor registry (its factories check their keys).
  ConfigSection compressor;
  double dp_clip = 0;       // 0: off
  bool sign_flip = false;   // client.attack = sign_flip (experiments only)
  double attack_scale = 1;  // > 0
};

// Reads and checks every key the participant uses (ConfigError naming the key otherwise), so a bad
// option never costs a round nor leaves a dead entry in the coordinator's pool.
ParticipantOptions participant_options_from(const Config& config);

// Runs until the coordinator says training is finished (returns 0) or `stop` becomes true. Each
// round trains with the rule the coordinator's train.rule names, made from `rules` (built-ins and
// what plug-ins added; a name it lacks stops the client when it joins).
// Throws ConfigError / DataError for a bad device, compressor or data before joining,
// TransportError if the coordinator cannot be reached within options.connect_timeout.
int run_participant(const ParticipantOptions& options, const std::atomic<bool>& stop,
                    const LocalTrainingRegistry& rules = builtin_local_training());

// How run_participant(options, work, stop) ended: code 0 (training finished, or stopped), or 1
// with `failure` saying why (the coordinator was lost, or it stopped training as failed).
struct ParticipantExit {
  int code = 0;
  std::string failure;
};

// The same protocol with someone else's data and training (client_work.h): options.data,
// partition, device, threads and memory_budget are the work's business and not read here;
// data_seed and part_index still seed the round's shuffles and the compressor. Throws as above,
// and whatever the work throws (after telling the coordinator this client stopped).
ParticipantExit run_participant(const ParticipantOptions& options, ClientWork& work,
                                const std::atomic<bool>& stop);

// The rows a data-parallel worker uses at `step`: epochs of `indices` shuffled by
// Rng::for_stream(seed, epoch), cut into floor(n / batch) batches (the remainder is dropped).
// Deterministic, so a single-process run can replay any worker's batches. REQUIRES batch >= 1.
std::vector<std::uint32_t> dataparallel_batch(std::span<const std::uint32_t> indices,
                                              std::size_t step, std::size_t batch,
                                              std::uint64_t seed);

// The rows a data-parallel worker uses under speed batches, whose size changes between steps:
// rows [first, first + count) of one stream of epochs, epoch e being `indices` shuffled by
// Rng::for_stream(seed, e) (as dataparallel_batch's, nothing dropped: a batch may span two
// epochs). Deterministic, for the same replay. Empty when indices is.
std::vector<std::uint32_t> dataparallel_rows(std::span<const std::uint32_t> indices,
                                             std::uint64_t first, std::size_t count,
                                             std::uint64_t seed);

}  // namespace cohort::client
