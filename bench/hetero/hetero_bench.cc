// cohort-bench-hetero: heterogeneity-aware work (issue 23) on cohort-sim's virtual clock, one
// JSON line per run:
//   {"bench":"hetero","setting":S,"policy":"fixed|deadline","rounds_to_target":R,
//    "time_to_target_s":T,"final_accuracy":A,"participation_min":P, ...}
// R is the first round whose test accuracy reaches --target and T the simulated seconds at its end
// (both null when the run never reaches it); A is the last evaluation's accuracy; P the fewest
// rounds any client's update was taken in (0: some device never contributed). Extra fields:
// rounds, sim_seconds, never_participated, local_steps_mean (mean over rounds of the mean local
// steps of the updates taken), target.
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
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
Outcome run_process(const std::vector<std::string>& args, const fs::path& err_file) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return {-1, "fork failed"};
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_WRONLY);
    const int err_fd = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (null_fd < 0 || err_fd < 0) _exit(127);
    dup2(null_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
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
  j["rounds"] = rounds;
  j["sim_seconds"] = (*summary)["sim_seconds"];
  j["local_steps_mean"] =
      stepped_rounds > 0 ? Line(steps_sum / static_cast<double>(stepped_rounds)) : Line(nullptr);
  j["target"] = target;
  return j;
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
  std::int64_t rounds = 0;
  bool quick = false, strict = false;
  std::string examples = COHORT_SOURCE_DIR "/examples/sim";
  std::string bin = (own_dir() / "cohort-sim").string();
  std::string keep;
  app.add_option("--settings", settings,
                 "compute_mlp, compute_lenet5, link_mlp, link_lenet5 (default: all)")
      ->delimiter(',');
  app.add_option("--policies", policies, "work policies to run")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--target", target, "test accuracy to reach")->capture_default_str();
  app.add_option("--rounds", rounds, "override server.rounds (0: the file's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--set", sets, "key=value passed to every run (repeatable)");
  app.add_option("--examples", examples, "folder of the configurations")->capture_default_str();
  app.add_option("--bin", bin, "the cohort-sim binary")->capture_default_str();
  app.add_option("--keep", keep, "keep each run's metrics file and log in this folder");
  app.add_flag("--quick", quick, "smoke run: compute_mlp, 5 rounds, 5 clients per round");
  app.add_flag("--strict", strict, "a policy cohort-sim refuses fails the benchmark (exit 1)");
  CLI11_PARSE(app, argc, argv);

  std::vector<Setting> chosen;
  if (quick && settings.empty()) settings = {"compute_mlp"};
  if (settings.empty()) chosen = kSettings;
  for (const auto& name : settings) {
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
  std::vector<std::string> common{"--sim.csv_file=", "--sim.progress=false",
                                  "--server.metrics_file="};
  if (quick) {
    common.push_back("--server.clients_per_round=5");
    if (rounds == 0) rounds = 5;
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
  const fs::path first = fs::path(examples) / chosen.front().file;
  const bool work_key =
      run_process({bin, "--config", first.string(), "--server.work=fixed", "--print-config"},
                  dir / "probe.log")
          .rc == 0;

  int failures = 0;
  for (const auto& s : chosen) {
    for (const auto& policy : policies) {
      Line line{{"bench", "hetero"}, {"setting", s.name}, {"policy", policy}};
      const fs::path metrics = dir / (s.name + "_" + policy + ".jsonl");
      std::vector<std::string> args{bin, "--config", (fs::path(examples) / s.file).string()};
      if (work_key || policy != "fixed") args.push_back("--server.work=" + policy);
      args.insert(args.end(), common.begin(), common.end());
      args.push_back("--sim.metrics_file=" + metrics.string());
      fs::remove(metrics);
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
        } catch (const std::exception& e) {
          line["error"] = std::string("cannot read ") + metrics.string() + ": " + e.what();
          ++failures;
        }
      }
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
  }
  if (keep.empty()) fs::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
