// Whole simulations in this process: the real server shards on threads, the fleet, the clock.
#include "cohort/sim/sim.h"

#include <doctest/doctest.h>

#include <cmath>

#include <algorithm>
#include <atomic>
#include <exception>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cohort/aggregation/registries.h"
#include "cohort/client/trainer.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/memory_plan.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/transport/endpoint.h"
#include "fleet.h"
#include "measurements.h"
#include "options.h"
#include "process.h"
#include "sim_clock.h"

namespace cohort::sim {
namespace {

using nlohmann::json;

Config make_config(const test::TempDir& dir, std::vector<std::string> overrides) {
  std::vector<std::string> base{
      "sim.progress=false",
      "sim.metrics_file=" + (dir.path() / "sim.jsonl").string(),
      "sim.csv_file=" + (dir.path() / "sim.csv").string(),
      "server.metrics_file=" + (dir.path() / "server.jsonl").string(),
      "server.eval_every=1",
      "model.spec=mlp:784-16-10",
      "train.epochs=1",
      "train.batch_size=32",
      "train.lr=0.05",
      "sim.threads=2",
  };
  base.insert(base.end(), overrides.begin(), overrides.end());
  return Config::load(sim_config_schema(), std::nullopt, base);
}

// The records of one event type in a JSON-lines file.
std::vector<json> records(const std::filesystem::path& path, const std::string& event) {
  std::ifstream in(path);
  REQUIRE(in);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = json::parse(line);
    if (j.value("event", "") == event) out.push_back(std::move(j));
  }
  return out;
}

// A metrics file without the host's timings: every wall_* field, and the server's round_seconds.
std::string without_wall_clock(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::string out, line;
  while (std::getline(in, line)) {
    auto j = json::parse(line);
    for (auto it = j.begin(); it != j.end();) {
      const std::string& k = it.key();
      it = k.rfind("wall_", 0) == 0 || k == "round_seconds" ? j.erase(it) : std::next(it);
    }
    out += j.dump() + "\n";
  }
  return out;
}

bool server_config_schema_has(std::string_view key) {
  return sim_config_schema().find(key) != nullptr;
}

Summary run(const Config& config) {
  set_log_level(LogLevel::Warn);  // a line per registered client otherwise
  const auto registries = builtin_registries();
  std::atomic<bool> stop{false};
  return run_in_process(config, registries, stop);
}

TEST_CASE("a multiplexed inproc DEALER speaks for many nodes and the ROUTER answers each by name") {
  using namespace std::chrono_literals;
  transport::Context ctx;
  transport::EndpointOptions ro;
  ro.node_id = "router";
  ro.multiplex = true;
  auto router = transport::Endpoint::bind(ctx, "inproc://sim-test-multiplex", ro);
  transport::EndpointOptions fo;
  fo.node_id = "fleet";
  fo.multiplex = true;
  auto fleet = transport::Endpoint::connect(ctx, "inproc://sim-test-multiplex", fo);
  for (const char* name : {"c00001", "c00002"}) {
    transport::Envelope e;
    e.sender = name;
    e.body = transport::Heartbeat{};
    fleet.send({}, std::move(e));
  }
  std::vector<transport::PeerHandle> handles;
  for (int i = 0; i < 2; ++i) {
    auto m = router.receive(5000ms);
    REQUIRE(m);
    CHECK(m->sender == (i == 0 ? "c00001" : "c00002"));
    CHECK(router.peer_id(m->peer) == m->sender);
    handles.push_back(m->peer);
    transport::Envelope reply;
    reply.body = transport::Bye{m->sender};
    CHECK(router.send(m->peer, std::move(reply)));
  }
  CHECK(handles[0] != handles[1]);  // one connection, two peers
  for (int i = 0; i < 2; ++i) {
    auto m = fleet.receive(5000ms);
    REQUIRE(m);
    CHECK(m->envelope.recipient == std::get<transport::Bye>(m->envelope.body).reason);
  }
  // Only inside the process: over tcp the option is refused.
  transport::EndpointOptions tcp = fo;
  tcp.security.insecure = true;
  CHECK_THROWS_AS(transport::Endpoint::connect(ctx, "tcp://127.0.0.1:1", tcp), ConfigError);
}

TEST_CASE("1,000 virtual clients with a small model complete their rounds") {
  test::TempDir dir;
  const Config config = make_config(dir, {"sim.clients=1000", "server.clients_per_round=20",
                                          "server.rounds=3", "train.batch_size=8", "train.lr=0.1"});
  const Summary s = run(config);
  CHECK(s.committed == 3);
  CHECK(s.rounds == 3);
  const auto rounds = records(dir.path() / "sim.jsonl", "sim_round");
  REQUIRE(rounds.size() == 3);
  for (const auto& r : rounds) {
    CHECK(r["selected"] == 20);
    CHECK(r["completed"] == 20);
    CHECK(r["committed"] == true);
  }
  // It learns: the test loss falls and the accuracy ends well above chance (0.1).
  CHECK(rounds.back()["test_loss"].get<double>() < rounds.front()["test_loss"].get<double>());
  CHECK(rounds.back()["test_accuracy"].get<double>() > 0.3);
  // The real coordinator saw the same rounds.
  const auto server_rounds = records(dir.path() / "server.jsonl", "round");
  REQUIRE(server_rounds.size() == 3);
  CHECK(server_rounds.back()["clients"] == 20);
  CHECK(server_rounds.back()["test_accuracy"].get<double>() ==
        doctest::Approx(rounds.back()["test_accuracy"].get<double>()).epsilon(1e-6));
}

// An example config as shipped, made shorter: 3 rounds of 10 of 40 clients. Returns its
// per-round records (after checking that 3 committed).
std::vector<json> run_shortened_example(const test::TempDir& dir, const char* example) {
  const std::vector<std::string> overrides{
      "sim.clients=40",
      "server.clients_per_round=10",
      "server.rounds=3",
      "sim.threads=2",
      "sim.metrics_file=" + (dir.path() / "sim.jsonl").string(),
      "sim.progress=false"};
  const Config config = Config::load(
      sim_config_schema(), std::filesystem::path(COHORT_EXAMPLES_DIR) / example, overrides);
  CHECK(config.get_string("model.spec").starts_with("net:1x28x28,\n"));
  const Summary s = run(config);
  CHECK(s.committed == 3);
  return records(dir.path() / "sim.jsonl", "sim_round");
}

TEST_CASE("a CNN written layer by layer in a TOML file trains in the simulator" *
          doctest::test_suite("long")) {
  test::TempDir dir;
  const auto rounds = run_shortened_example(dir, "sim/own_cnn.toml");
  REQUIRE(rounds.size() == 3);
  CHECK(rounds.back()["test_loss"].get<double>() < rounds.front()["test_loss"].get<double>());
  CHECK(rounds.back()["test_accuracy"].get<double>() > 0.5);
}

TEST_CASE("a residual network with batchnorm, written in a TOML file, trains in the simulator" *
          doctest::test_suite("long")) {
  // Residual blocks (one with a projection shortcut), batchnorm and global average pooling; the
  // server evaluates with the averaged running statistics.
  test::TempDir dir;
  const auto rounds = run_shortened_example(dir, "sim/own_resnet.toml");
  REQUIRE(rounds.size() == 3);
  CHECK(rounds.back()["test_loss"].get<double>() < rounds.front()["test_loss"].get<double>());
  CHECK(rounds.back()["test_accuracy"].get<double>() > 0.6);
}

TEST_CASE("training that diverges stops after server.max_failed_rounds with a clear error") {
  // A learning rate of 1e30 makes every update non-finite; every shard refuses them, so no round
  // can commit. The coordinator gives up after 3 rounds in a row instead of retrying for ever,
  // and says why.
  test::TempDir dir;
  const Config config =
      make_config(dir, {"sim.clients=20", "server.clients_per_round=5", "server.rounds=5",
                        "server.min_updates=5", "server.max_failed_rounds=3", "train.lr=1e30",
                        "server.eval_every=0"});
  try {
    (void)run(config);
    FAIL("the simulation should have stopped with a TrainingError");
  } catch (const TrainingError& e) {
    const std::string what = e.what();
    CHECK(what.find("3 rounds in a row") != std::string::npos);
    CHECK(what.find("server.max_failed_rounds") != std::string::npos);
    CHECK(what.find("refused") != std::string::npos);
  }
}

TEST_CASE("with a fixed profile the simulated round time is the closed form") {
  test::TempDir dir;
  const Config config = make_config(
      dir, {"sim.clients=20", "server.clients_per_round=5", "server.rounds=2", "server.shards=2",
            "profile.gflops=2", "profile.uplink_mbps=4", "profile.downlink_mbps=8",
            "profile.latency_ms=25", "server.round_deadline_ms=600000", "server.work=fixed"});
  const Summary s = run(config);
  REQUIRE(s.committed == 2);
  const double p =
      static_cast<double>(kernels::make_network_spec("mlp:784-16-10").parameter_count());
  const double samples = 60000.0 / 20;  // IID parts of Fashion-MNIST, one epoch
  const double bytes = 4 * p;           // one pull and one push of every shard's range
  const double expected =
      (0.025 + bytes * 8 / 8e6) + 6 * p * samples / 2e9 + (0.025 + bytes * 8 / 4e6);
  const auto rounds = records(dir.path() / "sim.jsonl", "sim_round");
  REQUIRE(rounds.size() == 2);
  for (const auto& r : rounds) {
    CHECK(r["sim_round_seconds"].get<double>() == doctest::Approx(expected).epsilon(1e-12));
    CHECK(r["bytes"].get<double>() == 5 * 2 * bytes);  // real payload bytes, five clients
  }
  CHECK(s.sim_seconds == doctest::Approx(2 * expected).epsilon(1e-12));
  CHECK(s.bytes_measured == s.bytes);  // the clock's bytes are the bytes that moved
}

TEST_CASE("the same config and seed give the same metrics, wall-clock fields aside") {
  // Non-IID data, two shards, heterogeneous devices and over-selection (some updates are cut),
  // so the aggregation order and the cut both have to be reproducible.
  const std::vector<std::string> overrides{"sim.clients=60",
                                           "server.clients_per_round=8",
                                           "server.overselect=1.5",
                                           "server.rounds=3",
                                           "server.shards=2",
                                           "data.partition=dirichlet:0.3",
                                           "profile.gflops=lognormal:2:0.8",
                                           "profile.uplink_mbps=lognormal:5:1",
                                           "profile.latency_ms=uniform:10:200",
                                           "sim.seed=11"};
  test::TempDir a, b;
  const Summary sa = run(make_config(a, overrides));
  const Summary sb = run(make_config(b, overrides));
  CHECK(sa.committed == 3);
  CHECK(sa.sim_seconds == sb.sim_seconds);
  CHECK(sa.final_accuracy == sb.final_accuracy);
  const std::string ma = without_wall_clock(a.path() / "sim.jsonl");
  CHECK(ma == without_wall_clock(b.path() / "sim.jsonl"));
  CHECK(without_wall_clock(a.path() / "server.jsonl") ==
        without_wall_clock(b.path() / "server.jsonl"));
  const auto rounds = records(a.path() / "sim.jsonl", "sim_round");
  std::uint64_t cut = 0;
  for (const auto& r : rounds) cut += r["cut"].get<std::uint64_t>();
  CHECK(cut > 0);  // over-selection made some clients miss the cut
}

TEST_CASE("virtual clients dropping out mid-round are handled like real ones") {
  // A dropped-out client never answers; the real coordinator closes the round at its deadline
  // (sim.wall_deadline_ms) with the updates that did arrive, and commits them.
  test::TempDir dir;
  const Config config =
      make_config(dir, {"sim.clients=30", "server.clients_per_round=10", "server.rounds=2",
                        "profile.dropout=0.3", "sim.wall_deadline_ms=3000",
                        "server.round_deadline_ms=90000", "sim.seed=5"});
  const Summary s = run(config);
  CHECK(s.committed == 2);
  const auto rounds = records(dir.path() / "sim.jsonl", "sim_round");
  const auto server_rounds = records(dir.path() / "server.jsonl", "round");
  REQUIRE(rounds.size() == 2);
  REQUIRE(server_rounds.size() == 2);
  std::uint64_t silent = 0;
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    const auto& r = rounds[i];
    silent += r["silent"].get<std::uint64_t>();
    CHECK(r["completed"].get<std::uint64_t>() + r["silent"].get<std::uint64_t>() +
              r["stragglers"].get<std::uint64_t>() ==
          r["selected"].get<std::uint64_t>());
    CHECK(r["completed"].get<std::uint64_t>() >= 1);
    // The coordinator aggregated exactly the clients that stayed.
    CHECK(server_rounds[i]["clients"] == r["completed"]);
    CHECK(server_rounds[i]["selected"] == r["selected"]);
    if (r["silent"].get<std::uint64_t>() > 0) {
      CHECK(r["sim_round_seconds"].get<double>() == 90.0);  // closed at the simulated deadline
    }
  }
  CHECK(silent > 0);
}

