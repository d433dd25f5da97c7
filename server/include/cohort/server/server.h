// The parameter server: one shard of the flat parameter vector per process, and on shard 0 the
// coordinator of the federation (membership, rounds, deadlines, evaluation, metrics).
//
// Embedding: a user's own program builds the registries (adding its own rules) and calls run():
//
//   auto registries = cohort::builtin_registries();
//   registries.aggregators.add("my_rule", [](const cohort::ConfigSection&) { ... });
//   auto config = cohort::Config::load(cohort::server::config_schema(), "server.toml");
//   return cohort::server::run(config, registries);
//
// Thread-safety: run() owns its sockets and threads; call it once per process (or per thread
// with distinct ports). Throws ConfigError for a bad configuration before anything starts.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "cohort/aggregation/registries.h"
#include "cohort/core/config.h"
#include "cohort/server/population.h"

namespace cohort::transport {
class Context;
}

namespace cohort::server {

// Every key cohort-server accepts, with defaults and help.
ConfigSchema config_schema();

// Runs this shard until the federation has finished its rounds (shard 0 then tells everyone to
// leave) or `stop` becomes true (SIGTERM: a final checkpoint is written). Returns the process
// exit code: 0 when training completed, 1 on a fatal error, 0 after a requested stop.
int run(const Config& config, const Registries& registries, const std::atomic<bool>& stop);

// The same inside a process that runs several shards and clients (cohort-sim): every shard and
// client shares the process's one ZeroMQ context, which inproc:// urls need. `ctx` must outlive
// the call.
int run(const Config& config, const Registries& registries, const std::atomic<bool>& stop,
        transport::Context& ctx);

// What cohort-sim changes in a shard it runs in its own process, past the keys the user sees.
struct InProcessOverrides {
  // > 0: server.work = deadline plans each client's work against this deadline (the simulated
  // one, on the virtual clock its clients report in) while rounds close at
  // server.round_deadline_ms of host time (sim.wall_deadline_ms).
  std::int64_t plan_deadline_ms = 0;
  // Set: shard 0's coordinator takes this population's first Register as the registration of
  // every present member (population.h), and refuses any other client.
  std::shared_ptr<const VirtualPopulation> population;
  // What the HTTP endpoint's /api/v1/status names as its source.
  std::string http_source = "cohort-server";
};
int run(const Config& config, const Registries& registries, const std::atomic<bool>& stop,
        transport::Context& ctx, const InProcessOverrides& overrides);

}  // namespace cohort::server
