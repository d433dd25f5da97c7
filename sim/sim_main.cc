// cohort-sim: simulates a federation of N virtual clients and its server shards in one process.
//
// How it works (details in fleet.cc):
//   - the shards are the real server (cohort::server::run on threads, inproc:// urls, one ZeroMQ
//     context), so rounds, selection, deadlines and FedAvg are exactly cohort-server's;
//   - the N clients are a fleet: one multiplexed socket per shard speaks for all of them (each
//     message names its virtual client as sender, replies name it as recipient), so 10,000
//     clients need 10,000 partitions and profiles, not 10,000 sockets; training runs on a thread
//     pool sized to the cores, with one model per thread and per client in flight;
//   - each client has a device profile (compute, links, latency, availability, dropout); a
//     virtual clock turns the bytes each client really moves and the training work it really
//     does into simulated time, decides stragglers and dropouts, and reports the simulated
//     wall-clock time of the fleet beside accuracy;
//   - rounds are reproducible: same config and seed, same metrics (except wall_* fields).
// --processes runs the same configuration as cohort-server / cohort-client processes instead.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cohort/aggregation/registries.h"
#include "cohort/core/cli.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/sim/sim.h"
#include "cohort/transport/allocator.h"

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }

std::filesystem::path own_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  return std::filesystem::path(buf).parent_path();
}
}  // namespace

int main(int argc, char** argv) {
  cohort::transport::tune_allocator_for_large_messages();  // large frames: see its header
  const cohort::ConfigSchema schema = cohort::sim::sim_config_schema();
  CLI::App app{
      "cohort-sim: simulates a federation in one process: the real server shards on\n"
      "threads and sim.clients virtual clients behind multiplexed inproc:// sockets,\n"
      "with device profiles (profile.*, or sim.profile_trace) driving a virtual clock.\n"
      "Prints a progress line, writes sim.metrics_file (JSON lines) and sim.csv_file;\n"
      "the coordinator's own per-round lines and server.metrics_file are cohort-server's.\n"
      "Ready configurations: examples/sim/*.toml."};
  cohort::ConfigFlags flags;
  flags.log_level = "warn";  // per-client registration lines would drown the progress line
  bool processes = false;
  std::string plot;
  std::vector<std::string> plugins;
  app.add_option("--plugin", plugins,
                 "load local training rules from this shared object (repeatable): it defines "
                 "cohort_plugin_abi() and cohort_register_client(); train.rule picks one by name "
                 "(with --processes every cohort-client loads it)");
  app.add_flag("--processes", processes,
               "run the configuration as cohort-server and cohort-client processes on loopback "
               "(plaintext, one process per client, at most 200; no device profiles)");
  app.add_option("--plot", plot,
                 "after the run, draw accuracy and loss against rounds and simulated time from "
                 "sim.csv_file into this PNG (needs gnuplot)");
  cohort::add_config_flags(app, flags, schema);
  CLI11_PARSE(app, argc, argv);
  try {
    cohort::Config config = cohort::finish_config(app, flags, schema);
    if (flags.print_config) {
      std::fputs(config.dump().c_str(), stdout);
      return 0;
    }
    if (!plot.empty() && config.get_string("sim.csv_file").empty()) {
      throw cohort::ConfigError("--plot reads sim.csv_file, which is empty");
    }
    if (!plot.empty() && processes) {
      throw cohort::ConfigError(
          "--plot draws the simulator's CSV; --processes writes none (see server.metrics_file)");
    }
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    auto rules = cohort::client::builtin_local_training();
    for (const std::string& plugin : plugins) cohort::client::load_client_plugin(plugin, rules);
    if (processes) return cohort::sim::run_processes(config, own_dir(), g_stop, plugins, rules);
    const auto registries = cohort::builtin_registries();
    const auto s = cohort::sim::run_in_process(config, registries, g_stop, rules);
    // train.loss = mse has no accuracy: the final test MSE instead.
    const std::string final_eval =
        s.regression ? "final test mse " + std::to_string(s.final_loss)
        : s.final_accuracy >= 0
            ? "final accuracy " + std::to_string(s.final_accuracy * 100).substr(0, 5) + "%"
            : "final accuracy -";
    std::printf(
        "cohort-sim: %llu rounds (%llu committed), simulated %.1f s (%.2f h), wall %.1f s, "
        "%s, %.2f GB moved\n",
        static_cast<unsigned long long>(s.rounds), static_cast<unsigned long long>(s.committed),
        s.sim_seconds, s.sim_seconds / 3600, s.wall_seconds, final_eval.c_str(),
        static_cast<double>(s.bytes) / 1e9);
    if (!s.participation.empty()) {
      const auto [lo, hi] = std::minmax_element(s.participation.begin(), s.participation.end());
      const auto never = std::count(s.participation.begin(), s.participation.end(), 0u);
      std::printf(
          "cohort-sim: participation: each client's update was taken in %u to %u rounds; %lld "
          "of %zu clients never contributed\n",
          *lo, *hi, static_cast<long long>(never), s.participation.size());
    }
    if (s.clients_unfit > 0) {
      std::printf(
          "cohort-sim: %zu of %zu clients could not train under their memory budget and were "
          "never selected\n",
          s.clients_unfit, s.participation.size());
    }
    if (s.round_wall_seconds > 0) {
      std::printf(
          "cohort-sim: rounds took %.1f s of host time, %.1f s of it local training summed over "
          "threads (%.1f s per thread)\n",
          s.round_wall_seconds, s.train_wall_seconds,
          s.train_wall_seconds / static_cast<double>(std::max<std::size_t>(1, s.threads)));
      // The framework's overhead: the rounds' host time less the local-training (and test-set
      // evaluation) compute each thread did, measured as thread CPU time, as a share of it.
      const double threads = static_cast<double>(std::max<std::size_t>(1, s.threads));
      const double compute = (s.train_cpu_seconds + s.eval_cpu_seconds) / threads;
      std::printf(
          "cohort-sim: compute %.2f s per thread (training %.2f s CPU, evaluation %.2f s CPU, "
          "summed); framework overhead %.1f%% of the rounds' host time\n",
          compute, s.train_cpu_seconds, s.eval_cpu_seconds,
          100.0 * std::max(0.0, 1.0 - compute / s.round_wall_seconds));
    }
    if (!plot.empty()) {
      cohort::sim::plot(config.get_string("sim.csv_file"), plot);
      std::printf("cohort-sim: wrote %s\n", plot.c_str());
    }
    return g_stop.load() ? 130 : 0;
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "cohort-sim: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-sim: unexpected error: %s\n", e.what());
    return 1;
  }
}