// A device trace of the closed-form devices (2 GFLOP/s, 4/8 Mbit/s, 25 ms), a row per memory
// budget (client i gets row i mod rows); without a memory column (one row) when none is given.
std::string device_trace(const test::TempDir& dir, const std::string& name,
                         const std::vector<std::size_t>& memory) {
  std::ofstream out(dir.file(name));
  out << "gflops,uplink_mbps,downlink_mbps,latency_ms" << (memory.empty() ? "" : ",memory") << "\n";
  if (memory.empty()) out << "2,4,8,25\n";
  for (const std::size_t m : memory) out << "2,4,8,25," << m << "\n";
  return dir.file(name);
}

// The measured training peak of config's model and train.* at micro-batch m, on the fleet's
// device (CPU, one thread): a budget that needs micro-batches of about m.
std::size_t peak_bytes(const Config& config, std::size_t m) {
  const auto train = client::trainer_options_from(config.section("train"));
  const auto device = kernels::make_device("cpu", {.threads = 1});
  return kernels::measure_peak_bytes(kernels::make_network_spec(config.get_string("model.spec")),
                                     *device, train.optimizer, train.batch_size, m);
}

// The closed-form round of the trace's devices: pull, train `samples` slowed by `slowdown`, push.
double closed_form_round(double samples, double slowdown) {
  const double p =
      static_cast<double>(kernels::make_network_spec("mlp:784-16-10").parameter_count());
  const double bytes = 4 * p;
  return (0.025 + bytes * 8 / 8e6) + 6 * p * samples / 2e9 * slowdown + (0.025 + bytes * 8 / 4e6);
}

