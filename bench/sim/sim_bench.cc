// cohort-bench-sim: cohort-sim's scale and overhead, one JSON line per configuration.
//
// Each configuration runs in-process (the real shards on threads, the virtual clients behind
// multiplexed inproc:// sockets, training on a pool sized to the cores), in its own forked child,
// so that its peak RSS is its own:
//   {"bench":"sim","name":...,"clients":N,"selected_per_round":K,"rounds":R,"threads":T,
//    "sec_per_round":X,"peak_rss_mb":Y,"train_cpu_s_per_round":C,"overhead":O,...}
// "overhead" is the framework's share of the rounds' host time: 1 - (local-training and
// evaluation CPU time / threads) / (host time of the rounds). Training CPU time is thread CPU
// time, so a training thread preempted by the fleet or a shard does not count as training.
//
// Default runs (repository configurations, found from the source tree):
//   sim_10k_1000  examples/sim/sim_10k.toml with 1,000 of the 10,000 clients selected per round
//                 (800 updates needed: the over-selection absorbs its 2% dropouts)
//   sim_10k       examples/sim/sim_10k.toml as it is (100 updates per round from 120 selected)
//   overhead_100  examples/sim/overhead_100.toml (100 clients per round, 60 images, E = 5)
// --config FILE runs a file instead (repeatable); --set key=value applies to every run.
// --population 10000,100000,1000000 runs overhead_100 at each registered count instead, with
// data.partition = sample:60 (every client 60 images at any count: the same work per round), and
// ends with one line comparing each count with the first:
//   {"bench":"sim_population","clients":[...],"sec_per_round_vs_first":[...],
//    "rss_bytes_per_client_over_first":[...],"setup_s":[...],"overhead":[...]}
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/aggregation/registries.h"
#include "cohort/core/config.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/sim/sim.h"
#include "cohort/transport/allocator.h"

