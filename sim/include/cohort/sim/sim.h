// cohort-sim: a whole federation in one process (see fleet.cc for the design), or, with
// --processes, the same configuration as real cohort-server / cohort-client processes.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cohort/aggregation/registries.h"
#include "cohort/client/local_training.h"
#include "cohort/core/config.h"

namespace cohort::sim {

// Every key of a simulation file: cohort-server's keys (server.*, model.*, [train], [aggregator],
// [server_optimizer], ...), the clients' data.*, the fleet's sim.* and the device profile.*.
ConfigSchema sim_config_schema();

struct Summary {
  std::uint64_t rounds = 0;          // rounds run (committed or not)
  std::uint64_t committed = 0;       // rounds with at least server.min_updates updates
  double sim_seconds = 0.0;          // simulated wall-clock time of the fleet
  double final_accuracy = -1.0;      // last evaluation (-1: none, or train.loss = mse)
  double final_loss = 0.0;           // last evaluation's test loss (mse: the mean squared error)
  bool regression = false;           // train.loss = mse: final_loss is the test MSE, no accuracy
  std::uint64_t bytes = 0;           // payload bytes of training rounds, as planned per client
  std::uint64_t bytes_measured = 0;  // the same as counted per virtual client from what it was
                                     // given and sent (a shared pull counts for each client that
                                     // used it; late clients cut short by the end excepted)
  double wall_seconds = 0.0;         // host time
  double train_wall_seconds = 0.0;   // host time spent in local training (summed over threads)
  double train_cpu_seconds = 0.0;    // CPU time of local training (summed over threads): the
                                     // compute itself, without time a thread was preempted
  double eval_cpu_seconds = 0.0;     // CPU time of test-set evaluations (summed over threads)
  double round_wall_seconds = 0.0;   // host time from the first round's start to the last's end
  double setup_seconds = 0.0;        // host time from the start (data, rows, memory plan,
                                     // shards, registration) to the first round's start
  std::size_t threads = 0;           // local-training threads
  // Clients whose memory budget (profile.memory) cannot train the model even in micro-batches
  // of one sample: they never registered, so they were never selected.
  std::size_t clients_unfit = 0;
  // Per virtual client (index = client): rounds it was selected for, and rounds whose shards
  // took its update (its participation; with train.* work a slow device may have none).
  std::vector<std::uint32_t> selections, participation;
};

// Runs the federation in-process until server.rounds rounds are committed or `stop` is set. The
// virtual clients train with train.rule, made from `rules` (ConfigError at start-up when it has
// no such rule).
// Throws ConfigError / DataError for bad settings or data, InternalError if a shard fails.
Summary run_in_process(
    const Config& config, const Registries& registries, const std::atomic<bool>& stop,
    const client::LocalTrainingRegistry& rules = client::builtin_local_training());

// Runs shards and sim.clients clients as processes on loopback (plaintext): the binaries
// cohort-server and cohort-client are looked up in `bin_dir`. Device profiles do not apply (real
// processes run in real time). Returns the coordinator's exit code.
// `client_plugins` are passed to every cohort-client as --plugin; `rules` (what they register,
// with the built-ins) must hold train.rule (ConfigError at start-up otherwise).
int run_processes(const Config& config, const std::filesystem::path& bin_dir,
                  const std::atomic<bool>& stop,
                  const std::vector<std::string>& client_plugins = {},
                  const client::LocalTrainingRegistry& rules = client::builtin_local_training());

// Draws accuracy and loss against rounds and simulated time from a sim CSV into a PNG with
// gnuplot. Throws ConfigError if gnuplot is not installed, DataError if it fails.
void plot(const std::filesystem::path& csv, const std::filesystem::path& png);

}  // namespace cohort::sim
