// cohort-bench-ps: per-client throughput of dense push and pull against real cohort-server
// processes on loopback (data-parallel ASP mode: every push is applied at once, pulls never wait).
//
// Prints one JSON object per line:
//   {"bench":"ps","op":"push|pull","shards":S,"clients":C,"bytes":N,"mode":"plain|tls","gbps":X,...}
// gbps is the per-client throughput: bytes / (time from sending to the last shard's answer),
// the median over repeats of each client, averaged over the clients. The clients start each timed
// loop (pushes, then pulls) together; a loop runs --repeats operations, or more where that moves
// fewer than --min-mib MiB (256 by default: 256 pushes of 1 MiB), and "repeats" says how many.
// The model is an mlp sized so that its parameter vector is exactly N bytes. The I/O threads of
// shards and clients run under --sched (batch, their default; keep: this process's policy).
//
//   cohort-bench-ps [--sizes-mib 1 16 64] [--modes plain tls] [--ops push pull] [--sched batch|keep]
//                   [--quick]
//   cohort-bench-ps --rss-clients 50 --rss-model mlp:1000-10000-10   peak RSS of one shard while
//                   that many clients push one update each (prints {"bench":"ps_rss",...})
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string_view>
#include <thread>

#include "cohort/client/shard_client.h"
#include "cohort/core/cli.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/scheduling.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/transport/allocator.h"
#include "cohort/transport/endpoint.h"
#include "cohort/transport/security/keygen.h"

extern char** environ;

namespace {

using namespace cohort;
using namespace cohort::transport;
using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find my own executable");
  buf[n] = 0;
  return buf;
}

pid_t spawn(const std::string& program, std::vector<std::string> args, const std::string& out = "",
            const std::string& err = "") {
  args.insert(args.begin(), program);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!out.empty()) posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.empty() ? "/dev/null" : err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, program.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw Error("cannot start " + program);
  return pid;
}

void stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return;
    std::this_thread::sleep_for(20ms);
  }
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
}

std::string read_port(const std::string& file) {
  for (int i = 0; i < 1000; ++i) {
    std::ifstream in(file);
    std::string line;
    if (std::getline(in, line) && !line.empty()) return line;
    std::this_thread::sleep_for(10ms);
  }
  throw Error("server did not start (" + file + ")");
}

// An mlp whose parameter vector is exactly `bytes` bytes: in*out + out floats.
std::string model_of_bytes(std::size_t bytes) {
  const std::size_t floats = bytes / 4;
  const std::size_t out = floats >= (std::size_t{1} << 22) ? 1024 : 256;
  return "mlp:" + std::to_string(floats / out - 1) + "-" + std::to_string(out);
}

struct Setup {
  std::string dir, mode, model, bin;
  int shards = 1, clients = 1;
  std::string sched = "batch";  // --sched of every process (cohort/core/scheduling.h)
  std::string log_level = "warn";  // --log-level of the shards; the workers log at its level or above
  std::vector<std::string> tls(const std::string& name) const {
    if (mode == "plain") return {"--insecure"};
    return {"--tls.ca_file=" + dir + "/ca/ca.pem", "--tls.cert_file=" + dir + "/certs/" + name + ".pem",
            "--tls.key_file=" + dir + "/certs/" + name + ".key"};
  }
};

