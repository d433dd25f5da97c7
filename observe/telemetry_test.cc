#include "cohort/observe/telemetry.h"

#include <doctest/doctest.h>

#include <stdexcept>

using cohort::observe::Kind;
using cohort::observe::Telemetry;

TEST_CASE("telemetry renders families with HELP, TYPE and escaped labels") {
  Telemetry t;
  t.describe("cohort_rounds_committed_total", Kind::kCounter, "rounds committed");
  t.describe("cohort_updates_refused_total", Kind::kCounter, "refused\nupdates \\ by reason");
  t.describe("cohort_test_accuracy", Kind::kGauge, "latest accuracy");
  t.add("cohort_rounds_committed_total", "", 1);
  t.add("cohort_rounds_committed_total", "", 2);
  t.add("cohort_updates_refused_total", cohort::observe::label("reason", "a \"b\"\\c\n"), 1);
  t.set("cohort_test_accuracy", "", 0.875);
  const std::string text = t.prometheus();
  CHECK(text ==
        "# HELP cohort_rounds_committed_total rounds committed\n"
        "# TYPE cohort_rounds_committed_total counter\n"
        "cohort_rounds_committed_total 3\n"
        "# HELP cohort_updates_refused_total refused\\nupdates \\\\ by reason\n"
        "# TYPE cohort_updates_refused_total counter\n"
        "cohort_updates_refused_total{reason=\"a \\\"b\\\"\\\\c\\n\"} 1\n"
        "# HELP cohort_test_accuracy latest accuracy\n"
        "# TYPE cohort_test_accuracy gauge\n"
        "cohort_test_accuracy 0.875\n");
  CHECK_THROWS_AS(t.set("cohort_unknown", "", 1), std::logic_error);
  CHECK_THROWS_AS(t.describe("cohort_test_accuracy", Kind::kGauge, "again"), std::logic_error);
}

TEST_CASE("a histogram's buckets are cumulative and end with +Inf") {
  Telemetry t;
  t.describe("cohort_round_duration_seconds", Kind::kHistogram, "round time", {1, 0.5, 2});
  for (double v : {0.1, 0.5, 0.7, 1.5, 9.0}) t.observe("cohort_round_duration_seconds", v);
  const std::string text = t.prometheus();
  CHECK(text.find("cohort_round_duration_seconds_bucket{le=\"0.5\"} 2\n") != std::string::npos);
  CHECK(text.find("cohort_round_duration_seconds_bucket{le=\"1\"} 3\n") != std::string::npos);
  CHECK(text.find("cohort_round_duration_seconds_bucket{le=\"2\"} 4\n") != std::string::npos);
  CHECK(text.find("cohort_round_duration_seconds_bucket{le=\"+Inf\"} 5\n") != std::string::npos);
  CHECK(text.find("cohort_round_duration_seconds_sum 11.8\n") != std::string::npos);
  CHECK(text.find("cohort_round_duration_seconds_count 5\n") != std::string::npos);
  CHECK_THROWS_AS(t.set("cohort_round_duration_seconds", "", 1), std::logic_error);
}

TEST_CASE("remote shards' samples join their families; unknown families are dropped") {
  Telemetry t;
  t.describe("cohort_sent_bytes_total", Kind::kCounter, "bytes sent");
  t.set("cohort_sent_bytes_total", "shard=\"0\"", 10);
  t.set_remote(1, {{"cohort_sent_bytes_total", "shard=\"1\"", 20}, {"cohort_evil", "", 1}});
  t.set_remote(2, {{"cohort_sent_bytes_total", "shard=\"2\"", 30}});
  t.set_remote(1, {{"cohort_sent_bytes_total", "shard=\"1\"", 25}});  // replaces
  const std::string text = t.prometheus();
  CHECK(text.find("cohort_sent_bytes_total{shard=\"0\"} 10\ncohort_sent_bytes_total{shard=\"1\"} "
                  "25\ncohort_sent_bytes_total{shard=\"2\"} 30\n") != std::string::npos);
  CHECK(text.find("cohort_evil") == std::string::npos);
  REQUIRE(t.samples().size() == 1);  // only this process's own
}

TEST_CASE("rounds are served after a given round, at most max, with the next cursor") {
  Telemetry t;
  for (std::uint64_t r = 1; r <= 5; ++r) t.add_round({{"round", r}, {"train_loss", 1.0 / r}});
  auto j = t.rounds_since(2, 2);
  REQUIRE(j["rounds"].size() == 2);
  CHECK(j["rounds"][0]["round"] == 3);
  CHECK(j["next"] == 4);
  j = t.rounds_since(5, 10);
  CHECK(j["rounds"].empty());
  CHECK(j["next"] == 5);
  t.set_status("state", "running");
  CHECK(t.status()["state"] == "running");
}
