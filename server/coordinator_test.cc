// The coordinator driven directly, with shard 0 in the same object graph, a manual clock and a
// recording outbox: rounds open, close at their deadline and commit in two phases, no sockets.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "cohort/core/error.h"

#include "coordinator.h"
#include "options.h"
#include "shard.h"
#include "test_util.h"

namespace cohort::server {
namespace {

using namespace std::chrono_literals;
using testing::RecordingOutbox;
using transport::RoundClose;
using transport::RoundStart;

constexpr std::uint64_t kModelSize = 6;  // mlp:2-2

struct Fixture {
  // `metrics_path`: where the coordinator's metrics go (empty: discarded).
  explicit Fixture(std::vector<std::string> overrides, const std::string& metrics_path = "")
      : options(testing::make_options(std::move(overrides))),
        registries(builtin_registries()),
        shards(options.node.shards),
        metrics(metrics_path),
        shard(options, registries, out, nullptr) {
    shard.setup("mlp:2-2", kModelSize);
    coordinator.emplace(options, shard, out, clock, "coordinator", "inproc://test", metrics);
  }

  void deliver(transport::Message m) {
    if (shard.handle(m)) return;
    REQUIRE(coordinator->handle(m));
  }
  void register_client(const NodeId& id) {
    deliver(testing::message(
        id, transport::Register{.role = transport::Role::kClient, .dataset_size = 100}));
  }
  void register_shard(std::uint32_t index) {
    deliver(testing::message(
        "shard-" + std::to_string(index),
        transport::Register{
            .role = transport::Role::kShard, .listen_url = "inproc://s", .shard_index = index}));
  }
  // Client `id` pushes a delta of 0.5 for shard 0's range and reports its round as trained, with
  // the measurements of `measured` (its samples/s, local steps and link samples).
  void train(const NodeId& id, std::uint64_t round, const transport::ClientReport& measured = {}) {
    std::vector<float> update(shard.size(), 0.5f);
    auto [push, report] =
        testing::trained_round(id, round, seq, shard.begin(), shard.end(), update, measured);
    deliver(std::move(push));
    deliver(std::move(report));
  }
  // RoundStarts sent to client `id`.
  std::vector<RoundStart> starts(const NodeId& id) const {
    std::vector<RoundStart> out_starts;
    for (const auto& [sent, rs] : out.of<RoundStart>()) {
      if (sent.peer == "peer:" + id) out_starts.push_back(rs);
    }
    return out_starts;
  }
  std::vector<RoundClose> closes() const {
    std::vector<RoundClose> c;
    for (const auto& [sent, rc] : out.of<RoundClose>()) c.push_back(rc);
    return c;
  }
  transport::Message shard_ack(std::uint32_t index, std::uint64_t round, bool prepared, bool ok,
                               std::string reason = "") {
    return testing::message(
        "shard-" + std::to_string(index),
        transport::PushAck{.accepted = ok, .reason = std::move(reason), .prepared = prepared},
        round, ++seq);
  }

