// cohort-server's options at the edge: the schema, the start-up check of every key and value
// (mode-specific keys refused in the other modes), and the server optimizer's options as a shard
// reads them. Internal to the server library.
#pragma once

#include "cohort/aggregation/registries.h"
#include "cohort/core/config.h"

namespace cohort::server {

// Checks every key and value that run() and the clients will read, before anything starts, so a
// bad option fails at start-up with one line instead of after clients joined. Throws ConfigError.
void validate(const Config& config, const Registries& registries);

// [server_optimizer] as a shard's optimizer reads it (data-parallel: the gradient rate when
// server_optimizer.lr is not set).
ConfigSection optimizer_options(const Config& config);

}  // namespace cohort::server
