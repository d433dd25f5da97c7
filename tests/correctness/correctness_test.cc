// Issue 21's findings, each through the real programs: FedBuff runs every step to the end, a round
// the rule cannot aggregate commits on no shard, the coordinator's name is pinned, every option is
// checked at start-up, and a restarted coordinator reopens its round on every shard.
#include <doctest/doctest.h>

#include <csignal>
#include <thread>

#include "cohort/server/checkpoint.h"
#include "federation.h"

using namespace std::chrono_literals;
using cohort::test::Federation;
using cohort::test::Process;
using Clock = std::chrono::steady_clock;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr int kSlow = 5;  // AddressSanitizer: everything takes several times longer
#else
constexpr int kSlow = 1;
#endif

// Waits until `text()` contains `needle`, polling every 20 ms for at most `timeout`.
template <typename Text>
bool wait_for_text(Text text, const std::string& needle, std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  while (Clock::now() < until) {
    if (text().find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(20ms);
  }
  return text().find(needle) != std::string::npos;
}

// Runs cohort-server with `args` (plaintext: the checks come before any socket) and returns its
// exit code and stderr.
std::pair<int, std::string> start_up(std::vector<std::string> args) {
  args.insert(args.end(), {"--insecure", "--listen", "tcp://127.0.0.1:*"});
  auto p = Process::spawn(COHORT_SERVER_BIN, args);
  const auto code = p.wait_for(20s);
  return {code.value_or(-1), p.stderr_text()};
}

}  // namespace

TEST_CASE("FedBuff runs every step to the end: 1 and 2 shards, buffer sizes 1 to 3, concurrency 1 to 4") {
  struct Layout {
    int shards, clients, k, concurrency, steps;
  };
  // The first is the report's: rounds = 3, K = 1, concurrency = 1 stopped after 2 steps.
  for (const Layout l : {Layout{1, 2, 1, 1, 3}, Layout{2, 3, 2, 3, 8}, Layout{2, 4, 1, 4, 12},
                         Layout{1, 3, 3, 2, 5}}) {
    CAPTURE(l.shards);
    CAPTURE(l.k);
    CAPTURE(l.concurrency);
    CAPTURE(l.steps);
    Federation f(l.shards, l.clients,
                 {"--server.mode=fedbuff", "--server.rounds=" + std::to_string(l.steps),
                  "--server.buffer_size=" + std::to_string(l.k),
                  "--server.concurrency=" + std::to_string(l.concurrency),
                  "--server.min_clients=" + std::to_string(l.clients), "--server.eval_every=2",
                  "--train.steps=20", "--train.lr=0.05"});
    f.start();
    REQUIRE(f.wait(std::chrono::seconds(180 * kSlow)) == 0);
    const auto steps = f.records("round");
    REQUIRE(steps.size() == static_cast<std::size_t>(l.steps));
    for (std::size_t i = 0; i < steps.size(); ++i) {
      CHECK(steps[i]["round"] == i + 1);  // every step has its line, in order
      CHECK(steps[i]["clients"].get<int>() >= 1);  // updates the step averaged
      // ... each with its client's report, even one that came in after the step.
      CHECK(steps[i]["selected"] == steps[i]["clients"]);
      CHECK(steps[i]["train_loss"].get<double>() > 0);
      // Evaluated every 2 steps and after the last: a step waiting for its evaluation is not
      // merged into the next one's line.
      if ((i + 1) % 2 == 0 || i + 1 == steps.size()) CHECK(steps[i].contains("test_accuracy"));
    }
    const auto done = f.records("done");
    REQUIRE(done.size() == 1);
    CHECK(done[0]["rounds"] == l.steps);
    CHECK(steps.back()["test_accuracy"].get<double>() > 0.3);  // trained, not stuck at chance
    for (auto& c : f.clients) CHECK(c.wait_for(20s) == 0);
  }
}

TEST_CASE("Krum with a cohort below 2f+3 is refused at start-up with a message naming 2f+3") {
  const auto [code, err] = start_up({"--aggregator.name=krum", "--aggregator.f=1",
                                     "--server.clients_per_round=4", "--server.min_updates=1"});
  CHECK(code == 1);
  CHECK(err.find("2f+3 = 5") != std::string::npos);
  CHECK(err.find("server.clients_per_round = 4") != std::string::npos);
  const auto [bcode, berr] = start_up({"--aggregator.name=bulyan", "--aggregator.f=1",
                                       "--server.clients_per_round=6", "--server.min_updates=1"});
  CHECK(bcode == 1);
  CHECK(berr.find("4f+3 = 7") != std::string::npos);
}