  ServerOptions options;
  Registries registries;
  std::uint32_t shards;
  RecordingOutbox out;
  ManualClock clock;
  MetricsSink metrics;
  Shard shard;
  std::optional<Coordinator> coordinator;
  std::uint64_t seq = 100;
};

TEST_CASE("coordinator: a federated round waits for its cohort and closes at the deadline") {
  Fixture f({"server.mode=federated", "server.rounds=3", "server.clients_per_round=2",
             "server.min_clients=2", "server.round_deadline_ms=1000"});
  f.register_client("a");
  f.coordinator->tick();
  CHECK(f.out.count<RoundStart>() == 0);  // one client of min_clients = 2
  f.register_client("b");
  f.coordinator->tick();
  REQUIRE(f.starts("a").size() == 1);
  REQUIRE(f.starts("b").size() == 1);
  CHECK(f.starts("a")[0].round == 1);

  f.train("a", 1);
  f.coordinator->tick();
  f.clock.advance(999ms);
  f.coordinator->tick();
  CHECK(f.shard.last_closed() == 0);  // b has neither pushed nor reported, the deadline is ahead
  CHECK(f.starts("a").size() == 1);

  f.clock.advance(2ms);
  f.coordinator->tick();
  CHECK(f.shard.last_closed() == 1);  // closed at the deadline with a's update, committed
  CHECK(f.shard.version() == 1);
  // The next round started at once, to both clients.
  REQUIRE(f.starts("b").size() == 2);
  CHECK(f.starts("b")[1].round == 2);
  CHECK(f.starts("b")[1].model_version == 1);

  SUBCASE("a round without any update fails at its deadline and the model stays") {
    f.clock.advance(1001ms);
    f.coordinator->tick();
    CHECK(f.shard.version() == 1);
    REQUIRE(f.starts("a").size() == 3);
    CHECK(f.starts("a")[2].round == 3);
  }
  SUBCASE("the round closes as soon as the whole cohort reported") {
    f.train("a", 2);
    f.train("b", 2);
    f.coordinator->tick();
    CHECK(f.shard.last_closed() == 2);
    CHECK(f.shard.version() == 2);
  }
}

// A round that fails at its deadline with too few complete updates is closed (aborted) on every
// shard under its own number: closing the previous round's number instead left the failed round
// open on the shards, which then refused every push of the next rounds as "push for another round".
TEST_CASE("coordinator: a round that failed with too few updates leaves the next round working") {
  Fixture f({"server.mode=federated", "server.rounds=3", "server.clients_per_round=2",
             "server.min_clients=2", "server.min_updates=2", "server.round_deadline_ms=1000"});
  f.register_client("a");
  f.register_client("b");
  f.coordinator->tick();
  f.train("a", 1);
  f.clock.advance(1001ms);
  f.coordinator->tick();
  REQUIRE(f.starts("a").size() == 2);
  f.train("a", 2);
  const auto acks = f.out.of<transport::PushAck>();
  CHECK(acks.back().second.reason == "");
  CHECK(acks.back().second.accepted);
}

TEST_CASE("coordinator: a round commits on every shard only when every shard prepared it") {
  Fixture f({"server.mode=federated", "server.shards=2", "server.rounds=3",
             "server.clients_per_round=1", "server.min_clients=1",
             "server.round_deadline_ms=1000"});
  f.register_client("early");  // refused until every shard is up
  CHECK(f.out.count<transport::ErrorBody>() == 1);
  f.register_shard(1);
  CHECK(f.out.count<transport::Welcome>() == 1);
  f.register_client("a");
  f.coordinator->tick();
  REQUIRE(f.starts("a").size() == 1);
  // Shard 1 learnt the selection before the client learnt of the round.
  const auto opens = f.out.of<transport::RoundOpen>();
  REQUIRE(opens.size() == 1);
  CHECK(opens[0].first.peer == "peer:shard-1");
  CHECK(opens[0].second.clients == std::vector<NodeId>{"a"});

  f.train("a", 1);
  f.coordinator->tick();
  // Phase one: shard 1 is asked to prepare; shard 0 prepared and applied nothing.
  REQUIRE(f.closes().size() == 1);
  CHECK(f.closes()[0].prepare);
  CHECK(f.closes()[0].round == 1);
  CHECK(f.shard.version() == 0);

  SUBCASE("commit") {
    f.deliver(f.shard_ack(1, 1, true, true));
    REQUIRE(f.closes().size() == 2);
    CHECK_FALSE(f.closes()[1].prepare);
    CHECK(f.closes()[1].commit);
    CHECK(f.shard.version() == 1);
    CHECK(f.starts("a").size() == 1);  // no new round before shard 1 answered the close
    f.deliver(f.shard_ack(1, 1, false, true));
    f.coordinator->tick();
    CHECK(f.starts("a").size() == 2);
  }
  SUBCASE("abort when the other shard's rule could not aggregate") {
    f.deliver(f.shard_ack(1, 1, true, false, "shard 1: no"));
    REQUIRE(f.closes().size() == 2);
    CHECK_FALSE(f.closes()[1].commit);
    CHECK(f.shard.version() == 0);
    CHECK(f.shard.last_closed() == 1);
  }
  SUBCASE("an unanswered phase is sent again after 2 s") {
    f.clock.advance(1s);
    f.coordinator->tick();
    CHECK(f.closes().size() == 1);
    f.clock.advance(1001ms);
    f.coordinator->tick();
    REQUIRE(f.closes().size() == 2);
    CHECK(f.closes()[1].prepare);
  }
}

TEST_CASE("coordinator: FedBuff steps once shard 0 buffers K updates") {
  Fixture f({"server.mode=fedbuff", "server.rounds=2", "server.buffer_size=2",
             "server.concurrency=2", "server.min_clients=2"});
  f.register_client("a");
  f.register_client("b");
  f.coordinator->tick();
  REQUIRE(f.starts("a").size() == 1);
  REQUIRE(f.starts("b").size() == 1);
  CHECK(f.starts("a")[0].mode == transport::TrainingMode::kBuffered);
  f.train("a", f.starts("a")[0].round);
  f.coordinator->tick();
  CHECK(f.shard.version() == 0);  // 1 of K = 2
  f.train("b", f.starts("b")[0].round);
  f.coordinator->tick();
  CHECK(f.shard.version() == 1);
  CHECK(f.shard.buffered() == 0);
}

TEST_CASE(
    "coordinator: FedBuff waits for a push still on its way to another shard instead of issuing "
    "more work") {
  Fixture f({"server.mode=fedbuff", "server.shards=2", "server.rounds=1", "server.buffer_size=2",
             "server.concurrency=2", "server.min_clients=2"});
  f.register_shard(1);
  for (const NodeId id : {"a", "b", "c"}) f.register_client(id);
  f.coordinator->tick();
  REQUIRE(f.out.count<RoundStart>() == 2);
  const NodeId first = f.starts("a").empty() ? "b" : "a";
  const NodeId second = f.starts("c").empty() ? "b" : "c";
  REQUIRE(f.starts(first).size() == 1);
  REQUIRE(f.starts(second).size() == 1);
  f.train(first, f.starts(first)[0].round);
  // The second update is in on shard 0; its push to shard 1 is still on its way, so its
  // client has not reported.
  std::vector<float> update(f.shard.size(), 0.5f);
  f.deliver(testing::push_all(second,
                              transport::Push{.shard = 0,
                                              .begin = f.shard.begin(),
                                              .end = f.shard.end(),
                                              .num_samples = 10,
                                              .elements = f.shard.size()},
                              f.starts(second)[0].round, ++f.seq, update));
  f.coordinator->tick();
  REQUIRE(f.closes().size() == 1);  // prepare: shard 1 holds 1 of 2
  f.deliver(f.shard_ack(1, 1, true, false, "shard 1 holds 1 of 2 updates"));
  REQUIRE(f.closes().size() == 2);
  CHECK_FALSE(f.closes()[1].commit);
  f.deliver(f.shard_ack(1, 1, false, true));
  // Now the push reaches shard 1 and the client reports: nothing is in flight, but the step
  // was short only because of that push. No new task: the retry takes the two updates.
  f.deliver(
      testing::message(second,
                       transport::ClientReport{
                           .round = f.starts(second)[0].round, .trained = true, .num_samples = 10},
                       f.starts(second)[0].round, ++f.seq));
  f.coordinator->tick();
  CHECK(f.out.count<RoundStart>() == 2);
  f.clock.advance(20ms);
  f.coordinator->tick();
  REQUIRE(f.closes().size() == 3);
  CHECK(f.closes()[2].prepare);

  SUBCASE("shard 1 holds both: the step commits with them") {
    f.deliver(f.shard_ack(1, 1, true, true));
    f.deliver(f.shard_ack(1, 1, false, true));
    CHECK(f.shard.version() == 1);
    CHECK(f.out.count<RoundStart>() == 2);
  }
  SUBCASE("shard 1 is short with nothing in flight (it refused an update): one more task") {
    f.deliver(f.shard_ack(1, 1, true, false, "shard 1 holds 1 of 2 updates"));
    f.deliver(f.shard_ack(1, 1, false, true));
    f.coordinator->tick();
    CHECK(f.out.count<RoundStart>() == 3);
    CHECK(f.shard.version() == 0);
  }
}

TEST_CASE(
    "coordinator: data-parallel training starts the first workers by name and ends when all "
    "reported") {
  Fixture f({"server.mode=dataparallel", "server.consistency=ssp", "server.clients_per_round=2",
             "server.min_clients=3", "server.steps=7"});
  f.register_client("w-c");
  f.register_client("w-b");
  f.coordinator->tick();
  CHECK(f.out.count<RoundStart>() == 0);  // 2 of min_clients = 3
  f.register_client("w-a");
  f.coordinator->tick();
  REQUIRE(f.starts("w-a").size() == 1);
  REQUIRE(f.starts("w-b").size() == 1);
  CHECK(f.starts("w-c").empty());
  CHECK(f.starts("w-a")[0].mode == transport::TrainingMode::kDataParallel);
  CHECK(f.starts("w-a")[0].local_steps == 7);
  for (const NodeId id : {"w-a", "w-b"}) {
    f.deliver(
        testing::message(id, transport::ClientReport{.round = 1, .trained = true}, 1, ++f.seq));
  }
  f.coordinator->tick();
  CHECK(f.coordinator->finished());
  CHECK(f.out.count<transport::Bye>() == 3);
}

TEST_CASE("coordinator: a report resent after a reconnect counts once") {
  Fixture f({"server.mode=federated", "server.rounds=2", "server.clients_per_round=2",
             "server.min_clients=2", "server.round_deadline_ms=1000"});
  f.register_client("a");
  f.register_client("b");
  f.coordinator->tick();
  f.train("a", 1);
  f.deliver(testing::message(
      "a", transport::ClientReport{.round = 1, .trained = true, .num_samples = 10}, 1, ++f.seq));
  f.coordinator->tick();
  CHECK(f.shard.last_closed() == 0);  // b has not reported: a's second report is not b's
  f.deliver(
      testing::message("b", transport::ClientReport{.round = 1, .trained = false}, 1, ++f.seq));
  f.coordinator->tick();
  CHECK(f.shard.last_closed() == 1);  // everyone reported: the round closes before its deadline
  CHECK(f.shard.version() == 1);
}

}  // namespace
}  // namespace cohort::server

