// cohort-sim's options: the typed SimOptions the fleet, the reporter and both runners take, filled
// and checked from the simulation's Config in one place (sim_options_from), and the server keys
// it sets itself. sim_config_schema() (cohort/sim/sim.h) is defined with them. Private to sim/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cohort/client/data_source.h"
#include "cohort/client/partition.h"
#include "cohort/core/config.h"
#include "sim_clock.h"

namespace cohort::sim {

// Whether cohort-sim sets server key `key` itself for its shards (server.shard, server.listen,
// ..., tls.*, transport.aead: its endpoints are in-process): such keys are not in its schema.
bool set_by_sim(std::string_view key);

// Where the shards' coordinator writes its TensorBoard scalars: metrics.tensorboard_dir/server,
// beside the simulator's own in metrics.tensorboard_dir/sim (two runs in TensorBoard); empty
// when the key is.
std::string server_tensorboard_dir(const Config& config);

// Which runner the options are for: each checks what it needs, and only that (--processes has no
// device profiles, so it does not read profile.*).
enum class Runner { kInProcess, kProcesses };

// server.mode as far as cohort-sim decides on it: the in-process fleet simulates federated rounds
// only; --processes hands any mode to cohort-server, which checks it.
enum class ServerMode { kFederated, kOther };

// What the fleet and the runners need of the server's keys (the shards themselves get the keys
// as the file set them).
struct ServerKeys {
  ServerMode mode = ServerMode::kFederated;  // server.mode
  std::uint32_t shards = 1;                  // server.shards, at least 1
  std::size_t clients_per_round = 1;         // K: server.clients_per_round, at least 1
  std::size_t min_updates = 1;               // server.min_updates, at least 1
  double overselect = 1.0;                   // server.overselect
  std::uint64_t rounds = 0;                  // server.rounds
  double round_deadline_s = 60;              // server.round_deadline_ms, on the simulated clock
  std::size_t chunk_bytes = 0;               // transport.chunk_kib, in bytes
  // server.work = "deadline" (issue 23; false while the server has no such key): the coordinator
  // sizes each client's local steps to server.round_deadline_ms, so the in-process shards get
  // that deadline, not sim.wall_deadline_ms.
  bool deadline_work = false;
};

// data.*: the clients' data and how it is split among them.
struct DataOptions {
  std::string dir;                           // data.dir: the Fashion-MNIST IDX files
  client::DataOptions source;                // data.format, data.train, ... (client/data_source.h)
  std::vector<std::string> source_settings;  // those set, as KEY=VALUE (--processes forwards)
  std::string partition_text;                // data.partition as written (--processes forwards it)
  client::PartitionSpec partition;           // data.partition, parsed
  std::uint64_t seed = 1;                    // data.seed: partition, local shuffles, initial model
};

// The devices: a measured trace, or per-client draws from the profile.* distributions.
struct ProfileOptions {
  std::string trace;  // sim.profile_trace; empty: draw from `spec`
  ProfileSpec spec;   // profile.*: parsed (in-process runner) only when `trace` is empty
};

// sim.metrics_file, sim.csv_file, sim.progress, metrics.tensorboard_dir.
struct ReportOptions {
  std::string metrics_file;  // per-round JSON lines; empty: none
  // The sim_round records as TensorBoard scalars: metrics.tensorboard_dir/sim; empty: none.
  std::string tensorboard_dir;
  std::string csv_file;  // the same as CSV; empty: none
  bool progress = true;  // live progress line on stderr
};

struct SimOptions {
  std::size_t clients = 100;  // sim.clients, at least 1
  // sim.micro_batch_slowdown: compute-time factor of a client training in micro-batches under its
  // memory budget; 0: measured per micro-batch size on the host (memory_budgets.h).
  double micro_batch_slowdown = 0.0;
  std::size_t threads = 0;            // sim.threads: local-training threads (0: one per core)
  std::uint64_t seed = 1;             // sim.seed: profiles, availability, dropouts
  std::int64_t wall_deadline_ms = 0;  // sim.wall_deadline_ms: the shards' real-time deadline
  std::string log_dir;                // sim.log_dir (--processes; empty: a new temp folder)
  ServerKeys server;
  DataOptions data;
  ProfileOptions profile;
  ReportOptions report;
};

// Fills SimOptions from a Config of sim_config_schema() and checks it for `runner`, in this order:
// (in-process) server.mode is federated; the clients' keys (an unknown train.* key, a bad value,
// train.device or train.threads, data.partition, data.seed, sim.clients, sim.threads), so that
// a bad one is a one-line error at start-up, not a failure after the virtual clients joined;
// then (in-process) train.reset_optimizer_state and profile.*, sim.wall_deadline_ms not set
// with server.work = "deadline", (--processes) at most 200 clients.
// Throws ConfigError.
SimOptions sim_options_from(const Config& config, Runner runner);

}  // namespace cohort::sim
