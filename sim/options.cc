// cohort-sim's configuration: its schema (the server's keys, the clients' data.*, the fleet's
// sim.* and the device profile.*), and the typed SimOptions filled and checked from it.
#include "options.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "cohort/aggregation/registries.h"
#include "cohort/client/idx.h"
#include "cohort/client/partition.h"
#include "cohort/client/trainer.h"
#include "cohort/core/error.h"
#include "cohort/server/server.h"
#include "cohort/sim/sim.h"

namespace cohort::sim {

using client::device_choice_from;
using client::kFashionMnistDir;
using client::parse_partition_spec;
using client::trainer_options_from;

bool set_by_sim(std::string_view key) {
  for (std::string_view k :
       {"server.shard", "server.listen", "server.coordinator", "server.advertise", "server.name",
        "server.port_file", "server.min_clients", "server.client_timeout_ms", "transport.aead"}) {
    if (key == k) return true;
  }
  return key.rfind("tls.", 0) == 0;
}

std::string server_tensorboard_dir(const Config& config) {
  const std::string dir = config.get_string("metrics.tensorboard_dir");
  return dir.empty() ? dir : (std::filesystem::path(dir) / "server").string();
}

namespace {

// The clients' keys, checked before any shard or client starts.
void check_client_side(const Config& config) {
  (void)trainer_options_from(config.section("train"));
  // The fleet trains on CPU threads of its own (sim.threads): a train.device or train.threads
  // would be ignored, so it is refused.
  const auto choice = device_choice_from(config.section("train"));
  if (choice.device != "cpu" || config.section("train").has("threads")) {
    throw ConfigError(
        "cohort-sim trains every virtual client on the CPU with one thread each: train.device "
        "and train.threads do not apply (set sim.threads for the number of training threads)");
  }
  if (trainer_options_from(config.section("train")).memory_budget > 0) {
    throw ConfigError(
        "cohort-sim gives each virtual client its own memory: set profile.memory (bytes, or a "
        "distribution) instead of train.memory_budget");
  }
  (void)parse_partition_spec(config.get_string("data.partition"), true);
  if (config.get_int("data.seed") < 0) throw ConfigError("data.seed must be >= 0");
  if (config.get_int("sim.clients") < 1) throw ConfigError("sim.clients must be at least 1");
  const auto threads = config.get_int("sim.threads");
  if (threads < 0 || threads > 1024) {
    throw ConfigError("sim.threads must be between 0 and 1024, got " + std::to_string(threads));
  }
}

// The in-process fleet's own refusals: per-client optimizer state, and the device profiles
// (parsed only without a trace, which overrides them).
void check_in_process(const Config& config, SimOptions& o) {
  if (!trainer_options_from(config.section("train")).reset_optimizer_state) {
    // Training threads are shared by all clients; per-client optimizer state is not kept.
    throw ConfigError(
        "the simulation keeps no optimizer state between a client's rounds: "
        "train.reset_optimizer_state = false is not simulated");
  }
  if (!o.profile.trace.empty()) return;
  ProfileSpec& p = o.profile.spec;
  p.gflops = parse_distribution(config.get_string("profile.gflops"), "profile.gflops");
  p.uplink_mbps =
      parse_distribution(config.get_string("profile.uplink_mbps"), "profile.uplink_mbps");
  p.downlink_mbps =
      parse_distribution(config.get_string("profile.downlink_mbps"), "profile.downlink_mbps");
  p.latency_ms = parse_distribution(config.get_string("profile.latency_ms"), "profile.latency_ms");
  parse_availability(config.get_string("profile.availability"), p);
  p.dropout = config.get_double("profile.dropout");
  if (!(p.dropout >= 0 && p.dropout <= 1)) throw ConfigError("profile.dropout must be in [0, 1]");
  const std::string memory = config.get_string("profile.memory");
  p.memory_bytes = memory == "0" ? Distribution{Distribution::Kind::kConst, 0.0, 0.0}
                                 : parse_distribution(memory, "profile.memory");
}

ServerKeys server_keys_from(const Config& config) {
  ServerKeys s;
  s.mode =
      config.get_string("server.mode") == "federated" ? ServerMode::kFederated : ServerMode::kOther;
  s.shards = static_cast<std::uint32_t>(std::max<std::int64_t>(1, config.get_int("server.shards")));
  s.clients_per_round = static_cast<std::size_t>(
      std::max<std::int64_t>(1, config.get_int("server.clients_per_round")));
  s.min_updates =
      static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.min_updates")));
  s.overselect = config.get_double("server.overselect");
  s.rounds = static_cast<std::uint64_t>(config.get_int("server.rounds"));
  s.round_deadline_s = static_cast<double>(config.get_int("server.round_deadline_ms")) / 1e3;
  s.chunk_bytes = static_cast<std::size_t>(config.get_int("transport.chunk_kib")) * 1024;
  s.deadline_work = server::config_schema().find("server.work") != nullptr &&
                    config.get_string("server.work") == "deadline";
  return s;
}

}  // namespace

SimOptions sim_options_from(const Config& config, Runner runner) {
  SimOptions o;
  o.server = server_keys_from(config);
  if (runner == Runner::kInProcess && o.server.mode != ServerMode::kFederated) {
    throw ConfigError("cohort-sim simulates federated rounds: server.mode must be \"federated\"");
  }
  check_client_side(config);
  o.clients = static_cast<std::size_t>(config.get_int("sim.clients"));
  o.threads = static_cast<std::size_t>(config.get_int("sim.threads"));
  o.seed = static_cast<std::uint64_t>(config.get_int("sim.seed"));
  o.wall_deadline_ms = config.get_int("sim.wall_deadline_ms");
  o.log_dir = config.get_string("sim.log_dir");
  o.data.dir = config.get_string("data.dir");
  o.data.source = client::data_options_from(config);
  // train.loss = mse reads the files' labels as float targets (IDX is refused when loading).
  o.data.source.targets =
      trainer_options_from(config.section("train")).loss == client::LossKind::kMse;
  for (const char* key : {"data.format", "data.train", "data.test", "data.train_labels",
                          "data.test_labels", "data.arrays", "data.test_arrays", "data.label",
                          "data.header", "data.delimiter", "data.shape", "data.scale"}) {
    if (config.is_set(key)) {
      o.data.source_settings.push_back(std::string(key) + "=" + config.get_string(key));
    }
  }
  o.data.partition_text = config.get_string("data.partition");
  o.data.partition = parse_partition_spec(o.data.partition_text, true);
  if (runner == Runner::kProcesses && o.data.partition.kind == client::PartitionKind::kSample) {
    throw ConfigError("data.partition = " + o.data.partition_text +
                      " is the in-process fleet's (clients share examples); --processes runs "
                      "real cohort-client processes, which each train on a part of their own");
  }
  o.data.seed = static_cast<std::uint64_t>(config.get_int("data.seed"));
  o.profile.trace = config.get_string("sim.profile_trace");
  o.report.metrics_file = config.get_string("sim.metrics_file");
  o.report.csv_file = config.get_string("sim.csv_file");
  if (const std::string tb = config.get_string("metrics.tensorboard_dir"); !tb.empty())
    o.report.tensorboard_dir = (std::filesystem::path(tb) / "sim").string();
  o.report.progress = config.get_bool("sim.progress");
  if (runner == Runner::kInProcess) {
    o.micro_batch_slowdown = config.get_double("sim.micro_batch_slowdown");
    if (!(o.micro_batch_slowdown == 0 || o.micro_batch_slowdown >= 1) ||
        !std::isfinite(o.micro_batch_slowdown)) {
      throw ConfigError(
          "sim.micro_batch_slowdown must be 0 (measure it) or a factor >= 1 (a micro-batched "
          "step is never faster than a whole one), got " +
          std::to_string(o.micro_batch_slowdown));
    }
    check_in_process(config, o);
  } else {
    constexpr std::size_t kMaxProcesses = 200;
    if (o.clients > kMaxProcesses) {
      throw ConfigError("--processes starts one process per client: sim.clients must be 1.." +
                        std::to_string(kMaxProcesses) + ", got " + std::to_string(o.clients));
    }
  }
  return o;
}

ConfigSchema sim_config_schema() {
  ConfigSchema s;
  const ConfigSchema server_schema = server::config_schema();
  for (const auto& o : server_schema.options()) {
    if (set_by_sim(o.key)) continue;
    std::string help = o.help;
    if (o.key == "server.mode") help = "federated (the only mode cohort-sim simulates)";
    if (o.key == "metrics.tensorboard_dir") {
      help =
          "folder for TensorBoard event files: the simulator's sim_round records as scalars "
          "in DIR/sim (train/loss, test/accuracy, round/sim_seconds, bytes/round, ...; step = "
          "round), the coordinator's round records in DIR/server (--processes: that one "
          "only); empty: none";
    }
    if (o.key == "server.round_deadline_ms") {
      help = "a round closes at this deadline, on the simulated clock (--processes: real time)";
    }
    s.add(o.key, o.default_value, help);
  }
  s.add_section("train",
                "client-side training options (epochs, batch_size, lr, momentum, optimizer, ...)")
      .add_section("aggregator", "aggregation rule: name = " +
                                     builtin_registries().aggregators.names() + ", and its options")
      .add_section("server_optimizer",
                   "server optimizer: name = " + builtin_registries().server_optimizers.names() +
                       ", and its options (lr: each one's own default)")
      .add("data.dir", std::string(kFashionMnistDir), "folder with the Fashion-MNIST IDX files")
      .add("data.partition", std::string("iid"),
           "iid | dirichlet:ALPHA | shards:S | quantity:BETA | sample:M (each client draws M "
           "examples of the whole set, so clients share examples and may outnumber them; "
           "in-process only)")
      .add("data.seed", std::int64_t{1}, "seed of the partition and of local shuffles")
      .add("sim.clients", std::int64_t{100}, "N: virtual clients, all registered before round 1")
      .add("sim.threads", std::int64_t{0}, "local-training threads (0: one per core)")
      .add("sim.seed", std::int64_t{1}, "seed of device profiles, availability and dropouts")
      .add("sim.wall_deadline_ms", std::int64_t{120000},
           "real-time deadline of the in-process coordinator: a round with a silent (offline or "
           "dropped-out) client and fewer than K updates waits this long; must exceed a round's "
           "host time (server.work = deadline plans work against server.round_deadline_ms, the "
           "simulated deadline)")
      .add("sim.metrics_file", std::string("sim_metrics.jsonl"),
           "per-round JSON lines (simulated and wall_* times)")
      .add("sim.csv_file", std::string("sim_metrics.csv"),
           "the same as CSV (--plot reads it); empty: none")
      .add("sim.progress", true, "live progress line on stderr")
      .add("sim.log_dir", std::string(""),
           "--processes: folder for the processes' logs and config (default: a new one under the "
           "temp dir)")
      .add("sim.profile_trace", std::string(""),
           "CSV of devices (gflops,uplink_mbps,downlink_mbps,latency_ms[,online_min,online_max,"
           "phase,dropout,memory]); client i gets row i mod rows; overrides profile.*")
      .add("sim.micro_batch_slowdown", 0.0,
           "compute-time factor of a client that trains in micro-batches under its memory "
           "budget (profile.memory); 0: measured once per micro-batch size on this host (whole "
           "vs. micro-batched steps, median of 3), which makes simulated times host-dependent; "
           "a factor >= 1 pins it for every micro-batched client (reproducible runs)")
      .add("profile.gflops", std::string("10"),
           "training speed, GFLOP/s: X | uniform:A:B | lognormal:MEDIAN:SIGMA")
      .add("profile.uplink_mbps", std::string("10"), "uplink, Mbit/s (same forms)")
      .add("profile.downlink_mbps", std::string("50"), "downlink, Mbit/s (same forms)")
      .add("profile.latency_ms", std::string("50"), "one-way latency, ms (same forms)")
      .add("profile.availability", std::string("always"),
           "always | diurnal:MIN:MAX (online probability over a simulated day)")
      .add("profile.dropout", 0.0,
           "probability that a selected client drops out of the round (silent)")
      .add("profile.memory", std::string("0"),
           "training memory budget, bytes (same forms; 0: unlimited): the client trains in "
           "micro-batches when its batch does not fit, and is never selected (not registered, "
           "counted as clients_unfit) when not even one sample fits");
  client::add_data_source_keys(s);
  return s;
}

}  // namespace cohort::sim