TEST_CASE("memory budgets: too-small clients are never selected, tight ones train micro-batched") {
  // Twelve clients: c % 3 == 0 unlimited, 1 under a budget that needs micro-batches, 2 under one
  // that holds nothing. Every client that can train is selected every round.
  test::TempDir dir;
  const std::vector<std::string> base{
      "sim.clients=12",    "server.clients_per_round=8",      "server.rounds=3",
      "server.work=fixed", "server.round_deadline_ms=600000", "sim.micro_batch_slowdown=2"};
  const std::size_t tight = peak_bytes(make_config(dir, base), 8);
  std::vector<std::string> overrides = base;
  overrides.push_back("sim.profile_trace=" + device_trace(dir, "devices.csv", {0, tight, 1000}));
  const Summary s = run(make_config(dir, overrides));
  CHECK(s.committed == 3);
  CHECK(s.clients_unfit == 4);
  for (std::size_t c = 0; c < 12; ++c) {
    CAPTURE(c);
    CHECK(s.selections[c] == (c % 3 == 2 ? 0u : 3u));
    CHECK(s.participation[c] == (c % 3 == 2 ? 0u : 3u));
  }
  const auto rounds = records(dir.path() / "sim.jsonl", "sim_round");
  REQUIRE(rounds.size() == 3);
  for (const auto& r : rounds) {
    CHECK(r["selected"] == 8);
    CHECK(r["completed"] == 8);
    CHECK(r["micro_batched"] == 4);
    // The round closes at its slowest client: a micro-batched one, its compute time doubled.
    CHECK(r["sim_round_seconds"].get<double>() ==
          doctest::Approx(closed_form_round(60000.0 / 12, 2.0)).epsilon(1e-12));
  }
  const auto summaries = records(dir.path() / "sim.jsonl", "sim_summary");
  REQUIRE(summaries.size() == 1);
  CHECK(summaries[0]["clients_unfit"] == 4);
  CHECK(summaries[0]["never_selected"] == 4);
  for (const auto& r : records(dir.path() / "server.jsonl", "round")) CHECK(r["selected"] == 8);
}

