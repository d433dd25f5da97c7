// AllReduce bus bandwidth over real processes on loopback TCP, plaintext and TLS.
//
// The launcher spawns n copies of itself per (mode, n); each binds a ZmqComm, publishes its url in
// a shared temp dir, connects to every other rank, then for every size and algorithm checks one
// allreduce for exactness (integer data) and times `iters` more on warm buffers. Rank 0 prints one
// JSON line per measurement:
//   {"bench":"allreduce","algo":"ring","n":4,"bytes":16777216,"mode":"plain","busbw_gbps":0.9,...}
// with busbw = bytes / seconds * 2(n-1)/n (NCCL-tests' definition), seconds the mean per call.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cohort/aggregation/allreduce.h"
#include "cohort/core/cli.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/scheduling.h"
#include "cohort/transport/allocator.h"
#include "cohort/transport/security/security.h"
#include "cohort/transport/zmq_comm.h"

extern char** environ;

using namespace cohort;
using namespace cohort::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace agg = cohort::aggregation;
using Clock = std::chrono::steady_clock;

namespace {

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find my own executable");
  buf[n] = 0;
  return buf;
}

pid_t spawn(const std::string& program, std::vector<std::string> args, const std::string& out,
            const std::string& err) {
  args.insert(args.begin(), program);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, program.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw Error("cannot start " + program);
  return pid;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::size_t> parse_list(const std::string& text) {
  std::vector<std::size_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoull(item));
  return out;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

struct WorkerArgs {
  Rank rank = 0;
  Rank n = 2;
  std::string dir;
  std::string mode = "plain";
  std::string sizes;
  std::string algos;
  double target_seconds = 1.0;
  int max_iters = 200;
  std::size_t segment_bytes = 0;  // 0: AllreduceOptions' default
};

int worker(const WorkerArgs& a) {
  const fs::path dir = a.dir;
  const bool tls = a.mode == "tls";
  EndpointOptions o;
  o.node_id = "peer-" + std::to_string(a.rank);
  o.security.insecure = !tls;
  o.security.ca_file = (dir / "ca" / "ca.pem").string();
  o.security.cert_file = (dir / "certs" / (o.node_id + ".pem")).string();
  o.security.key_file = (dir / "certs" / (o.node_id + ".key")).string();
  o.handshake_timeout = 60s;
  ThreadPool pool(2);
  o.pool = &pool;
  Context ctx;
  ZmqComm comm(ctx, a.rank, a.n, "tcp://127.0.0.1:*", o);
  {
    std::ofstream f(dir / ("url." + std::to_string(a.rank) + ".tmp"));
    f << comm.url();
  }
  fs::rename(dir / ("url." + std::to_string(a.rank) + ".tmp"),
             dir / ("url." + std::to_string(a.rank)));
  std::vector<PeerAddress> peers(a.n);
  for (Rank r = 0; r < a.n; ++r) {
    const fs::path p = dir / ("url." + std::to_string(r));
    const auto deadline = Clock::now() + 60s;
    while (!fs::exists(p)) {
      if (Clock::now() > deadline)
        throw TimeoutError("rank " + std::to_string(r) + " never started");
      std::this_thread::sleep_for(5ms);
    }
    peers[r] = {slurp(p), "peer-" + std::to_string(r)};
  }
  comm.set_peers(peers);
  std::vector<Rank> others;
  for (Rank r = 0; r < a.n; ++r)
    if (r != a.rank) others.push_back(r);
  comm.connect(others, 60s);

  const auto sizes = parse_list(a.sizes);
  std::size_t max_bytes = 0;
  for (auto s : sizes) max_bytes = std::max(max_bytes, s);
  std::vector<float> data(max_bytes / sizeof(float));  // touched once here, reused below
  agg::AllreduceOptions base;
  base.timeout = 120s;
  if (a.segment_bytes > 0) base.segment_bytes = a.segment_bytes;
  agg::AllReducer barrier(comm, base);
  std::vector<float> token(1);
  for (const auto& algo_name : split(a.algos)) {
    agg::AllreduceOptions opt = base;
    opt.algo = agg::parse_allreduce_algo(algo_name);
    agg::AllReducer reducer(comm, opt);
    for (std::size_t bytes : sizes) {
      std::span<float> v(data.data(), bytes / sizeof(float));
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<float>((a.rank + 1) * (i % 1024));
      }
      const agg::AllreduceAlgo picked = reducer.sum(v);  // warm-up and check
      const float factor = static_cast<float>(a.n) * (a.n + 1) / 2;
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] != factor * static_cast<float>(i % 1024)) {
          throw InternalError("allreduce " + algo_name + " gave a wrong sum at element " +
                              std::to_string(i));
        }
      }
      std::fill(v.begin(), v.end(), 0.0f);
      // Iterations: about target_seconds at an assumed 0.5 GB/s, at least 3.
      const double guess = static_cast<double>(bytes) * 2 / 0.5e9 + 2e-4 * a.n;
      const int iters = std::clamp(static_cast<int>(a.target_seconds / guess), 3, a.max_iters);
      barrier.sum(token);
      const auto t0 = Clock::now();
      for (int it = 0; it < iters; ++it) reducer.sum(v);
      barrier.sum(token);  // every rank done: the slowest one sets the time
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
      if (a.rank == 0) {
        nlohmann::json j;
        j["bench"] = "allreduce";
        j["algo"] = algo_name;
        j["picked"] = agg::allreduce_algo_name(picked);  // what "auto" ran
        j["n"] = a.n;
        j["bytes"] = bytes;
        j["mode"] = a.mode;
        j["busbw_gbps"] = agg::allreduce_bus_bandwidth_gbps(bytes, secs, a.n);
        j["algbw_gbps"] = static_cast<double>(bytes) / secs / 1e9;
        j["seconds"] = secs;
        j["iters"] = iters;
        std::cout << j.dump() << std::endl;
      }
    }
  }
  barrier.sum(token);  // nobody leaves while another still needs it
  return 0;
}

