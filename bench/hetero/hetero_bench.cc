// cohort-bench-hetero: heterogeneity-aware work (issue 23) on cohort-sim's virtual clock, one
// JSON line per run:
//   {"bench":"hetero","setting":S,"policy":"fixed|deadline","rounds_to_target":R,
//    "time_to_target_s":T,"final_accuracy":A,"participation_min":P, ...}
// R is the first round whose test accuracy reaches --target and T the simulated seconds at its end
// (both null when the run never reaches it); A is the last evaluation's accuracy; P the fewest
// rounds any client's update was taken in (0: some device never contributed). Extra fields:
// participation_min_20 (the same over the first 20 rounds, from the coordinator's "client"
// records), time_vs_fixed (deadline lines: T over fixed's T for the same setting, when both reach
// the target), rounds (200 unless --rounds), clients, sim_seconds, never_participated,
// local_steps_mean (mean over rounds of the mean local steps of the updates taken), target.
//
// Data-parallel (setting dp_bsp_slow4x, with --dp or alone with --settings dp_bsp_slow4x): a real
// cohort-server under BSP and three cohort-client workers on loopback (plaintext), each held by
// a cgroup to a CPU share, one worker to a quarter of the others' (root only; elsewhere an
// "unavailable" line), once with server.batch_policy = equal and once with speed. Its lines:
//   {"bench":"hetero","setting":"dp_bsp_slow4x","policy":"equal|speed","steps":S,
//    "steps_per_s":X,"samples_per_s":Y,"final_train_loss":L,"final_accuracy":A,
//    "participation_min":S,"last_batches":{...},"speedup_vs_equal":Z (speed only)}
// Both runs take the same S steps of the same global batch, so the loss per sample seen compares
// directly (final_train_loss, final_accuracy).
//
// Each run is the cohort-sim binary (next to this one, or --bin) on an example configuration,
// with --server.work=POLICY, its sim_round and sim_summary records read back from a temporary
// sim.metrics_file. Settings (examples/sim):
//   compute_mlp     hetero_compute_mlp.toml     10x compute spread, MLP, Dirichlet 0.5
//   compute_lenet5  hetero_compute_lenet5.toml  the same with LeNet-5
//   link_mlp        hetero_link_mlp.toml        10x link spread, MLP
//   link_lenet5     hetero_link_lenet5.toml     the same with LeNet-5
// A policy this build's cohort-sim refuses (no server.work key yet, or not this value) gives a
// line {"bench":"hetero","setting":S,"policy":P,"error":"...","unavailable":true} and no numbers;
// the exit code is still 0 unless --strict. Any other failed run is an "error" line and exit 1.
// Without a server.work key at all, "fixed" runs the file as it is (fixed work is then the only
// behaviour) and says so ("server_work_key":false). Other server keys go through --set, e.g.
// --set server.normalization=fednova (FedNova's averaging of unequal work, for both policies).
//
//   cohort-bench-hetero                                  all four settings, both policies
//   cohort-bench-hetero --settings compute_mlp,compute_lenet5 --set server.normalization=fednova
//   cohort-bench-hetero --quick                          smoke run (CTest bench_hetero_smoke)
//   cohort-bench-hetero --settings dp_bsp_slow4x         the data-parallel pair alone (root)
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpu_limit.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Line = nlohmann::ordered_json;  // fields in the order the header lists them

struct Setting {
  std::string name;
  std::string file;
};

const std::vector<Setting> kSettings{{"compute_mlp", "hetero_compute_mlp.toml"},
                                     {"compute_lenet5", "hetero_compute_lenet5.toml"},
                                     {"link_mlp", "hetero_link_mlp.toml"},
                                     {"link_lenet5", "hetero_link_lenet5.toml"}};

fs::path own_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  return fs::path(buf).parent_path();
}

struct Outcome {
  int rc = -1;
  std::string message;  // the last line cohort-sim wrote to stderr that names itself
};