TEST_CASE("a client under a tight budget learns what whole batches learn, timed by the factor") {
  // The same six clients, seed and selection, unlimited (an old trace without the memory column)
  // and under a budget that needs micro-batches: the arithmetic differs only in float rounding.
  const std::vector<std::string> base{
      "sim.clients=6",     "server.clients_per_round=3",      "server.rounds=2",
      "server.work=fixed", "server.round_deadline_ms=600000", "sim.micro_batch_slowdown=1.5",
      "sim.seed=3"};
  test::TempDir a, b;
  std::vector<std::string> whole = base, micro = base;
  whole.push_back("sim.profile_trace=" + device_trace(a, "devices.csv", {}));
  const std::size_t tight = peak_bytes(make_config(b, base), 4);
  micro.push_back("sim.profile_trace=" + device_trace(b, "devices.csv", {tight}));
  const Summary sa = run(make_config(a, whole));
  const Summary sb = run(make_config(b, micro));
  CHECK(sb.clients_unfit == 0);
  CHECK(sa.selections == sb.selections);
  CHECK(sb.final_accuracy == doctest::Approx(sa.final_accuracy).epsilon(1e-3));
  const auto ra = records(a.path() / "sim.jsonl", "sim_round");
  const auto rb = records(b.path() / "sim.jsonl", "sim_round");
  REQUIRE(ra.size() == 2);
  REQUIRE(rb.size() == 2);
  for (std::size_t i = 0; i < ra.size(); ++i) {
    CAPTURE(i);
    CHECK_FALSE(ra[i].contains("micro_batched"));  // no budgets: the record is as it was
    CHECK(rb[i]["micro_batched"] == 3);
    CHECK(rb[i]["train_loss"].get<double>() ==
          doctest::Approx(ra[i]["train_loss"].get<double>()).epsilon(1e-4));
    CHECK(rb[i]["test_loss"].get<double>() ==
          doctest::Approx(ra[i]["test_loss"].get<double>()).epsilon(1e-4));
    CHECK(ra[i]["sim_round_seconds"].get<double>() ==
          doctest::Approx(closed_form_round(10000, 1.0)).epsilon(1e-12));
    CHECK(rb[i]["sim_round_seconds"].get<double>() ==
          doctest::Approx(closed_form_round(10000, 1.5)).epsilon(1e-12));
  }
}

