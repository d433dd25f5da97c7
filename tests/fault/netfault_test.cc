// Multi-host faults: a shard and clients each in their own network namespace, on the addresses
// of those namespaces only, over veth links that are delayed (a relay), lossy (nftables), capped
// (tbf) and cut; and a disk that fills while a shard checkpoints (a small tmpfs). Root only: each
// case says why it is skipped otherwise. Every process is killed and every namespace and mount is
// removed by destructors, also when a check fails.
#include <doctest/doctest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "skip.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/server/checkpoint.h"
#include "cohort/transport/security/keygen.h"
#include "netns.h"
#include "process.h"

using namespace std::chrono_literals;
using cohort::test::NetLab;
using cohort::test::Process;
using cohort::test::TempDir;

namespace {

constexpr const char* kModel = "mlp:784-32-10";

std::vector<nlohmann::json> records(const std::string& file, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == event) out.push_back(j);
  }
  return out;
}

bool skip_without_lab() {
  const std::string why = NetLab::unavailable();
  if (!why.empty()) cohort::test::skip_test_case(why);
  return !why.empty();
}

// Waits (bounded) until `done()` holds; false on timeout.
template <typename Pred>
bool wait_until(Pred done, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A federation of one shard and N clients, each in its own namespace, over TLS.
class NetFederation {
 public:
  NetFederation(NetLab& lab, int clients, std::vector<std::string> server_args)
      : lab_(lab), clients_(clients), server_args_(std::move(server_args)) {
    namespace sec = cohort::transport::security;
    sec::generate_ca(dir_.path() / "ca");
    sec::generate_node(dir_.path() / "ca", "shard-0", dir_.path() / "certs");
    shard_address = lab.add_host("shard");
    for (int i = 0; i < clients; ++i) {
      sec::generate_node(dir_.path() / "ca", client(i), dir_.path() / "certs");
      lab.add_host(client(i));
    }
  }

  static std::string client(int i) { return "client-" + std::to_string(i); }

  std::vector<std::string> tls(const std::string& name) const {
    return {"--tls.ca_file=" + dir_.file("ca/ca.pem"), "--tls.cert_file=" + dir_.file("certs/" + name + ".pem"),
            "--tls.key_file=" + dir_.file("certs/" + name + ".key")};
  }

  // Starts the shard bound to its namespace's address; clients dial `url` (default: the shard).
  void start(std::string url = {}) {
    std::vector<std::string> a{"--listen", "tcp://" + shard_address + ":7000", "--log-level", "debug",
                               "--server.metrics_file=" + metrics(), "--model.spec=" + model};
    a.insert(a.end(), server_args_.begin(), server_args_.end());
    auto t = tls("shard-0");
    a.insert(a.end(), t.begin(), t.end());
    server = lab_.spawn("shard", COHORT_SERVER_BIN, a);
    if (url.empty()) url = "tcp://" + shard_address + ":7000";
    for (int i = 0; i < clients_; ++i) {
      std::vector<std::string> c{"--server", url, "--name", client(i), "--data", "iid", "--part",
                                 std::to_string(i) + "/" + std::to_string(clients_), "--log-level", client_log_level};
      auto ct = tls(client(i));
      c.insert(c.end(), ct.begin(), ct.end());
      clients.push_back(lab_.spawn(client(i), COHORT_CLIENT_BIN, c));
    }
  }

  std::string metrics() const { return dir_.file("metrics.jsonl"); }

  int wait(std::chrono::seconds timeout) {
    const auto code = server->wait_for(timeout);
    if (!code || *code != 0) dump();
    return code.value_or(-1);
  }

  void dump() {
    MESSAGE("shard stderr (tail):\n" << tail(server->stderr_text(), 6000));
    for (std::size_t i = 0; i < clients.size(); ++i) {
      MESSAGE("client " << i << " stderr (tail):\n" << tail(clients[i].stderr_text(), 2500));
    }
  }

  static std::string tail(const std::string& s, std::size_t n) {
    return s.size() <= n ? s : s.substr(s.size() - n);
  }

  std::string shard_address;
  std::string client_log_level = "info";
  std::string model = kModel;
  std::optional<Process> server;
  std::vector<Process> clients;

 private:
  NetLab& lab_;
  TempDir dir_;
  int clients_;
  std::vector<std::string> server_args_;
};

// The (client, round) pairs the shard folded into its model, from its debug log.
std::multiset<std::pair<std::string, int>> applied_updates(const std::string& log) {
  std::multiset<std::pair<std::string, int>> out;
  static const std::regex re("applied the update of (\\S+) for round (\\d+)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it) {
    out.insert({(*it)[1].str(), std::stoi((*it)[2].str())});
  }
  return out;
}

}  // namespace

