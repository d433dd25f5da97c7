// Federations of real cohort-server and cohort-client processes on loopback.
#include <doctest/doctest.h>

#include <csignal>
#include <thread>

#include "cohort/server/checkpoint.h"
#include "federation.h"

using namespace std::chrono_literals;
using cohort::test::Federation;


TEST_CASE("2 shards + 4 clients, 3 rounds over TLS: test accuracy rises") {
  Federation f(2, 4, {"--server.rounds=3", "--server.clients_per_round=4", "--server.min_clients=4",
                      "--train.epochs=1", "--train.lr=0.05", "--train.momentum=0.9"});
  f.start();
  REQUIRE(f.wait(240s) == 0);
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 3);
  for (const auto& r : rounds) CHECK(r["clients"] == 4);
  // server.work = deadline, the default: round 1 measures everyone with server.min_local_steps
  // (1 step); from round 2 each client runs at least its train.epochs (ceil(15000 / 64) = 235
  // steps): the round lasts the slowest one's epoch, and faster ones fill it, up to 4 x 235.
  for (const auto& c : f.records("client")) {
    CAPTURE(c.dump());
    CHECK(c["local_steps"] == c["assigned_steps"]);
    if (c["round_id"] == 1) {
      CHECK(c["assigned_steps"] == 1);
    } else {
      CHECK(c["assigned_steps"].get<std::uint64_t>() >= 235);
      CHECK(c["assigned_steps"].get<std::uint64_t>() <= 4 * 235);
    }
  }
  const double first = rounds[0]["test_accuracy"];
  const double second = rounds[1]["test_accuracy"];
  const double last = rounds[2]["test_accuracy"];
  MESSAGE("accuracy after round 1: " << first << ", 2: " << second << ", 3: " << last);
  CHECK(second > 0.5);   // far above chance (0.1) after one round of an epoch or more
  CHECK(last > first);   // and rising
  for (auto& c : f.clients) CHECK(c.wait_for(20s) == 0);
}

TEST_CASE("kill -9 of one client mid-round: the round closes at its deadline with the others"
          * doctest::test_suite("long")) {
  // The deadline must leave the two live clients time for their three epochs: several times
  // longer under AddressSanitizer.
#if defined(__SANITIZE_ADDRESS__)
  constexpr int kDeadlineMs = 40000;
#else
  constexpr int kDeadlineMs = 8000;
#endif
  Federation f(1, 3, {"--server.rounds=2", "--server.clients_per_round=3", "--server.min_clients=3",
                      "--server.min_updates=2",
                      "--server.round_deadline_ms=" + std::to_string(kDeadlineMs),
                      "--train.epochs=3", "--server.work=fixed"});
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
  REQUIRE(f.wait(240s) == 0);
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 2);
  CHECK(rounds[0]["clients"] == 2);   // the killed client's update never came
  CHECK(rounds[0]["selected"] == 3);
  CHECK(rounds[0]["round_seconds"].get<double>() >= kDeadlineMs / 1000.0 - 1.0);  // at the deadline
}

TEST_CASE("kill -9 of shard 1 mid-training, then restart: it resumes from its checkpoint"
          * doctest::test_suite("long")) {
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

TEST_CASE("SIGTERM to a waiting shard writes a checkpoint and exits 0") {
  // No clients: shard 0 sits in its poll loop, where the signal interrupts ZeroMQ's wait (EINTR).
  Federation f(1, 0, {"--server.rounds=3"});
  f.start();
  std::this_thread::sleep_for(1s);
  f.server(0).kill(SIGTERM);
  const auto code = f.server(0).wait_for(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  cohort::server::CheckpointStore store(f.checkpoint_dir(), "shard-0");
  CHECK(store.load_latest().has_value());
  CHECK(f.server(0).stderr_text().find("stopping (signal)") != std::string::npos);
}

TEST_CASE("kill -9 of the coordinator: a waiting client gives up after client.connect_timeout_ms") {
  // min_clients 2 with one client: no round starts, the client waits in its main loop.
  Federation f(1, 1, {"--server.rounds=3", "--server.min_clients=2"});
  f.client_extra[0] = {"--client.connect_timeout_ms=3000"};
  f.start();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (f.clients[0].stderr_text().find("joined") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE(f.clients[0].stderr_text().find("joined") != std::string::npos);
  f.server(0).kill(9);
  // The session breaks at once on loopback; reconnects are refused; the client stops with an
  // error instead of waiting for ever.
  const auto code = f.clients[0].wait_for(60s);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(f.clients[0].stderr_text().find("lost the coordinator") != std::string::npos);
}
