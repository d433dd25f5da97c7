// Client-side programs against a wrong coordinator and bad options (issue 21): the coordinator's
// certificate must name tls.coordinator_name; every option is checked at start-up, before the
// client registers; a fatal error after joining is reported to the coordinator (ClientReport with
// fatal = true) before the client exits non-zero; options that do not apply are refused.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "cohort/transport/endpoint.h"
#include "cohort/transport/security/keygen.h"
#include "process.h"

using namespace std::chrono_literals;
using cohort::test::Process;
using cohort::test::TempDir;
namespace tp = cohort::transport;

namespace {

// A CA and node certificates in a temp dir.
class Pki {
 public:
  explicit Pki(const std::vector<std::string>& names) {
    cohort::transport::security::generate_ca(dir_.path() / "ca");
    for (const auto& n : names) {
      cohort::transport::security::generate_node(dir_.path() / "ca", n, dir_.path() / "certs");
    }
  }
  std::vector<std::string> tls(const std::string& name) const {
    return {"--tls.ca_file=" + dir_.file("ca/ca.pem"),
            "--tls.cert_file=" + dir_.file("certs/" + name + ".pem"),
            "--tls.key_file=" + dir_.file("certs/" + name + ".key")};
  }
  std::string file(const std::string& name) const { return dir_.file(name); }

 private:
  TempDir dir_;
};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string first_line_with(const std::string& text, const std::string& needle) {
  const auto at = text.find(needle);
  if (at == std::string::npos) return {};
  const auto begin = text.rfind('\n', at);
  const auto end = text.find('\n', at);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end == std::string::npos ? std::string::npos : end - begin - 1);
}

// Waits for the process to exit; on a timeout it is killed and the test fails.
int exit_code(Process& p, std::chrono::seconds timeout) {
  auto code = p.wait_for(timeout);
  if (!code) {
    p.kill();
    FAIL_CHECK("still running after " << timeout.count() << " s; stderr:\n"
                                      << p.stderr_text().substr(0, 3000));
    return -1;
  }
  return *code;
}

template <typename T>
std::optional<tp::Message> wait_for_body(tp::Endpoint& ep, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = ep.receive(100ms);
    if (m && std::holds_alternative<T>(m->envelope.body)) return m;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("a client refuses a coordinator whose certificate names another node, and trains nothing") {
  Pki pki({"client-0", "client-3"});
  // An impostor: a real cohort-server holding client-3's certificate, from the same CA.
  Process server = Process::spawn(
      COHORT_SERVER_BIN,
      std::vector<std::string>{"--name", "client-3", "--tls.coordinator_name=client-3",
                               "--listen", "tcp://127.0.0.1:*",
                               "--port-file", pki.file("port"), "--log-level", "info",
                               "--model.spec=mlp:784-32-10", "--server.rounds=1",
                               "--server.min_clients=1", "--server.clients_per_round=1"} +
          pki.tls("client-3"));
  const std::string url = "tcp://127.0.0.1:" + cohort::test::read_when_ready(pki.file("port"), 20s);
  Process client = Process::spawn(
      COHORT_CLIENT_BIN, std::vector<std::string>{"--server", url, "--name", "client-0",
                                                  "--log-level", "info",
                                                  "--client.connect_timeout_ms=60000"} +
                             pki.tls("client-0"));
  CHECK(exit_code(client, 45s) == 1);
  const std::string line = first_line_with(client.stderr_text(), "refused the coordinator");
  MESSAGE(line);
  CHECK(line.find("'shard-0'") != std::string::npos);   // the name we expected
  CHECK(line.find("'client-3'") != std::string::npos);  // the name it presented
  CHECK(line.find("tls.coordinator_name") != std::string::npos);
  server.kill(15);
  (void)server.wait_for(10s);
  CHECK(server.stderr_text().find("client registered: client-0") == std::string::npos);
}

TEST_CASE("a decentralized peer refuses a rendezvous whose certificate names another node") {
  Pki pki({"peer-0", "peer-9"});
  Process server = Process::spawn(
      COHORT_SERVER_BIN,
      std::vector<std::string>{"--server.mode=decentralized", "--name", "peer-9", "--listen",
                               "tcp://127.0.0.1:*", "--port-file", pki.file("port"),
                               "--decentralized.peers=1", "--decentralized.steps=5",
                               "--log-level", "info"} +
          pki.tls("peer-9"));
  const std::string url = "tcp://127.0.0.1:" + cohort::test::read_when_ready(pki.file("port"), 20s);
  Process peer = Process::spawn(
      COHORT_CLIENT_BIN,
      std::vector<std::string>{"--mode", "decentralized", "--server", url, "--name", "peer-0",
                               "--client.connect_timeout_ms=60000", "--log-level", "info"} +
          pki.tls("peer-0"));
  CHECK(exit_code(peer, 45s) == 1);
  const std::string line = first_line_with(peer.stderr_text(), "refused the coordinator");
  MESSAGE(line);
  CHECK(line.find("'shard-0'") != std::string::npos);
  CHECK(line.find("'peer-9'") != std::string::npos);
  // With the name pinned to what it really is, the same rendezvous is accepted.
  Process trusting = Process::spawn(
      COHORT_CLIENT_BIN,
      std::vector<std::string>{"--mode", "decentralized", "--server", url, "--name", "peer-0",
                               "--tls.coordinator_name=peer-9", "--log-level", "info"} +
          pki.tls("peer-0"));
  CHECK(exit_code(trusting, 120s) == 0);
  CHECK(exit_code(server, 30s) == 0);
}

TEST_CASE("bad client options stop cohort-client at start-up, before it registers") {
  TempDir dir;
  Process server = Process::spawn(
      COHORT_SERVER_BIN,
      {"--insecure", "--listen", "tcp://127.0.0.1:*", "--port-file", dir.file("port"),
       "--log-level", "info", "--model.spec=mlp:784-32-10", "--server.min_clients=5"});
  const std::string url = "tcp://127.0.0.1:" + cohort::test::read_when_ready(dir.file("port"), 20s);
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--device", "gpu7"}, "gpu7"},
      {{"--device", "cuda:7"}, "cuda:7"},  // no such GPU here, or a build without CUDA
      {{"--client.threads=-1"}, "client.threads must be between 0 and 1024"},
      {{"--part", "3/2"}, "data.part"},
      {{"--data", "dirichlet:-1"}, "dirichlet"},
      {{"--compressor.name=bogus"}, "bogus"},
      {{"--compressor.name=topk", "--compressor.k_fractoin=0.1"}, "k_fractoin"},
      {{"--client.connect_timeout_ms=0"}, "client.connect_timeout_ms"},
      {{"--tls.coordinator_name="}, "tls.coordinator_name must not be empty"},
      {{"--peer.listen=tcp://127.0.0.1:*"}, "peer.listen applies to client.mode = decentralized"},
  };
  int i = 0;
  for (const auto& c : cases) {
    CAPTURE(c.expected);
    const std::string name = "client-" + std::to_string(i++);
    Process client = Process::spawn(
        COHORT_CLIENT_BIN,
        std::vector<std::string>{"--server", url, "--name", name, "--insecure"} + c.flags);
    CHECK(exit_code(client, 60s) == 1);
    const std::string line = first_line_with(client.stderr_text(), "cohort-client: ");
    MESSAGE(line);
    CHECK(line.find(c.expected) != std::string::npos);
  }
  server.kill(15);
  (void)server.wait_for(10s);
  CHECK(server.stderr_text().find("client registered") == std::string::npos);
}

