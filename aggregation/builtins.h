// Registration functions of the built-in plug-ins, one per source file (private header).
// add_builtin_*() in registry.cc calls them; users call only the public add_builtin_*().
#pragma once

#include "cohort/aggregation/aggregator.h"
#include "cohort/aggregation/client_selector.h"
#include "cohort/aggregation/compressor.h"
#include "cohort/aggregation/server_optimizer.h"

namespace cohort::aggregation::detail {

void add_fedavg_aggregator(AggregatorRegistry& registry);
void add_median_aggregator(AggregatorRegistry& registry);
void add_trimmed_mean_aggregator(AggregatorRegistry& registry);
void add_krum_aggregators(AggregatorRegistry& registry);  // krum, multi_krum
void add_bulyan_aggregator(AggregatorRegistry& registry);
void add_norm_clip_aggregator(AggregatorRegistry& registry);

void add_fedopt_server_optimizers(
    ServerOptimizerRegistry& registry);  // fedadagrad, fedyogi, fedadam

void add_cast_compressors(CompressorRegistry& registry);  // none, fp16, bf16, int8
void add_qsgd_compressor(CompressorRegistry& registry);
void add_sparse_compressors(CompressorRegistry& registry);  // topk, randomk
void add_sign_compressor(CompressorRegistry& registry);
void add_powersgd_compressor(CompressorRegistry& registry);

// Reads the size_t option `name` (an int >= 0), or fallback when absent; ConfigError otherwise.
std::size_t get_count(const ConfigSection& options, std::string_view name, std::size_t fallback);

}  // namespace cohort::aggregation::detail