// Runs `args` (argv[0] is the binary), stdout discarded, stderr to `err_file`.
// Starts `args` (argv[0] the binary) with stdout to `out` and stderr to `err` (/dev/null when
// empty); its pid, or -1.
pid_t start_process(const std::vector<std::string>& args, const fs::path& out,
                    const fs::path& err) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int out_fd =
      open(out.empty() ? "/dev/null" : out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err_fd = out == err ? out_fd : open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out_fd < 0 || err_fd < 0) _exit(127);
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  _exit(127);
}

Outcome run_process(const std::vector<std::string>& args, const fs::path& err_file) {
  const pid_t pid = start_process(args, "", err_file);
  if (pid < 0) return {-1, "fork failed"};
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  Outcome out;
  out.rc =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  std::ifstream in(err_file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cohort-sim: ", 0) == 0) out.message = line;
  }
  if (out.rc == 127 && out.message.empty()) out.message = "cannot run " + args[0];
  if (out.rc != 0 && out.message.empty()) out.message = "exit status " + std::to_string(out.rc);
  return out;
}

std::vector<json> read_records(const fs::path& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

// The fewest rounds among the first `first` in which a client's update counted, over all
// `clients` clients, from the coordinator's "client" records (a client never selected: 0).
std::uint64_t participation_min_within(const std::vector<json>& server_records,
                                       std::uint64_t clients, std::uint64_t first) {
  std::map<std::string, std::uint64_t> counted;
  for (const auto& r : server_records) {
    if (r.value("event", "") != "client") continue;
    if (r["round_id"].get<std::uint64_t>() > first || !r["trained"].get<bool>()) continue;
    ++counted[r["client"].get<std::string>()];
  }
  if (counted.size() < clients) return 0;
  std::uint64_t fewest = UINT64_MAX;
  for (const auto& [client, n] : counted) fewest = std::min(fewest, n);
  return fewest;
}

// The JSON line of a finished run, from its metrics file; throws if the file lacks a record.
Line result_line(const std::vector<json>& records, double target) {
  Line rounds_to = nullptr, time_to = nullptr;
  double final_accuracy = -1, steps_sum = 0;
  std::uint64_t rounds = 0, stepped_rounds = 0;
  const json* summary = nullptr;
  for (const auto& r : records) {
    const std::string event = r.value("event", "");
    if (event == "sim_summary") summary = &r;
    if (event != "sim_round") continue;
    ++rounds;
    if (r.contains("local_steps_mean")) {
      steps_sum += r["local_steps_mean"].get<double>();
      ++stepped_rounds;
    }
    if (!r.contains("test_accuracy")) continue;
    final_accuracy = r["test_accuracy"].get<double>();
    if (rounds_to.is_null() && final_accuracy >= target) {
      rounds_to = r["round"];
      time_to = r["sim_seconds"];
    }
  }
  if (summary == nullptr) throw std::runtime_error("the metrics file has no sim_summary record");
  Line j;
  j["rounds_to_target"] = rounds_to;
  j["time_to_target_s"] = time_to;
  j["final_accuracy"] = final_accuracy >= 0 ? Line(final_accuracy) : Line(nullptr);
  j["participation_min"] = (*summary)["participation_min"];
  j["never_participated"] = (*summary)["never_participated"];
  j["clients"] = (*summary)["clients"];
  j["rounds"] = rounds;
  j["sim_seconds"] = (*summary)["sim_seconds"];
  j["local_steps_mean"] =
      stepped_rounds > 0 ? Line(steps_sum / static_cast<double>(stepped_rounds)) : Line(nullptr);
  j["target"] = target;
  return j;
}

// ---- data-parallel BSP with one worker slower: real processes --------------------------------

constexpr const char* kDpSetting = "dp_bsp_slow4x";

// Waits up to `seconds` for `pid`; its exit status, or -1 when it was still running (then killed).
int finish_process(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    usleep(50000);
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  return -1;
}

std::string read_port(const fs::path& file) {
  for (int i = 0; i < 400; ++i) {
    std::ifstream in(file);
    std::string port;
    if (std::getline(in, port) && !port.empty()) return port;
    usleep(50000);
  }
  return "";
}

struct DpOptions {
  int steps = 60, batch = 256;
  std::string model = "mlp:784-256-128-10";
  double fast_cpus = 0.5, slow_cpus = 0.125;  // the slow worker's share: a quarter
};

// One BSP run under `policy`: its line, or an "error" line. The workers' CPU groups are made here
// and removed when it returns.
Line run_dataparallel(const std::string& bin_dir, const std::string& policy, const DpOptions& o,
                      const fs::path& dir, bool& failed) {
  Line line{{"bench", "hetero"}, {"setting", kDpSetting}, {"policy", policy}};
  std::string why;
  std::vector<std::unique_ptr<cohort::test::CpuLimit>> groups;
  for (int i = 0; i < 3; ++i) {
    groups.push_back(cohort::test::CpuLimit::make(i == 2 ? o.slow_cpus : o.fast_cpus, why,
                                                  "-" + std::to_string(i)));
    if (!groups.back()) {
      line["error"] = "cannot hold the workers to CPU shares: " + why;
      line["unavailable"] = true;
      return line;
    }
  }
  const fs::path metrics = dir / ("dp_" + policy + ".jsonl");
  const fs::path port = dir / ("dp_" + policy + ".port");
  fs::remove(metrics);
  fs::remove(port);
  std::vector<std::string> server{bin_dir + "/cohort-server",
                                  "--insecure",
                                  "--listen",
                                  "tcp://127.0.0.1:*",
                                  "--port-file",
                                  port.string(),
                                  "--server.metrics_file=" + metrics.string(),
                                  "--server.mode=dataparallel",
                                  "--server.consistency=bsp",
                                  "--server.batch_policy=" + policy,
                                  "--server.steps=" + std::to_string(o.steps),
                                  "--server.clients_per_round=3",
                                  "--server.min_clients=3",
                                  "--train.batch_size=" + std::to_string(o.batch),
                                  "--model.spec=" + o.model,
                                  "--log-level",
                                  "warn"};
  if (policy == "speed") server.push_back("--server.rebalance_every=20");
  const fs::path server_log = dir / ("dp_" + policy + "_server.log");
  const pid_t server_pid = start_process(server, server_log, server_log);
  const std::string p = read_port(port);
  std::vector<pid_t> workers;
  if (!p.empty()) {
    for (int i = 0; i < 3; ++i) {
      const fs::path log = dir / ("dp_" + policy + "_worker" + std::to_string(i) + ".log");
      const pid_t w = start_process(
          {bin_dir + "/cohort-client", "--insecure", "--server", "tcp://127.0.0.1:" + p, "--name",
           "worker-" + std::to_string(i), "--data", "iid", "--part", std::to_string(i) + "/3",
           "--client.threads=1", "--log-level", "warn"},
          log, log);
      workers.push_back(w);
      if (w > 0) (void)groups[static_cast<std::size_t>(i)]->add(w);
    }
  }
  const int server_rc = p.empty() ? finish_process(server_pid, 0) : finish_process(server_pid, 600);
  int worker_failures = 0;
  for (const pid_t w : workers) worker_failures += finish_process(w, 30) == 0 ? 0 : 1;
  if (p.empty() || server_rc != 0 || worker_failures > 0) {
    line["error"] = p.empty()        ? "cohort-server did not start"
                    : server_rc != 0 ? "cohort-server exited with " + std::to_string(server_rc)
                                     : std::to_string(worker_failures) + " worker(s) failed";
    line["logs"] = dir.string();
    failed = true;
    return line;
  }
  const auto records = read_records(metrics);
  double seconds = 0;
  std::optional<double> loss, accuracy;
  Line last_batches = Line::object();
  for (const auto& r : records) {
    const std::string event = r.value("event", "");
    if (event == "round") {
      seconds = r["round_seconds"].get<double>();
      loss = r["train_loss"].get<double>();
      if (r.contains("test_accuracy")) accuracy = r["test_accuracy"].get<double>();
    } else if (event == "dp_pull" && r["clock"].get<int>() == o.steps - 1) {
      last_batches[r["worker"].get<std::string>()] = r["batch"];
    }
  }
  if (seconds <= 0) {
    line["error"] = "no round record in " + metrics.string();
    failed = true;
    return line;
  }
  line["steps"] = o.steps;
  line["steps_per_s"] = o.steps / seconds;
  line["samples_per_s"] = static_cast<double>(o.steps) * 3 * o.batch / seconds;
  line["final_train_loss"] = loss ? Line(*loss) : Line(nullptr);
  line["final_accuracy"] = accuracy ? Line(*accuracy) : Line(nullptr);
  line["participation_min"] = o.steps;  // under BSP every worker takes part in every step
  line["last_batches"] = last_batches;
  line["cpu_shares"] = {o.fast_cpus, o.fast_cpus, o.slow_cpus};
  line["model"] = o.model;
  line["global_batch"] = 3 * o.batch;
  line["transport"] = "plain";
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "cohort-bench-hetero: runs cohort-sim on the heterogeneous fleets of examples/sim\n"
      "(10x compute spread, 10x link spread; MLP and LeNet-5; Dirichlet 0.5) under each work\n"
      "policy (--server.work=fixed|deadline) and prints one JSON line per run: rounds and\n"
      "simulated seconds to the target accuracy, final accuracy, and the fewest rounds any\n"
      "client contributed to. A policy cohort-sim refuses is an error line, never a number."};
  std::vector<std::string> settings, policies{"fixed", "deadline"}, sets;
  double target = 0.85;
  std::int64_t rounds = 200;
  bool quick = false, strict = false;
  std::string examples = COHORT_SOURCE_DIR "/examples/sim";
  std::string bin = (own_dir() / "cohort-sim").string();
  std::string keep;
  app.add_option("--settings", settings,
                 "compute_mlp, compute_lenet5, link_mlp, link_lenet5, dp_bsp_slow4x (default: all)")
      ->delimiter(',');
  app.add_option("--policies", policies, "work policies to run")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--target", target, "test accuracy to reach")->capture_default_str();
  app.add_option("--rounds", rounds,
                 "server.rounds of every run (0: the file's, 100; fixed work needs more than 100 "
                 "rounds to reach 85% on compute_mlp)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--set", sets, "key=value passed to every run (repeatable)");
  app.add_option("--examples", examples, "folder of the configurations")->capture_default_str();
  app.add_option("--bin", bin, "the cohort-sim binary")->capture_default_str();
  app.add_option("--keep", keep, "keep each run's metrics file and log in this folder");
  DpOptions dp_options;
  app.add_option("--dp-steps", dp_options.steps, "dp_bsp_slow4x: BSP steps per run")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_flag("--quick", quick,
               "smoke run: compute_mlp, 5 rounds, 5 clients per round; dp_bsp_slow4x, 10 steps");
  app.add_flag("--strict", strict, "a policy cohort-sim refuses fails the benchmark (exit 1)");
  CLI11_PARSE(app, argc, argv);

  std::vector<Setting> chosen;
  if (quick && settings.empty()) settings = {"compute_mlp", kDpSetting};
  if (quick) dp_options.steps = std::min(dp_options.steps, 10);
  bool dp = false;
  if (settings.empty()) {
    chosen = kSettings;
    dp = true;
  }
  for (const auto& name : settings) {
    if (name == kDpSetting) {
      dp = true;
      continue;
    }
    const auto it = std::find_if(kSettings.begin(), kSettings.end(),
                                 [&](const Setting& s) { return s.name == name; });
    if (it == kSettings.end()) {
      std::fprintf(stderr, "cohort-bench-hetero: unknown setting '%s'\n", name.c_str());
      return 1;
    }
    chosen.push_back(*it);
  }
  for (const auto& p : policies) {
    if (p != "fixed" && p != "deadline") {
      std::fprintf(stderr, "cohort-bench-hetero: unknown policy '%s' (fixed, deadline)\n",
                   p.c_str());
      return 1;
    }
  }
  std::vector<std::string> common{"--sim.csv_file=", "--sim.progress=false"};
  if (quick) {
    common.push_back("--server.clients_per_round=5");
    if (app.count("--rounds") == 0) rounds = 5;
  }
  if (rounds > 0) common.push_back("--server.rounds=" + std::to_string(rounds));
  for (const auto& s : sets) common.push_back("--set=" + s);

  fs::path dir;
  if (!keep.empty()) {
    dir = keep;
    fs::create_directories(dir);
  } else {
    std::string tmpl = (fs::temp_directory_path() / "cohort-bench-hetero-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "cohort-bench-hetero: cannot make a temporary folder\n");
      return 1;
    }
    dir = tmpl;
  }
  // Whether this build's cohort-sim knows server.work at all: without it "fixed" is the file as
  // it is, and "deadline" is refused.
  const bool work_key =
      chosen.empty() ||
      run_process({bin, "--config", (fs::path(examples) / chosen.front().file).string(),
                   "--server.work=fixed", "--print-config"},
                  dir / "probe.log")
              .rc == 0;

  int failures = 0;
  std::map<std::string, Line> fixed_time;  // by setting: fixed's time_to_target_s
  for (const auto& s : chosen) {
    for (const auto& policy : policies) {
      Line line{{"bench", "hetero"}, {"setting", s.name}, {"policy", policy}};
      const fs::path metrics = dir / (s.name + "_" + policy + ".jsonl");
      std::vector<std::string> args{bin, "--config", (fs::path(examples) / s.file).string()};
      if (work_key || policy != "fixed") args.push_back("--server.work=" + policy);
      args.insert(args.end(), common.begin(), common.end());
      args.push_back("--sim.metrics_file=" + metrics.string());
      const fs::path server_metrics = dir / (s.name + "_" + policy + "_server.jsonl");
      args.push_back("--server.metrics_file=" + server_metrics.string());
      fs::remove(metrics);
      fs::remove(server_metrics);
      const Outcome o = run_process(args, dir / (s.name + "_" + policy + ".log"));
      if (!work_key && policy == "fixed") line["server_work_key"] = false;
      if (o.rc != 0) {
        line["error"] = o.message;
        // Refused by the configuration checker for server.work: this build cannot run the policy.
        const bool unavailable = o.message.find("server.work") != std::string::npos;
        if (unavailable) line["unavailable"] = true;
        if (!unavailable || strict) ++failures;
      } else {
        try {
          line.update(result_line(read_records(metrics), target));
          const auto clients = line.contains("clients") ? line["clients"].get<std::uint64_t>() : 0;
          line["participation_min_20"] =
              participation_min_within(read_records(server_metrics), clients, 20);
          if (policy == "fixed") fixed_time[s.name] = line["time_to_target_s"];
          if (policy == "deadline" && fixed_time.contains(s.name) &&
              !fixed_time[s.name].is_null() && !line["time_to_target_s"].is_null()) {
            line["time_vs_fixed"] =
                line["time_to_target_s"].get<double>() / fixed_time[s.name].get<double>();
          }
        } catch (const std::exception& e) {
          line["error"] = std::string("cannot read ") + metrics.string() + ": " + e.what();
          ++failures;
        }
      }
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
  }
  if (dp) {
    // The programs next to cohort-sim: cohort-server and cohort-client.
    const std::string bin_dir = fs::path(bin).parent_path().string();
    std::optional<double> equal_rate;
    bool dp_failed = false;
    for (const std::string policy : {"equal", "speed"}) {
      Line line = run_dataparallel(bin_dir, policy, dp_options, dir, dp_failed);
      if (line.contains("steps_per_s")) {
        const double rate = line["steps_per_s"].get<double>();
        if (policy == "equal") equal_rate = rate;
        if (policy == "speed" && equal_rate) line["speedup_vs_equal"] = rate / *equal_rate;
      }
      if (line.contains("unavailable") && strict) ++failures;
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
    if (dp_failed) {
      ++failures;
      keep = keep.empty() ? dir.string() : keep;  // the logs the error line names stay
    }
  }
  if (keep.empty()) fs::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