TEST_CASE("a client that cannot use the coordinator's training options reports a fatal error first") {
  // The coordinator is this test, speaking the protocol: its [train] section has an unknown key.
  tp::Context ctx;
  tp::EndpointOptions o;
  o.node_id = "shard-0";
  o.security.insecure = true;
  auto coordinator = tp::Endpoint::bind(ctx, "tcp://127.0.0.1:*", o);
  Process client = Process::spawn(
      COHORT_CLIENT_BIN, {"--server", coordinator.url(), "--name", "client-0", "--insecure",
                          "--log-level", "info"});
  auto reg = wait_for_body<tp::Register>(coordinator, 60s);
  REQUIRE(reg.has_value());
  tp::Welcome w;
  w.model_spec = "mlp:784-32-10";
  w.model_size = 784 * 32 + 32 + 32 * 10 + 10;
  w.heartbeat_ms = 1000;
  w.training_toml = "lr = 0.05\nbogus_option = 3\n";
  w.shards.push_back({0, coordinator.url(), "shard-0", 0, w.model_size});
  tp::Envelope e;
  e.body = w;
  (void)coordinator.send(reg->peer, std::move(e));
  auto report = wait_for_body<tp::ClientReport>(coordinator, 30s);
  REQUIRE(report.has_value());
  const auto& r = std::get<tp::ClientReport>(report->envelope.body);
  MESSAGE(r.message);
  CHECK(r.fatal);
  CHECK(r.message.find("bogus_option") != std::string::npos);
  CHECK(exit_code(client, 30s) == 1);
}