// Starts the shards; returns their pids and the coordinator's url.
std::pair<std::vector<pid_t>, std::string> start_servers(const Setup& s, const std::vector<std::string>& extra) {
  std::vector<pid_t> pids;
  std::filesystem::remove(s.dir + "/port");
  std::vector<std::string> base{"--shards", std::to_string(s.shards),
                                "--server.clients_per_round=" + std::to_string(s.clients),
                                "--server.min_clients=1000000", "--model.spec=" + s.model,
                                "--server.metrics_file=", "--server_optimizer.lr=0.0001",
                                "--log-level", s.log_level, "--sched", s.sched};
  // Data-parallel ASP unless `extra` picks another mode; the server refuses another mode's keys.
  if (std::find_if(extra.begin(), extra.end(), [](const std::string& a) {
        return a.starts_with("--server.mode=");
      }) == extra.end()) {
    base.insert(base.end(), {"--server.mode=dataparallel", "--server.consistency=asp",
                             "--server.steps=1000000000"});
  }
  base.insert(base.end(), extra.begin(), extra.end());
  auto args0 = base;
  args0.insert(args0.end(), {"--shard", "0", "--listen", "tcp://127.0.0.1:*", "--port-file", s.dir + "/port"});
  for (auto& a : s.tls("shard-0")) args0.push_back(a);
  pids.push_back(spawn(s.bin + "/cohort-server", args0, "", s.dir + "/shard-0.log"));
  const std::string url = "tcp://127.0.0.1:" + read_port(s.dir + "/port");
  for (int i = 1; i < s.shards; ++i) {
    auto a = base;
    a.insert(a.end(), {"--shard", std::to_string(i), "--listen", "tcp://127.0.0.1:*", "--coordinator", url});
    for (auto& t : s.tls("shard-" + std::to_string(i))) a.push_back(t);
    pids.push_back(spawn(s.bin + "/cohort-server", a, "", s.dir + "/shard-" + std::to_string(i) + ".log"));
  }
  return {pids, url};
}

// ---- the worker role: one client process ---------------------------------------------------

// One client process: the protocol comes from cohort/client/shard_client.h, as for cohort-client.
struct Worker {
  Context ctx;
  ThreadPool pool{2};
  std::optional<Endpoint> coordinator;
  std::optional<client::ShardClient> links;
  std::string name;

  EndpointOptions options(const Setup& s, const std::string& peer) {
    EndpointOptions o;
    o.node_id = name;
    o.pool = &pool;
    o.security.insecure = s.mode == "plain";
    o.security.ca_file = s.dir + "/ca/ca.pem";
    o.security.cert_file = s.dir + "/certs/" + name + ".pem";
    o.security.key_file = s.dir + "/certs/" + name + ".key";
    o.security.expected_peer = peer;
    // A push waits while the shard reads the other clients' chunks: with 50 clients pushing 40 MB
    // at once on a loaded machine, longer than the default 30 s.
    o.send_timeout = std::chrono::seconds(600);
    return o;
  }

  void join(const Setup& s, const std::string& url) {
    coordinator.emplace(Endpoint::connect(ctx, url, options(s, "")));
    links.emplace(ctx, *coordinator, [this, &s](const std::string& node) { return options(s, node); });
    const auto deadline = Steady::now() + 60s;
    while (Steady::now() < deadline) {
      const auto welcome = links->register_once(
          Register{.role = Role::kClient, .dataset_size = 1, .device = "cpu"}, 500ms, {});
      if (welcome) {
        links->connect(welcome->shards);
        links->wait_ready(20s);
        return;
      }
    }
    throw TimeoutError("no welcome from the coordinator");
  }
  const std::vector<ShardInfo>& shards() const { return links->shards(); }

  // Sends to every shard, then waits up to `patience` for every answer. A timed request is sent
  // once (`resend` false); else as cohort-client sends it, again while unanswered (first after
  // 30 s: `patient`), so a link that drops and reconnects mid-push loses nothing.
  void round_trip(const client::MakeRequest& make, const client::AcceptAnswer& done,
                  std::chrono::seconds patience = 60s, bool resend = false) {
    client::ExchangeOptions o{
        .deadline = steady_clock().now() + patience, .patient = resend, .who = name, .resend = resend};
    if (!client::exchange(*links, steady_clock(), make, done, o)) {
      throw TimeoutError("no answer from every shard within " + std::to_string(patience.count()) + " s");
    }
  }
};

