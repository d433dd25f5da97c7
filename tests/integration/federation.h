// A federation of real cohort-server and cohort-client processes on loopback, for tests: a
// throwaway PKI, shard processes (fixed ports for shards > 0, so a restart comes back at the same
// address) and client processes, all killed by their destructors.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cohort/server/checkpoint.h"
#include "cohort/transport/security/keygen.h"
#include "process.h"

namespace cohort::test {

using namespace std::chrono_literals;

// A federation under test: a PKI, shard processes and client processes, all killed at the end.
class Federation {
 public:
  explicit Federation(int shards, int clients, std::vector<std::string> server_args,
                      std::string partition = "iid")
      : shards_(shards), clients_(clients), server_args_(std::move(server_args)),
        partition_(std::move(partition)) {
    transport::security::generate_ca(dir_.path() / "ca");
    for (int i = 0; i < shards; ++i) transport::security::generate_node(dir_.path() / "ca", "shard-" + std::to_string(i), dir_.path() / "certs");
    for (int i = 0; i < clients; ++i) transport::security::generate_node(dir_.path() / "ca", "client-" + std::to_string(i), dir_.path() / "certs");
  }

  std::vector<std::string> tls(const std::string& name) const {
    return {"--tls.ca_file=" + dir_.file("ca/ca.pem"), "--tls.cert_file=" + dir_.file("certs/" + name + ".pem"),
            "--tls.key_file=" + dir_.file("certs/" + name + ".key")};
  }

  std::vector<std::string> shard_args(int i) const {
    std::vector<std::string> a{"--shard", std::to_string(i), "--shards", std::to_string(shards_),
                               "--server.checkpoint_dir=" + dir_.file("ckpt"), "--log-level", shard_log_level};
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
    start_servers();
    for (int i = 0; i < clients_; ++i) start_client(i);
  }

  // The shards only: a test then starts clients one by one, or speaks the protocol itself.
  void start_servers() {
    servers_.push_back(Process::spawn(COHORT_SERVER_BIN, shard_args(0)));
    coordinator_ = "tcp://127.0.0.1:" + cohort::test::read_when_ready(dir_.file("port"), 20s);
    for (int i = 1; i < shards_; ++i) {
      shard_ports_[i] = 0;
      start_shard(i);
    }
  }

  const std::string& coordinator() const { return coordinator_; }
  // A file of the federation's folder, e.g. "certs/client-1.pem".
  std::string file(const std::string& name) const { return dir_.file(name); }

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
                               "--log-level", "info"};
    if (!own_data) {  // a part of the shared data set; with own_data, client_extra names its files
      a.insert(a.end(), {"--data", partition_, "--part", std::to_string(i) + "/" + std::to_string(clients_)});
    }
    auto t = tls("client-" + std::to_string(i));
    a.insert(a.end(), t.begin(), t.end());
    if (auto it = client_extra.find(i); it != client_extra.end()) {
      a.insert(a.end(), it->second.begin(), it->second.end());
    }
    clients.push_back(Process::spawn(COHORT_CLIENT_BIN, a));
  }

  Process& server(int i) { return servers_[static_cast<std::size_t>(i)]; }
  std::string metrics() const { return dir_.file("metrics.jsonl"); }
  std::string checkpoint_dir() const { return dir_.file("ckpt"); }

  // The whole model as the shards last checkpointed it, concatenated in shard order.
  std::vector<float> checkpointed_model() const {
    std::vector<float> out;
    for (int i = 0; i < shards_; ++i) {
      server::CheckpointStore store(checkpoint_dir(), "shard-" + std::to_string(i));
      auto state = store.load_latest();
      REQUIRE(state.has_value());
      REQUIRE(state->begin == out.size());
      out.insert(out.end(), state->params.begin(), state->params.end());
    }
    return out;
  }

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
  std::map<int, std::vector<std::string>> client_extra;  // extra flags per client index
  bool own_data = false;  // clients get no --data/--part: each trains on all of its own files
  std::string shard_log_level = "info";

 private:
  TempDir dir_;
  int shards_, clients_;
  std::vector<std::string> server_args_;
  std::string partition_;
  std::vector<Process> servers_;
  mutable std::map<int, int> shard_ports_;
  std::string coordinator_;
};


}  // namespace cohort::test