int launch(const std::vector<Rank>& ns, const std::vector<std::string>& modes,
           const std::string& sizes, const std::string& algos, double target_seconds, int max_iters,
           std::size_t segment_bytes, const std::string& sched) {
  const fs::path dir = fs::temp_directory_path() / ("cohort-allreduce-" + std::to_string(getpid()));
  fs::create_directories(dir);
  struct Cleanup {
    fs::path d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  const Rank max_n = *std::max_element(ns.begin(), ns.end());
  security::generate_ca(dir / "ca");
  for (Rank r = 0; r < max_n; ++r) {
    security::generate_node(dir / "ca", "peer-" + std::to_string(r), dir / "certs");
  }
  int failures = 0;
  for (const auto& mode : modes) {
    for (Rank n : ns) {
      for (Rank r = 0; r < max_n; ++r) fs::remove(dir / ("url." + std::to_string(r)));
      std::vector<pid_t> pids;
      for (Rank r = 0; r < n; ++r) {
        pids.push_back(spawn(self_path(),
                             {"--worker",
                              "--rank",
                              std::to_string(r),
                              "--n",
                              std::to_string(n),
                              "--dir",
                              dir.string(),
                              "--mode",
                              mode,
                              "--sizes",
                              sizes,
                              "--algos",
                              algos,
                              "--segment",
                              std::to_string(segment_bytes),
                              "--seconds",
                              std::to_string(target_seconds),
                              "--max-iters",
                              std::to_string(max_iters),
                              "--sched",
                              sched},
                             (dir / ("out." + std::to_string(r))).string(),
                             (dir / ("err." + std::to_string(r))).string()));
      }
      // Bounded: a worker that hangs is killed, never waited on forever.
      const auto deadline = Clock::now() + std::chrono::seconds(600);
      std::vector<int> status(n, -1);
      for (;;) {
        bool all = true;
        for (Rank r = 0; r < n; ++r) {
          if (status[r] >= 0) continue;
          int st = 0;
          if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
            status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          } else {
            all = false;
          }
        }
        if (all) break;
        if (Clock::now() > deadline) {
          for (Rank r = 0; r < n; ++r) {
            if (status[r] < 0) {
              kill(pids[r], SIGKILL);
              waitpid(pids[r], nullptr, 0);
              status[r] = 137;
            }
          }
          break;
        }
        std::this_thread::sleep_for(10ms);
      }
      std::cout << slurp(dir / "out.0") << std::flush;
      for (Rank r = 0; r < n; ++r) {
        if (status[r] != 0) {
          ++failures;
          std::cerr << "rank " << r << " of " << n << " (" << mode << ") exited " << status[r]
                    << ":\n"
                    << slurp(dir / ("err." + std::to_string(r))) << '\n';
        }
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  cohort::transport::tune_allocator_for_large_messages();  // large frames: see its header
  CLI::App app{"Cohort AllReduce benchmark: bus bandwidth over loopback TCP, plaintext and TLS"};
  WorkerArgs w;
  bool is_worker = false, quick = false;
  std::string ns = "2,4,8", modes = "plain,tls";
  std::string sizes = "4096,1048576,16777216,67108864",
              algos = "auto,ring,halving_doubling,recursive_doubling";
  std::string sched = "batch";
  app.add_flag("--worker", is_worker, "internal: run one rank");
  app.add_option("--rank", w.rank, "internal: this worker's rank");
  app.add_option("--n", w.n, "internal: group size");
  app.add_option("--dir", w.dir, "internal: shared temp dir");
  app.add_option("--mode", w.mode, "internal: plain or tls");
  app.add_option("--ns", ns, "comma-separated process counts");
  app.add_option("--modes", modes, "comma-separated: plain, tls (both: plain,tls)");
  app.add_option("--sizes", sizes, "comma-separated message sizes in bytes (multiples of 4)");
  app.add_option("--algos", algos,
                 "comma-separated: auto, ring, halving_doubling, recursive_doubling (tree)")
      ->capture_default_str();
  app.add_option("--seconds", w.target_seconds, "rough time per measurement");
  app.add_option("--max-iters", w.max_iters, "most timed iterations per measurement");
  app.add_option("--segment", w.segment_bytes, "ring pipelining segment in bytes (0: default)");
  cohort::add_sched_flag(app, sched, "the workers");
  app.add_flag("--quick", quick, "smoke test: 2 processes, 4 KiB and 64 KiB, few iterations");
  CLI11_PARSE(app, argc, argv);
  try {
    set_io_scheduling(parse_scheduling(sched));
    if (is_worker) {
      set_log_level(LogLevel::Error);
      w.sizes = sizes;
      w.algos = algos;
      return worker(w);
    }
    set_log_level(LogLevel::Error);
    if (quick) {
      ns = "2";
      sizes = "4096,65536";
      w.target_seconds = 0.05;
      w.max_iters = 5;
    }
    std::vector<Rank> nlist;
    for (auto v : parse_list(ns)) nlist.push_back(static_cast<Rank>(v));
    std::vector<std::string> mode_list;
    for (const auto& m : split(modes)) {
      if (m == "both") {
        mode_list.insert(mode_list.end(), {"plain", "tls"});
      } else if (m == "plain" || m == "tls") {
        mode_list.push_back(m);
      } else {
        throw cohort::ConfigError("--modes: unknown mode '" + m + "' (plain, tls or both)");
      }
    }
    return launch(nlist, mode_list, sizes, algos, w.target_seconds, w.max_iters, w.segment_bytes,
                  sched);
  } catch (const std::exception& e) {
    std::cerr << "cohort-bench-allreduce: " << e.what() << '\n';
    return 1;
  }
}
