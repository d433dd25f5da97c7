#include "cohort/core/scheduling.h"

#include <doctest/doctest.h>
#include <sched.h>

#include <future>
#include <tuple>

#include "cohort/core/error.h"

TEST_CASE("parse_scheduling takes batch and keep and names anything else") {
  CHECK(cohort::parse_scheduling("batch") == cohort::Scheduling::kBatch);
  CHECK(cohort::parse_scheduling("keep") == cohort::Scheduling::kKeep);
  CHECK(cohort::to_string(cohort::Scheduling::kBatch) == "batch");
  CHECK(cohort::to_string(cohort::Scheduling::kKeep) == "keep");
  CHECK_THROWS_WITH_AS(cohort::parse_scheduling("fifo"), "--sched must be batch or keep, got 'fifo'",
                       cohort::ConfigError);
}

TEST_CASE("the process-wide choice defaults to batch and can be changed") {
  CHECK(cohort::io_scheduling() == cohort::Scheduling::kBatch);
  cohort::set_io_scheduling(cohort::Scheduling::kKeep);
  CHECK(cohort::io_scheduling() == cohort::Scheduling::kKeep);
  cohort::set_io_scheduling(cohort::Scheduling::kBatch);
  CHECK(cohort::io_scheduling() == cohort::Scheduling::kBatch);
}

TEST_CASE("I/O threads get SCHED_BATCH under a default-policy creator, else the creator's policy") {
  // On a fresh thread, so that the policies set here do not leak into other test cases.
  const auto [switched, batch, keep, kept_idle] = std::async(std::launch::async, [] {
    sched_param p{};
    bool switched = sched_setscheduler(0, SCHED_OTHER, &p) == 0;
    const int batch = cohort::io_thread_policy(cohort::Scheduling::kBatch);
    const int keep = cohort::io_thread_policy(cohort::Scheduling::kKeep);
    switched = switched && sched_setscheduler(0, SCHED_IDLE, &p) == 0;  // as `chrt -i 0` starts it
    return std::tuple{switched, batch, keep, cohort::io_thread_policy(cohort::Scheduling::kBatch)};
  }).get();
  REQUIRE(switched);
  CHECK(batch == SCHED_BATCH);
  CHECK(keep == SCHED_OTHER);
  CHECK(kept_idle == SCHED_IDLE);
}
