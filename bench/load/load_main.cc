// cohort-bench-load: starts one cohort-server shard (TLS by default) and N protocol clients in
// this process, each with its own connection, for a bounded time; then stops the shard with
// SIGTERM and prints one JSON object: rounds, the shard's resident memory over time, and the
// update counts on each side, which must agree: every push a client got accepted is folded in by
// the shard exactly once (its debug log) and counted once by the coordinator (its metrics).
//
// The clients speak the protocol without training (a pull, then a push of a small constant
// delta, then a report), so the load on the shard is the protocol's, not local training's.
//
// Usage: cohort-bench-load [--clients 200] [--seconds 150] [--threads 4] [--model mlp:784-32-10]
//                          [--insecure] [--server-bin PATH]
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cohort/client/shard_client.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/transport/allocator.h"
#include "cohort/transport/endpoint.h"
#include "cohort/transport/security/keygen.h"

extern char** environ;

namespace {

namespace tp = cohort::transport;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

pid_t spawn(const std::string& program, const std::vector<std::string>& args, const fs::path& err) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> all{program};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
    throw std::runtime_error("cannot start " + program);
  }
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

struct Counts {
  std::mutex mu;
  std::map<std::uint64_t, std::uint64_t> pushes_sent, acks_accepted, acks_refused;
  std::set<std::pair<std::string, std::uint64_t>> accepted;  // (client, round)
  std::uint64_t duplicate_accepts = 0;
};

// One simulated client: a state machine on its own connection.
struct SimClient {
  std::string name;
  std::optional<tp::Endpoint> ep;
  bool welcomed = false, done = false;
  std::uint64_t model_size = 0;
  tp::ShardInfo shard;
  Clock::time_point next_register{}, next_heartbeat{};
  std::uint64_t round = 0, version = 0;
  std::vector<float> delta;

  void step(Counts& /*counts*/) {
    const auto now = Clock::now();
    if (!welcomed && now >= next_register) {
      tp::Envelope e;
      e.body = tp::Register{.role = tp::Role::kClient, .dataset_size = 300, .device = "cpu", .partition = "load"};
      ep->send({}, e);
      next_register = now + 3s;
    }
    if (welcomed && now >= next_heartbeat) {
      tp::Envelope e;
      e.body = tp::Heartbeat{.clock = 0, .load = 0};
      ep->send({}, e);
      next_heartbeat = now + 2s;
    }
  }

