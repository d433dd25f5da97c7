// Registration functions of the built-in rules and server optimizers, one per source file (private
// header). add_builtin_aggregators() in registry.cc calls them; users call only the public
// add_builtin_*().
#pragma once

#include "../registry_detail.h"
#include "cohort/aggregation/aggregator.h"
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

}  // namespace cohort::aggregation::detail