namespace cohort::server {
namespace {

// A report's measurements: `sps` samples/s over `steps` steps, shard 0 pulled and pushed
// (1 MB each way) in 0.5 s each.
transport::ClientReport measured(float sps, std::uint32_t steps) {
  return transport::ClientReport{.local_steps = steps,
                                 .samples_per_second = sps,
                                 .links = {transport::LinkSample{.shard = 0,
                                                                 .down_bytes = 1'000'000,
                                                                 .down_seconds = 0.5f,
                                                                 .up_bytes = 1'000'000,
                                                                 .up_seconds = 0.5f}}};
}

// Registers `clients`, starts round 1 and has each report it (one step) at its samples/s, with
// measured()'s links. The next tick starts round 2.
void measure_first_round(Fixture& f, const std::vector<std::pair<NodeId, float>>& clients) {
  for (const auto& [id, sps] : clients) f.register_client(id);
  f.coordinator->tick();
  for (const auto& [id, sps] : clients) f.train(id, 1, measured(sps, 1));
}

// A fresh path in the temporary folder, removed with the object.
struct TempFile {
  TempFile()
      : path(std::filesystem::temp_directory_path() /
             ("cohort_coordinator_test_" + std::to_string(std::random_device{}()) + ".jsonl")) {}
  ~TempFile() { std::filesystem::remove(path); }
  std::vector<nlohmann::json> records(const std::string& event) const {
    std::ifstream in(path);
    std::vector<nlohmann::json> out;
    std::string line;
    for (int n = 0; n < 10000 && std::getline(in, line); ++n) {
      auto j = nlohmann::json::parse(line);
      if (j.value("event", "") == event) out.push_back(std::move(j));
    }
    return out;
  }
  std::filesystem::path path;
};

TEST_CASE("coordinator: server.work = deadline sizes each client's steps from its measured speed") {
  // D = 10 s, margin 0.2, B = 10, transfers 1 s: (10 - 1 - 2) s x s / 10 steps.
  TempFile file;
  Fixture f({"server.mode=federated", "server.rounds=5", "server.clients_per_round=2",
             "server.min_clients=2", "server.round_deadline_ms=10000", "server.work=deadline",
             "server.min_local_steps=2", "server.max_local_steps=500", "train.batch_size=10"},
            file.path.string());
  f.register_client("fast");
  f.register_client("slow");
  f.coordinator->tick();
  REQUIRE(f.starts("fast").size() == 1);
  REQUIRE(f.starts("slow").size() == 1);
  CHECK(f.starts("fast")[0].local_steps == 2);  // nobody measured yet: server.min_local_steps
  CHECK(f.starts("slow")[0].local_steps == 2);
  f.train("fast", 1, measured(100, 2));
  f.train("slow", 1, measured(10, 2));
  f.coordinator->tick();
  REQUIRE(f.starts("fast").size() == 2);
  REQUIRE(f.starts("slow").size() == 2);
  CHECK(f.starts("fast")[1].round == 2);
  CHECK(f.starts("fast")[1].local_steps == 70);
  CHECK(f.starts("slow")[1].local_steps == 7);

  // One "client" record per client and round, in client order, with the profile after the report.
  const auto records = file.records("client");
  REQUIRE(records.size() == 2);
  CHECK(records[0]["client"] == "fast");
  CHECK(records[0]["round_id"] == 1);
  CHECK(records[0]["trained"] == true);
  CHECK(records[0]["assigned_steps"] == 2);
  CHECK(records[0]["local_steps"] == 2);
  CHECK(records[0]["samples_per_s"].get<double>() == doctest::Approx(100));
  CHECK(records[0]["down_bytes_per_s_0"].get<double>() == doctest::Approx(2e6));
  CHECK(records[0]["up_bytes_per_s_0"].get<double>() == doctest::Approx(2e6));
  CHECK(records[0]["participations"] == 1);
  CHECK(records[1]["client"] == "slow");
  CHECK(records[1]["measured_samples_per_s"].get<double>() == doctest::Approx(10));

  SUBCASE("the averages move by alpha = 0.3 towards the new measurement") {
    f.train("fast", 2, measured(200, 70));
    f.train("slow", 2, measured(10, 7));
    f.coordinator->tick();
    REQUIRE(f.starts("fast").size() == 3);
    CHECK(f.starts("fast")[2].local_steps == 91);  // 7 s x 130 samples/s / 10
    CHECK(f.starts("slow")[2].local_steps == 7);
    const auto later = file.records("client");
    REQUIRE(later.size() == 4);
    CHECK(later[2]["participations"] == 2);
    CHECK(later[2]["assigned_steps"] == 70);
  }
  SUBCASE("a client whose work did not fit: its late report replaces the average") {
    f.train("slow", 2, measured(10, 7));
    f.clock.advance(10001ms);  // fast misses the deadline; the round commits with slow's update
    f.coordinator->tick();
    REQUIRE(f.starts("fast").size() == 3);
    CHECK(f.starts("fast")[2].local_steps == 70);  // nothing new heard from fast yet
    // fast's report of round 2 arrives during round 3: it trained at 20 samples/s, not 100.
    auto late = measured(20, 70);
    late.round = 2;
    late.message = "could not push before the deadline";
    f.deliver(testing::message("fast", late, 2, ++f.seq));
    f.train("slow", 3, measured(10, 7));
    f.clock.advance(10001ms);
    f.coordinator->tick();
    REQUIRE(f.starts("fast").size() == 4);
    CHECK(f.starts("fast")[3].local_steps == 14);  // 7 s x 20 samples/s / 10, not the average
    const auto later = file.records("client");
    REQUIRE(later.size() == 4);  // slow's in rounds 2 and 3: a late report is not the round's
    CHECK(later[2]["client"] == "slow");
    CHECK(later[3]["client"] == "slow");
    CHECK(later[3]["round_id"] == 3);
  }
  SUBCASE("a client that registers again starts from no profile") {
    f.register_client("fast");
    f.train("fast", 2, measured(100, 70));
    f.train("slow", 2, measured(10, 7));
    f.coordinator->tick();
    REQUIRE(f.starts("fast").size() == 3);
    // Its report of round 2 is its first measurement since registering: 100 samples/s again.
    CHECK(f.starts("fast")[2].local_steps == 70);
    const auto later = file.records("client");
    REQUIRE(later.size() == 4);
    CHECK(later[2]["profile_reports"] == 1);
    CHECK(later[2]["participations"] == 2);  // participation survives the registration
  }
}

TEST_CASE("coordinator: a cohort that meets the deadline keeps the fixed work's round length") {
  // 100 samples each, B = 10: the fixed work is 10 steps. With 1 s of transfers the fast client
  // (100 samples/s) needs 2 s for it, the slower one (50 samples/s) 3 s, both far inside
  // (1 - 0.2) x 10 s: the round is planned to 3 s. The slower one gets its 10 steps, the fast one
  // fills the 3 s with 20 (below the derived bound, 4 x 10).
  Fixture f({"server.mode=federated", "server.rounds=5", "server.clients_per_round=2",
             "server.min_clients=2", "server.round_deadline_ms=10000", "train.batch_size=10"});
  measure_first_round(f, {{"fast", 100}, {"slower", 50}});
  CHECK(f.starts("fast")[0].local_steps == 1);  // server.work = deadline is the default
  f.coordinator->tick();
  REQUIRE(f.starts("fast").size() == 2);
  REQUIRE(f.starts("slower").size() == 2);
  CHECK(f.starts("fast")[1].local_steps == 20);
  CHECK(f.starts("slower")[1].local_steps == 10);
  SUBCASE("the averages move, T with them") {
    f.train("fast", 2, measured(100, 20));
    f.train("slower", 2, measured(2, 10));  // 0.3 x 2 + 0.7 x 50 = 35.6 samples/s
    f.coordinator->tick();
    REQUIRE(f.starts("fast").size() == 3);
    // The slower's fixed work: 1 s + 100 / 35.6 s = 3.81 s, still inside 8 s: T = 3.81 s.
    CHECK(f.starts("fast")[2].local_steps == 28);  // floor(2.81 x 100 / 10)
    CHECK(f.starts("slower")[2].local_steps == 10);
  }
}

TEST_CASE("coordinator: a client too slow for the deadline plans the round to (1 - margin) D") {
  Fixture f({"server.mode=federated", "server.rounds=5", "server.clients_per_round=2",
             "server.min_clients=2", "server.round_deadline_ms=10000", "train.batch_size=10"});
  // The snail's fixed work: 1 s + 100 / 5 s = 21 s > 8 s.
  measure_first_round(f, {{"fast", 100}, {"snail", 5}});
  f.coordinator->tick();
  REQUIRE(f.starts("fast").size() == 2);
  REQUIRE(f.starts("snail").size() == 2);
  // T = 8 s: the fast client's (8 - 1) x 100 / 10 = 70 steps are capped by the derived bound,
  // 4 x its fixed 10; the snail gets floor(7 x 5 / 10) = 3.
  CHECK(f.starts("fast")[1].local_steps == 40);
  CHECK(f.starts("snail")[1].local_steps == 3);
}

TEST_CASE("coordinator: a client registering into a measured fleet is planned with its slow end") {
  Fixture f({"server.mode=federated", "server.rounds=5", "server.clients_per_round=3",
             "server.min_clients=2", "server.round_deadline_ms=10000", "train.batch_size=10"});
  measure_first_round(f, {{"fast", 100}, {"slow", 10}});
  f.register_client("new");
  f.coordinator->tick();
  REQUIRE(f.starts("new").size() == 1);
  REQUIRE(f.starts("new")[0].round == 2);
  // The prior: the 10% quantile of {100, 10} samples/s is 10, links 2 MB/s. Its fixed work (10
  // steps) would take 1 s + 10 s > 8 s, so T = 8 s and it is given floor(7 x 10 / 10) = 7, at most
  // its fixed work.
  CHECK(f.starts("new")[0].local_steps == 7);
  CHECK(f.starts("slow")[1].local_steps == 7);
  CHECK(f.starts("fast")[1].local_steps == 40);
}

TEST_CASE("server.work and its keys: federated only, deadline only, and checked values") {
  CHECK(testing::validate_error({"server.work=deadline", "server.min_local_steps=3",
                                 "server.max_local_steps=30", "server.deadline_margin=0.1"}) == "");
  CHECK(testing::validate_error({"server.work=deadline"}) == "");  // max 0: derived per client
  CHECK(
      testing::validate_error({"server.work=fast"}).find("server.work must be fixed or deadline") ==
      0);
  CHECK(testing::validate_error({"server.mode=fedbuff", "server.work=deadline"})
            .find("server.work applies to server.mode = federated only") == 0);
  CHECK(testing::validate_error({"server.mode=dataparallel", "server.max_local_steps=5"})
            .find("server.max_local_steps applies to server.mode = federated only") == 0);
  CHECK(testing::validate_error({"server.min_local_steps=4"}) == "");  // deadline is the default
  CHECK(testing::validate_error({"server.work=fixed", "server.min_local_steps=4"})
            .find("server.min_local_steps applies to server.work = deadline only") == 0);
  CHECK(testing::validate_error({"server.work=deadline", "server.min_local_steps=0"})
            .find("server.min_local_steps must be from 1") == 0);
  CHECK(testing::validate_error(
            {"server.work=deadline", "server.min_local_steps=10", "server.max_local_steps=5"})
            .find("server.max_local_steps = 5 is below server.min_local_steps = 10") == 0);
  CHECK(testing::validate_error({"server.work=deadline", "server.deadline_margin=1"})
            .find("server.deadline_margin must be a fraction in [0, 1)") == 0);
  const auto options =
      testing::make_options({"server.work=deadline", "server.min_local_steps=3",
                             "server.max_local_steps=30", "server.deadline_margin=0.1"});
  CHECK(options.work.policy == WorkPolicy::kDeadline);
  CHECK(options.work.min_steps == 3);
  CHECK(options.work.max_steps == 30);
  CHECK(options.work.margin == doctest::Approx(0.1));
  CHECK(testing::make_options({}).work.policy == WorkPolicy::kDeadline);
  CHECK(testing::make_options({"server.work=fixed"}).work.policy == WorkPolicy::kFixed);
}

TEST_CASE("coordinator: server.work = fixed sends today's RoundStart whatever clients measured") {
  Fixture f({"server.mode=federated", "server.rounds=3", "server.clients_per_round=2",
             "server.min_clients=2", "server.round_deadline_ms=1000", "train.steps=5",
             "server.work=fixed"});
  f.register_client("fast");
  f.register_client("slow");
  f.coordinator->tick();
  f.train("fast", 1, measured(100, 5));
  f.train("slow", 1, measured(10, 5));
  f.coordinator->tick();
  for (const NodeId id : {"fast", "slow"}) {
    REQUIRE(f.starts(id).size() == 2);
    CHECK(f.starts(id)[0] == RoundStart{.round = 1,
                                        .deadline_ms = 1000,
                                        .local_epochs = 1,
                                        .local_steps = 5,
                                        .model_version = 0,
                                        .cohort_size = 2});
    CHECK(f.starts(id)[1] == RoundStart{.round = 2,
                                        .deadline_ms = 1000,
                                        .local_epochs = 1,
                                        .local_steps = 5,
                                        .model_version = 1,
                                        .cohort_size = 2});
  }
}

}  // namespace
}  // namespace cohort::server
