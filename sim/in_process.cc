// cohort-sim in one process: the real server shards on threads (cohort::server::run with
// inproc:// urls, one ZeroMQ context) and the fleet (fleet.h) on the calling thread.
#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "cohort/client/trainer.h"
#include "cohort/core/error.h"
#include "cohort/server/server.h"
#include "cohort/sim/sim.h"
#include "cohort/transport/endpoint.h"
#include "fleet.h"
#include "options.h"

namespace cohort::sim {
namespace {

// The server's configuration for shard `index` of the simulation: the server's keys the
// simulation's file or flags set, forwarded, and those cohort-sim sets itself.
Config shard_config(const Config& sim, const SimOptions& options, std::size_t registrants,
                    std::uint32_t index, const std::vector<std::string>& urls) {
  const ConfigSchema schema = server::config_schema();
  Config c(schema);
  for (const auto& o : schema.options()) {
    // Only what the simulation's file or flags set: the server refuses a key its mode cannot
    // honour, and its defaults are the simulation's.
    if (set_by_sim(o.key) || !sim.is_set(o.key)) continue;
    c.set_value(o.key, [&]() -> Value {
      switch (o.type) {
        case ValueType::kBool: return sim.get_bool(o.key);
        case ValueType::kInt: return sim.get_int(o.key);
        case ValueType::kDouble: return sim.get_double(o.key);
        case ValueType::kString: return sim.get_string(o.key);
      }
      return sim.get_string(o.key);
    }());
  }
  for (const char* section : {"train", "aggregator", "server_optimizer"}) {
    const auto s = sim.section(section);
    for (const auto& name : s.names())
      c.set(std::string(section) + "." + name, s.get_string(name, ""));
  }
  c.set_value("server.shard", std::int64_t{index});
  c.set_value("server.listen", urls[index]);
  c.set_value("server.advertise", urls[index]);
  c.set_value("server.coordinator", index == 0 ? std::string() : urls[0]);
  c.set_value("server.name", "shard-" + std::to_string(index));
  c.set_value("server.port_file", std::string());
  // Every client that can train registers before round 1; the others never do (memory_budgets.h).
  c.set_value("server.min_clients", static_cast<std::int64_t>(registrants));
  // The shards close rounds on host time (sim.wall_deadline_ms) while the fleet plans them on the
  // simulated clock (server.round_deadline_ms). A coordinator that sizes each client's work to
  // the round's deadline (server.work = "deadline") plans against the simulated deadline, with
  // the virtual throughput and link times the clients report: run_in_process() passes it in
  // InProcessOverrides.
  c.set_value("server.round_deadline_ms", options.wall_deadline_ms);
  c.set_value("server.client_timeout_ms", std::int64_t{1} << 40);  // virtual clients never time out
  c.set_value("tls.insecure", true);
  if (index != 0) c.set_value("server.metrics_file", std::string());
  // The HTTP endpoint (server.http) is shard 0's only: every shard of the run shares the config.
  if (index != 0) c.set_value("server.http", std::string("off"));
  c.set_value("metrics.tensorboard_dir", index == 0 ? server_tensorboard_dir(sim) : std::string());
  return c;
}

std::string sim_url(std::uint64_t run, std::uint32_t shard) {
  return "inproc://cohort-sim-" + std::to_string(run) + "-shard-" + std::to_string(shard);
}

}  // namespace

Summary run_in_process(const Config& config, const Registries& registries,
                       const std::atomic<bool>& stop, const client::LocalTrainingRegistry& rules) {
  const auto began = Clock::now();
  const SimOptions options = sim_options_from(config, Runner::kInProcess);
  rules.check(client::trainer_options_from(config.section("train")).rule);
  // Planned before any shard starts: it refuses a fleet that cannot train at all, and the
  // coordinator must wait for the clients that can, only.
  FleetMemory memory = plan_fleet_memory(config, options);
  const std::size_t registrants = options.clients - memory.unfit();
  const std::uint32_t shards = options.server.shards;
  static std::atomic<std::uint64_t> runs{0};
  const std::uint64_t run = ++runs;
  std::vector<std::string> urls;
  for (std::uint32_t i = 0; i < shards; ++i) urls.push_back(sim_url(run, i));
  std::vector<Config> shard_configs;
  for (std::uint32_t i = 0; i < shards; ++i)
    shard_configs.push_back(shard_config(config, options, registrants, i, urls));

  transport::Context ctx;
  std::atomic<bool> stop_shards{false};
  std::vector<std::atomic<bool>> finished(shards);
  std::vector<std::exception_ptr> errors(shards);
  std::mutex errors_mu;
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  // The fleet loads the data and makes the clients' rows before any shard starts: the
  // coordinator admits its population in bulk (population.h), and reads it on its own thread.
  const double planning_s = std::chrono::duration<double>(Clock::now() - began).count();
  std::optional<Fleet> fleet;
  fleet.emplace(
      options, ctx, urls, stop, [&] { return failed.load(); }, rules, std::move(memory));
  const server::InProcessOverrides overrides{
      .plan_deadline_ms =
          options.server.deadline_work ? config.get_int("server.round_deadline_ms") : 0,
      .population = fleet->prepare(),
      .http_source = "cohort-sim"};
  for (std::uint32_t i = 0; i < shards; ++i) {
    threads.emplace_back([&, i] {
      try {
        server::run(shard_configs[i], registries, stop_shards, ctx, overrides);
      } catch (...) {
        std::lock_guard lock(errors_mu);
        errors[i] = std::current_exception();
        failed = true;
      }
      finished[i] = true;
    });
  }
  auto all_finished = [&] {
    return std::all_of(finished.begin(), finished.end(), [](const auto& f) { return f.load(); });
  };
  Summary summary;
  std::exception_ptr fleet_error;
  {
    try {
      summary = fleet->run();
      summary.setup_seconds += planning_s;  // the memory plan, before the fleet existed
      if (!stop.load()) fleet->drain_until(all_finished);
    } catch (...) {
      fleet_error = std::current_exception();
    }
    stop_shards = true;
    for (auto& t : threads) t.join();
    fleet.reset();  // the fleet's sockets close before the context
  }
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  if (fleet_error) std::rethrow_exception(fleet_error);
  return summary;
}

}  // namespace cohort::sim