namespace {

namespace fs = std::filesystem;
namespace sim = cohort::sim;

struct Run {
  std::string name;
  fs::path file;
  std::vector<std::string> overrides;
};

std::atomic<bool> g_stop{false};

// Runs one configuration in this process and writes its JSON line to `json_fd`. Returns the exit
// code. The coordinator's per-round lines go to stdout; here they go to stderr.
int run_one(const Run& run, const std::vector<std::string>& common, std::int64_t rounds,
            int json_fd) {
  if (dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    throw cohort::InternalError("cannot redirect stdout");
  }
  const cohort::ConfigSchema schema = sim::sim_config_schema();
  std::vector<std::string> overrides = run.overrides;
  overrides.insert(overrides.end(), common.begin(), common.end());
  // Benchmarks write no metrics files unless asked to (--set sim.metrics_file=...).
  overrides.insert(overrides.begin(), {"sim.metrics_file=", "sim.csv_file=", "sim.progress=false"});
  // Every client runs train.epochs, as the peers' clients do (server.work = deadline would size
  // the work per client; --set server.work=deadline measures that instead).
  overrides.insert(overrides.begin(), "server.work=fixed");
  if (rounds > 0) overrides.push_back("server.rounds=" + std::to_string(rounds));
  cohort::Config config = cohort::Config::load(schema, run.file, overrides);
  const auto registries = cohort::builtin_registries();
  const sim::Summary s = sim::run_in_process(config, registries, g_stop);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double threads = static_cast<double>(std::max<std::size_t>(1, s.threads));
  const double compute = (s.train_cpu_seconds + s.eval_cpu_seconds) / threads;
  const double rounds_run = static_cast<double>(std::max<std::uint64_t>(1, s.rounds));
  const double k = static_cast<double>(config.get_int("server.clients_per_round"));
  nlohmann::json j{
      {"bench", "sim"},
      {"name", run.name},
      {"config", run.file.filename().string()},
      {"clients", config.get_int("sim.clients")},
      {"selected_per_round",
       static_cast<std::int64_t>(std::ceil(k * config.get_double("server.overselect")))},
      {"updates_per_round", config.get_int("server.clients_per_round")},
      {"rounds", s.rounds},
      {"threads", s.threads},
      {"sec_per_round", s.round_wall_seconds / rounds_run},
      {"wall_s", s.wall_seconds},
      {"setup_s", s.setup_seconds},
      {"peak_rss_mb", static_cast<double>(ru.ru_maxrss) / 1024.0},
      {"train_cpu_s_per_round", s.train_cpu_seconds / rounds_run},
      {"eval_cpu_s", s.eval_cpu_seconds},
      {"overhead",
       s.round_wall_seconds > 0 ? std::max(0.0, 1.0 - compute / s.round_wall_seconds) : 0.0},
      {"final_accuracy", s.final_accuracy},
      {"sim_seconds", s.sim_seconds}};
  std::fflush(stdout);
  const std::string line = j.dump() + "\n";
  if (write(json_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 1;
  close(json_fd);
  return s.committed >= s.rounds && s.rounds > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // As cohort-sim does (it measures cohort-sim's runs): large frames, see the header.
  cohort::transport::tune_allocator_for_large_messages();
  CLI::App app{
      "cohort-bench-sim: runs cohort-sim configurations in-process, each in its own child\n"
      "process, and prints one JSON line per run: seconds per round, peak RSS, and the\n"
      "framework's overhead (the rounds' host time less the local-training compute per\n"
      "thread, as a share of it). Without --config: sim_10k with 1,000 selected per round,\n"
      "sim_10k as it is, and overhead_100 (examples/sim)."};
  std::vector<std::string> configs, sets;
  std::int64_t rounds = 0;
  bool quick = false;
  std::string log_level = "warn";
  std::string examples = COHORT_SOURCE_DIR "/examples/sim";
  app.add_option("--config", configs, "a cohort-sim configuration file to run (repeatable)");
  app.add_option("--set", sets, "key=value applied to every run (repeatable)");
  app.add_option("--rounds", rounds, "override server.rounds of every run (0: the file's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--examples", examples, "folder of the default configurations")
      ->capture_default_str();
  app.add_flag("--quick", quick,
               "smoke run: overhead_100 with 100 clients, 10 per round, 3 rounds");
  std::vector<std::int64_t> population;
  app.add_option("--population", population,
                 "registered counts (e.g. 10000,100000,1000000): overhead_100 at each, with "
                 "data.partition = sample:60, then a line comparing each with the first")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    cohort::set_log_level(cohort::parse_log_level(log_level));
    std::vector<Run> runs;
    for (const auto& c : configs) runs.push_back({fs::path(c).stem().string(), c, {}});
    if (!population.empty() && (!runs.empty() || quick)) {
      throw cohort::ConfigError("--population runs overhead_100 alone: not with --config/--quick");
    }
    for (const auto n : population) {
      runs.push_back({"population_" + std::to_string(n),
                      fs::path(examples) / "overhead_100.toml",
                      {"sim.clients=" + std::to_string(n), "data.partition=sample:60"}});
    }
    if (runs.empty() && quick) {
      runs.push_back({"quick",
                      fs::path(examples) / "overhead_100.toml",
                      {"sim.clients=100", "server.clients_per_round=10", "server.min_updates=10",
                       "server.eval_every=0"}});
      if (rounds == 0) rounds = 3;
    } else if (runs.empty()) {
      runs.push_back(
          {"sim_10k_1000",
           fs::path(examples) / "sim_10k.toml",
           {"server.clients_per_round=800", "server.overselect=1.25", "server.min_updates=400"}});
      runs.push_back({"sim_10k", fs::path(examples) / "sim_10k.toml", {}});
      runs.push_back({"overhead_100", fs::path(examples) / "overhead_100.toml", {}});
    }
    for (const auto& r : runs) {
      if (!fs::exists(r.file)) throw cohort::ConfigError("no configuration " + r.file.string());
    }
    int failures = 0;
    std::vector<nlohmann::json> lines;
    for (const auto& r : runs) {
      std::fflush(stdout);
      int fds[2];
      if (pipe(fds) != 0) throw cohort::InternalError("pipe failed");
      const pid_t pid = fork();
      if (pid < 0) throw cohort::InternalError("fork failed");
      if (pid == 0) {
        close(fds[0]);
        int rc = 1;
        try {
          rc = run_one(r, sets, rounds, fds[1]);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "cohort-bench-sim: %s: %s\n", r.name.c_str(), e.what());
        }
        std::fflush(stdout);
        _exit(rc);
      }
      close(fds[1]);
      std::string line;
      char buf[4096];
      for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) != 0;) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) break;
        line.append(buf, static_cast<std::size_t>(got));
      }
      close(fds[0]);
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || line.empty()) {
        std::fprintf(stderr, "cohort-bench-sim: run %s failed\n", r.name.c_str());
        ++failures;
        continue;
      }
      std::fputs(line.c_str(), stdout);
      std::fflush(stdout);
      lines.push_back(nlohmann::json::parse(line));
    }
    if (!population.empty() && failures == 0 && !lines.empty()) {
      const auto& first = lines.front();
      nlohmann::json out{{"bench", "sim_population"}};
      for (const auto& j : lines) {
        const double extra_clients = j["clients"].get<double>() - first["clients"].get<double>();
        out["clients"].push_back(j["clients"]);
        out["sec_per_round"].push_back(j["sec_per_round"]);
        out["sec_per_round_vs_first"].push_back(j["sec_per_round"].get<double>() /
                                                first["sec_per_round"].get<double>());
        out["peak_rss_mb"].push_back(j["peak_rss_mb"]);
        out["rss_bytes_per_client_over_first"].push_back(
            extra_clients > 0
                ? (j["peak_rss_mb"].get<double>() - first["peak_rss_mb"].get<double>()) *
                      1048576.0 / extra_clients
                : 0.0);
        out["setup_s"].push_back(j["setup_s"]);
        out["overhead"].push_back(j["overhead"]);
      }
      std::printf("%s\n", out.dump().c_str());
    }
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-bench-sim: %s\n", e.what());
    return 1;
  }
}