TEST_CASE("50 +- 10 ms delay, 1% loss, 10 Mbit/s links: a federation over TLS completes and learns") {
  if (skip_without_lab()) return;
  NetLab lab;
  NetFederation f(lab, 3, {"--server.rounds=3", "--server.clients_per_round=3", "--server.min_clients=3",
                           "--server.round_deadline_ms=120000", "--train.epochs=1", "--train.lr=0.05"});
  for (const char* h : {"shard", "client-0", "client-1", "client-2"}) lab.cap(h, 10);
  for (const char* h : {"client-0", "client-1", "client-2"}) lab.lose(h, 1);
  // The relay runs beside the shard: every byte between a client and the shard is delayed there
  // once each way, after crossing the client's lossy, capped link.
  Process relay = lab.spawn("shard", COHORT_DELAY_RELAY_BIN,
                            {f.shard_address, "7100", f.shard_address, "7000", "50", "10"});
  REQUIRE(wait_until([&] { return relay.stdout_text().find("relay ready") != std::string::npos; }, 30s));
  f.start("tcp://" + f.shard_address + ":7100");
  REQUIRE(f.wait(240s) == 0);
  std::uint64_t lost = 0;
  for (const char* h : {"client-0", "client-1", "client-2"}) lost += lab.lost(h);
  MESSAGE("packets dropped by the 1% loss rules: " << lost);
  const auto rounds = records(f.metrics(), "round");
  REQUIRE(rounds.size() == 3);
  for (const auto& r : rounds) CHECK(r["clients"] == 3);
  // server.work = deadline (the default): round 1 measures everyone with one step; rounds 2 and 3
  // train at least an epoch each, sized from what the clients measured over these links.
  const double second = rounds[1]["test_accuracy"];
  const double last = rounds.back()["test_accuracy"];
  MESSAGE("accuracy after rounds 2 and 3 over slow lossy links: " << second << ", " << last
          << "; round seconds " << rounds.back()["round_seconds"]);
  for (const auto& c : records(f.metrics(), "client")) {
    if (c["round_id"] != 1) CHECK(c["assigned_steps"].get<std::uint64_t>() >= 313);  // 20000 / 64
  }
  CHECK(second > 0.5);
  CHECK(last > 0.7);  // as on loopback: these links slow a federation down, they change no update
  for (auto& c : f.clients) CHECK(c.wait_for(60s) == 0);
}

TEST_CASE("a client's link cut mid-round: the round closes at its deadline, the client rejoins later") {
  if (skip_without_lab()) return;
  NetLab lab;
  // Enough rounds after the restore (each takes 0.08-0.15 s on an idle machine) for client-2 to
  // reconnect (a connect attempt lasts at most 2 s, retried every 2 s at most) and be selected
  // again.
  constexpr std::size_t kRounds = 40;
  NetFederation f(lab, 3, {"--server.rounds=" + std::to_string(kRounds), "--server.clients_per_round=3",
                           "--server.min_clients=3", "--server.min_updates=2",
                           "--server.round_deadline_ms=10000", "--server.client_timeout_ms=120000",
                           "--train.epochs=3", "--server.work=fixed"});
  f.client_log_level = "debug";  // the endpoints' "disconnected" lines
  f.start();
  auto joined = [&](int i) {
    return f.clients[static_cast<std::size_t>(i)].stderr_text().find("joined") != std::string::npos;
  };
  // Round 1 starts when the third client has joined; three local epochs keep it busy a while.
  REQUIRE(wait_until([&] { return joined(0) && joined(1) && joined(2); }, 120s));
  lab.cut("client-2");
  // Round 1 can close only at its deadline: client-2 can neither push nor report.
  REQUIRE(wait_until([&] { return !records(f.metrics(), "round").empty(); }, 120s));
  const auto first = records(f.metrics(), "round").front();
  CHECK(first["round"] == 1);
  CHECK(first["selected"] == 3);
  CHECK(first["clients"] == 2);
  // client-2 notices the dead link while it is still down (TCP_USER_TIMEOUT, 5 heartbeats), so it
  // is already reconnecting when the link returns. Without that it noticed only when TCP's
  // retransmission backoff next fired after the restore, up to tens of seconds later.
  const auto noticed = [&] {
    return f.clients[2].stderr_text().find(": disconnected") != std::string::npos;
  };
  CHECK(wait_until(noticed, 30s));
  lab.restore("client-2");
  REQUIRE(f.wait(300s) == 0);
  const auto rounds = records(f.metrics(), "round");
  REQUIRE(rounds.size() == kRounds);
  // Back on line, client-2 is selected again and its update counts in a later round.
  bool rejoined = false;
  for (std::size_t i = 1; i < rounds.size(); ++i) rejoined = rejoined || rounds[i]["clients"] == 3;
  CHECK(rejoined);
  if (!rejoined) f.dump();
  const auto applied = applied_updates(f.server->stderr_text());
  CHECK(applied.count({"client-2", 1}) == 0);
  int later = 0;
  const int last = rounds.back()["round_id"];
  for (int r = 2; r <= last; ++r) later += static_cast<int>(applied.count({"client-2", r}));
  CHECK(later >= 1);
  MESSAGE("updates of client-2 applied after the cut: " << later);
  for (auto& c : f.clients) CHECK(c.wait_for(60s) == 0);
}

