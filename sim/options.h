// cohort-sim's options, shared by its two runners: the server keys it sets itself and the checks
// of the clients' keys. sim_config_schema() (cohort/sim/sim.h) is defined with them.
// Private to sim/.
#pragma once

#include <string_view>

#include "cohort/core/config.h"

namespace cohort::sim {

// Whether cohort-sim sets server key `key` itself for its shards (server.shard, server.listen,
// ..., tls.*): such keys are not in its schema.
bool set_by_sim(std::string_view key);

// The clients' keys, checked before any shard starts: an unknown train.* key or a bad value is a
// one-line error at start-up, not a failure after the virtual clients joined. Throws ConfigError.
void check_client_side(const Config& config);

}  // namespace cohort::sim
