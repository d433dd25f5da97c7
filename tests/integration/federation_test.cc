// Federations of real cohort-server and cohort-client processes on loopback.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/transport/security/keygen.h"
#include "process.h"

using namespace std::chrono_literals;
namespace sec = cohort::transport::security;
using cohort::test::Process;
using cohort::test::TempDir;

namespace {

// A federation under test: a PKI, shard processes and client processes, all killed at the end.
class Federation {
 public:
  explicit Federation(int shards, int clients, std::vector<std::string> server_args,
                      std::string partition = "iid")
      : shards_(shards), clients_(clients), server_args_(std::move(server_args)),
        partition_(std::move(partition)) {
    sec::generate_ca(dir_.path() / "ca");
    for (int i = 0; i < shards; ++i) sec::generate_node(dir_.path() / "ca", "shard-" + std::to_string(i), dir_.path() / "certs");
    for (int i = 0; i < clients; ++i) sec::generate_node(dir_.path() / "ca", "client-" + std::to_string(i), dir_.path() / "certs");
  }

  std::vector<std::string> tls(const std::string& name) const {
    return {"--tls.ca_file=" + dir_.file("ca/ca.pem"), "--tls.cert_file=" + dir_.file("certs/" + name + ".pem"),
            "--tls.key_file=" + dir_.file("certs/" + name + ".key")};
  }

  std::vector<std::string> shard_args(int i) const {
    std::vector<std::string> a{"--shard", std::to_string(i), "--shards", std::to_string(shards_),
                               "--server.checkpoint_dir=" + dir_.file("ckpt"), "--log-level", "info"};
    if (i == 0) {
      a.insert(a.end(), {"--listen", "tcp://127.0.0.1:*", "--port-file", dir_.file("port"),
                         "--server.metrics_file=" + metrics()});
    } else {
      a.insert(a.end(), {"--listen", "tcp://127.0.0.1:" + std::to_string(shard_ports_.at(i)),
                         "--coordinator", coordinator_});
    }
    a.insert(a.end(), server_args_.begin(), server_args_.end());
    auto t = tls("shard-" + std::to_string(i));
    a.insert(a.end(), t.begin(), t.end());
    return a;
  }

  void start() {
    servers_.push_back(Process::spawn(COHORT_SERVER_BIN, shard_args(0)));
    coordinator_ = "tcp://127.0.0.1:" + cohort::test::read_when_ready(dir_.file("port"), 20s);
    for (int i = 1; i < shards_; ++i) {
      shard_ports_[i] = 0;
      start_shard(i);
    }
    for (int i = 0; i < clients_; ++i) start_client(i);
  }

  void start_shard(int i) {
    if (shard_ports_[i] == 0) {
      // A fixed port per shard, so that a restart comes back at the same address.
      shard_ports_[i] = 20000 + static_cast<int>((::getpid() * 7 + i * 13) % 20000);
    }
    if (static_cast<int>(servers_.size()) > i) {
      servers_[static_cast<std::size_t>(i)] = Process::spawn(COHORT_SERVER_BIN, shard_args(i));
    } else {
      servers_.push_back(Process::spawn(COHORT_SERVER_BIN, shard_args(i)));
    }
  }

  void start_client(int i) {
    std::vector<std::string> a{"--server", coordinator_, "--name", "client-" + std::to_string(i),
                               "--data", partition_, "--part", std::to_string(i) + "/" + std::to_string(clients_),
                               "--log-level", "info"};
    auto t = tls("client-" + std::to_string(i));
    a.insert(a.end(), t.begin(), t.end());
    clients.push_back(Process::spawn(COHORT_CLIENT_BIN, a));
  }

  Process& server(int i) { return servers_[static_cast<std::size_t>(i)]; }
  std::string metrics() const { return dir_.file("metrics.jsonl"); }