// Waits until all `workers` workers have reached `phase`, so that their timed loops overlap: a
// worker that started first would otherwise time its pushes alone, and the per-client figure of
// two clients swung between one client's throughput and half of it from run to run.
void barrier(const Setup& s, int index, int workers, const std::string& phase) {
  const std::filesystem::path dir(s.dir);
  { std::ofstream(dir / (phase + "-" + std::to_string(index))); }
  const auto deadline = Steady::now() + 120s;
  for (;;) {
    int ready = 0;
    for (int c = 0; c < workers; ++c) ready += std::filesystem::exists(dir / (phase + "-" + std::to_string(c))) ? 1 : 0;
    if (ready == workers) return;
    if (Steady::now() > deadline) {
      throw TimeoutError("only " + std::to_string(ready) + " of " + std::to_string(workers) + " workers reached " + phase);
    }
    std::this_thread::sleep_for(1ms);
  }
}

int worker_main(const Setup& s, const std::string& url, int repeats, const std::string& op, int workers,
                const std::vector<std::string>& ops) {
  Worker w;
  w.name = "client-" + std::to_string(s.clients);  // --clients carries this worker's index here
  w.join(s, url);
  std::uint64_t total = 0;
  for (const auto& sh : w.shards()) total = std::max(total, sh.end);
  auto grad = std::make_shared<std::vector<float>>(total, 1e-6f);
  const auto bytes = std::as_bytes(std::span<const float>(*grad));
  std::uint64_t clock = 0;
  auto push = [&] {
    w.round_trip(
        [&](std::size_t i) {
          const auto& sh = w.shards()[i];
          auto e = client::push_request(sh, client::PushFields{.round = 1,
                                                               .num_samples = 1,
                                                               .base_version = clock,
                                                               .kind = PushKind::kGradient,
                                                               .clock = clock});
          return std::pair{std::move(e), Payload{bytes.subspan(sh.begin * 4, (sh.end - sh.begin) * 4), grad}};
        },
        [&](std::size_t, Message& m) { return std::holds_alternative<PushAck>(m.envelope.body); });
    ++clock;
  };
  auto pull = [&] {
    w.round_trip(
        [&](std::size_t i) { return std::pair{client::pull_request(w.shards()[i], 1, clock), Payload{}}; },
        [&](std::size_t, Message& m) { return std::holds_alternative<PullReply>(m.envelope.body); });
  };
  nlohmann::json out;
  if (op == "rss") {  // one federated delta push, as a client selected for the first round
    // The shards take a round's pushes only from the clients selected for it: wait for the
    // RoundStart (the coordinator starts once every worker has registered).
    std::optional<RoundStart> rs;
    for (const auto until = Steady::now() + 120s; !rs && Steady::now() < until;) {
      auto m = w.coordinator->receive(100ms);
      if (m) {
        if (auto* r = std::get_if<RoundStart>(&m->envelope.body)) rs = *r;
      }
    }
    if (!rs) throw TimeoutError(w.name + ": no RoundStart within 120 s");
    w.round_trip(
        [&](std::size_t i) {
          const auto& sh = w.shards()[i];
          auto e = client::push_request(
              sh, client::PushFields{.round = rs->round, .num_samples = 100, .base_version = rs->model_version});
          return std::pair{std::move(e), Payload{bytes.subspan(sh.begin * 4, (sh.end - sh.begin) * 4), grad}};
        },
        [&](std::size_t, Message& m) {
          if (auto* a = std::get_if<PushAck>(&m.envelope.body)) {
            out["accepted"] = a->accepted;
            return true;
          }
          return false;
        },
        // Every worker pushes its 40 MB at once and the shard interleaves their chunks, so the
        // first ack comes near the end of all of them (minutes under ASan on 2 cores). Resent
        // while unanswered: a shard that stalls for 5 heartbeats (a loaded CI machine) loses its
        // clients' connections with the chunks queued in them, and the resend continues the
        // update where it broke off (one that was never resent hung here until the patience ran out).
        300s, /*resend=*/true);
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  for (int i = 0; i < 2; ++i) {  // warm up pools, connections and the shards' buffers
    push();
    pull();
  }
  // Pushes, then pulls, each timed one by one in its own loop (ps-lite's PUSH_ONLY and PULL_ONLY).
  // Alternating them (a training step's pattern) measured lower on 2 cores, where each switch of
  // direction wakes different threads (docs/PERFORMANCE.md 1).
  // Each loop reports the median of its timings; --ops leaves one out (bench/tls_ceiling.sh times
  // one direction alone).
  auto timed = [&](const std::string& name, auto&& run) {
    if (std::find(ops.begin(), ops.end(), name) == ops.end()) return;
    std::vector<double> secs;
    barrier(s, s.clients, workers, name);
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = Steady::now();
      run();
      secs.push_back(std::chrono::duration<double>(Steady::now() - t0).count());
    }
    std::sort(secs.begin(), secs.end());
    out[name + "_gbps"] = static_cast<double>(bytes.size()) / secs[secs.size() / 2] / 1e9;
  };
  timed("push", push);
  timed("pull", pull);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// The last `lines` lines of a text file (what a failed run leaves to read).
std::string tail_of(const std::string& file, std::size_t lines) {
  std::ifstream in(file);
  std::vector<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(std::move(line));
    if (last.size() > lines) last.erase(last.begin());
  }
  std::string out;
  for (auto& l : last) out += l + "\n";
  return out.empty() ? "(empty)\n" : out;
}