TEST_CASE("a round the rule cannot aggregate commits on no shard: it fails, logged and recorded") {
  // Krum with f = 1 needs 5 updates; the cohort is 5 but only 4 clients exist, so every round
  // closes with 4 (all selected clients reported) and must fail, on both shards.
  Federation f(2, 4, {"--aggregator.name=krum", "--aggregator.f=1", "--server.clients_per_round=5",
                      "--server.min_clients=4", "--server.min_updates=1", "--server.rounds=3",
                      "--server.max_failed_rounds=2", "--train.steps=5"});
  f.start();
  const auto code = f.server(0).wait_for(std::chrono::seconds(120 * kSlow));
  REQUIRE(code.has_value());
  CHECK(*code == 1);  // gave up after server.max_failed_rounds, with the reason
  const std::string log = f.server(0).stderr_text();
  CHECK(log.find("round 1 failed") != std::string::npos);
  CHECK(log.find("krum") != std::string::npos);
  CHECK(f.records("round").empty());  // no round was counted as committed
  const auto failed = f.records("round_failed");
  REQUIRE(failed.size() == 2);
  CHECK(failed[0]["clients"] == 4);
  CHECK(failed[0]["reason"].get<std::string>().find("krum") != std::string::npos);
  // Neither shard moved: both still hold round 0's model.
  for (int i = 0; i < 2; ++i) {
    cohort::server::CheckpointStore store(f.checkpoint_dir(), "shard-" + std::to_string(i));
    auto state = store.load_latest();
    if (state) CHECK(state->version == 0);
  }
}

TEST_CASE("a rule that refuses on one shard fails the round on both: no shard applies it") {
  // mlp:784-15-10 has 11,935 parameters: shard 0 owns 5,968, shard 1 5,967, whose rule refuses.
  Federation f(2, 2, {"--plugin", COHORT_TEST_PLUGIN_GOOD, "--aggregator.name=test_plugin_refuses_odd",
                      "--model.spec=mlp:784-15-10", "--server.clients_per_round=2",
                      "--server.min_clients=2", "--server.rounds=2", "--server.max_failed_rounds=2",
                      "--train.steps=5"});
  f.start();
  const auto code = f.server(0).wait_for(std::chrono::seconds(120 * kSlow));
  REQUIRE(code.has_value());
  CHECK(*code == 1);  // two failed rounds in a row: server.max_failed_rounds
  CHECK(f.records("round").empty());
  const auto failed = f.records("round_failed");
  REQUIRE(failed.size() == 2);
  CHECK(failed[0]["clients"] == 2);
  CHECK(failed[0]["reason"].get<std::string>().find("shard 1") != std::string::npos);
  // Shard 0's rule could aggregate, yet it did not apply: every shard is still at version 0.
  for (int i = 0; i < 2; ++i) {
    cohort::server::CheckpointStore store(f.checkpoint_dir(), "shard-" + std::to_string(i));
    auto state = store.load_latest();
    if (state) CHECK(state->version == 0);
  }
}

TEST_CASE("shards pin the coordinator's name: a server with another node's certificate is refused") {
  Federation f(2, 4, {});
  // The impostor: a coordinator started with client-3's certificate (same CA), which it names as
  // the coordinator for itself; shard 1 keeps the default tls.coordinator_name = shard-0.
  std::vector<std::string> a{"--shard", "0", "--shards", "2", "--listen", "tcp://127.0.0.1:*",
                             "--port-file", f.file("impostor.port"), "--name", "client-3",
                             "--tls.coordinator_name=client-3",
                             "--server.metrics_file=" + f.file("impostor.jsonl")};
  const auto tls = f.tls("client-3");
  a.insert(a.end(), tls.begin(), tls.end());
  auto impostor = Process::spawn(COHORT_SERVER_BIN, a);
  const std::string url = "tcp://127.0.0.1:" + cohort::test::read_when_ready(f.file("impostor.port"), 20s);
  std::vector<std::string> b{"--shard", "1", "--shards", "2", "--listen", "tcp://127.0.0.1:*",
                             "--coordinator", url};
  const auto tls1 = f.tls("shard-1");
  b.insert(b.end(), tls1.begin(), tls1.end());
  auto shard1 = Process::spawn(COHORT_SERVER_BIN, b);
  CHECK(wait_for_text([&] { return shard1.stderr_text(); }, "client-3", std::chrono::seconds(20 * kSlow)));
  std::this_thread::sleep_for(1s);
  CHECK(impostor.stderr_text().find("shard registered") == std::string::npos);
  MESSAGE("shard 1: " << shard1.stderr_text().substr(0, 1500));

  // And a coordinator whose own name is not tls.coordinator_name does not start at all.
  const auto [code, err] = start_up({"--name", "client-3"});
  CHECK(code == 1);
  CHECK(err.find("tls.coordinator_name") != std::string::npos);
}

