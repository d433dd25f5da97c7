// Every plug-in registry, bundled: what main() builds, a plug-in's cohort_register() fills, and
// cohort::server::run() consumes.
#pragma once

#include "cohort/aggregation/aggregator.h"
#include "cohort/aggregation/client_selector.h"
#include "cohort/aggregation/compressor.h"
#include "cohort/aggregation/server_optimizer.h"

namespace cohort {

struct Registries {
  aggregation::AggregatorRegistry aggregators;
  aggregation::ServerOptimizerRegistry server_optimizers;
  aggregation::CompressorRegistry compressors;
  aggregation::ClientSelectorRegistry client_selectors;
};

// Registries holding every built-in rule.
Registries builtin_registries();

}  // namespace cohort
