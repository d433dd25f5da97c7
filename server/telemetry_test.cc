// The HTTP endpoint's options (server.http*) and what the server shows on it: the metrics sink's
// records and the shards' figures as Telemetry samples and status rows.

#include "telemetry.h"

#include <doctest/doctest.h>

#include "cohort/core/error.h"

#include "test_util.h"

using namespace cohort;
using namespace cohort::server;
using namespace cohort::server::testing;

TEST_CASE("server.http: shard 0 serves on 127.0.0.1:9100 by default, the others only when set") {
  auto o = make_options({"tls.insecure=true"});
  CHECK(o.http.enabled);
  CHECK_FALSE(o.http.explicitly_set);
  CHECK(o.http.http.host == "127.0.0.1");
  CHECK(o.http.http.port == 9100);
  CHECK(o.http.http.cert_file.empty());
  o = make_options({"tls.insecure=true", "server.shard=1", "server.shards=2"});
  CHECK_FALSE(o.http.enabled);
  o = make_options(
      {"tls.insecure=true", "server.shard=1", "server.shards=2", "server.http=127.0.0.1:0"});
  CHECK(o.http.enabled);
  CHECK(o.http.explicitly_set);
  CHECK(o.http.http.port == 0);
  o = make_options({"tls.insecure=true", "server.http=off"});
  CHECK_FALSE(o.http.enabled);
}

TEST_CASE("server.http: a non-loopback address serves HTTPS, and needs the shard's certificate") {
  CHECK_THROWS_WITH_AS(make_options({"tls.insecure=true", "server.http=0.0.0.0:9100"}),
                       doctest::Contains("reverse proxy"), ConfigError);
  auto o = make_options({"tls.cert_file=/k/shard-0.pem", "tls.key_file=/k/shard-0.key",
                         "tls.ca_file=/k/ca.pem", "server.http=0.0.0.0:9100"});
  CHECK(o.http.http.cert_file == "/k/shard-0.pem");
  CHECK(o.http.http.key_file == "/k/shard-0.key");
  CHECK_THROWS_AS(make_options({"tls.insecure=true", "server.http=9100"}), ConfigError);
  CHECK_THROWS_AS(make_options({"tls.insecure=true", "server.http_linger_ms=-1"}), ConfigError);
}

TEST_CASE("refusal reasons become a few label values") {
  CHECK(reason_class("push for round 3 arrived after its round closed: refused") == "late");
  CHECK(reason_class("gradient has non-finite values") == "non_finite");
  CHECK(reason_class("misaligned chunk") == "malformed");
  CHECK(reason_class("a second masked input for round 2 (the first stands)") == "duplicate");
  CHECK(reason_class("something new") == "other");
}

TEST_CASE("rounds, failures and client records from the sink; a shard's samples on shard 0") {
  const auto options = make_options({"tls.insecure=true", "server.shards=2"});
  ServerTelemetry shard0(options, 0), shard1(options, 1);
  MetricsSink sink("");
  shard0.watch(sink);
  sink.write("round", {{"round", std::uint64_t{1}},
                       {"round_seconds", 0.5},
                       {"train_seconds", 0.4},
                       {"comm_seconds", 0.1},
                       {"train_loss", 0.9},
                       {"test_accuracy", 0.7}});
  sink.write("round_failed", {{"round_id", std::uint64_t{2}}, {"reason", "deadline passed"}});
  sink.write("client", {{"client", std::string("client-3")},
                        {"round_id", std::uint64_t{1}},
                        {"participations", std::uint64_t{1}},
                        {"measured_samples_per_s", 1000.0},
                        {"assigned_steps", std::uint64_t{12}},
                        {"micro_batch", std::uint64_t{32}}});
  transport::EndpointStats ep;
  ep.bytes_sent = 100;
  ShardStats stats;
  stats.accepted = 4;
  stats.refused["late"] = 1;
  shard1.refresh(ep, stats);
  shard0.on_remote(1, shard1.encode_samples());
  shard0.refresh(ep, ShardStats{});
  CoordinatorSnapshot snap;
  snap.state = "running";
  snap.registered = 5;
  snap.clients = {{"client-3", "training"}};
  shard0.refresh(snap);

  const std::string text = shard0.store().prometheus();
  CHECK(text.find("cohort_rounds_committed_total 1\n") != std::string::npos);
  CHECK(text.find("cohort_rounds_failed_total{reason=\"deadline\"} 1\n") != std::string::npos);
  CHECK(text.find("cohort_round_duration_seconds_count 1\n") != std::string::npos);
  CHECK(text.find("cohort_test_accuracy 0.7\n") != std::string::npos);
  CHECK(text.find("cohort_sent_bytes_total{shard=\"0\"} 100\n") != std::string::npos);
  CHECK(text.find("cohort_sent_bytes_total{shard=\"1\"} 100\n") != std::string::npos);
  CHECK(text.find("cohort_updates_accepted_total{shard=\"1\"} 4\n") != std::string::npos);
  CHECK(text.find("cohort_updates_refused_total{shard=\"1\",reason=\"late\"} 1\n") !=
        std::string::npos);
  CHECK(text.find("cohort_clients{state=\"registered\"} 5\n") != std::string::npos);
  const auto status = shard0.store().status();
  CHECK(status["rounds_committed"] == 1);
  CHECK(status["rounds_failed"] == 1);
  CHECK(status["shards"].size() == 2);
  REQUIRE(status["clients"].size() == 1);
  CHECK(status["clients"][0]["assigned"]["local_steps"] == 12);
  CHECK(shard0.store().rounds_since(0, 10)["rounds"].size() == 1);

  // A shard speaks for itself only, and a malformed payload is refused.
  shard0.on_remote(1, shard0.encode_samples());  // shard 0's samples, sent as shard 1's
  CHECK(shard0.store().prometheus().find("cohort_sent_bytes_total{shard=\"1\"}") ==
        std::string::npos);
  const std::string junk = "{\"samples\": 3}";
  CHECK_THROWS_AS(shard0.on_remote(1, std::as_bytes(std::span(junk))), ProtocolError);
}