TEST_CASE("options a mode cannot honour, unknown keys and bad values stop cohort-server at start-up") {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const Case cases[] = {
      {{"--train.bogus=1"}, "bogus"},
      {{"--train.device=cuda:0"}, "train.device"},
      {{"--train.threads=4"}, "train.threads"},
      {{"--train.lr=-1"}, "[train]"},
      {{"--server.selection=bogus"}, "server.selection"},
      {{"--server.mode=fedbuff", "--server.min_updates=3"}, "server.min_updates"},
      {{"--server.mode=fedbuff", "--aggregator.name=median"}, "[aggregator]"},
      {{"--server.mode=dataparallel", "--server.rounds=5"}, "server.rounds"},
      {{"--server.mode=federated", "--server.buffer_size=3"}, "server.buffer_size"},
      {{"--server.mode=federated", "--decentralized.peers=4"}, "[decentralized]"},
      {{"--server.min_updates=11"}, "can never be reached"},
      {{"--server_optimizer.name=bogus"}, "bogus"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args.front());
    const auto [code, err] = start_up(c.args);
    CHECK(code == 1);
    CHECK(err.find(c.says) != std::string::npos);
    CHECK(std::count(err.begin(), err.end(), '\n') <= 1);  // one line
  }
}

TEST_CASE("a restarted coordinator reopens its round on every shard: no shard keeps the old round's update") {
  // Client 2 is stopped (SIGSTOP) as soon as it registers, so round 1 stays open while clients 0
  // and 1 push to both shards; then the coordinator is killed and restarted at the same address.
  // Clients train with 2 threads: a retrained update need not equal the first one bit for bit.
  Federation f(2, 3, {"--server.rounds=2", "--server.clients_per_round=3", "--server.min_clients=3",
                      "--server.round_deadline_ms=" + std::to_string(60000 * kSlow),
                      "--train.epochs=2"});
  f.shard_log_level = "debug";  // shard 1's "applied the update of" lines
  for (int i = 0; i < 3; ++i) f.client_extra[i] = {"--client.threads=2"};
  f.start();
  auto log0 = [&] { return f.server(0).stderr_text(); };
  auto log1 = [&] { return f.server(1).stderr_text(); };
  REQUIRE(wait_for_text(log0, "client registered: client-2", std::chrono::seconds(60 * kSlow)));
  f.clients[2].kill(SIGSTOP);
  REQUIRE(wait_for_text(log1, "applied the update of client-0", std::chrono::seconds(60 * kSlow)));
  REQUIRE(wait_for_text(log1, "applied the update of client-1", std::chrono::seconds(60 * kSlow)));
  const std::string before = log1();
  f.server(0).kill(9);
  // The same flags at the same address, so clients and shard 1 find it again.
  auto args = f.shard_args(0);
  for (auto& a : args) {
    if (a == "tcp://127.0.0.1:*") a = f.coordinator();
  }
  f.server(0) = Process::spawn(COHORT_SERVER_BIN, args);
  f.clients[2].kill(SIGCONT);
  REQUIRE(f.wait(std::chrono::seconds(240 * kSlow)) == 0);
  const std::string after = log1().substr(before.size());
  MESSAGE("shard 1 after the restart:\n" << after.substr(0, 3000));
  CHECK(after.find("the coordinator restarted") != std::string::npos);
  CHECK(after.find("already applied") == std::string::npos);  // the old update was not kept
  // Every shard's model belongs to the same committed round.
  cohort::server::CheckpointStore s0(f.checkpoint_dir(), "shard-0"), s1(f.checkpoint_dir(), "shard-1");
  const auto c0 = s0.load_latest(), c1 = s1.load_latest();
  REQUIRE(c0.has_value());
  REQUIRE(c1.has_value());
  CHECK(c0->round == c1->round);
  CHECK(c0->version == c1->version);
  CHECK(c0->version == 2);
}
