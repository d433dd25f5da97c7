// Secure aggregation (server.secure_aggregation) in federations of real cohort-server and
// cohort-client processes over mutual TLS.
#include <doctest/doctest.h>

#include "federation.h"

using namespace std::chrono_literals;
using cohort::test::Federation;

TEST_CASE("secagg+ with 2 shards + 5 clients over TLS: every round commits, accuracy rises") {
  Federation f(2, 5,
               {"--server.rounds=3", "--server.clients_per_round=5", "--server.min_clients=5",
                "--server.work=fixed", "--train.steps=100", "--train.lr=0.05",
                "--train.momentum=0.9", "--server.secure_aggregation=secagg+",
                "--secagg.stage_ms=60000"});
  f.start();
  REQUIRE(f.wait(300s) == 0);
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 3);
  for (const auto& r : rounds) {
    CAPTURE(r.dump());
    CHECK(r["clients"] == 5);
  }
  const double first = rounds[0]["test_accuracy"];
  const double last = rounds[2]["test_accuracy"];
  MESSAGE("accuracy after round 1: " << first << ", 3: " << last);
  CHECK(first > 0.5);  // the unmasked mean moved the model: far above chance (0.1)
  CHECK(last > first);
  for (auto& c : f.clients) CHECK(c.wait_for(20s) == 0);
}

TEST_CASE("a client with a compressor stops under secure aggregation, naming the conflict") {
  Federation f(1, 2,
               {"--server.rounds=1", "--server.clients_per_round=2", "--server.min_clients=2",
                "--server.min_updates=1", "--server.work=fixed", "--train.steps=2",
                "--server.secure_aggregation=secagg", "--secagg.stage_ms=5000",
                "--server.round_deadline_ms=20000"});
  f.client_extra[0] = {"--compressor.name=fp16"};
  f.start();
  const auto code = f.clients[0].wait_for(120s);
  const std::string err = f.clients[0].stderr_text();
  CAPTURE(err);
  CHECK(code == 1);
  CHECK(err.find("cannot run under the server's secure aggregation") != std::string::npos);
}