  std::vector<nlohmann::json> records(const std::string& event) const {
    std::vector<nlohmann::json> out;
    std::ifstream in(metrics());
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("event", "") == event) out.push_back(j);
    }
    return out;
  }

  // Waits for shard 0 to exit; prints every log on failure.
  int wait(std::chrono::seconds timeout) {
    auto code = server(0).wait_for(timeout);
    if (!code || *code != 0) dump();
    return code.value_or(-1);
  }

  void dump() {
    for (std::size_t i = 0; i < servers_.size(); ++i) {
      MESSAGE("shard " << i << " stderr:\n" << servers_[i].stderr_text().substr(0, 6000));
    }
    for (std::size_t i = 0; i < clients.size() && i < 3; ++i) {
      MESSAGE("client " << i << " stderr:\n" << clients[i].stderr_text().substr(0, 3000));
    }
  }

  std::vector<Process> clients;

 private:
  TempDir dir_;
  int shards_, clients_;
  std::vector<std::string> server_args_;
  std::string partition_;
  std::vector<Process> servers_;
  mutable std::map<int, int> shard_ports_;
  std::string coordinator_;
};

}  // namespace

TEST_CASE("2 shards + 4 clients, 3 rounds over TLS: test accuracy rises") {
  Federation f(2, 4, {"--server.rounds=3", "--server.clients_per_round=4", "--server.min_clients=4",
                      "--train.epochs=1", "--train.lr=0.05", "--train.momentum=0.9"});
  f.start();
  REQUIRE(f.wait(240s) == 0);
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 3);
  for (const auto& r : rounds) CHECK(r["clients"] == 4);
  const double first = rounds.front()["test_accuracy"];
  const double last = rounds.back()["test_accuracy"];
  MESSAGE("accuracy after round 1: " << first << ", after round 3: " << last);
  CHECK(first > 0.5);   // far above chance (0.1) after one round
  CHECK(last > first);  // and rising
  for (auto& c : f.clients) CHECK(c.wait_for(20s) == 0);
}

TEST_CASE("kill -9 of one client mid-round: the round closes at its deadline with the others") {
  Federation f(1, 3, {"--server.rounds=2", "--server.clients_per_round=3", "--server.min_clients=3",
                      "--server.min_updates=2", "--server.round_deadline_ms=8000",
                      "--train.epochs=3"});
  f.start();
  // Kill a client once the first round is under way: it starts when all three have joined, and
  // three local epochs take over a second.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto joined = [&](int i) {
    return f.clients[static_cast<std::size_t>(i)].stderr_text().find("joined") != std::string::npos;
  };
  while (std::chrono::steady_clock::now() < deadline && !(joined(0) && joined(1) && joined(2))) {
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(400ms);
  f.clients[2].kill(9);
  REQUIRE(f.wait(120s) == 0);
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 2);
  CHECK(rounds[0]["clients"] == 2);   // the killed client's update never came
  CHECK(rounds[0]["selected"] == 3);
  CHECK(rounds[0]["round_seconds"].get<double>() >= 7.0);  // closed at the deadline
}

TEST_CASE("kill -9 of shard 1 mid-training, then restart: it resumes from its checkpoint") {
  Federation f(2, 2, {"--server.rounds=6", "--server.clients_per_round=2", "--server.min_clients=2",
                      "--server.round_deadline_ms=30000", "--train.epochs=1", "--train.batch_size=64"});
  f.start();
  // Wait for two committed rounds, then kill shard 1.
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < 120s && f.records("round").size() < 2) {
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE(f.records("round").size() >= 2);
  f.server(1).kill(9);
  (void)f.server(1).wait_for(5s);
  std::this_thread::sleep_for(500ms);
  f.start_shard(1);
  REQUIRE(f.wait(240s) == 0);
  const auto rounds = f.records("round");
  CHECK(rounds.size() == 6);
  CHECK(f.server(1).stderr_text().find("resumed from checkpoint") != std::string::npos);
  CHECK(rounds.back()["test_accuracy"].get<double>() > 0.6);
}
