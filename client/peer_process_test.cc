// Decentralized mode end to end, as real processes on loopback over mutual TLS: a rendezvous-only
// cohort-server and four cohort-client --mode decentralized peers on a ring. One peer is killed
// mid-training; the others must drop it from mixing and finish. Every process this test starts
// is killed by its Process destructor; the waits of each case add up to under 450 s, so both
// stay inside the CTest timeout (900 s) even on a machine loaded far beyond its cores.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cohort/transport/security/security.h"
#include "process.h"

using namespace std::chrono_literals;
using cohort::test::Process;
namespace sec = cohort::transport::security;

namespace {

struct Run {
  cohort::test::TempDir dir;
  std::vector<sec::TlsFiles> peers;
  sec::TlsFiles coordinator;
  explicit Run(int n) {
    sec::generate_ca(dir.path() / "ca");
    coordinator = sec::generate_node(dir.path() / "ca", "shard-0", dir.path() / "certs");
    for (int i = 0; i < n; ++i) {
      peers.push_back(
          sec::generate_node(dir.path() / "ca", "peer-" + std::to_string(i), dir.path() / "certs"));
    }
  }
  static std::vector<std::string> tls(const sec::TlsFiles& f) {
    return {"--set", "tls.ca_file=" + f.ca_file,  "--set", "tls.cert_file=" + f.cert_file,
            "--set", "tls.key_file=" + f.key_file};
  }
};

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Waits until `p`'s stderr contains `text`, or the process exits, or the timeout passes.
bool wait_for_text(Process& p, const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (p.stderr_text().find(text) != std::string::npos) return true;
    if (!p.running()) return false;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

TEST_CASE("decentralized peers over TLS: one killed mid-training, the other three finish") {
  const int n = 4;
  Run run(n);
  const std::string port_file = run.dir.file("port");
  Process server = Process::spawn(COHORT_SERVER_BIN, concat({"--server.mode=decentralized",
                                                             "--set",
                                                             "server.listen=tcp://127.0.0.1:*",
                                                             "--set",
                                                             "server.port_file=" + port_file,
                                                             "--set",
                                                             "decentralized.peers=4",
                                                             "--set",
                                                             "decentralized.steps=1500",
                                                             "--set",
                                                             "decentralized.topology=ring",
                                                             "--set",
                                                             "decentralized.algorithm=dsgdm",
                                                             "--set",
                                                             "decentralized.lr=0.02",
                                                             "--set",
                                                             "decentralized.gossip_timeout_ms=2000",
                                                             "--set",
                                                             "model.spec=mlp:784-16-10",
                                                             "--set",
                                                             "server.heartbeat_ms=300",
                                                             "--set",
                                                             "server.client_timeout_ms=6000"},
                                                            Run::tls(run.coordinator)));
  const std::string port = cohort::test::read_when_ready(port_file, 60s);
  std::vector<Process> peers;
  for (int i = 0; i < n; ++i) {
    peers.push_back(Process::spawn(
        COHORT_CLIENT_BIN,
        concat({"--mode", "decentralized", "--server", "tcp://127.0.0.1:" + port, "--name",
                "peer-" + std::to_string(i), "--set", "client.step_delay_ms=2", "--set",
                "client.connect_timeout_ms=120000"},
               Run::tls(run.peers[static_cast<std::size_t>(i)]))));
  }
  // Kill peer-2 once it is well into training.
  const bool started = wait_for_text(peers[2], "step 200/1500", 120s);
  if (!started) MESSAGE("peer-2 stderr:\n" << peers[2].stderr_text().substr(0, 4000));
  REQUIRE(started);
  peers[2].kill(9);

  const auto code = server.wait_for(180s);
  if (!code || *code != 0) {
    MESSAGE("server stderr:\n" << server.stderr_text().substr(0, 6000));
    for (int i = 0; i < n; ++i) {
      MESSAGE("peer " << i << " stderr:\n"
                      << peers[static_cast<std::size_t>(i)].stderr_text().substr(0, 3000));
    }
  }
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  const std::string summary = server.stdout_text();
  CHECK(summary.find("\"finished\":3") != std::string::npos);
  CHECK(summary.find("\"gone\":1") != std::string::npos);
  CHECK(server.stderr_text().find("peer peer-2 silent") != std::string::npos);
  for (int i : {0, 1, 3}) {
    auto& p = peers[static_cast<std::size_t>(i)];
    const auto rc = p.wait_for(30s);
    CHECK(rc.has_value());
    if (rc) CHECK(*rc == 0);
    CHECK(p.stdout_text().find("\"steps\":1500") != std::string::npos);
    CHECK(p.stdout_text().find("\"test_accuracy\":") != std::string::npos);
    // The TLS transport carried the gossip: no plaintext warning.
    CHECK(p.stderr_text().find("plaintext transport") == std::string::npos);
  }
}

TEST_CASE("decentralized peers over TLS: a killed peer restarts under its name and rejoins") {
  const int n = 4;
  Run run(n);
  const std::string port_file = run.dir.file("port");
  Process server = Process::spawn(COHORT_SERVER_BIN, concat({"--server.mode=decentralized",
                                                             "--set",
                                                             "server.listen=tcp://127.0.0.1:*",
                                                             "--set",
                                                             "server.port_file=" + port_file,
                                                             "--set",
                                                             "decentralized.peers=4",
                                                             "--set",
                                                             "decentralized.steps=4000",
                                                             "--set",
                                                             "decentralized.algorithm=dpsgd",
                                                             "--set",
                                                             "decentralized.lr=0.02",
                                                             "--set",
                                                             "decentralized.gossip_timeout_ms=2000",
                                                             "--set",
                                                             "model.spec=mlp:784-16-10",
                                                             "--set",
                                                             "server.heartbeat_ms=300",
                                                             "--set",
                                                             "server.client_timeout_ms=5000"},
                                                            Run::tls(run.coordinator)));
  const std::string port = cohort::test::read_when_ready(port_file, 60s);
  auto peer_args = [&](int i) {
    return concat({"--mode", "decentralized", "--server", "tcp://127.0.0.1:" + port, "--name",
                   "peer-" + std::to_string(i), "--set", "client.step_delay_ms=3", "--set",
                   "client.connect_timeout_ms=120000"},
                  Run::tls(run.peers[static_cast<std::size_t>(i)]));
  };
  std::vector<Process> peers;
  for (int i = 0; i < n; ++i) peers.push_back(Process::spawn(COHORT_CLIENT_BIN, peer_args(i)));
  REQUIRE(wait_for_text(peers[1], "step 200/4000", 120s));
  peers[1].kill(9);
  // The coordinator notices, tells the others; then the peer comes back under the same name.
  REQUIRE(wait_for_text(server, "peer peer-1 silent", 60s));
  peers[1] = Process::spawn(COHORT_CLIENT_BIN, peer_args(1));
  const auto code = server.wait_for(180s);
  if (!code || *code != 0 || server.stdout_text().find("\"finished\":4") == std::string::npos) {
    MESSAGE("server stderr:\n" << server.stderr_text().substr(0, 6000));
    MESSAGE("peer-1 stderr:\n" << peers[1].stderr_text().substr(0, 4000));
  }
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(server.stderr_text().find("peer peer-1 rejoined") != std::string::npos);
  CHECK(server.stdout_text().find("\"finished\":4") != std::string::npos);
  for (auto& p : peers) {
    const auto rc = p.wait_for(15s);
    CHECK(rc.has_value());
    if (rc) CHECK(*rc == 0);
    CHECK(p.stdout_text().find("\"steps\":4000") != std::string::npos);
  }
}

}  // namespace