  void on_message(tp::Message& m, Counts& counts) {
    if (auto* w = std::get_if<tp::Welcome>(&m.envelope.body)) {
      welcomed = true;
      model_size = w->model_size;
      if (w->shards.size() != 1) throw cohort::ConfigError("cohort-bench-load drives a single shard");
      shard = w->shards[0];
      delta.assign(model_size, 1e-4f);
    } else if (auto* rs = std::get_if<tp::RoundStart>(&m.envelope.body)) {
      round = rs->round;
      version = rs->model_version;
      ep->send({}, cohort::client::pull_request(shard, round, version));
    } else if (auto* pr = std::get_if<tp::PullReply>(&m.envelope.body)) {
      if (m.envelope.round != round || m.payload.size() != model_size * 4) return;
      auto e = cohort::client::push_request(
          shard, cohort::client::PushFields{.round = round, .num_samples = 300, .base_version = pr->version,
                                            .train_loss = 0.5f});
      ep->send({}, std::move(e), tp::Payload{std::as_bytes(std::span(delta)), nullptr});
      std::lock_guard lock(counts.mu);
      ++counts.pushes_sent[round];
    } else if (auto* a = std::get_if<tp::PushAck>(&m.envelope.body)) {
      {
        std::lock_guard lock(counts.mu);
        if (a->accepted) {
          ++counts.acks_accepted[m.envelope.round];
          if (!counts.accepted.insert({name, m.envelope.round}).second) ++counts.duplicate_accepts;
        } else {
          ++counts.acks_refused[m.envelope.round];
        }
      }
      tp::Envelope e;
      e.round = m.envelope.round;
      tp::ClientReport r;
      r.round = m.envelope.round;
      r.trained = a->accepted;
      r.num_samples = 300;
      r.train_loss = 0.5f;
      r.message = a->accepted ? "" : a->reason;
      e.body = r;
      ep->send({}, e);
    } else if (std::holds_alternative<tp::Bye>(m.envelope.body)) {
      done = true;
    } else if (auto* err = std::get_if<tp::ErrorBody>(&m.envelope.body)) {
      if (!welcomed) next_register = Clock::now() + 1s;  // "waiting for all shards": retry soon
      (void)err;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  cohort::transport::tune_allocator_for_large_messages();  // large frames: see its header
  CLI::App app{"cohort-bench-load: N concurrent clients against one shard"};
  int clients = 200, seconds = 150, threads = 4;
  std::string model = "mlp:784-32-10", server_bin = COHORT_SERVER_BIN;
  bool insecure = false;
  app.add_option("--clients", clients);
  app.add_option("--seconds", seconds);
  app.add_option("--threads", threads);
  app.add_option("--model", model);
  app.add_option("--server-bin", server_bin);
  app.add_flag("--insecure", insecure);
  CLI11_PARSE(app, argc, argv);
  cohort::set_log_level(cohort::LogLevel::Error);
  ::signal(SIGPIPE, SIG_IGN);

  const fs::path dir = fs::temp_directory_path() / ("cohort-bench-load-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  namespace sec = tp::security;
  auto client_name = [](int i) { return "load-" + std::to_string(i); };
  if (!insecure) {
    sec::generate_ca(dir / "ca");
    sec::generate_node(dir / "ca", "shard-0", dir / "certs");
    for (int i = 0; i < clients; ++i) sec::generate_node(dir / "ca", client_name(i), dir / "certs");
  }
  auto tls = [&](const std::string& n) {
    return std::vector<std::string>{"--tls.ca_file=" + (dir / "ca/ca.pem").string(),
                                    "--tls.cert_file=" + (dir / "certs" / (n + ".pem")).string(),
                                    "--tls.key_file=" + (dir / "certs" / (n + ".key")).string()};
  };
  std::vector<std::string> args{"--listen", "tcp://127.0.0.1:*", "--port-file", (dir / "port").string(),
      "--log-level", "debug", "--server.metrics_file=" + (dir / "metrics.jsonl").string(),
      "--model.spec=" + model, "--server.rounds=100000", "--server.clients_per_round=" + std::to_string(clients),
      "--server.min_clients=" + std::to_string(clients), "--server.round_deadline_ms=60000",
      "--server.eval_every=0", "--server.client_timeout_ms=120000"};
  if (insecure) {
    args.push_back("--insecure");
  } else {
    auto t = tls("shard-0");
    args.insert(args.end(), t.begin(), t.end());
  }
  const pid_t server = spawn(server_bin, args, dir / "server.err");
  std::string port;
  for (int i = 0; i < 600 && port.empty(); ++i) {
    std::this_thread::sleep_for(100ms);
    std::istringstream(read_file(dir / "port")) >> port;
  }
  if (port.empty()) {
    std::fprintf(stderr, "cohort-bench-load: the shard did not start:\n%s\n", read_file(dir / "server.err").c_str());
    ::kill(server, SIGKILL);
    return 1;
  }
  const std::string url = "tcp://127.0.0.1:" + port;

  tp::Context ctx(2);
  std::vector<SimClient> sims(static_cast<std::size_t>(clients));
  for (int i = 0; i < clients; ++i) {
    auto& s = sims[static_cast<std::size_t>(i)];
    s.name = client_name(i);
    tp::EndpointOptions o;
    o.node_id = s.name;
    o.security.insecure = insecure;
    if (!insecure) {
      const auto t = sec::TlsFiles{(dir / "ca/ca.pem").string(), (dir / "certs" / (s.name + ".pem")).string(),
                                   (dir / "certs" / (s.name + ".key")).string()};
      o.security.ca_file = t.ca_file;
      o.security.cert_file = t.cert_file;
      o.security.key_file = t.key_file;
      o.security.expected_peer = "shard-0";
    }
    s.ep.emplace(tp::Endpoint::connect(ctx, url, o));
  }

  Counts counts;
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      std::vector<SimClient*> mine;
      std::vector<tp::Endpoint*> eps;
      for (std::size_t i = static_cast<std::size_t>(w); i < sims.size(); i += static_cast<std::size_t>(threads)) {
        mine.push_back(&sims[i]);
        eps.push_back(&*sims[i].ep);
      }
      while (!stop.load()) {
        for (auto* s : mine) {
          if (stop.load()) break;
          try {
            s->step(counts);
          } catch (const cohort::Error&) {
          }
        }
        const int ready = tp::Endpoint::poll(eps, 50ms);
        if (ready < 0) continue;
        for (std::size_t k = 0; k < mine.size(); ++k) {
          for (int burst = 0; burst < 8; ++burst) {
            auto m = eps[k]->receive(0ms);
            if (!m) break;
            try {
              mine[k]->on_message(*m, counts);
            } catch (const cohort::Error&) {
            }
          }
        }
      }
    });
  }

