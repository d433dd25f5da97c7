// The shard's policy for each server.mode (docs/ALGORITHMS.md): one class per mode, each in its own
// file, made here. Each works on the ShardCore it is given, which must outlive it.
#pragma once

#include <memory>

#include "cohort/core/clock.h"

#include "../shard_core.h"

namespace cohort::server {

// Federated rounds: the coordinator's selection, streamed deltas into the aggregation rule, DP,
// FedNova's normalisation. REQUIRES for Normalization::kFedNova: the rule is fedavg (validate()
// refuses any other).
// `secure` (server.secure_aggregation): pushes are masked fixed-point inputs summed mod 2^32,
// unmasked at phase one with the coordinator's seeds (secagg_seeds()).
std::unique_ptr<ShardMode> make_federated_mode(ShardCore& core, const DpOptions& dp,
                                               Normalization normalization, bool secure);
// FedBuff: staleness-weighted deltas buffered until the coordinator steps every shard at K.
std::unique_ptr<ShardMode> make_fedbuff_mode(ShardCore& core, const FedBuffOptions& options);
// Data-parallel workers' gradients under BSP, ASP or SSP; under BSP with BatchPolicy::kSpeed,
// shard 0 times each worker's step with `clock` (which must outlive the mode) and sizes its batch.
std::unique_ptr<ShardMode> make_dataparallel_mode(ShardCore& core, Consistency consistency,
                                                  const DataParallelOptions& options,
                                                  const Clock& clock);

}  // namespace cohort::server
