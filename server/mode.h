// The server's training mode and data-parallel consistency model, read from the configuration
// once at the edge (server_options_from(), called by run()) and passed on as enums. Internal to
// the server library.
#pragma once

#include <cstdint>
#include <string_view>

#include "cohort/core/config.h"
#include "cohort/transport/messages.h"

namespace cohort::server {

// Data-parallel consistency (docs/ALGORITHMS.md section 3): bulk-synchronous, asynchronous, or
// stale synchronous with bound server.staleness.
enum class Consistency : std::uint8_t { kBsp, kAsp, kSsp };

struct Modes {
  // server.mode: federated (kFederated), fedbuff (kBuffered), dataparallel (kDataParallel).
  transport::TrainingMode mode = transport::TrainingMode::kFederated;
  Consistency consistency = Consistency::kBsp;  // server.consistency
};

// server.mode and server.consistency as enums. Throws ConfigError for a value it does not know
// (server.mode = decentralized never gets here: run() hands it to the rendezvous first).
Modes parse_modes(const Config& config);

// "bsp", "asp", "ssp": as the configuration spells them, for logs.
std::string_view consistency_name(Consistency c);

}  // namespace cohort::server