TEST_CASE("a fleet in which no client's memory can train the model is refused in one line") {
  test::TempDir dir;
  const Config config =
      make_config(dir, {"sim.clients=6", "server.clients_per_round=3", "server.rounds=1",
                        "sim.profile_trace=" + device_trace(dir, "devices.csv", {1000, 20000})});
  try {
    (void)run(config);
    FAIL("the simulation should have been refused");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    CHECK(what.find("none of the 6 clients can train mlp:784-16-10 at batch 32") == 0);
    CHECK(what.find("below the minimum of") != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
}

// A coordinator and shard in one ROUTER, scripted: it welcomes the population's knocker as a
// population coordinator does (both virtual clients registered), asks client 0 for 3 local steps
// and client 1 for 11 (as server.work = "deadline" would), serves the pulls,
// acknowledges the pushes and keeps what the fleet sent.
struct ScriptedCoordinator {
  std::uint64_t params = 0;
  std::map<std::string, float> local_work;  // per client, from its push
  std::map<std::string, transport::ClientReport> reports;

  void run(transport::Endpoint& router) {
    using namespace std::chrono_literals;
    const std::map<std::string, std::uint32_t> steps{{"c00000", 3}, {"c00001", 11}};
    std::vector<transport::PeerHandle> peers;
    std::vector<std::string> names;
    std::vector<float> model(params, 0.01f);
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (reports.size() < 2 && std::chrono::steady_clock::now() < until) {
      auto m = router.receive(50ms);
      if (!m) continue;
      auto& body = m->envelope.body;
      transport::Envelope reply;
      reply.round = m->envelope.round;
      if (std::holds_alternative<transport::Register>(body)) {
        if (std::find(names.begin(), names.end(), m->sender) != names.end()) continue;
        reply.body = transport::Welcome{
            .client_index = static_cast<std::uint32_t>(names.size()),
            .model_size = params,
            .model_spec = "mlp:784-16-10",
            .shards = {{0, router.url(), "coordinator", 0, params}},
            .training_toml = "epochs = 1\nbatch_size = 32\nlr = 0.05\nmomentum = 0.9\n"};
        router.send(m->peer, std::move(reply));
        peers.push_back(m->peer);
        names.push_back(m->sender);
        REQUIRE(m->sender == "c00000");  // one Register stands for the population
        peers.push_back(transport::multiplexed_peer(m->peer, "c00001"));
        names.push_back("c00001");
        for (std::size_t i = 0; i < 2; ++i) {
          transport::Envelope rs;
          rs.round = 1;
          rs.body = transport::RoundStart{.round = 1,
                                          .deadline_ms = 60000,
                                          .local_epochs = 1,
                                          .local_steps = steps.at(names[i]),
                                          .model_version = 0};
          router.send(peers[i], std::move(rs));
        }
      } else if (auto* pull = std::get_if<transport::Pull>(&body)) {
        reply.body = transport::PullReply{.shard = 0, .begin = 0, .end = params, .version = 0};
        const auto bytes = std::as_bytes(std::span<const float>(model));
        router.send(m->peer, std::move(reply), transport::Payload{bytes, nullptr});
        (void)pull;
      } else if (auto* push = std::get_if<transport::Push>(&body)) {
        local_work[m->sender] = push->local_work;
        reply.body = transport::PushAck{.accepted = true, .version = 1};
        router.send(m->peer, std::move(reply));
      } else if (auto* r = std::get_if<transport::ClientReport>(&body)) {
        reports[m->sender] = *r;
      }
    }
    for (const auto& peer : peers) {
      transport::Envelope bye;
      bye.body = transport::Bye{"done"};
      router.send(peer, std::move(bye));
    }
  }
};

TEST_CASE("a virtual client trains the steps its RoundStart asks for and reports its device") {
  set_log_level(LogLevel::Warn);
  test::TempDir dir;
  const Config config = make_config(
      dir, {"sim.clients=2", "server.clients_per_round=2", "server.round_deadline_ms=600000",
            "profile.gflops=2", "profile.uplink_mbps=4", "profile.downlink_mbps=8",
            "profile.latency_ms=25", "sim.threads=1"});
  const SimOptions options = sim_options_from(config, Runner::kInProcess);
  transport::Context ctx;
  transport::EndpointOptions ro;
  ro.node_id = "coordinator";
  ro.multiplex = true;
  ro.security.insecure = true;
  const std::string url = "inproc://sim-test-scripted-coordinator";
  auto router = transport::Endpoint::bind(ctx, url, ro);
  ScriptedCoordinator coordinator;
  coordinator.params = kernels::make_network_spec("mlp:784-16-10").parameter_count();
  std::atomic<bool> stop{false};
  Summary summary;
  std::exception_ptr error;
  std::thread fleet_thread([&] {
    try {
      const auto rules = client::builtin_local_training();
      Fleet fleet(
          options, ctx, {url}, stop, [] { return false; }, rules);
      (void)fleet.prepare();
      summary = fleet.run();
    } catch (...) {
      error = std::current_exception();
    }
  });
  coordinator.run(router);
  stop = true;  // ends the fleet's loop if the script stopped short
  fleet_thread.join();
  if (error) std::rethrow_exception(error);
  REQUIRE(coordinator.reports.size() == 2);
  const double p = static_cast<double>(coordinator.params);
  const double bytes = 4 * p;
  for (const auto& [name, steps] : {std::pair{"c00000", 3u}, std::pair{"c00001", 11u}}) {
    CAPTURE(name);
    const auto& r = coordinator.reports.at(name);
    CHECK(r.trained);
    CHECK(r.local_steps == steps);
    // IID halves of Fashion-MNIST: 30,000 rows, so every step is a full batch of 32.
    const double samples = 32.0 * steps;
    CHECK(r.train_seconds == doctest::Approx(6 * p * samples / 2e9));
    CHECK(r.samples_per_second == doctest::Approx(2e9 / (6 * p)));
    REQUIRE(r.links.size() == 1);
    CHECK(r.links[0].shard == 0);
    CHECK(r.links[0].down_bytes == bytes);
    CHECK(r.links[0].up_bytes == bytes);
    CHECK(r.links[0].down_seconds == doctest::Approx(0.025 + bytes * 8 / 8e6));
    CHECK(r.links[0].up_seconds == doctest::Approx(0.025 + bytes * 8 / 4e6));
    // FedNova's a_i for heavy-ball momentum 0.9 over the steps it ran (1.20).
    const double rho = 0.9, tau = steps;
    CHECK(coordinator.local_work.at(name) ==
          doctest::Approx((tau - rho * (1 - std::pow(rho, tau)) / (1 - rho)) / (1 - rho)));
  }
  CHECK(summary.participation == std::vector<std::uint32_t>{1, 1});
  CHECK(summary.selections == std::vector<std::uint32_t>{1, 1});
  // The round lasted as long as its slower client, the one asked for 11 steps.
  const auto rounds = records(dir.path() / "sim.jsonl", "sim_round");
  REQUIRE(rounds.size() == 1);
  CHECK(rounds[0]["local_steps_min"] == 3);
  CHECK(rounds[0]["local_steps_max"] == 11);
  CHECK(rounds[0]["sim_round_seconds"].get<double>() ==
        doctest::Approx((0.025 + bytes * 8 / 8e6) + 6 * p * 352 / 2e9 + (0.025 + bytes * 8 / 4e6)));
  const auto summaries = records(dir.path() / "sim.jsonl", "sim_summary");
  REQUIRE(summaries.size() == 1);
  CHECK(summaries[0]["participation_min"] == 1);
  CHECK(summaries[0]["never_participated"] == 0);
}

TEST_CASE("server.work = deadline sizes each virtual client's steps to the simulated deadline") {
  // Ten clients of 6,000 images, every one selected every round; devices from 0.01 to 0.1
  // GFLOP/s. With train.epochs = 1 (188 steps) the slowest would need ~46 s against a 20 s
  // deadline; sized to it from their virtual reports, every client fits.
  test::TempDir dir;
  const std::vector<std::string> overrides{"sim.clients=10",
                                           "server.clients_per_round=10",
                                           "server.rounds=3",
                                           "profile.gflops=uniform:0.01:0.1",
                                           "profile.uplink_mbps=20",
                                           "profile.downlink_mbps=100",
                                           "server.round_deadline_ms=20000",
                                           "server.work=deadline",
                                           "server.min_local_steps=1"};
  if (server_config_schema_has("server.work")) {
    const Summary s = run(make_config(dir, overrides));
    CHECK(s.committed == 3);
    const auto rounds = records(dir.path() / "sim.jsonl", "sim_round");
    REQUIRE(rounds.size() == 3);
    // Nobody measured yet: server.min_local_steps each.
    CHECK(rounds[0]["local_steps_max"] == 1);
    for (std::size_t i = 1; i < rounds.size(); ++i) {
      CAPTURE(i);
      CHECK(rounds[i]["stragglers"] == 0);
      CHECK(rounds[i]["completed"] == 10);
      CHECK(rounds[i]["local_steps_min"].get<std::uint64_t>() <
            rounds[i]["local_steps_max"].get<std::uint64_t>());
      CHECK(rounds[i]["local_steps_min"].get<std::uint64_t>() < 188);  // a slow device: less
      CHECK(rounds[i]["local_steps_max"].get<std::uint64_t>() > 188);  // a fast one fills the round
      CHECK(rounds[i]["local_steps_max"].get<std::uint64_t>() <= 4 * 188);  // the derived bound
      CHECK(rounds[i]["sim_round_seconds"].get<double>() <= 20.0);
    }
    CHECK(s.participation == std::vector<std::uint32_t>(10, 3));
  } else {
    // This server has no heterogeneity-aware work yet: the key is refused at start-up.
    CHECK_THROWS_AS((void)make_config(dir, overrides), ConfigError);
  }
}

TEST_CASE("server.selection = speed_aware: over-selects new clients, then less; nobody starves") {
  // 30 clients, 10 per round, server.overselect = 1.3: at most 13 selected. Devices from 0.005 to
  // 0.1 GFLOP/s under a 20 s deadline with fixed work: the slowest third miss every round they
  // are picked for, and still get picked.
  test::TempDir dir;
  const Summary s = run(make_config(
      dir, {"sim.clients=30", "server.clients_per_round=10", "server.overselect=1.3",
            "server.rounds=20", "server.selection=speed_aware", "server.work=fixed",
            "profile.gflops=uniform:0.005:0.1", "profile.uplink_mbps=20",
            "profile.downlink_mbps=100", "server.round_deadline_ms=20000", "server.eval_every=0"}));
  CHECK(s.committed == 20);
  const auto rounds = records(dir.path() / "sim.jsonl", "sim_round");
  REQUIRE(rounds.size() == 20);
  CHECK(rounds[0]["selected"] == 13);  // nobody's record yet: 1/2 each, the cap binds
  std::uint64_t fewest = 13;
  for (const auto& r : rounds) {
    const auto n = r["selected"].get<std::uint64_t>();
    CHECK(n >= 10);
    CHECK(n <= 13);
    fewest = std::min(fewest, n);
  }
  CHECK(fewest < 13);  // once records build up, fewer extra clients
  for (auto n : s.selections) CHECK(n >= 2);
  const auto summaries = records(dir.path() / "sim.jsonl", "sim_summary");
  REQUIRE(summaries.size() == 1);
  MESSAGE("selected per round: " << rounds[0]["selected"] << " first, " << fewest
                                 << " fewest; participation_min "
                                 << summaries[0]["participation_min"]);
}

TEST_CASE("100,000 registered clients on 60,000 images: sample:60, registered at once") {
  test::TempDir dir;
  const Config config =
      make_config(dir, {"sim.clients=100000", "data.partition=sample:60",
                        "server.clients_per_round=10", "server.rounds=3", "server.eval_every=3",
                        "train.batch_size=20", "train.epochs=5", "train.lr=0.1"});
  const Summary s = run(config);
  CHECK(s.committed == 3);
  REQUIRE(s.selections.size() == 100000);
  std::uint64_t selected = 0, distinct = 0;
  for (auto n : s.selections) {
    selected += n;
    distinct += n > 0 ? 1 : 0;
  }
  CHECK(selected == 30);
  CHECK(distinct >= 29);  // 30 draws from 100,000
  CHECK(s.final_accuracy > 0.4);
  CHECK(s.setup_seconds > 0);
  const auto clients = records(dir.path() / "server.jsonl", "client");
  REQUIRE(clients.size() == 30);
  CHECK(clients[0]["client"].get<std::string>().size() == 6);  // "c" and five digits
  MESSAGE("set-up " << s.setup_seconds << " s, accuracy " << s.final_accuracy);
  // iid cannot give 100,000 clients a part of 60,000 images: it says what can.
  const Config iid = make_config(dir, {"sim.clients=100000", "server.rounds=1"});
  CHECK_THROWS_WITH_AS((void)run(iid), doctest::Contains("data.partition = sample:M"), ConfigError);
  // --processes starts real clients, which cannot share examples.
  const Config processes = make_config(dir, {"sim.clients=3", "data.partition=sample:60"});
  CHECK_THROWS_WITH_AS((void)sim_options_from(processes, Runner::kProcesses),
                       doctest::Contains("--processes"), ConfigError);
}

TEST_CASE("server.selection other than uniform is refused with DP noise (the accountant's q)") {
  test::TempDir dir;
  for (const char* selection : {"weighted", "speed_aware"}) {
    CAPTURE(selection);
    const Config config = make_config(
        dir, {"sim.clients=4", "server.clients_per_round=2", "server.rounds=1",
              std::string("server.selection=") + selection, "dp.clip=1", "dp.noise_multiplier=1"});
    CHECK_THROWS_WITH_AS((void)run(config), doctest::Contains("does not sample clients uniformly"),
                         ConfigError);
  }
}

TEST_CASE("--processes runs the same configuration as cohort-server and cohort-client processes") {
  test::TempDir dir;
  const Config config =
      make_config(dir, {"sim.clients=3", "server.clients_per_round=2", "server.rounds=2",
                        "server.shards=2", "sim.log_dir=" + (dir.path() / "logs").string()});
  std::atomic<bool> stop{false};
  CHECK(run_processes(config, COHORT_BIN_DIR, stop) == 0);  // every process is reaped on return
  const auto rounds = records(dir.path() / "server.jsonl", "round");
  REQUIRE(rounds.size() == 2);
  CHECK(rounds.back()["clients"] == 2);
  CHECK(std::filesystem::exists(dir.path() / "logs" / "c00002.log"));
}

}  // namespace
}  // namespace cohort::sim