TEST_CASE("a client with a compressor refuses a data-parallel task, tells the coordinator and exits 1") {
  TempDir dir;
  Process server = Process::spawn(
      COHORT_SERVER_BIN,
      {"--insecure", "--listen", "tcp://127.0.0.1:*", "--port-file", dir.file("port"),
       "--log-level", "info", "--model.spec=mlp:784-32-10", "--server.mode=dataparallel",
       "--server.min_clients=1", "--server.steps=5"});
  const std::string url = "tcp://127.0.0.1:" + cohort::test::read_when_ready(dir.file("port"), 20s);
  Process client = Process::spawn(
      COHORT_CLIENT_BIN, {"--server", url, "--name", "client-0", "--insecure", "--log-level",
                          "info", "--compressor.name=topk", "--compressor.k_fraction=0.1"});
  CHECK(exit_code(client, 90s) == 1);
  const std::string line = first_line_with(client.stderr_text(), "cohort-client: ");
  MESSAGE(line);
  CHECK(line.find("compressor.* does not apply to server.mode = dataparallel (gradients go "
                  "uncompressed)") != std::string::npos);
  server.kill(15);
  (void)server.wait_for(10s);
  // The coordinator heard it: its log names the client and the reason.
  const std::string said = first_line_with(server.stderr_text(), "client client-0 stopped");
  MESSAGE(said);
  CHECK(said.find("compressor.* does not apply") != std::string::npos);
}

TEST_CASE("the decentralized rendezvous refuses unknown and bad decentralized.* keys at start-up") {
  struct Case {
    std::string flag, expected;
  };
  const std::vector<Case> cases = {
      {"--decentralized.stpes=10", "unknown config key 'decentralized.stpes'"},
      {"--decentralized.algorithm=adam", "unknown decentralized optimizer 'adam'"},
      {"--decentralized.compressor=topk", "apply to choco only"},
      {"--decentralized.gamma=0.5", "unknown config key 'decentralized.gamma'"},  // dpsgd has none
      {"--decentralized.topology=random_regular", "no 4-regular graph on 4 nodes"},
      {"--decentralized.topology_options.degree=2", "unknown config key"},  // ring takes none
      {"--decentralized.lr=-1", "decentralized.lr"},
      {"--decentralized.partition=dirichlet:-1", "dirichlet:-1"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.flag);
    TempDir dir;
    Process server = Process::spawn(
        COHORT_SERVER_BIN, {"--server.mode=decentralized", "--insecure", "--listen",
                            "tcp://127.0.0.1:*", "--port-file", dir.file("port"), c.flag});
    CHECK(exit_code(server, 30s) == 1);
    const std::string line = first_line_with(server.stderr_text(), c.expected);
    MESSAGE(line);
    CHECK(!line.empty());
  }
}

TEST_CASE("cohort-sim and cohort-decentralized-sim refuse unknown and inapplicable options at start-up") {
  TempDir dir;
  struct Case {
    std::string binary;
    std::vector<std::string> args;
    std::string expected;
  };
  std::ofstream(dir.file("extra.toml")) << "nodes = 4\nstesp = 10\n";
  const std::vector<Case> cases = {
      {COHORT_SIM_BIN, {"--train.lrr=0.1", "--sim.clients=2"}, "unknown config key 'train.lrr'"},
      {COHORT_SIM_BIN, {"--processes", "--train.lrr=0.1", "--sim.clients=2"}, "train.lrr"},
      {COHORT_SIM_BIN, {"--train.device=cuda:0", "--sim.clients=2"}, "train.device"},
      {COHORT_SIM_BIN, {"--train.threads=4", "--sim.clients=2"}, "train.threads"},
      {COHORT_DSIM_BIN, {"--config", dir.file("extra.toml")}, "stesp"},
      {COHORT_DSIM_BIN, {"--algos", "dpsgd", "--compressor", "topk"}, "apply to choco only"},
      {COHORT_DSIM_BIN, {"--algos", "dpsgd", "--gamma", "0.2"}, "--gamma applies to none"},
      {COHORT_DSIM_BIN, {"--nodes", "4", "--topology", "random_regular"}, "no 4-regular graph"},
      {COHORT_DSIM_BIN,
       {"--algos", "choco", "--compressor", "topk", "--compressor-option", "k_fractoin=0.1"},
       "k_fractoin"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.expected);
    Process p = Process::spawn(c.binary, c.args);
    CHECK(exit_code(p, 60s) != 0);
    const std::string line = first_line_with(p.stderr_text(), c.expected);
    MESSAGE(line);
    CHECK(!line.empty());
  }
}

TEST_CASE("cohort-decentralized-sim passes topology, compressor and allreduce options through") {
  // random_regular's default degree 4 has no graph on 4 nodes; degree 2 (a 4-cycle) does.
  Process p = Process::spawn(
      COHORT_DSIM_BIN, {"--nodes", "4", "--topology", "random_regular", "--topology-option",
                        "degree=2", "--algos", "dpsgd,choco,ring_allreduce", "--compressor",
                        "topk", "--compressor-option", "k_fraction=0.1", "--compressor-option",
                        "error_feedback=true", "--allreduce", "recursive_doubling", "--steps", "20",
                        "--model", "mlp:784-16-10", "--partition", "iid"});
  REQUIRE(exit_code(p, 240s) == 0);
  const std::string out = p.stdout_text();
  MESSAGE(out);
  CHECK(out.find("\"algo\":\"choco\"") != std::string::npos);
  CHECK(out.find("\"allreduce\":\"recursive_doubling\"") != std::string::npos);
}
