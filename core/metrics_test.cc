#include "cohort/core/metrics.h"

#include <doctest/doctest.h>

TEST_CASE("metrics records are one JSON object with the event first") {
  const std::string line = cohort::MetricsSink::encode(
      "round", {{"round", std::int64_t{3}}, {"accuracy", 0.5}, {"ok", true}, {"who", std::string("a")}});
  CHECK(line == R"({"event":"round","round":3,"accuracy":0.5,"ok":true,"who":"a"})");
}