TEST_CASE("the shard's link cut for 10 s: clients retry with backoff and resume; no update lost or applied twice") {
  if (skip_without_lab()) return;
  NetLab lab;
  NetFederation f(lab, 3, {"--server.rounds=5", "--server.clients_per_round=3", "--server.min_clients=3",
                           "--server.round_deadline_ms=90000", "--server.client_timeout_ms=120000",
                           "--train.epochs=1"});
  f.client_log_level = "debug";  // the endpoints' connection events, for the dump
  f.start();
  // Cut when the first update of round 2 is in: the other pushes, acks and reports of the round
  // are in flight or still to come.
  REQUIRE(wait_until([&] {
    return f.server->stderr_text().find("for round 2") != std::string::npos;
  }, 180s));
  lab.cut("shard");
  std::this_thread::sleep_for(10s);
  lab.restore("shard");
  REQUIRE(f.wait(300s) == 0);
  const auto rounds = records(f.metrics(), "round");
  REQUIRE(rounds.size() == 5);
  const auto applied = applied_updates(f.server->stderr_text());
  bool consistent = true;
  for (const auto& r : rounds) {
    const int round = r["round_id"];  // the id pushes carry; "round" counts committed rounds
    CAPTURE(round);
    // A round's clients are those connected when it starts. Every update the shard folded in is
    // counted by the coordinator (none lost), and none is folded in twice.
    int in_round = 0;
    for (int i = 0; i < 3; ++i) {
      const auto n = applied.count({NetFederation::client(i), round});
      CHECK(n <= 1);
      in_round += static_cast<int>(n);
    }
    CHECK(r["clients"] == in_round);
    consistent = consistent && r["clients"] == in_round;
  }
  // Every client came back after the cut and had an update applied in a later round.
  const int last = rounds.back()["round_id"];
  bool all_back = true;
  for (int i = 0; i < 3; ++i) {
    int later = 0;
    for (int r = 3; r <= last; ++r) later += static_cast<int>(applied.count({NetFederation::client(i), r}));
    CAPTURE(i);
    CHECK(later >= 1);
    all_back = all_back && later >= 1;
  }
  if (!consistent || !all_back) f.dump();
  const std::string log = f.server->stderr_text();
  MESSAGE("resends acknowledged as already applied: " << count(log, "already applied: acknowledged again"));
  std::size_t retries = 0;
  for (auto& c : f.clients) {
    CHECK(c.wait_for(60s) == 0);
    retries += count(c.stderr_text(), "registering again") + count(c.stderr_text(), "unreachable");
  }
  MESSAGE("client reconnects and resends logged: " << retries);
}