std::vector<nlohmann::json> run_workers(const Setup& s, const std::string& url, int repeats, const std::string& op,
                                        const std::vector<std::string>& ops = {"push", "pull"}) {
  std::vector<pid_t> pids;
  for (int c = 0; c < 8; ++c) {  // the last run's barrier marks
    for (const char* phase : {"push-", "pull-"}) std::filesystem::remove(s.dir + "/" + phase + std::to_string(c));
  }
  for (int c = 0; c < s.clients; ++c) {
    std::vector<std::string> args{"--role", "worker", "--dir", s.dir, "--mode", s.mode, "--url", url,
                                  "--index", std::to_string(c), "--repeats", std::to_string(repeats),
                                  "--op", op, "--workers", std::to_string(s.clients), "--sched", s.sched,
                                  "--log-level", s.log_level, "--ops"};
    args.insert(args.end(), ops.begin(), ops.end());
    pids.push_back(spawn(self_path(), args,
                         s.dir + "/worker-" + std::to_string(c) + ".out", s.dir + "/worker-" + std::to_string(c) + ".err"));
  }
  std::vector<nlohmann::json> results;
  for (int c = 0; c < s.clients; ++c) {
    int st = 0;
    waitpid(pids[static_cast<std::size_t>(c)], &st, 0);
    std::ifstream in(s.dir + "/worker-" + std::to_string(c) + ".out");
    std::string line;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !std::getline(in, line)) {
      std::ifstream err(s.dir + "/worker-" + std::to_string(c) + ".err");
      std::stringstream ss;
      ss << err.rdbuf();
      for (int k = c + 1; k < s.clients; ++k) stop(pids[static_cast<std::size_t>(k)]);  // no orphans
      throw Error("worker " + std::to_string(c) + " failed: " + ss.str().substr(0, 2000) +
                  "\nshard 0's log (" + s.log_level + " and above), the end:\n" +
                  tail_of(s.dir + "/shard-0.log", 40));
    }
    results.push_back(nlohmann::json::parse(line));
  }
  return results;
}

std::uint64_t peak_rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      std::uint64_t v = 0;
      in >> v;
      return v;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

void make_pki(const std::string& dir, int shards, int clients) {
  security::generate_ca(std::filesystem::path(dir) / "ca");
  for (int i = 0; i < shards; ++i) security::generate_node(std::filesystem::path(dir) / "ca", "shard-" + std::to_string(i), std::filesystem::path(dir) / "certs");
  for (int i = 0; i < clients; ++i) security::generate_node(std::filesystem::path(dir) / "ca", "client-" + std::to_string(i), std::filesystem::path(dir) / "certs");
}

