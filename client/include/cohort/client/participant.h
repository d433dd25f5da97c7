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
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cohort/core/config.h"

namespace cohort::client {

// Every key cohort-client accepts, with defaults and help.
ConfigSchema participant_config_schema();

// Runs until the coordinator says training is finished (returns 0) or `stop` becomes true.
// Throws ConfigError / DataError for bad configuration or data before joining, TransportError
// if the coordinator cannot be reached within client.connect_timeout_ms.
int run_participant(const Config& config, const std::atomic<bool>& stop);

// The rows a data-parallel worker uses at `step`: epochs of `indices` shuffled by
// Rng::for_stream(seed, epoch), cut into floor(n / batch) batches (the remainder is dropped).
// Deterministic, so a single-process run can replay any worker's batches. REQUIRES batch >= 1.
std::vector<std::uint32_t> dataparallel_batch(std::span<const std::uint32_t> indices,
                                              std::size_t step, std::size_t batch,
                                              std::uint64_t seed);

}  // namespace cohort::client