TEST_CASE("a client's link cut mid-push for 8 s: its resend continues the update, applied once") {
  if (skip_without_lab()) return;
  NetLab lab;
  // A 6.5 MB update (1.6M parameters) through an 8 Mbit/s link takes about 7 s: the cut lands
  // with part of it in, the rest queued in the dead connection and lost with it.
  NetFederation f(lab, 1, {"--server.rounds=2", "--server.clients_per_round=1", "--server.min_clients=1",
                           "--server.round_deadline_ms=120000", "--server.client_timeout_ms=120000",
                           "--train.steps=2"});
  f.model = "mlp:784-2048-10";
  f.client_log_level = "debug";  // "pushing its update", and the endpoint's connection events
  f.start();
  lab.cap("client-0", 8);
  REQUIRE(wait_until([&] {
    return f.clients[0].stderr_text().find("pushing its update for round 1") != std::string::npos;
  }, 120s));
  std::this_thread::sleep_for(2s);
  lab.cut("client-0");
  std::this_thread::sleep_for(8s);
  lab.restore("client-0");
  // The link stays at 8 Mbit/s to the end: the client resends neither a push still queued in its
  // socket nor a pull whose reply is streaming in. Before that, whole copies queued behind each
  // other there, and the client missed the coordinator's goodbye and exited 1 at
  // client.connect_timeout_ms.
  const int code = f.wait(240s);
  REQUIRE(code == 0);
  const std::string log = f.server->stderr_text();
  const bool continued = log.find("the resend continues it") != std::string::npos;
  CHECK(continued);
  CHECK(f.clients[0].stderr_text().find(": disconnected") != std::string::npos);
  const auto applied = applied_updates(log);
  CHECK(applied.count({"client-0", 1}) == 1);
  const auto rounds = records(f.metrics(), "round");
  REQUIRE(rounds.size() == 2);
  CHECK(rounds[0]["clients"] == 1);
  CHECK(rounds[1]["clients"] == 1);
  const auto client_code = f.clients[0].wait_for(60s);
  CHECK(client_code == 0);
  if (!continued || client_code != 0) f.dump();
}

TEST_CASE("a disk that fills while checkpointing: the shard goes on, the previous checkpoint stays loadable") {
  if (::geteuid() != 0) {
    cohort::test::skip_test_case("needs root (mounts a small tmpfs)");
    return;
  }
  TempDir dir;
  const std::filesystem::path disk = dir.path() / "disk";
  std::filesystem::create_directory(disk);
  // Room for one checkpoint and a half: the second can never be written next to the first.
  const std::uint64_t params = cohort::kernels::make_network_spec(kModel).parameter_count();
  const std::uint64_t size = (params * 4 * 3 / 2 + 4095) / 4096 * 4096;
  const std::string opts = "size=" + std::to_string(size) + ",mode=0755";
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    cohort::test::skip_test_case(std::string("cannot mount a tmpfs here: ") + std::strerror(errno));
    return;
  }
  struct Unmount {
    std::filesystem::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{disk};
  const std::string ckpt = (disk / "ckpt").string();
  Process server = Process::spawn(COHORT_SERVER_BIN,
      {"--insecure", "--listen", "tcp://127.0.0.1:*", "--port-file", dir.file("port"), "--log-level", "info",
       "--server.metrics_file=" + dir.file("metrics.jsonl"), "--model.spec=" + std::string(kModel),
       "--server.rounds=3", "--server.clients_per_round=2", "--server.min_clients=2",
       "--server.checkpoint_dir=" + ckpt, "--train.epochs=1"});
  const std::string url = "tcp://127.0.0.1:" + cohort::test::read_when_ready(dir.file("port"), 30s);
  std::vector<Process> clients;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(Process::spawn(COHORT_CLIENT_BIN,
        {"--insecure", "--server", url, "--name", "client-" + std::to_string(i), "--data", "iid",
         "--part", std::to_string(i) + "/2"}));
  }
  const auto code = server.wait_for(240s);
  const std::string log = server.stderr_text();
  if (code != 0) MESSAGE(log.substr(log.size() > 6000 ? log.size() - 6000 : 0));
  REQUIRE(code == 0);
  CHECK(records(dir.file("metrics.jsonl"), "round").size() == 3);
  CHECK(count(log, "checkpoint failed, the previous one stays") >= 2);
  CHECK(log.find("No space left on device") != std::string::npos);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(ckpt)) names.push_back(e.path().filename());
  CHECK(names == std::vector<std::string>{"shard-0-000000000001.ckpt"});  // no temporary file left
  cohort::server::CheckpointStore store(ckpt, "shard-0");
  std::vector<std::string> skipped;
  const auto state = store.load_latest(&skipped);
  REQUIRE(state);
  CHECK(skipped.empty());
  CHECK(state->round == 1);
  CHECK(state->params.size() == params);
  for (auto& c : clients) CHECK(c.wait_for(60s) == 0);
}