// "2x3" -> {2, 3}: shards and clients of one benchmark layout; nullopt unless both are 1..8.
std::optional<std::pair<int, int>> parse_layout(const std::string& spec) {
  const auto x = spec.find('x');
  if (x == std::string::npos || x == 0 || x + 1 >= spec.size()) return std::nullopt;
  auto number = [](std::string_view d) -> std::optional<int> {
    if (d.size() > 1 || d.empty() || d[0] < '1' || d[0] > '8') return std::nullopt;
    return d[0] - '0';
  };
  const auto shards = number(std::string_view(spec).substr(0, x));
  const auto clients = number(std::string_view(spec).substr(x + 1));
  if (!shards || !clients) return std::nullopt;
  return std::pair{*shards, *clients};
}

}  // namespace

int main(int argc, char** argv) {
  cohort::transport::tune_allocator_for_large_messages();  // large frames: see its header
  CLI::App app{"Parameter-server push/pull throughput between real processes on loopback (JSON lines)."};
  std::vector<std::size_t> sizes{1, 16, 64};
  std::vector<std::string> modes{"plain", "tls"};
  std::vector<std::string> layout_specs{"1x1", "1x2", "2x2"};
  std::vector<std::string> ops{"push", "pull"};
  int repeats = 7, rss_clients = 0;
  std::size_t min_mib = 256;
  bool quick = false;
  std::string rss_model = "mlp:1000-10000-10", role = "main", dir, mode = "plain", url, op = "bench";
  std::string sched = "batch", log_level = "warn";
  int index = 0, workers = 1;
  app.add_option("--sizes-mib", sizes, "parameter vector sizes in MiB")
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}));
  app.add_option("--modes", modes, "plain and/or tls")->check(CLI::IsMember({"plain", "tls"}));
  app.add_option("--layouts", layout_specs, "SHARDSxCLIENTS layouts to measure, each side 1 to 8")
      ->check([](const std::string& v) -> std::string {
        return parse_layout(v) ? "" : "expected SHARDSxCLIENTS with each from 1 to 8, e.g. 2x2";
      })
      ->capture_default_str();
  app.add_option("--ops", ops, "timed loops to run: push and/or pull")
      ->check(CLI::IsMember({"push", "pull"}))
      ->capture_default_str();
  app.add_option("--repeats", repeats, "timed pushes and pulls per client");
  app.add_option("--min-mib", min_mib,
                 "each client's timed loop moves at least this many MiB: small sizes get more than "
                 "--repeats operations (0: exactly --repeats)")
      ->check(CLI::Range(std::size_t{0}, std::size_t{65536}))
      ->capture_default_str();
  app.add_flag("--quick", quick, "tiny run for smoke tests");
  app.add_option("--rss-clients", rss_clients, "measure a shard's peak RSS while this many clients push once");
  app.add_option("--rss-model", rss_model, "model for --rss-clients");
  add_sched_flag(app, sched, "the shards and clients (their --sched)");
  app.add_option("--log-level", log_level, "the shards' and workers' log level (a failed worker's error quotes its log and the end of shard 0's)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--role", role, "internal");
  app.add_option("--dir", dir, "internal");
  app.add_option("--mode", mode, "internal");
  app.add_option("--url", url, "internal");
  app.add_option("--index", index, "internal");
  app.add_option("--op", op, "internal");
  app.add_option("--workers", workers, "internal");
  CLI11_PARSE(app, argc, argv);
  try {
    // A worker logs at --log-level to its own stderr, which a failed run's error quotes; the main
    // process prints JSON only.
    set_log_level(role == "worker" ? parse_log_level(log_level) : LogLevel::Error);
    set_io_scheduling(parse_scheduling(sched));  // a worker stands in for cohort-client: the same
    const std::string bin = std::filesystem::path(self_path()).parent_path().string();
    if (role == "worker") {
      Setup s{dir, mode, "", bin, 1, index, sched, log_level};
      return worker_main(s, url, repeats, op, workers, ops);
    }
    const auto tmp = std::filesystem::temp_directory_path() / ("cohort-bench-ps-" + std::to_string(getpid()));
    std::filesystem::create_directories(tmp);
    struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    } cleanup{tmp};
    if (rss_clients > 0) {
      make_pki(tmp.string(), 1, rss_clients);
      const std::size_t params = kernels::make_network_spec(rss_model).parameter_count();
      Setup s{tmp.string(), modes.front(), rss_model, bin, 1, rss_clients, sched, log_level};
      const std::string n = std::to_string(rss_clients);
      // The round waits for every push: 50 clients' 40 MB through TLS can outlast the default
      // 60 s deadline on a loaded 2-core machine, and a round closed early refuses the rest.
      auto [pids, coord] = start_servers(s, {"--server.mode=federated", "--server.clients_per_round=" + n,
                                             "--server.min_clients=" + n, "--server.round_deadline_ms=600000"});
      std::this_thread::sleep_for(300ms);
      const auto base_kib = peak_rss_kib(pids[0]);
      const auto t0 = Steady::now();
      std::vector<nlohmann::json> results;
      try {
        results = run_workers(s, coord, 1, "rss");
      } catch (...) {
        for (auto p : pids) stop(p);  // a failed run leaves no server behind
        throw;
      }
      const double secs = std::chrono::duration<double>(Steady::now() - t0).count();
      const auto peak_kib = peak_rss_kib(pids[0]);
      int accepted = 0;
      for (auto& r : results) accepted += r.value("accepted", false) ? 1 : 0;
      for (auto p : pids) stop(p);
      std::printf("{\"bench\":\"ps_rss\",\"clients\":%d,\"accepted\":%d,\"model_bytes\":%zu,\"mode\":\"%s\","
                  "\"baseline_rss_mib\":%.1f,\"peak_rss_mib\":%.1f,\"peak_over_model\":%.2f,\"seconds\":%.2f}\n",
                  rss_clients, accepted, params * 4, s.mode.c_str(), static_cast<double>(base_kib) / 1024,
                  static_cast<double>(peak_kib) / 1024,
                  static_cast<double>(peak_kib) * 1024 / static_cast<double>(params * 4), secs);
      return accepted == rss_clients ? 0 : 1;
    }
    if (quick) {
      sizes = {1};
      repeats = 2;
      min_mib = 0;
    }
    std::vector<std::pair<int, int>> layouts;
    int most_shards = 1, most_clients = 1;
    for (const auto& spec : layout_specs) {
      const auto l = *parse_layout(spec);  // validated by the option's check
      layouts.push_back(l);
      most_shards = std::max(most_shards, l.first);
      most_clients = std::max(most_clients, l.second);
    }
    make_pki(tmp.string(), most_shards, most_clients);
    for (const auto& m : modes) {
      for (auto [shards, clients] : layouts) {
        if (quick && (shards != 1 || clients != 1)) continue;
        for (std::size_t mib : sizes) {
          Setup s{tmp.string(), m, model_of_bytes(mib << 20), bin, shards, clients, sched, log_level};
          // A 1 MiB push is short: a handful of them time the scheduler more than the transport.
          const int n_ops = std::max(repeats, static_cast<int>((min_mib + mib - 1) / mib));
          auto [pids, coord] = start_servers(s, {});
          std::vector<nlohmann::json> results;
          try {
            results = run_workers(s, coord, n_ops, "bench", ops);
          } catch (...) {
            for (auto p : pids) stop(p);
            throw;
          }
          for (auto p : pids) stop(p);
          for (const std::string& opname : ops) {
            double sum = 0;
            for (auto& r : results) sum += r[opname + "_gbps"].get<double>();
            std::printf("{\"bench\":\"ps\",\"op\":\"%s\",\"shards\":%d,\"clients\":%d,\"bytes\":%zu,"
                        "\"mode\":\"%s\",\"gbps\":%.3f,\"repeats\":%d,\"sched\":\"%s\"}\n",
                        opname.c_str(), shards, clients, mib << 20, m.c_str(),
                        sum / static_cast<double>(results.size()), n_ops, sched.c_str());
            std::fflush(stdout);
          }
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-bench-ps: %s\n", e.what());
    return 1;
  }
}