namespace cohort::sim {
namespace {

TEST_CASE("secure aggregation in cohort-sim: the same accuracy, the stages on the virtual clock") {
  const std::vector<std::string> common{"sim.clients=30", "server.clients_per_round=12",
                                        "server.rounds=3", "server.work=fixed"};
  auto run_with = [&](const test::TempDir& dir, const std::string& mode) {
    auto o = common;
    o.push_back("server.secure_aggregation=" + mode);
    const Summary s = run(make_config(dir, o));
    CHECK(s.committed == 3);
    return records(dir.path() / "sim.jsonl", "sim_round");
  };
  test::TempDir plain_dir, plus_dir, full_dir;
  const auto plain = run_with(plain_dir, "none");
  const auto plus = run_with(plus_dir, "secagg+");
  const auto full = run_with(full_dir, "secagg");
  REQUIRE(plain.size() == 3);
  REQUIRE(plus.size() == 3);
  REQUIRE(full.size() == 3);
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK_FALSE(plain[r].contains("secagg_seconds"));
    // The stages add time and bytes; SecAgg+'s neighbourhoods (k = 9 of 12) share less.
    CHECK(plus[r]["secagg_seconds"].get<double>() > 0);
    CHECK(plus[r]["sim_round_seconds"].get<double>() > plain[r]["sim_round_seconds"].get<double>());
    CHECK(plus[r]["bytes"].get<std::uint64_t>() ==
          plain[r]["bytes"].get<std::uint64_t>() + plus[r]["secagg_bytes"].get<std::uint64_t>());
    CHECK(plus[r]["secagg_bytes"].get<std::uint64_t>() <
          full[r]["secagg_bytes"].get<std::uint64_t>());
    // The unmasked mean is the plain mean up to the fixed point's rounding.
    CHECK(plus[r]["test_accuracy"].get<double>() ==
          doctest::Approx(plain[r]["test_accuracy"].get<double>()).epsilon(0.01));
  }
}

}  // namespace
}  // namespace cohort::sim