  // Resident memory of the shard, once a second.
  std::vector<long> rss;
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < std::chrono::seconds(seconds)) {
    std::this_thread::sleep_for(1s);
    rss.push_back(rss_kib(server));
  }
  // Clients first (a send to a stopped shard would wait out the handshake timeout), then the shard.
  stop = true;
  for (auto& t : workers) t.join();
  ::kill(server, SIGTERM);
  int status = 0;
  for (int i = 0; i < 300 && ::waitpid(server, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(100ms);
  if (::waitpid(server, &status, WNOHANG) == 0) {
    ::kill(server, SIGKILL);
    ::waitpid(server, &status, 0);
  }

  // The shard's side: updates folded in (debug log) and rounds counted (metrics).
  const std::string log = read_file(dir / "server.err");
  std::map<std::uint64_t, std::uint64_t> applied;
  std::set<std::pair<std::string, std::uint64_t>> applied_set;
  std::uint64_t applied_twice = 0;
  static const std::regex re("applied the update of (\\S+) for round (\\d+)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it) {
    const std::uint64_t r = std::stoull((*it)[2].str());
    ++applied[r];
    if (!applied_set.insert({(*it)[1].str(), r}).second) ++applied_twice;
  }
  std::map<std::uint64_t, std::uint64_t> counted;
  {
    std::ifstream in(dir / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("event", "") == "round") counted[j["round_id"]] = j["clients"];
    }
  }
  // Compare per committed round; a round still open at SIGTERM has no record and is left out.
  std::uint64_t sent = 0, accepted = 0, folded = 0, coordinator = 0, mismatched_rounds = 0;
  for (const auto& [r, c] : counted) {
    sent += counts.pushes_sent[r];
    accepted += counts.acks_accepted[r];
    folded += applied[r];
    coordinator += c;
    if (counts.acks_accepted[r] != c || applied[r] != c || counts.pushes_sent[r] != c) ++mismatched_rounds;
  }
  std::uint64_t refused = 0;
  for (const auto& [r, n] : counts.acks_refused) refused += n;
  const std::size_t n = rss.size();
  auto window_max = [&](std::size_t from, std::size_t to) {
    long m = 0;
    for (std::size_t i = from; i < to && i < n; ++i) m = std::max(m, rss[i]);
    return m;
  };
  nlohmann::json out{
      {"bench", "load"},
      {"clients", clients},
      {"tls", !insecure},
      {"model", model},
      {"seconds", seconds},
      {"rounds_committed", counted.size()},
      {"pushes_sent", sent},
      {"acks_accepted", accepted},
      {"acks_refused", refused},
      {"shard_applied", folded},
      {"coordinator_counted", coordinator},
      {"applied_twice", applied_twice},
      {"duplicate_accepts", counts.duplicate_accepts},
      {"mismatched_rounds", mismatched_rounds},
      {"shard_exit", WIFEXITED(status) ? WEXITSTATUS(status) : -1},
      {"rss_mib_first_30s_max", window_max(0, 30) / 1024.0},
      {"rss_mib_last_30s_max", window_max(n > 30 ? n - 30 : 0, n) / 1024.0},
      {"rss_mib_max", window_max(0, n) / 1024.0},
  };
  std::printf("%s\n", out.dump().c_str());
  std::error_code ec;
  fs::remove_all(dir, ec);
  const bool ok = mismatched_rounds == 0 && applied_twice == 0 && counts.duplicate_accepts == 0 && !counted.empty();
  return ok ? 0 : 1;
}
